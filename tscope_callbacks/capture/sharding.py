"""Memory by category under sharding, the way torch's ``FSDPMemTracker`` splits it: parameters and gradients as this
rank holds them (sharded: DTensor local shards) and as compute needs them (unsharded), the transient buffers of the
all-gathers and reduce-scatters (nccl-tests sizes S of the step's collectives), and saved activations (with layer
details). Figures in bytes, per rank; ``None`` when the model has no distributed tensors and ran no collective."""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["memory_categories"]


def _local(t: torch.Tensor) -> torch.Tensor:
    lt = getattr(t, "_local_tensor", None)
    return lt if isinstance(lt, torch.Tensor) else t


def memory_categories(model: torch.nn.Module, ops: list[Any], layers: dict[str, Any],
                      params: list[torch.Tensor] | None = None) -> dict[str, Any] | None:
    params = list(model.parameters()) if params is None else params
    sharded = any(hasattr(p, "_local_tensor") for p in params)
    gathers = [r.comm["bytes"] for r in ops if r.comm and r.comm.get("collective") == "all_gather"]
    scatters = [r.comm["bytes"] for r in ops if r.comm and r.comm.get("collective") == "reduce_scatter"]
    if not sharded and not gathers and not scatters:
        return None
    item = lambda t: t.element_size()  # noqa: E731
    out: dict[str, Any] = {
        "sharded_params": sum(_local(p).numel() * item(_local(p)) for p in params),
        "unsharded_params": sum(p.numel() * item(_local(p)) for p in params),  # DTensor numel: the global one
        "sharded_grads": sum(_local(p.grad).numel() * item(_local(p.grad)) for p in params if p.grad is not None),
        "unsharded_grads": sum(p.numel() * item(_local(p)) for p in params if p.requires_grad),
        "all_gather_buffer_max": max(gathers, default=0), "all_gather_total": sum(gathers),
        "reduce_scatter_buffer_max": max(scatters, default=0), "reduce_scatter_total": sum(scatters),
    }
    saved = sum(getattr(rec, "saved_bytes", 0) or 0 for rec in layers.values())
    out["activations_saved"] = saved or None  # needs layer details (LayerProfilerCallback / layer_details=True)
    return out
