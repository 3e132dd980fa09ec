"""Which phase and layer an op belongs to (the rules in ``capture.profile``'s module doc), in one function."""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["attribute"]

_graph_task = torch._C._current_graph_task_id
_saved_hooks = torch._C._autograd._top_saved_tensors_default_hooks


def attribute(p: Any, args: tuple, seq: int, node: Any) -> tuple[str, str]:
    """(phase, layer) of the op being recorded by profile ``p`` (``seq``: the sequence counter at dispatch,
    ``node``: the autograd node running, None outside backward). Updates ``p``'s forward seq -> layer map."""
    stack = p._stack
    if p._phase_override is not None:
        phase = p._phase_override
        layer = stack[-1][0] if stack else ""
    elif node is None and _graph_task() != -1:  # a callback of the backward engine (FSDP's reduce-scatter)
        phase = "backward"
        layer = stack[-1][0] if stack else ""
    elif p._in_opt_step and node is None and not torch.is_grad_enabled() and not stack:
        # the update itself (no module running: a no-grad op inside a module's forward, such as FSDP's parameter
        # all-gather in its pre-forward hook, belongs to the closure's forward)
        phase = "optimizer"
        layer = stack[-1][0] if stack else ""
    elif node is None:
        phase = "forward"
        layer = stack[-1][0] if stack else ""
        cs = p._cstate
        if cs is not None and cs.depth:  # inside a compiled forward: no hooks there, the parameters tell
            layer = cs.layer_of(args, layer)
            cs.note(len(p._pending))
        if torch.is_grad_enabled():
            p._seq_layer.setdefault(seq - 1, layer)
            if p._memory is not None and _saved_hooks(False) is not None:
                p._hooked.add(seq - 1)  # saved through someone's hooks (checkpointing): never unpacked
        p._in_backward = False
    elif stack and stack[-1][1]:
        phase = "recompute"
        layer = stack[-1][0]
        p._seq_layer.setdefault(seq - 1, layer)
    else:
        phase = "backward"
        layer = p._seq_layer.get(node._sequence_nr())
        cs = p._cstate
        if layer is None and cs is not None and node.name().startswith("CompiledFunctionBackward"):
            layer = cs.layer_of(args, stack[-1][0] if stack else "")
            cs.note(len(p._pending))
        if layer is None:
            var = getattr(node, "variable", None)  # AccumulateGrad
            layer = p._param_owner.get(id(var), "") if var is not None else (stack[-1][0] if stack else "")
        if not p._in_backward:
            p._in_backward = True
            if p._memory is not None:  # a backward pass starts: nothing freed yet, read what was saved
                with p._mute():
                    p._memory.walk_saved(node, p._layer_of_node)
    return phase, layer
