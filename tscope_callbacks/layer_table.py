"""Per-layer views of a profiled step: layer selection, the torchprof-style tree table, InspectorGadgets JSON.

Pure functions of :class:`~tscope_callbacks.records.LayerRecord` dicts (no torch, no Lightning).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from fnmatch import fnmatchcase
from typing import Any

from tscope_callbacks.records import LayerRecord

__all__ = [
    "select_layers",
    "layer_children",
    "render_tree_table",
    "inspector_gadgets_json",
    "top_layers",
    "layer_rows",
    "format_time",
]

_MB = 1e6

# (inclusive field, self field) pairs re-derived when layers are aggregated into a selected ancestor
_SELF_PAIRS = (
    ("forward_s", "self_forward_s"),
    ("backward_s", "self_backward_s"),
    ("flops_fwd", "self_flops_fwd"),
    ("flops_bwd", "self_flops_bwd"),
    ("bytes_fwd", "self_bytes_fwd"),
    ("bytes_bwd", "self_bytes_bwd"),
)


def _selected(path: str, paths: Sequence[str] | None, depth: int | None) -> bool:
    if path == "":
        return True
    if depth is not None and path.count(".") + 1 > depth:
        return False
    if paths is not None and not any(path == p or fnmatchcase(path, p) for p in paths):
        return False
    return True


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
    ``""`` is always kept); the ``self_*`` totals of a kept layer then include its dropped descendants.

    Same selection rule as ``ts.profile(paths=..., depth=...)``, applied after the fact, so records captured at full
    detail can be shown at a coarser one. Inclusive fields are unchanged. Returns copies; the input is not modified.
    """
    if isinstance(paths, str):
        paths = [paths]
    if paths is None and depth is None:
        return dict(layers)
    keep = {p: dataclasses.replace(L) for p, L in layers.items() if _selected(p, paths, depth)}
    for parent, kids in layer_children(keep).items():
        if not kids:
            continue
        P = keep[parent]
        for incl, own in _SELF_PAIRS:
            v = getattr(P, incl) - sum(getattr(keep[k], incl) for k in kids)
            setattr(P, own, max(v, 0.0) if isinstance(v, float) else v)  # no float-rounding negatives
    # leaves that lost children: self = inclusive
    kids_of = layer_children(keep)
    for p, L in keep.items():
        if not kids_of[p]:
            for incl, own in _SELF_PAIRS:
                setattr(L, own, getattr(L, incl))
    return keep


def format_time(seconds: float) -> str:
    """torchprof/autograd-profiler style: ``"1.671ms"``, ``"312.5us"``, ``"2.104s"``."""
    seconds = max(seconds, 0.0)
    if seconds >= 1.0:
        return f"{seconds:.3f}s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.3f}ms"
    return f"{seconds * 1e6:.1f}us"


def _mb(b: int | float) -> str:
    return f"{b / _MB:.3f}"


def _gflops(f: int | float) -> str:
    return f"{f / 1e9:.4f}"


_COLUMNS = ("Module", "Self fwd", "fwd total", "Self bwd", "bwd total", "GFLOPs fwd", "GFLOPs bwd",
            "output MB", "mem fwd MB", "mem bwd MB", "calls")


def _tree_order(layers: Mapping[str, LayerRecord], root_name: str) -> list[tuple[str, str]]:
    """(label with tree prefix, path) in pre-order; labels drawn with ``├──``, ``└──`` and ``│``."""
    kids = layer_children(layers)
    out: list[tuple[str, str]] = []
    if "" not in layers:
        return [(p, p) for p in layers]

    def walk(path: str, prefix: str) -> None:
        ch = kids.get(path, [])
        for i, c in enumerate(ch):
            last = i == len(ch) - 1
            name = c[len(path) + 1 :] if path else c
            out.append((prefix + ("└── " if last else "├── ") + name, c))
            walk(c, prefix + ("    " if last else "│   "))

    out.append((root_name, ""))
    walk("", "")
    return out


def render_tree_table(
    layers: Mapping[str, LayerRecord], *, root_name: str | None = None, title: str | None = None
) -> str:
    """torchprof-style table: one row per layer, the module tree drawn in the first column.

    Columns: Module | Self fwd | fwd total | Self bwd | bwd total | GFLOPs fwd | GFLOPs bwd | output MB |
    mem fwd MB | mem bwd MB | calls. Times are op times (self = the layer's own ops, total = with children).
    """
    root = layers.get("")
    name = root_name or (root.type if root is not None and root.type else "model")
    rows = []
    for label, path in _tree_order(layers, name):
        L = layers[path]
        rows.append((
            label,
            format_time(L.self_forward_s),
            format_time(L.forward_s),
            format_time(L.self_backward_s),
            format_time(L.backward_s),
            _gflops(L.flops_fwd),
            _gflops(L.flops_bwd),
            _mb(L.output_bytes),
            _mb(L.memory_fwd_bytes),
            _mb(L.memory_bwd_bytes),
            str(L.calls),
        ))
    widths = [max(len(c), *(len(r[i]) for r in rows)) if rows else len(c) for i, c in enumerate(_COLUMNS)]

    def line(cells: Sequence[str]) -> str:
        return " | ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()

    out = [title] if title else []
    out.append(line(_COLUMNS))
    out.append("-|-".join("-" * w for w in widths))
    out.extend(line(r) for r in rows)
    return "\n".join(out)


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
    """The ``k`` non-root layers with the largest self time (forward + backward), largest first."""
    cand = [L for p, L in layers.items() if p != ""]
    cand.sort(key=lambda L: L.self_forward_s + L.self_backward_s, reverse=True)
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
            "output_mb": L.output_bytes / _MB,
            "mem_fwd_mb": L.memory_fwd_bytes / _MB,
            "mem_bwd_mb": L.memory_bwd_bytes / _MB,
            "params": L.num_parameters,
            "input_shapes": str(L.input_shapes),
            "output_shapes": str(L.output_shapes),
            "grad_output_shapes": str(L.grad_output_shapes),
            "nonfinite": bool(L.nonfinite_output or L.nonfinite_grad_input or L.nonfinite_grad_output),
        })
    return rows
