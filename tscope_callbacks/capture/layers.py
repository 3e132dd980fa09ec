"""Per-layer records: totals built from op records, plus the per-call details gathered by module/tensor hooks.

Times, FLOPs and bytes of a layer are sums of its ops (``self_*``) and of its descendants' ops (inclusive), so a
parent's time is never a sum of host timers around asynchronous children (InspectorGadgets' over-estimate).

Details (``layer_details=True``): input shapes (positional and keyword tensors) and output shapes of the first call,
gradient shapes, output bytes, memory (:mod:`.memory`) and non-finite flags. The non-finite checks never sync the
host: each checked tensor contributes one ``aminmax`` reduction (exact: NaN and Inf propagate, finite values never
overflow), kept on the device and read once, all together, when the capture stops.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable
from typing import Any

import torch

from tscope_callbacks.capture.faults import Faults
from tscope_callbacks.capture.memory import MemoryTracker
from tscope_callbacks.capture.paths import ModelTree, ancestors, clean_path
from tscope_callbacks.capture.step_memory import _PLAIN
from tscope_callbacks.records import LayerRecord, OpRecord

__all__ = ["LayerDetails", "build_layers"]

_SHAPE_LIMIT = 8  #: gradient shapes kept per layer and kind


def _tensors(x: Any) -> list[torch.Tensor]:
    """Tensors in a nested output (tuple/list/dict/ModelOutput), in order."""
    if isinstance(x, torch.Tensor):  # the common cases, without the walk: a tensor, a tuple of one tensor
        return [x]
    if type(x) is tuple and len(x) == 1 and isinstance(x[0], torch.Tensor):
        return [x[0]]
    out: list[torch.Tensor] = []
    stack = [x]
    while stack:
        v = stack.pop()
        if isinstance(v, torch.Tensor):
            out.append(v)
        elif isinstance(v, dict):
            stack.extend(reversed(list(v.values())))
        elif isinstance(v, (list, tuple)):
            stack.extend(reversed(v))
    return out


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


class LayerDetails:
    """Shapes, gradient shapes, output bytes, memory and non-finite flags per layer (first call's shapes)."""

    def __init__(self, check_finite: bool, mute: Callable[[], Any] = contextlib.nullcontext,
                 memory: MemoryTracker | None = None, faults: Faults | None = None) -> None:
        self.check_finite = check_finite
        self._mute = mute  #: context in which our own checks run unrecorded
        self.memory = memory
        self.faults = faults if faults is not None else Faults("layer details")
        self.info: dict[str, dict[str, Any]] = {}
        self._flags: list[tuple[str, str, torch.Tensor]] = []  #: (path, flag name, aminmax pair) read at stop
        #: id(tensor) -> (weak ref, its aminmax pair): a tensor handed up unchanged (a parent returning its child's
        #: output, a gradient seen by two hooks) is reduced once and its result shared
        self._checked: dict[int, tuple[Any, torch.Tensor, torch.Tensor]] = {}
        self._handles: list[Any] = []
        #: id(tensor) -> (weak ref, [(path, kind)]): the tensors whose gradient is watched, each with one hook
        self._watched: dict[int, tuple[Any, list[tuple[str, str]]]] = {}
        self._live = True

    def _get(self, path: str) -> dict[str, Any]:
        d = self.info.get(path)
        if d is None:
            d = self.info[path] = {
                "input_shapes": None, "output_shapes": None, "grad_input_shapes": None, "grad_output_shapes": None,
                "output_bytes": 0, "nonfinite_output": False, "nonfinite_grad_input": False,
                "nonfinite_grad_output": False,
            }
        return d

    def _check(self, path: str, flag: str, ts: list[torch.Tensor]) -> None:
        """Queue an exact, sync-free non-finite check of ``ts`` (read in :meth:`finish`). The reductions of one call
        (a module's outputs) run in one muted stretch: on CUDA one ``tscope#paused`` range, not one per tensor."""
        todo = []
        for t in ts:
            if t.numel() == 0 or not (t.is_floating_point() or t.is_complex()):
                continue
            seen = self._checked.get(id(t))
            if seen is not None and seen[0]() is t:
                self._flags.append((path, flag, seen[1]))
                self._flags.append((path, flag, seen[2]))
            else:
                todo.append(t)
        if not todo:
            return
        with self._mute(), torch.no_grad():  # no autograd node: nothing saved, nothing recorded
            for t in todo:
                seen = self._checked.get(id(t))  # the same tensor twice in one output
                if seen is not None and seen[0]() is t:
                    lo, hi = seen[1], seen[2]
                else:
                    x = torch.view_as_real(t) if t.is_complex() else t
                    lo, hi = torch.aminmax(x.detach())
                    self._checked[id(t)] = (weakref.ref(t), lo, hi)
                self._flags.append((path, flag, lo))
                self._flags.append((path, flag, hi))

    def on_enter(self, path: str, module: torch.nn.Module, args: Any, kwargs: Any) -> None:
        d = self._get(path)
        ins = _tensors(args) + (_tensors(kwargs) if kwargs else [])
        if d["input_shapes"] is None:
            d["input_shapes"] = [list(t.shape) for t in ins]
        for t in ins:
            if t.requires_grad:
                self._watch_grad(t, path, "grad_input")
        if self.memory is not None:
            self.memory.enter(path)

    def on_exit(self, path: str, module: torch.nn.Module, output: Any, in_backward: bool) -> None:
        if self.memory is not None:
            self.memory.exit(path)
        if in_backward:  # activation-checkpointing recompute: shapes already known, no new grads to watch
            return
        d = self._get(path)
        outs = _tensors(output)
        if d["output_shapes"] is None:
            d["output_shapes"] = [list(t.shape) for t in outs]
        d["output_bytes"] += sum(_nbytes(t) for t in outs)
        if self.check_finite:
            self._check(path, "nonfinite_output", outs)
        for t in outs:
            if t.requires_grad:
                self._watch_grad(t, path, "grad_output")

    def _watch_grad(self, t: torch.Tensor, path: str, kind: str) -> None:
        """Note ``t``'s gradient under ``path`` as ``kind`` when backward computes it. One hook per tensor: a tensor
        seen by several modules (a block's input is its first child's; a child's output is handed up) gets one
        hook, which serves each (path, kind) in the order they were noted, as one hook each did."""
        w = self._watched.get(id(t))
        if w is not None and w[0]() is t:
            w[1].append((path, kind))
            return
        targets = [(path, kind)]
        self._watched[id(t)] = (weakref.ref(t), targets)
        node = t.grad_fn
        if node is not None and type(t) in _PLAIN:
            # a pre-hook on the node that made it, reading its output ``output_nr``: what ``t.register_hook`` does
            # (it binds to the same node, as it is when the hook is registered), without the Python wrapper's dict
            # and checks (2 us a registration instead of 7); a leaf or a tensor subclass: the tensor's own hook
            try:
                self._handles.append(node.register_prehook(self._grad_hook(targets, t.output_nr)))
                return
            except (AttributeError, RuntimeError, TypeError):
                pass
        self._handles.append(t.register_hook(self._grad_hook(targets)))

    def _grad_hook(self, targets: list[tuple[str, str]], output_nr: int | None = None) -> Callable[[Any], None]:
        """The hook noting a gradient under each of ``targets``: a tensor hook (the gradient), or with ``output_nr``
        a node pre-hook (the node's output gradients; an output backward did not reach is None)."""

        def hook(grad: Any) -> None:  # runs inside the user's backward: never raises
            if output_nr is not None:
                grad = grad[output_nr] if output_nr < len(grad) else None
            if not self._live or grad is None:
                return None
            for path, kind in targets:
                try:
                    d = self._get(path)
                    key = f"{kind}_shapes"
                    if d[key] is None:
                        d[key] = []
                    if len(d[key]) < _SHAPE_LIMIT:
                        d[key].append(list(grad.shape))
                    if self.check_finite:
                        self._check(path, f"nonfinite_{kind}", [grad])
                except Exception as e:
                    self.faults.report("the gradient hook of layer details", e)
            return None

        return hook

    def finish(self) -> None:
        """Read every queued non-finite check (one host read per dtype group) into the flags."""
        if not self._flags:
            self._checked.clear()
            return
        groups: dict[tuple[Any, Any], list[int]] = {}
        for i, (_, _, v) in enumerate(self._flags):
            groups.setdefault((v.device, v.dtype), []).append(i)
        with self._mute(), torch.no_grad():
            for idx in groups.values():
                finite = torch.isfinite(torch.stack([self._flags[i][2] for i in idx])).tolist()
                for i, ok in zip(idx, finite):
                    if not ok:
                        path, flag, _ = self._flags[i]
                        self._get(path)[flag] = True
        self._flags.clear()
        self._checked.clear()

    def remove_hooks(self) -> None:
        self._live = False
        self._watched.clear()
        for h in self._handles:
            try:
                h.remove()
            except Exception:
                pass
        self._handles.clear()


def build_layers(
    model: torch.nn.Module,
    ops: list[OpRecord],
    details: LayerDetails | None,
    collapse: Callable[[str], str],
    calls: dict[str, int] | None = None,
    *,
    tree: ModelTree | None = None,
    sums: dict[tuple[str, str], list] | None = None,
) -> dict[str, LayerRecord]:
    """LayerRecords for every (selected) module of ``model``, with self and inclusive op totals.

    One pass sums the ops per (layer, phase); the sums are then added to each layer and its ancestors (the cost
    grows with the number of layers, not ops x depth)."""
    layers: dict[str, LayerRecord] = {}
    tree = tree if tree is not None else ModelTree(model)
    for path, mod in tree.clean_modules():
        if collapse(path) == path:  # below the selected depth: aggregated into an ancestor
            layers[path] = LayerRecord(path=path, type=type(mod).__name__)
    if "" not in layers:
        layers[""] = LayerRecord(path="", type=type(model).__name__)
    seen: set[int] = set()
    for name, prm in tree.parameters:  # parameter totals, bottom-up (shared parameters once)
        if id(prm) in seen:
            continue
        seen.add(id(prm))
        n, nb = prm.numel(), _nbytes(prm)
        gb = _nbytes(prm.grad) if prm.grad is not None else 0
        for a in ancestors(clean_path(name).rpartition(".")[0]):
            L = layers.get(a)
            if L is not None:
                L.num_parameters += n
                L.num_trainable_parameters += n if prm.requires_grad else 0
                L.param_bytes += nb
                L.grad_bytes += gb
    add_op_totals(layers, ops, sums=sums)
    for path, n in (calls or {}).items():
        if path in layers:
            layers[path].calls += n
    if details is not None:
        _apply_details(layers, details, ops)
    return layers


def add_op_totals(layers: dict[str, LayerRecord], ops: list[OpRecord], *, counts: bool = True,
                  sums: dict[tuple[str, str], list] | None = None) -> None:
    """Add each op's time (and, with ``counts``, FLOPs and bytes) to its layer and that layer's ancestors, inclusive
    and (for the layer itself) self totals: one pass sums per (layer, phase) (``sums``: that pass done already,
    ``{(layer, phase): [seconds, flops, bytes]}``, as the capture's record pass does), then each sum goes up."""
    if sums is None:
        sums = {}
        for r in ops:
            acc = sums.get((r.layer, r.phase))
            if acc is None:
                acc = sums[(r.layer, r.phase)] = [0.0, 0, 0]
            acc[0] += r.time_s or 0.0
            acc[1] += r.flops
            acc[2] += r.bytes_read + r.bytes_written
    for (layer, phase), (t, fl, by) in sums.items():
        anc = [a for a in ancestors(layer) if a in layers]
        own = bool(anc) and anc[0] == layer
        if not counts:
            fl = by = 0
        for i, a in enumerate(anc):
            L = layers[a]
            if phase == "forward":
                L.forward_s += t
                L.flops_fwd += fl
                L.bytes_fwd += by
                if i == 0 and own:
                    L.self_forward_s += t
                    L.self_flops_fwd += fl
                    L.self_bytes_fwd += by
            elif phase == "backward":
                L.backward_s += t
                L.flops_bwd += fl
                L.bytes_bwd += by
                if i == 0 and own:
                    L.self_backward_s += t
                    L.self_flops_bwd += fl
                    L.self_bytes_bwd += by
            elif phase == "recompute":
                L.recompute_s += t
                L.flops_recompute += fl


def _apply_details(layers: dict[str, LayerRecord], details: LayerDetails, ops: list[OpRecord]) -> None:
    for path, d in details.info.items():
        L = layers.get(path)
        if L is None:
            continue
        L.input_shapes = d["input_shapes"] or []
        L.output_shapes = d["output_shapes"] or []
        L.grad_input_shapes = d["grad_input_shapes"] or []
        L.grad_output_shapes = d["grad_output_shapes"] or []
        L.output_bytes = d["output_bytes"]
        L.nonfinite_output = d["nonfinite_output"]
        L.nonfinite_grad_input = d["nonfinite_grad_input"]
        L.nonfinite_grad_output = d["nonfinite_grad_output"]
    mem = details.memory
    if mem is None:
        return
    wanted = set(layers)
    for path, (growth, peak) in mem.fwd.items():  # module-boundary spans: inclusive by construction
        L = layers.get(path)
        if L is not None:
            L.memory_fwd_bytes, L.peak_fwd_bytes = growth, peak
    # a module never called (a ModuleList, a ModuleDict: a container) has no forward span; its backward span would
    # be its children's (a row read "calls 0 · mem fwd 0 B · mem bwd -14.5 MiB"): neither is its own
    bwd = mem.backward_spans([(r.layer, r.phase) for r in ops], ancestors, {p for p in wanted if p in mem.fwd})
    for path, (growth, peak) in bwd.items():
        layers[path].memory_bwd_bytes, layers[path].peak_bwd_bytes = growth, peak
    for path, n in mem.saved_inclusive(ancestors, wanted).items():
        layers[path].saved_bytes = n
