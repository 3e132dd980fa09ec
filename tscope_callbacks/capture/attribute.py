"""Which phase and layer an op (or a compiled kernel) belongs to: the rules in ``capture.profile``'s module doc,
in one place."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any, Protocol

import torch
import torch.optim.optimizer as _optimizer

__all__ = ["AttributionState", "attribute", "phase_of", "optimizer_hooks"]


class AttributionState(Protocol):
    """What the rules read and write of a running capture (``state.CaptureState``, which imports this module, never
    the other way round): the module stack, the phase flags, the forward sequence-number map and what backward
    needs of it."""

    stack: list[tuple[str, bool]]  #: (module path, entered during backward), innermost last
    phase_override: str | None
    in_opt_step: int
    in_backward: bool
    cstate: Any  #: ``compiled.CompiledState`` when compiled modules run compiled, else None
    pending: list[tuple]
    seq_hi: int
    seq_layer: dict[int, str]
    hooked: set[int]
    memory: Any  #: ``memory.MemoryTracker`` with layer details, else None
    param_owner: dict[int, str]
    error: Callable[[BaseException, str], None]

    def mute(self) -> AbstractContextManager[None]: ...

    def layer_of_node(self, node: Any) -> str | None: ...

    def add_optimizer(self, optimizer: Any) -> None: ...

_graph_task = torch._C._current_graph_task_id
_saved_hooks = torch._C._autograd._top_saved_tensors_default_hooks


def phase_of(st: AttributionState, node: Any) -> str:
    """The phase of an op or kernel run now by the capture ``st`` (``node``: the autograd node running, None outside
    backward): the override; backward inside the backward engine, its callbacks included (FSDP's reduce-scatter);
    the update itself inside ``optimizer.step()`` when no module runs and grad is off (a no-grad op inside a
    module's forward, such as FSDP's parameter all-gather in its pre-forward hook, belongs to the closure's forward);
    a module forward started during backward is a recompute (activation checkpointing)."""
    stack = st.stack
    if st.phase_override is not None:
        return st.phase_override
    if node is None:
        if _graph_task() != -1:
            return "backward"
        if st.in_opt_step and not torch.is_grad_enabled() and not stack:
            return "optimizer"
        return "forward"
    return "recompute" if stack and stack[-1][1] else "backward"


def attribute(st: AttributionState, args: tuple, seq: int, node: Any) -> tuple[str, str]:
    """(phase, layer) of the op being recorded by the capture ``st`` (``seq``: the sequence counter at dispatch,
    ``node``: the autograd node running, None outside backward). Updates ``st``'s forward seq -> layer map."""
    stack = st.stack
    layer = stack[-1][0] if stack else ""
    if node is None and st.phase_override is None and not st.in_opt_step and _graph_task() == -1:
        phase = "forward"  # phase_of's common case, without the call (this runs for every op)
    else:
        phase = phase_of(st, node)
        if st.phase_override is not None or (node is None and phase != "forward"):
            return phase, layer
    if phase == "forward":
        cs = st.cstate
        if cs is not None and cs.depth:  # inside a compiled forward: no hooks there, the parameters tell
            layer = cs.layer_of(args, layer)
            cs.note(len(st.pending))
        # every autograd node made since the last forward op was made by this op: its own (seq - 1) and any made
        # before the op's kernel dispatched, such as an in-place op's node, made before autograd copies the input
        # it saves (``w /= w.sum()``: DivBackward0, then the clone, then div_). Not in a compiled capture: there a
        # compiled region's node (made when the region returns, no op dispatched after it) would be claimed by the
        # next eager op; its backward kernels take the layer their parameters tell
        hi = st.seq_hi
        if cs is not None:
            if torch.is_grad_enabled():
                st.seq_layer.setdefault(seq - 1, layer)
                if st.memory is not None and _saved_hooks(False) is not None:
                    st.hooked.add(seq - 1)
        elif hi < seq:
            lo = hi if hi >= 0 else seq - 1
            sl = st.seq_layer
            for s in range(lo, seq):
                sl.setdefault(s, layer)
            st.seq_hi = seq
            if st.memory is not None and _saved_hooks(False) is not None:
                st.hooked.update(range(lo, seq))  # saved through someone's hooks (checkpointing): never unpacked
        st.in_backward = False
    elif phase == "recompute":
        st.seq_layer.setdefault(seq - 1, layer)
    else:
        layer = st.seq_layer.get(node._sequence_nr())
        cs = st.cstate
        if layer is None and cs is not None and node.name().startswith("CompiledFunctionBackward"):
            layer = cs.layer_of(args, stack[-1][0] if stack else "")
            cs.note(len(st.pending))
        if layer is None:
            var = getattr(node, "variable", None)  # AccumulateGrad
            layer = st.param_owner.get(id(var), "") if var is not None else (stack[-1][0] if stack else "")
        if not st.in_backward:
            st.in_backward = True
            if st.memory is not None:  # a backward pass starts: nothing freed yet, read what was saved
                with st.mute():
                    st.memory.walk_saved(node, st.layer_of_node)
    return phase, layer


def optimizer_hooks(st: AttributionState) -> list[Any]:
    """Global optimizer step hooks: ops of an ``optimizer.step()`` inside the region are phase ``"optimizer"``. A
    closure the step runs (``step(closure)``: forward and backward inside the step, as Lightning does) keeps its
    phases: inside a step, backward ops are backward and ops with grad mode on (the closure's forward) are forward;
    the update itself runs under ``no_grad``."""
    reg_pre = getattr(_optimizer, "register_optimizer_step_pre_hook", None)
    reg_post = getattr(_optimizer, "register_optimizer_step_post_hook", None)
    if reg_pre is None or reg_post is None:
        return []

    def pre(opt: Any, args: Any, kwargs: Any) -> None:
        st.in_opt_step += 1
        try:
            st.add_optimizer(opt)
        except Exception as e:  # inside the user's optimizer.step()
            st.error(e, "the optimizer step hook")

    def post(opt: Any, args: Any, kwargs: Any) -> None:
        st.in_opt_step = max(0, st.in_opt_step - 1)

    return [reg_pre(pre), reg_post(post)]
