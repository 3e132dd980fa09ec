"""Per-layer views of a profiled step as data: layer selection, parent/child links, the top layers, flat rows and
the InspectorGadgets JSON. Pure functions of :class:`~tscope_callbacks.records.LayerRecord` dicts."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from tscope_callbacks.capture.paths import Selection
from tscope_callbacks.records import LayerRecord

__all__ = [
    "select_layers",
    "layer_children",
    "inspector_gadgets_json",
    "top_layers",
    "layer_rows",
]

_MB = 1e6  # InspectorGadgets' JSON format (its keys, its units)
_MIB = 2**20  # ours: bytes in binary units, "_mb" keys in MiB

# (inclusive field, self field) pairs re-derived when layers are aggregated into a selected ancestor
_SELF_PAIRS = (
    ("forward_s", "self_forward_s"),
    ("backward_s", "self_backward_s"),
    ("flops_fwd", "self_flops_fwd"),
    ("flops_bwd", "self_flops_bwd"),
    ("bytes_fwd", "self_bytes_fwd"),
    ("bytes_bwd", "self_bytes_bwd"),
)


def _nearest_parent(path: str, keep: Mapping[str, Any]) -> str | None:
    if path == "":
        return None
    p = path
    while p:
        p = p.rpartition(".")[0]
        if p in keep:
            return p
    return ""


def layer_children(layers: Mapping[str, LayerRecord]) -> dict[str, list[str]]:
    """parent path -> child paths (nearest present ancestor), in the layers' (module registration) order."""
    out: dict[str, list[str]] = {p: [] for p in layers}
    for p in layers:
        parent = _nearest_parent(p, layers)
        if parent is not None and parent in out:
            out[parent].append(p)
    return out


def select_layers(
    layers: Mapping[str, LayerRecord], paths: Sequence[str] | str | None = None, depth: int | None = None
) -> dict[str, LayerRecord]:
    """Keep the layers matching ``paths`` (exact paths or fnmatch globs) and ``depth`` (path segments; the root
    ``""`` is always kept); the ``self_*`` totals of a kept layer with kept children then include its dropped
    descendants outside them; a kept layer none of whose sub-layers is kept keeps its own ``self_*`` (its own ops).

    Same selection rule as ``ts.profile(paths=..., depth=...)``, applied after the fact, so records captured at full
    detail can be shown at a coarser one. Inclusive fields are unchanged. Returns copies; the input is not modified.
    """
    sel = Selection(paths, depth)
    if sel.everything:
        return dict(layers)
    keep = {p: dataclasses.replace(L) for p, L in layers.items() if sel.selected(p)}
    for parent, kids in layer_children(keep).items():
        if not kids:
            continue
        P = keep[parent]
        for incl, own in _SELF_PAIRS:
            v = getattr(P, incl) - sum(getattr(keep[k], incl) for k in kids)
            setattr(P, own, max(v, 0.0) if isinstance(v, float) else v)  # no float-rounding negatives
    # a kept layer whose sub-layers were all dropped keeps its own self time (its own ops, as every other surface
    # shows it): its total still includes the sub-layers (self = total would say it has no sub-layers at all)
    return keep


def _ig_info(L: LayerRecord) -> dict[str, Any]:
    return {
        "type": L.type,
        "input_shapes": L.input_shapes,
        "output_shapes": L.output_shapes,
        "grad_in_shape": L.grad_input_shapes,
        "grad_out_shape": L.grad_output_shapes,
        "num_parameters": L.num_parameters,
        "num_learnable_parameters": L.num_trainable_parameters,
        "param_memory_usage": L.param_bytes / _MB,
        "gradient_memory_usage": L.grad_bytes / _MB,
        "output_memory_usage": [L.output_bytes / _MB],
        "effective_additional_memory_fwd": L.memory_fwd_bytes / _MB,
        "effective_additional_memory_bwd": L.memory_bwd_bytes / _MB,
        "forward_nan": L.nonfinite_output,
        "grad_in_nan": L.nonfinite_grad_input,
        "grad_out_nan": L.nonfinite_grad_output,
        "total_memory": (L.param_bytes + L.grad_bytes) / _MB,
        "forward_latency": L.forward_s * 1e3,
        "backward_latency": L.backward_s * 1e3,
        # ours (same units: ms, MB)
        "self_forward_latency": L.self_forward_s * 1e3,
        "self_backward_latency": L.self_backward_s * 1e3,
        "flops_fwd": L.flops_fwd,
        "flops_bwd": L.flops_bwd,
        "bytes_fwd": L.bytes_fwd,
        "bytes_bwd": L.bytes_bwd,
        "calls": L.calls,
    }


def inspector_gadgets_json(layers: Mapping[str, LayerRecord], model_name: str | None = None) -> dict[str, Any]:
    """The InspectorGadgets nested format: ``{<model class>: {"info": {...}, "children": {<name>: {...}}}}``.

    Units as InspectorGadgets: memory in MB (1e6 bytes), latencies in ms (inclusive of children; ``self_*``
    exclusive). A child is keyed by its path relative to its (selected) parent.
    """
    kids = layer_children(layers)

    def node(path: str) -> dict[str, Any]:
        children = {}
        for c in kids.get(path, []):
            children[c[len(path) + 1 :] if path else c] = node(c)
        return {"info": _ig_info(layers[path]), "children": children}

    if "" not in layers:
        return {}
    name = model_name or layers[""].type or "model"
    return {name: node("")}


def top_layers(layers: Mapping[str, LayerRecord], k: int) -> list[LayerRecord]:
    """The ``k`` non-root leaf-most layers with the most FLOPs outside their listed sub-layers (forward + backward;
    ties by path), largest first: a deterministic set (FLOPs do not vary with timing noise)."""
    kids = layer_children(layers)
    # a layer's FLOPs outside its listed sub-layers (its own ops and those of the sub-layers not listed)
    own = {p: L.flops_fwd + L.flops_bwd - sum(layers[c].flops_fwd + layers[c].flops_bwd for c in kids.get(p, []))
           for p, L in layers.items()}
    cand = [L for p, L in layers.items() if p != ""]
    cand.sort(key=lambda L: (-own[L.path], L.path))
    return cand[: max(k, 0)]


def layer_rows(layers: Mapping[str, LayerRecord]) -> list[dict[str, Any]]:
    """One flat dict per layer (for ``wandb.Table`` / CSV): times in ms, memory in MB."""
    rows = []
    for p, L in layers.items():
        rows.append({
            "layer": p or "(root)",
            "type": L.type,
            "calls": L.calls,
            "forward_ms": L.forward_s * 1e3,
            "backward_ms": L.backward_s * 1e3,
            "self_forward_ms": L.self_forward_s * 1e3,
            "self_backward_ms": L.self_backward_s * 1e3,
            "gflops_fwd": L.flops_fwd / 1e9,
            "gflops_bwd": L.flops_bwd / 1e9,
            "output_mb": L.output_bytes / _MIB,
            "mem_fwd_mb": L.memory_fwd_bytes / _MIB,
            "mem_bwd_mb": L.memory_bwd_bytes / _MIB,
            "params": L.num_parameters,
            "input_shapes": str(L.input_shapes),
            "output_shapes": str(L.output_shapes),
            "grad_output_shapes": str(L.grad_output_shapes),
            "nonfinite": bool(L.nonfinite_output or L.nonfinite_grad_input or L.nonfinite_grad_output),
        })
    return rows
