"""Chrome / Perfetto trace of a profiled step (``chrome://tracing``, ui.perfetto.dev), readable by HTA and TraceLens.

One process per rank (``pid`` = rank), Kineto's event shapes and argument names so trace tools read it:

- ``cpu_op`` events (CPU timing: each op at its start, for its measured time) with ``External id``, ``Input Dims``,
  ``Input type``, plus tscope's annotations: ``layer``, ``phase``, ``category``, ``flops``, ``bytes``, ``bound`` (with a
  report), ``tensor core`` and, for collectives, ``Collective name``, ``Group size``, ``In msg nelems``-style
  ``comm bytes`` and the busbw factor;
- on CUDA, ``kernel`` events on one track per stream (``device``, ``stream``, ``correlation``, ``External id`` of the op
  that launched them) and one ``gpu_user_annotation`` per op spanning its kernels (layer, FLOPs, bytes, bound);
- ``distributedInfo`` (rank, world size) and ``tscope`` metadata (device, step, step-time basis).

Timestamps are microseconds on the host clock the capture used (``perf_counter`` on CPU, Kineto's on CUDA), so
the ranks of one host line up.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tscope_callbacks.analysis.report import ReportData
from tscope_callbacks.records import CaptureInfo, OpRecord, StepProfile

__all__ = ["chrome_trace", "save_trace"]


def _bounds(report: ReportData | None) -> dict[int, str]:
    if report is None:
        return {}
    return {o.i: o.bound for o in report.ops}


def _op_args(r: OpRecord, bound: str | None) -> dict[str, Any]:
    a: dict[str, Any] = {"External id": r.index, "Input Dims": r.input_shapes, "Input type": [r.dtype],
                         "layer": r.layer or "(root)", "phase": r.phase, "category": r.category,
                         "flops": r.flops, "bytes": r.bytes}
    if bound:
        a["bound"] = bound
    if r.tensor_core is not None:
        a["tensor core"] = r.tensor_core
    if r.fused_ops:
        a["fused ops"] = r.fused_ops
    if r.comm:
        a.update({"Collective name": r.comm.get("collective"), "Group size": r.comm.get("group_size"),
                  "Process Group Name": r.comm.get("group"), "comm bytes": r.comm.get("bytes"),
                  "busbw factor": r.comm.get("busbw_factor")})
    return a


def _rank_events(prof: StepProfile, rank: int, report: ReportData | None) -> list[dict[str, Any]]:
    origin_us = (prof.info.clock_origin_ns or 0) / 1e3
    bounds = _bounds(report)
    ev: list[dict[str, Any]] = [{"ph": "M", "name": "process_name", "pid": rank, "args": {"name": f"rank {rank}"}},
                                {"ph": "M", "name": "process_sort_index", "pid": rank, "args": {"sort_index": rank}}]
    kernels = prof.info.kernels or []
    if kernels:  # CUDA: kernels per stream, and one annotation per op over its kernels
        span: dict[int, list[float]] = {}
        for corr, (name, start, dur, stream, op) in enumerate(kernels):
            ts = origin_us + start / 1e3
            args = {"device": 0, "stream": stream, "correlation": corr}
            if op is not None:
                args["External id"] = op
                s = span.setdefault(op, [ts, ts + dur / 1e3])
                s[0], s[1] = min(s[0], ts), max(s[1], ts + dur / 1e3)
            ev.append({"ph": "X", "cat": "kernel", "name": name, "pid": rank, "tid": int(stream), "ts": ts,
                       "dur": dur / 1e3, "args": args})
        for stream in sorted({int(k[3]) for k in kernels}):
            ev.append({"ph": "M", "name": "thread_name", "pid": rank, "tid": stream, "args": {"name": f"stream {stream}"}})
        ev.append({"ph": "M", "name": "thread_name", "pid": rank, "tid": -1, "args": {"name": "ops (over their kernels)"}})
        for r in prof.ops:
            if r.index in span:
                a, b = span[r.index]
                ev.append({"ph": "X", "cat": "gpu_user_annotation", "name": r.op, "pid": rank, "tid": -1, "ts": a,
                           "dur": b - a, "args": _op_args(r, bounds.get(r.index))})
        return ev
    ev.append({"ph": "M", "name": "thread_name", "pid": rank, "tid": 0, "args": {"name": "ops (CPU)"}})
    for r in prof.ops:
        if r.start_s is None or r.time_s is None:
            continue
        ev.append({"ph": "X", "cat": "cpu_op", "name": r.op, "pid": rank, "tid": 0,
                   "ts": origin_us + r.start_s * 1e6, "dur": r.time_s * 1e6, "args": _op_args(r, bounds.get(r.index))})
    return ev


def chrome_trace(profiles: StepProfile | Sequence[StepProfile],
                 reports: Sequence[ReportData | None] | ReportData | None = None) -> dict[str, Any]:
    """The trace dict of one profile or a list of per-rank profiles (rank = position); ``reports`` (one per
    profile, or one for all) adds each op's roofline bound."""
    profs = list(profiles) if isinstance(profiles, (list, tuple)) else [profiles]
    many = reports if isinstance(reports, (list, tuple)) else [reports] * len(profs)
    reps = list(many)
    events: list[dict[str, Any]] = []
    for rank, (p, rep) in enumerate(zip(profs, reps)):
        events += _rank_events(p, rank, rep)
    m = profs[0].info if profs else CaptureInfo()
    return {"schemaVersion": 1, "displayTimeUnit": "ms", "traceEvents": events,
            "distributedInfo": {"rank": 0, "world_size": len(profs), "backend": ""},
            "tscope": {"device": m.device_name, "step": m.step, "model": m.model, "step_time_s": m.step_time_s,
                       "step_time_basis": m.step_time_basis}}


def save_trace(profiles: StepProfile | Sequence[StepProfile], path: str | os.PathLike[str],
               reports: Sequence[ReportData | None] | ReportData | None = None) -> Path:
    """Write :func:`chrome_trace` to ``path`` (open it in ui.perfetto.dev or chrome://tracing)."""
    out = Path(path)
    out.write_text(json.dumps(chrome_trace(profiles, reports)))
    return out
