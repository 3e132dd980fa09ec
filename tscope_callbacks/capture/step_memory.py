"""Memory of a captured step by category, the way torch's ``MemTracker`` splits it (parameters, buffers, gradients,
optimizer state, activations), and under sharding the way ``FSDPMemTracker`` does (parameters and gradients as this
rank holds them and as compute needs them, the all-gather and reduce-scatter buffers). Bytes, per rank.

- ``params``, ``buffers``: the module's, at their dtype (local shards under FSDP/TP).
- ``grads``: the gradients present when the capture stops.
- ``optimizer_state``: the state tensors of the optimizers that stepped in the region (``Profile.add_optimizer``
  adds others) on the parameters' device (host-offloaded state left out), each storage once; None when no
  optimizer stepped.
- ``optimizer_state_scalars``: the part of it in 0-dim tensors (step counters), which sharding does not divide.
- ``activations_saved``: what the forward saved for backward (the root's ``saved_bytes``; layer details).
- ``step_tracked_peak``: the peak of the bytes the step itself allocated (activations, temporaries, gradients it
  created; the capture's tracked live bytes, layer details).
- ``step_tracked_peak_no_grads``: the same peak without the gradients the step created (activations and
  temporaries: what FSDP / ZeRO sharding leaves whole, ``analysis.fsdp``); ``live_no_grads``: the same after each op
  (None when the tracker's ops and the records differ); ``grads_created``: those gradients' bytes; ``grad_events``:
  ``[op index, +bytes stored / -bytes freed, parameter name]`` of each; ``cast_events``: ``[op index, +bytes / -bytes]``
  of the parameters' dtype casts (autocast's weight copies, saved for the backward).
- ``step_peak``: the step's peak, steady state. On CUDA the allocator's bytes when the region started plus the
  tracked peak. Elsewhere (meta, CPU: no allocator statistics) what lives across steps -- parameters, buffers,
  optimizer state created before the step, gradients held from before it -- plus the tracked peak; inputs and
  allocator overhead (fragmentation, cached blocks) are not in it. ``step_peak_basis`` says which.
"""

from __future__ import annotations

from typing import Any

import torch

from tscope_callbacks.formulas.bytes import storage_id

__all__ = ["memory_categories", "grad_bytes", "local_tensor"]


_PLAIN = (torch.Tensor, torch.nn.Parameter)


def local_tensor(t: torch.Tensor) -> torch.Tensor:
    if type(t) in _PLAIN:  # no attribute lookup that misses (slow on a tensor) for the common case
        return t
    lt = getattr(t, "_local_tensor", None)
    return lt if isinstance(lt, torch.Tensor) else t


def _nbytes(t: torch.Tensor) -> int:
    t = local_tensor(t)
    return t.numel() * t.element_size()


def grad_bytes(params: list[torch.Tensor]) -> int:
    """Bytes of the gradients ``params`` hold now (local shards)."""
    return sum(_nbytes(p.grad) for p in params if isinstance(p.grad, torch.Tensor))


def _optimizer_state(optimizers: list[Any], tracker: Any, device_type: str | None) -> tuple[int, int, int]:
    """(all state bytes, the part that existed before the region, the part in scalars such as step counters) of
    ``optimizers`` on the parameters' device type (state offloaded to the host is not this device's memory), each
    storage once."""
    seen: set[int] = set()
    total = before = scalars = 0
    for opt in optimizers:
        for state in getattr(opt, "state", {}).values():
            for v in state.values() if isinstance(state, dict) else ():
                if not isinstance(v, torch.Tensor):
                    continue
                lt = local_tensor(v)
                if device_type is not None and lt.device.type != device_type and lt.dim() > 0:
                    continue  # offloaded (scalar step counters may live on the host either way: kept, 4 B each)
                try:
                    key = storage_id(lt)
                except (RuntimeError, NotImplementedError, TypeError):
                    key = id(lt)
                if key in seen:
                    continue
                seen.add(key)
                n = _nbytes(v)
                total += n
                scalars += n if lt.dim() == 0 else 0
                if tracker is None or not tracker.tracks(lt):
                    before += n
    return total, before, scalars


def memory_categories(model: torch.nn.Module, ops: list[Any], layers: dict[str, Any],
                      params: list[torch.Tensor] | None = None, *, tracker: Any = None,
                      optimizers: list[Any] | None = None, grads_at_start: int = 0,
                      buffers: list[torch.Tensor] | None = None) -> dict[str, Any]:
    """The step's memory by category (the module doc); ``params`` / ``buffers``: the model's, each once, when the
    caller has walked the model already."""
    params = list(model.parameters()) if params is None else params
    buffers = list(model.buffers()) if buffers is None else buffers
    optimizers = optimizers or []
    out: dict[str, Any] = {
        "params": sum(_nbytes(p) for p in params),
        "buffers": sum(_nbytes(b) for b in buffers),
        "grads": grad_bytes(params),
    }
    device_type = local_tensor(params[0]).device.type if params else None
    opt_total, opt_before, opt_scalars = _optimizer_state(optimizers, tracker, device_type)
    out["optimizer_state"] = opt_total if optimizers else None
    out["optimizer_state_scalars"] = opt_scalars if optimizers else None  # not divided by sharding
    root = layers.get("")
    out["activations_saved"] = (getattr(root, "saved_bytes", 0) or None) if root is not None else None
    out["step_tracked_peak"] = out["step_peak"] = out["step_peak_basis"] = None
    if tracker is not None:
        peak = tracker.peak()
        out["step_tracked_peak"] = peak
        live = tracker.live_without_grads()
        out["step_tracked_peak_no_grads"] = max(live, default=0)
        out["live_no_grads"] = live if len(live) == len(ops) else None  # per op (``analysis.fsdp``'s timeline)
        out["grads_created"] = tracker.grads_created()
        out["grad_events"] = [list(e) for e in tracker.grad_events] if out["live_no_grads"] is not None else None
        out["cast_events"] = [list(e) for e in tracker.cast_events] if out["live_no_grads"] is not None else None
        if tracker.at_start is not None:
            out["step_peak"] = tracker.at_start + peak
            out["step_peak_basis"] = "the allocator's bytes at the step's start + the step's tracked peak"
        else:
            out["step_peak"] = out["params"] + out["buffers"] + opt_before + grads_at_start + peak
            out["step_peak_basis"] = ("weights, buffers, optimizer state and earlier gradients + the step's tracked "
                                      "peak; inputs and allocator overhead not included")
    sharded = any(type(p) not in _PLAIN and hasattr(p, "_local_tensor") for p in params)  # (a miss is slow)
    gathers, scatters = [], []
    for r in ops:
        c = r.comm
        if c:
            kind = c.get("collective")
            if kind == "all_gather":
                gathers.append(c["bytes"])
            elif kind == "reduce_scatter":
                scatters.append(c["bytes"])
    if sharded or gathers or scatters:
        item = lambda t: local_tensor(t).element_size()  # noqa: E731
        out.update({
            "sharded_params": out["params"],
            "unsharded_params": sum(p.numel() * item(p) for p in params),  # DTensor numel: the global one
            "sharded_grads": out["grads"],
            "unsharded_grads": sum(p.numel() * item(p) for p in params if p.requires_grad),
            "all_gather_buffer_max": max(gathers, default=0), "all_gather_total": sum(gathers),
            "reduce_scatter_buffer_max": max(scatters, default=0), "reduce_scatter_total": sum(scatters),
        })
    return out
