"""This rank's memory under the FSDP what-if (``analysis.fsdp``): the shards, and op by op through the profiled step
what FSDP2 holds unsharded beside the step's own activations and temporaries.

Checked byte for byte against torch's ``FSDPMemTracker`` on a real FSDP2 step (a fake process group of N ranks in
one process, ``tests/test_fsdp_whatif.py``) in full precision, with and without ``reshard_after_forward``. With
``param_dtype`` (mixed precision) a step profiled under autocast with fp32 weights keeps fp32 activations where
FSDP's bf16 parameters give bf16 ones (an embedding's output, the residual stream): the peak comes out high (1.08x
and 1.12x on the test models).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tscope_callbacks.analysis.memory_fit import report_capacity, verdict
from tscope_callbacks.analysis.report import ReportData

__all__ = ["FsdpUnit", "fsdp_memory", "unit_of"]


@dataclass
class FsdpUnit:
    """One ``fully_shard`` unit's parameters, for a world of ``n``."""

    path: str  #: module path ("" = the root: every parameter outside the other units)
    type: str
    numel: int  #: its parameters' elements
    padded: int  #: the same, each parameter padded to a multiple of n rows on dim 0 (what FSDP2 gathers)
    padded_trainable: int  #: the padded elements of the parameters that require grad
    local_bytes: int  #: this rank's shard of the parameters, at their own dtype
    local_grad_bytes: int  #: this rank's shard of the gradients (FSDP2 keeps them at the parameters' dtype)
    gather_bytes: int  #: S of its all-gather: the padded parameters at param_dtype
    reduce_bytes: int  #: S of its reduce-scatter: the padded gradients at reduce_dtype
    grad_bytes: int  #: its unsharded gradients as the backward makes them (param_dtype)
    own_grad_bytes: int = 0  #: the same at the parameters' own dtype (what one device makes)


def unit_of(layer: str, paths: Sequence[str]) -> str:
    """The unit of ``paths`` a layer belongs to: the longest that is the layer or one of its ancestors; "" (the
    root) when none is."""
    best = ""
    for p in paths:
        if (layer == p or layer.startswith(p + ".")) and len(p) > len(best):
            best = p
    return best


def fsdp_memory(report: ReportData, us: list[FsdpUnit], share: float, reshard: bool, two_grads: bool,
                drop_casts: bool, what_if: str | None = None) -> dict[str, Any]:
    """This rank's memory at the step's peak: the shards, the buffers and, at each op of the profiled step, its
    activations and temporaries (``live_no_grads``; the optimizer's temporaries divided like its state) plus what
    FSDP holds unsharded then (module doc). Without that timeline (older profiles, no layer details) the sum of the
    maxima: an upper bound."""
    mc = (report.profile.info.memory_categories if report.profile is not None else None) or (
        dict(report.memory.categories) if report.memory is not None else {})
    blocks = [u for u in us if u.path]
    root = next((u for u in us if not u.path), None)
    opt, scal = mc.get("optimizer_state"), int(mc.get("optimizer_state_scalars") or 0)
    ugrad = {u.path: u.grad_bytes + (u.reduce_bytes if two_grads else 0) for u in us}
    r_gather = root.gather_bytes if root else 0
    mem: dict[str, Any] = {
        "params": sum(u.local_bytes for u in us),
        "grads": sum(u.local_grad_bytes for u in us),
        "optimizer_state": None if opt is None else scal + int((opt - scal) * share),
        "buffers": int(mc.get("buffers") or 0),
    }
    live = mc.get("live_no_grads")
    ops = report.ops
    if live and len(live) == len(ops):
        mem.update(_peak_walk(ops, live, mc, us, share, reshard, drop_casts))
    else:
        acts = mc.get("step_tracked_peak_no_grads", mc.get("step_tracked_peak"))
        gmax = max((u.gather_bytes for u in blocks), default=0)
        mem.update(activations=None if acts is None else int(acts),
                   gathered_params=r_gather + (sum(u.gather_bytes for u in blocks) if not reshard
                                               else min(2, len(blocks)) * gmax),
                   unsharded_grads=max(ugrad.values(), default=0),
                   basis="the sum of each part's maximum (an upper bound: no per-op timeline in this profile)")
    mem["peak"] = (sum(int(mem[k] or 0) for k in ("params", "grads", "optimizer_state", "buffers", "activations",
                                                  "gathered_params", "unsharded_grads"))
                   if mem["activations"] is not None else None)
    cap = mem["capacity"] = report_capacity(report.device.memory_bytes, what_if)
    mem["share"] = mem["peak"] / cap if cap and mem["peak"] else None
    mem["verdict"] = verdict(mem["peak"], cap) if mem["share"] is not None else None
    return mem


def _peak_walk(ops: list[Any], live: list[int], mc: dict[str, Any], us: list[FsdpUnit], share: float, reshard: bool,
               drop_casts: bool) -> dict[str, Any]:
    """Op by op through the profiled step, this rank's bytes under FSDP: its activations and temporaries
    (``live_no_grads``; the optimizer's temporaries divided like its state), the parameters gathered then, the
    gradients still unsharded (each from the op that made it on one device to its unit's reduce-scatter: the end
    of the unit's backward, the end of the backward for the root's) and the gradient shards so far. Returns the
    parts at the peak."""
    blocks = [u for u in us if u.path]
    paths = [u.path for u in blocks]
    idx = {p: i for i, p in enumerate(paths)}
    by = {u.path: u for u in us}
    r_gather = by[""].gather_bytes if "" in by else 0
    gather = {u.path: u.gather_bytes for u in blocks}
    # a gradient under FSDP: at param_dtype (the single-device run made it at the parameter's own dtype)
    scale = {u.path: u.grad_bytes / u.own_grad_bytes if u.own_grad_bytes else 0.0 for u in us}
    events: dict[int, list[tuple[str, int]]] = {}
    for i, n, name in mc.get("grad_events") or []:
        events.setdefault(int(i), []).append((unit_of(str(name).rpartition(".")[0], paths), int(n)))
    held = bool(mc.get("grads")) and not mc.get("grads_created")  # gradients kept from before (accumulation)
    casts: dict[int, int] = {}
    if drop_casts:  # FSDP's param_dtype replaces autocast's weight copies: the gathered parameters are them
        for i, n in mc.get("cast_events") or []:
            casts[int(i)] = casts.get(int(i), 0) + int(n)
    cast_alive = 0
    alive = {u.path: 0 for u in us}
    best = (-1, 0, 0, 0, 0)  # (total, activations, gathered, unsharded grads, grad shards) at the peak
    fwd_seen, low = False, len(paths)  # low: the lowest block whose backward has started
    for i, (o, v) in enumerate(zip(ops, live)):
        for u, n in events.get(i, ()):
            alive[u] += n
        cast_alive += casts.get(i, 0)
        v -= cast_alive
        phase, u = o.phase, unit_of(o.layer, paths)
        j = idx.get(u)
        g = r_gather if phase != "optimizer" else 0
        if phase == "optimizer":
            v = int(v * share)
        elif not reshard and phase != "forward":
            g += sum(gather.values())
        elif not reshard:  # forward: the blocks so far stay gathered; the last one's all-gather buffer lingers
            if j is not None:
                fwd_seen = True
                g += sum(gather[p] for p in paths[:j + 1]) + gather[paths[min(j + 1, len(paths) - 1)]]
            elif fwd_seen:
                g += sum(gather.values()) + gather[paths[-1]]
            elif paths:
                g += gather[paths[0]]
        elif phase == "forward":
            if j is not None:
                fwd_seen = True
                g += gather[u] + (gather[paths[j + 1]] if j + 1 < len(paths) else 0)
            elif paths and not fwd_seen:
                g += gather[paths[0]]
        elif j is not None:  # backward / recompute of a block, the one below prefetched
            g += gather[u] + (gather[paths[j - 1]] if j > 0 else 0)
        elif paths and low == len(paths):
            g += gather[paths[-1]]
        if j is not None and phase != "forward":
            low = min(low, j)
        done = [p for p in paths if idx[p] > low or (phase == "optimizer")]
        if phase == "optimizer":
            done.append("")
        unsharded = 0 if phase == "optimizer" else int(sum(alive[p] * scale[p] for p in alive if p not in done))
        shards = sum(by[p].local_grad_bytes for p in by) if held else sum(by[p].local_grad_bytes for p in done)
        total = v + g + unsharded + shards
        if total > best[0]:
            best = (total, v, g, unsharded, shards)
    return {"activations": best[1], "gathered_params": best[2], "unsharded_grads": best[3], "grads": best[4],
            "basis": "at the step's peak, op by op through the profiled step"}
