"""What fully sharded data parallelism over N GPUs would do to a step profiled (or analysed) on one device.

FSDP2 (``fully_shard``), as torchtitan, Lightning's ``ModelParallelStrategy`` and most FSDP users apply it: each
repeated block is one unit (``auto_units``: the items of the block list holding the most parameters), the root
holds every parameter outside them. Per GPU and per step, with the GPU's micro-batch unchanged (the global batch
grows N-fold):

- **Memory.** FSDP2 shards every parameter on dim 0, padded to a multiple of N rows: this rank's share of a
  parameter is ``ceil(dim0 / N) x (the other dims)`` elements, gradient and optimizer state alike (the optimizer
  state scaled by that share: its step counters are a few bytes). Buffers stay whole. Activations and temporaries
  are this step's own (``step_tracked_peak_no_grads``: the tracked peak without the gradients it created; FSDP does
  not divide them). In flight: the root's gathered parameters (FSDP2 keeps the root unsharded from its forward to the
  end of the backward), two units' gathered parameters (the one running and the one prefetched) and one unit's
  unsharded gradients (at ``param_dtype``) with their reduce-scatter input (at ``reduce_dtype``).
- **Collectives**, in nccl-tests' convention (``formulas.comm``): the forward all-gathers every unit and the root,
  the backward all-gathers every unit again (``reshard_after_forward=True``, FSDP2's default; not the root), and
  every unit and the root reduce-scatter their gradients. S of an all-gather is the gathered (padded) parameters at
  ``param_dtype``, of a reduce-scatter the padded gradients at ``reduce_dtype``.
- **Time.** Each collective takes ``latency + S x (N-1)/N / (efficiency x link bandwidth)``: the device's fastest
  link in one direction (NVLink) within a node of ``gpus_per_node``, the network per GPU beyond. The compute of
  each unit is this step's (measured, or the expected time of an analysis), the optimizer's divided by N (it
  updates the shard). One link queue in issue order against one compute stream: a unit's all-gather is issued
  when the unit two before it has finished (two in flight), in the backward when the unit after it starts (one
  prefetched), its reduce-scatter when its backward ends; a unit's compute waits for its parameters; the root's
  own forward compute runs after the units (an LM's head), its backward before them. Exposed communication is the
  step minus the compute.

**HSDP** (``shard_size=S`` < N: FSDP2's hybrid sharding, a 2-D mesh of N/S replicas x S shards): parameters,
gradients and optimizer state are sharded over S, not N; all-gathers and reduce-scatters run within the shard group
(NVLink when S fits a node), and each unit's reduced gradient shard (its reduce-scatter output) is then all-reduced
across the N/S replicas: ``latency + 2 (R-1)/R x S_shard / (efficiency x bandwidth)`` on the network once N exceeds
a node, on a second queue issued when the unit's reduce-scatter ends (its own link: the NIC, not NVLink).

Assumptions that are not measurements: ``link_efficiency`` (0.8 of the link; large all-gathers and
reduce-scatters over NVLink reach about this in published nccl-tests runs), ``latency_s`` (20 µs a collective),
``network_bw`` (50 GB/s a GPU, one 400 Gb/s NIC each). Not modelled: NCCL kernels slowing the compute they
overlap, FSDP2's copy-in/out kernels, stragglers.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

import torch

from tscope_callbacks.analysis.fsdp_memory import FsdpUnit, fsdp_memory, unit_of
from tscope_callbacks.analysis.report import ReportData
from tscope_callbacks.capture.paths import clean_path
from tscope_callbacks.devices.precision import TORCH_DTYPES, normalize_precision

__all__ = ["FsdpUnit", "auto_units", "fsdp_units", "fsdp_whatif", "mixed_policy", "simulate_step"]

LINK_EFFICIENCY = 0.8
LATENCY_S = 20e-6
GPUS_PER_NODE = 8
NETWORK_BW = 50e9


def _padded_rows(p: torch.Tensor, n: int) -> tuple[int, int]:
    """(padded elements, this rank's elements) of ``p`` sharded on dim 0 over ``n`` ranks (FSDP2's chunking)."""
    rows = p.shape[0] if p.dim() else 1
    rest = p.numel() // rows if rows else 0
    per = math.ceil(rows / n)
    return per * n * rest, per * rest


def auto_units(model: torch.nn.Module) -> list[str]:
    """The repeated blocks FSDP is applied to: the items of the ``ModuleList`` / ``Sequential`` holding the most
    parameters whose items (two or more) share one class; [] when the model has none (one unit: the root)."""
    best: tuple[int, list[str]] = (0, [])
    for path, mod in model.named_modules():
        if not isinstance(mod, (torch.nn.ModuleList, torch.nn.Sequential)) or len(mod) < 2:
            continue
        items = list(mod.named_children())
        if len({type(m) for _, m in items}) != 1:
            continue
        size = sum(p.numel() for p in mod.parameters())
        if size > best[0]:
            best = (size, [f"{path}.{name}" if path else name for name, _ in items])
    return best[1]


def fsdp_units(model: torch.nn.Module, n: int, *, units: Sequence[str] | str | None = None,
               param_dtype: torch.dtype | None = None, reduce_dtype: torch.dtype | None = None) -> list[FsdpUnit]:
    """The units of ``fully_shard`` applied to ``units`` (module paths, a class name such as ``"GPT2Block"``, or
    None: :func:`auto_units`) and then to the root. Raises ValueError on a path that is not a module or a unit
    inside another one."""
    if not isinstance(n, int) or isinstance(n, bool) or n < 2:
        raise ValueError(f"FSDP needs a world of 2 or more GPUs, got {n!r}")
    mods = dict(model.named_modules())
    if units is None:
        paths = auto_units(model)
    elif isinstance(units, str) and units in mods and units:
        paths = [units]
    elif isinstance(units, str):
        paths = [p for p, m in mods.items() if p and type(m).__name__ == units]
        if not paths:
            kinds = sorted({type(m).__name__ for p, m in mods.items() if p})[:12]
            raise ValueError(f"no module of class {units!r} in {type(model).__name__}; classes there: {kinds}")
    else:
        paths = list(units)
        bad = [p for p in paths if p not in mods or not p]
        if bad:
            raise ValueError(f"not module paths of {type(model).__name__}: {bad} (give paths such as "
                             f"'transformer.h.0', or a class name)")
    for a in paths:
        for b in paths:
            if a != b and b.startswith(a + "."):
                raise ValueError(f"FSDP unit {b!r} is inside unit {a!r}: give units that do not nest")
    owner: dict[int, str] = {}
    for path in paths:
        for p in mods[path].parameters():
            owner.setdefault(id(p), path)
    groups: dict[str, list[torch.Tensor]] = {path: [] for path in paths}
    groups[""] = []
    for p in model.parameters():
        groups[owner.get(id(p), "")].append(p)
    out = []
    for path in paths + [""]:
        ps = groups[path]
        if not ps and path == "":
            continue
        padded = padded_tr = local_b = local_g = gather = reduce = grad = own = 0
        for p in ps:
            pad, loc = _padded_rows(p, n)
            gdt = param_dtype or p.dtype
            padded += pad
            local_b += loc * p.element_size()
            gather += pad * gdt.itemsize
            if p.requires_grad:
                padded_tr += pad
                local_g += loc * p.element_size()
                reduce += pad * (reduce_dtype or gdt).itemsize
                grad += p.numel() * gdt.itemsize
                own += p.numel() * p.element_size()
        out.append(FsdpUnit(clean_path(path), type(mods[path]).__name__, sum(p.numel() for p in ps), padded,
                            padded_tr, local_b, local_g, gather, reduce, grad, own))
    return out


def simulate_step(fwd: Sequence[float], bwd: Sequence[float], ag: Sequence[float], rs: Sequence[float], *,
                  root_ag: float, root_rs: float, root_fwd: float, root_bwd: float, after: float = 0.0,
                  reshard_after_forward: bool = True, ar: Sequence[float] | None = None,
                  root_ar: float = 0.0) -> dict[str, float]:
    """One step of FSDP2's schedule (module doc): per unit in forward order its forward and backward compute and
    its all-gather and reduce-scatter times; the root's; under HSDP (``ar``) each unit's all-reduce across replicas,
    on its own queue after the unit's reduce-scatter. Returns ``step_s``, ``compute_s`` and ``exposed_s``."""
    link = net = 0.0

    def comm(issue: float, dur: float) -> float:
        nonlocal link
        link = max(issue, link) + dur
        return link

    def across(issue: float, dur: float) -> float:  # the replicas' all-reduce queue
        nonlocal net
        if dur:
            net = max(issue, net) + dur
        return net

    k = len(fwd)
    comp = comm(0.0, root_ag)
    done: list[float] = []
    for j in range(k):  # forward: two units' parameters in flight
        ready = comm(done[j - 2] if j >= 2 else 0.0, ag[j])
        comp = max(comp, ready) + fwd[j]
        done.append(comp)
    comp += root_fwd
    bwd_start = comp
    comp += root_bwd
    order = list(range(k - 1, -1, -1))
    ready_at = {order[0]: comm(bwd_start, ag[order[0]])} if k and reshard_after_forward else {}
    for i, j in enumerate(order):  # backward: the next unit's all-gather issued as this one starts
        start = max(comp, ready_at.get(j, 0.0))
        if reshard_after_forward and i + 1 < k:
            ready_at[order[i + 1]] = comm(start, ag[order[i + 1]])
        comp = start + bwd[j]
        done_rs = comm(comp, rs[j])
        if ar:
            across(done_rs, ar[j])
    done_rs = comm(comp, root_rs)
    end = max(done_rs, across(done_rs, root_ar), comp) + after
    compute = sum(fwd) + sum(bwd) + root_fwd + root_bwd + after
    return {"step_s": end, "compute_s": compute, "exposed_s": max(0.0, end - compute)}


def mixed_policy(precision: str) -> tuple[torch.dtype | None, torch.dtype | None]:
    """``(param_dtype, reduce_dtype)`` of the what-if for a precision: under "-mixed" (autocast over fp32 weights)
    parameters are gathered at the low dtype and gradients reduced in fp32 (torchtitan's policy); otherwise
    ``(None, None)``: every parameter at its own dtype."""
    if not str(precision).strip().lower().endswith("-mixed"):
        return None, None
    return TORCH_DTYPES.get(normalize_precision(precision)), torch.float32


def fsdp_whatif(report: ReportData, model: torch.nn.Module, n: int, *, units: Sequence[str] | str | None = None,
                param_dtype: torch.dtype | None = None, reduce_dtype: torch.dtype | None = None,
                reshard_after_forward: bool = True, link_efficiency: float = LINK_EFFICIENCY,
                latency_s: float = LATENCY_S, gpus_per_node: int = GPUS_PER_NODE,
                network_bw: float = NETWORK_BW, shard_size: int | None = None) -> dict[str, Any]:
    """Per-GPU memory, collectives and step time of ``report``'s step (a report of ``model`` on one device, with
    layer details) under FSDP2 over ``n`` GPUs, or HSDP with ``shard_size`` GPUs per shard group (module doc).
    JSON-safe; ``AnalyzeOptions(fsdp_whatif=...)`` carries it into a report (``analyze_model(fsdp=N)`` and
    ``RooflineCallback(fsdp_whatif=N)`` do)."""
    for name, v in (("link_efficiency", link_efficiency), ("network_bw", network_bw)):
        if not v > 0:
            raise ValueError(f"{name} must be positive, got {v!r}")
    if not isinstance(gpus_per_node, int) or gpus_per_node < 1:
        raise ValueError(f"gpus_per_node must be a positive integer, got {gpus_per_node!r}")
    shard = n if shard_size is None else shard_size
    if isinstance(shard, bool) or not isinstance(shard, int) or not 2 <= shard <= n or n % shard:
        raise ValueError(f"shard_size must divide the {n} GPUs and be 2 or more (HSDP: {n} = replicas x shard "
                         f"size), got {shard_size!r}")
    reps = n // shard
    if any(hasattr(p, "_local_tensor") for p in model.parameters()):
        raise ValueError("this model is already sharded (DTensor parameters): its profile shows FSDP's real "
                         "collectives and memory; the what-if is for a model profiled on one device")
    us = fsdp_units(model, shard, units=units, param_dtype=param_dtype, reduce_dtype=reduce_dtype)
    blocks = [u for u in us if u.path]
    root = next((u for u in us if not u.path), None)
    numel_tr = sum(p.numel() for p in model.parameters() if p.requires_grad)
    share = sum(u.padded_trainable for u in us) / shard / numel_tr if numel_tr else 0.0
    # the step's times were measured on another device than the roofs'
    what_if = report.what_if.measured_on if report.what_if else None
    mem = fsdp_memory(report, us, share, reshard_after_forward, two_grads=reduce_dtype not in (None, param_dtype),
                      drop_casts=param_dtype is not None, what_if=what_if)
    n_back = len(blocks) if reshard_after_forward else 0
    comm: dict[str, Any] = {
        "all_gather": {"calls": len(us) + n_back,
                       "bytes": sum(u.gather_bytes for u in us) + (sum(u.gather_bytes for u in blocks) if n_back else 0)},
        "reduce_scatter": {"calls": sum(1 for u in us if u.padded_trainable),
                           "bytes": sum(u.reduce_bytes for u in us)},
    }
    if reps > 1:  # HSDP: each unit's reduced shard (its reduce-scatter output) all-reduced across the replicas
        comm["all_reduce"] = {"calls": comm["reduce_scatter"]["calls"], "bytes": comm["reduce_scatter"]["bytes"] // shard}
    link_name, bw = _link(report, shard, gpus_per_node, network_bw)
    ar_name, ar_bw = _link(report, n, gpus_per_node, network_bw) if reps > 1 else ("", None)
    out: dict[str, Any] = {
        "n": n, "shard_size": shard, "replicas": reps, "all_reduce_link": ar_name, "all_reduce_bandwidth": ar_bw,
        "units": [asdict(u) for u in us], "unit_summary": _summary(blocks, root),
        "param_dtype": _name(param_dtype), "reduce_dtype": _name(reduce_dtype or param_dtype),
        "reshard_after_forward": reshard_after_forward, "memory": mem, "comm": comm,
        "link": link_name, "link_bandwidth": bw, "link_efficiency": link_efficiency, "latency_s": latency_s,
        "time": None,
    }
    if bw is None or reps > 1 and ar_bw is None:
        return out
    t = lambda b: (latency_s + b * (shard - 1) / shard / (link_efficiency * bw)) if b else 0.0  # noqa: E731
    # an all-reduce of b bytes over R replicas moves 2 (R-1)/R x b per GPU (ring; nccl-tests' busbw factor)
    t_ar = lambda b: (latency_s + 2 * b * (reps - 1) / reps / (link_efficiency * ar_bw)) if b and reps > 1 else 0.0  # noqa: E731
    for c in comm.values():
        c["time_s"] = 0.0
    comm["all_gather"]["time_s"] = sum(t(u.gather_bytes) for u in us) + sum(t(u.gather_bytes) for u in blocks
                                                                             if n_back)
    comm["reduce_scatter"]["time_s"] = sum(t(u.reduce_bytes) for u in us)
    if reps > 1:
        comm["all_reduce"]["time_s"] = sum(t_ar(u.reduce_bytes // shard) for u in us)
    paths = [u.path for u in blocks]
    per: dict[tuple[str, str], float] = {}
    measured = report.timed and not what_if  # times of another device: its expected times
    for o in report.ops:
        s = (o.time_s or 0.0) if measured else o.expected_s
        key = (unit_of(o.layer, paths), "backward" if o.phase == "recompute" else o.phase)
        per[key] = per.get(key, 0.0) + s
    opt_s = per.get(("", "optimizer"), 0.0) + sum(per.get((p, "optimizer"), 0.0) for p in paths)
    sim = simulate_step([per.get((p, "forward"), 0.0) for p in paths], [per.get((p, "backward"), 0.0) for p in paths],
                        [t(u.gather_bytes) for u in blocks], [t(u.reduce_bytes) for u in blocks],
                        root_ag=t(root.gather_bytes) if root else 0.0, root_rs=t(root.reduce_bytes) if root else 0.0,
                        root_fwd=per.get(("", "forward"), 0.0), root_bwd=per.get(("", "backward"), 0.0),
                        after=opt_s * share, reshard_after_forward=reshard_after_forward,
                        ar=[t_ar(u.reduce_bytes // shard) for u in blocks] if reps > 1 else None,
                        root_ar=t_ar(root.reduce_bytes // shard) if root and reps > 1 else 0.0)
    sim["single_step_s"] = sum(per.values())  # one device, the same basis: its op times in sequence
    sim["basis"] = "measured op times" if measured else "expected op times"
    s = report.summary
    sim["mfu"] = s.model_flops / sim["step_s"] / s.mfu_peak_flops if sim["step_s"] and s.mfu_peak_flops else None
    comm_s = sum(c["time_s"] for c in comm.values())
    sim["comm_s"] = comm_s
    sim["overlap_frac"] = 1.0 - sim["exposed_s"] / comm_s if comm_s else None
    out["time"] = sim
    return out


def _link(report: ReportData, group: int, gpus_per_node: int, network_bw: float) -> tuple[str, float | None]:
    """(name, bandwidth per direction) of the link a collective over ``group`` GPUs runs on: the device's fastest
    link within a node, the network beyond."""
    if group > gpus_per_node:
        return "network", float(network_bw)
    if report.device.link_bandwidth:
        return report.device.link_name or "", float(report.device.link_bandwidth)
    return "", None


def _name(dtype: torch.dtype | None) -> str | None:
    return None if dtype is None else str(dtype).replace("torch.", "")


def _summary(blocks: list[FsdpUnit], root: FsdpUnit | None) -> str:
    kinds: dict[str, int] = {}
    for u in blocks:
        kinds[u.type] = kinds.get(u.type, 0) + 1
    parts = [f"{c} x {k}" for k, c in kinds.items()]
    if root is not None:
        parts.append("the root")
    return " + ".join(parts) if parts else "the root"
