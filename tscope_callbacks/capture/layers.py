"""Per-layer records: totals built from op records, plus the per-call details gathered by module/tensor hooks.

Times, FLOPs and bytes of a layer are sums of its ops (``self_*``) and of its descendants' ops (inclusive), so a
parent's time is never a sum of host timers around asynchronous children (InspectorGadgets' over-estimate).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch

from tscope_callbacks.capture.paths import ancestors, named_modules
from tscope_callbacks.records import LayerRecord, OpRecord

__all__ = ["LayerDetails", "build_layers"]


def _tensors(x: Any) -> list[torch.Tensor]:
    """Tensors in a nested output (tuple/list/dict/ModelOutput), in order."""
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


def _shape(t: torch.Tensor) -> list[int]:
    return list(t.shape)


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


@torch.no_grad()  # no autograd nodes: nothing saved for backward (activation checkpointing counts saved tensors)
def _nonfinite(ts: list[torch.Tensor]) -> bool:
    fl = [t.detach() for t in ts if t.is_floating_point() or t.is_complex()]
    if not fl:
        return False
    if len(fl) == 1:
        return not bool(torch.isfinite(fl[0]).all())
    return not bool(torch.stack([torch.isfinite(t).all() for t in fl]).all())


class LayerDetails:
    """Shapes, gradient shapes, output/allocation memory and non-finite flags per layer (first call's shapes)."""

    def __init__(self, check_finite: bool, mute: Callable[[], Any] = contextlib.nullcontext) -> None:
        self.check_finite = check_finite
        self._mute = mute  #: context in which our own checks run unrecorded
        self.info: dict[str, dict[str, Any]] = {}
        self._handles: list[Any] = []
        self._live = True

    def _get(self, path: str) -> dict[str, Any]:
        d = self.info.get(path)
        if d is None:
            d = self.info[path] = {
                "input_shapes": None,
                "output_shapes": None,
                "grad_input_shapes": None,
                "grad_output_shapes": None,
                "output_bytes": 0,
                "memory_fwd_bytes": 0,
                "memory_bwd_bytes": 0,
                "nonfinite_output": False,
                "nonfinite_grad_input": False,
                "nonfinite_grad_output": False,
            }
        return d

    def on_enter(self, path: str, module: torch.nn.Module, args: Any) -> None:
        d = self._get(path)
        ins = _tensors(args)
        if d["input_shapes"] is None:
            d["input_shapes"] = [_shape(t) for t in ins]
        for t in ins:
            if t.requires_grad:
                self._handles.append(t.register_hook(self._grad_hook(path, "grad_input")))

    def on_exit(
        self, path: str, module: torch.nn.Module, args: Any, output: Any, in_backward: bool
    ) -> None:
        if in_backward:  # activation-checkpointing recompute: shapes already known, no new grads to watch
            return
        d = self._get(path)
        outs = _tensors(output)
        if d["output_shapes"] is None:
            d["output_shapes"] = [_shape(t) for t in outs]
        d["output_bytes"] += sum(_nbytes(t) for t in outs)
        if self.check_finite and not d["nonfinite_output"] and _nonfinite(outs):
            d["nonfinite_output"] = True
        for t in outs:
            if t.requires_grad:
                self._handles.append(t.register_hook(self._grad_hook(path, "grad_output")))

    def _grad_hook(self, path: str, kind: str) -> Callable[[torch.Tensor], None]:
        def hook(grad: torch.Tensor) -> None:
            if not self._live or grad is None:
                return None
            d = self._get(path)
            key = f"{kind}_shapes"
            if d[key] is None:
                d[key] = []
            if len(d[key]) < 8:
                d[key].append(_shape(grad))
            flag = f"nonfinite_{kind}"
            if self.check_finite and not d[flag]:
                with self._mute():
                    d[flag] = _nonfinite([grad])
            return None

        return hook

    def on_op(self, rec: OpRecord, alloc_bytes: int) -> None:
        if rec.category == "view":
            return
        d = self._get(rec.layer)
        if rec.phase == "backward":
            d["memory_bwd_bytes"] += alloc_bytes
        elif rec.phase == "forward":
            d["memory_fwd_bytes"] += alloc_bytes

    def remove_hooks(self) -> None:
        self._live = False
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
) -> dict[str, LayerRecord]:
    """LayerRecords for every (selected) module of ``model``, with self and inclusive op totals."""
    layers: dict[str, LayerRecord] = {}
    for path, mod in named_modules(model):
        if collapse(path) != path:
            continue  # below the selected depth / aggregated into an ancestor
        params = list(mod.parameters())
        layers[path] = LayerRecord(
            path=path,
            type=type(mod).__name__,
            num_parameters=sum(p.numel() for p in params),
            num_trainable_parameters=sum(p.numel() for p in params if p.requires_grad),
            param_bytes=sum(_nbytes(p) for p in params),
            grad_bytes=sum(_nbytes(p.grad) for p in params if p.grad is not None),
        )
    if "" not in layers:
        layers[""] = LayerRecord(path="", type=type(model).__name__)
    anc_cache: dict[str, list[str]] = {}
    for r in ops:
        anc = anc_cache.get(r.layer)
        if anc is None:
            anc = anc_cache[r.layer] = [a for a in ancestors(r.layer) if a in layers]
        t = r.time_s or 0.0
        own = anc[0] == r.layer if anc else False
        for i, a in enumerate(anc):
            L = layers[a]
            if r.phase == "forward":
                L.forward_s += t
                L.flops_fwd += r.flops
                L.bytes_fwd += r.bytes
                if i == 0 and own:
                    L.self_forward_s += t
                    L.self_flops_fwd += r.flops
                    L.self_bytes_fwd += r.bytes
            elif r.phase == "backward":
                L.backward_s += t
                L.flops_bwd += r.flops
                L.bytes_bwd += r.bytes
                if i == 0 and own:
                    L.self_backward_s += t
                    L.self_flops_bwd += r.flops
                    L.self_bytes_bwd += r.bytes
            elif r.phase == "recompute":
                L.recompute_s += t
                L.flops_recompute += r.flops
    for path, n in (calls or {}).items():
        if path in layers:
            layers[path].calls += n
    if details is not None:
        _apply_details(layers, details)
    return layers


def _apply_details(layers: dict[str, LayerRecord], details: LayerDetails) -> None:
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
    # allocation totals are inclusive: a parent's growth includes its children's
    fwd: dict[str, int] = dict.fromkeys(layers, 0)
    bwd: dict[str, int] = dict.fromkeys(layers, 0)
    for path, d in details.info.items():
        for a in ancestors(path):
            if a in fwd:
                fwd[a] += d["memory_fwd_bytes"]
                bwd[a] += d["memory_bwd_bytes"]
    for path, L in layers.items():
        L.memory_fwd_bytes = fwd[path]
        L.memory_bwd_bytes = bwd[path]
