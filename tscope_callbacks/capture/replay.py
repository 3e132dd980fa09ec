"""Count once, time later: a CUDA step timed from the device's kernel records alone, its kernels attributed to the
ops of an earlier full capture of the same step by the order they were launched in.

A full capture (``ts.profile``) pays Python per op: the dispatch mode, the count, a Kineto range and the record (on
an H100 GPT-2 124M step, 1,797 ops: 4.7x a plain step). But counts, shapes, layers and memory depend only on the
shapes the step runs, and in eager mode the kernels a step launches are the same, in the same order, from one step
to the next. So a later step of the same shapes is timed with no dispatch mode and no hook: only the profiler's
kernel records (CUPTI), and one pass at stop that matches the step's kernel names, in launch order (the profiler's
correlation ids), to the full capture's (:func:`kernel_plan`). Each matched kernel's time goes to the op that
launched it in the full capture; the records, layers, memory and shapes are the full capture's, the times, tensor-core
flags, kernel timeline, device-busy and idle time this step's.

Kernels the step runs that the plan lacks (a logging copy, a kernel of a branch taken this step only) count in the
device-busy time and stay unattributed; plan kernels the step skips leave their op untimed (``time_s`` None). When
less than ``min_match`` of either side matches (different shapes, another code path, cuDNN autotuning still
running), the result says so (``info.replay["status"] == "mismatch"``), no op is timed, and a full capture is
needed: the callbacks then recount at their next profile.

What a replayed step does not give: per-step values (non-finite checks, ``check_finite``), and anything of ops that
launch no kernel (their records are copied). On CPU there are no kernel records to match: replay needs a source
profile timed on CUDA.
"""

from __future__ import annotations

import contextlib
import dataclasses
import operator
import time
from collections.abc import Iterator, Sequence
from typing import Any

import torch

from tscope_callbacks.capture.active import claim, release
from tscope_callbacks.capture.build import step_time
from tscope_callbacks.capture.collector import DeferredCollection
from tscope_callbacks.capture.cuda_timing import (
    PAUSED_RANGE,
    KernelRecord,
    KernelTimeline,
    Timeline,
    is_tensor_core_kernel,
)
from tscope_callbacks.capture.faults import Faults
from tscope_callbacks.capture.layers import add_op_totals
from tscope_callbacks.records import CaptureInfo, LayerRecord, OpRecord, StepProfile

__all__ = ["ReplayProfile", "can_replay", "kernel_plan", "align", "MIN_MATCH"]


MIN_MATCH = 0.95  #: share of the plan's kernels and of the step's kernels that must match for the times to count
_WINDOW = 64  #: how far ahead (kernels, on either side) a mismatch looks for the sequences to agree again
_CONFIRM = 3  #: kernels that must agree after a resynchronisation point


def can_replay(prof: Any) -> bool:
    """Whether ``prof`` (a stopped capture) can be replayed from: it has CUDA kernel records attributed to its ops."""
    tl = getattr(prof, "timeline", None)
    return tl is not None and any(k.op is not None for k in tl.kernels)


def kernel_plan(timeline: Timeline) -> list[tuple[str, int]]:
    """(kernel name, op index) of a full capture's kernels that ran inside an op, in launch order."""
    ks = [k for k in timeline.kernels if k.op is not None]
    if ks and all(k.corr for k in ks):
        ks.sort(key=lambda k: k.corr)
    else:  # no correlation ids: ops ran one after the other on the host, kernels of an op in start order
        ks.sort(key=lambda k: (k.op, k.start_ns))
    return [(k.name, k.op) for k in ks]


def align(plan: Sequence[str], run: Sequence[str], window: int = _WINDOW, confirm: int = _CONFIRM) -> list[int | None]:
    """For each kernel of ``run``, the index of the ``plan`` kernel it matches (None: not in the plan).

    Both walk forward together; at a disagreement the nearest point (fewest kernels skipped on both sides, within
    ``window``) after which ``confirm`` kernels agree again is taken, and what was skipped stays unmatched."""
    m = len(run)
    if len(plan) == m and all(a == b for a, b in zip(plan, run)):
        return list(range(m))
    out: list[int | None] = [None] * m
    n = len(plan)
    i = j = 0
    while i < n and j < m:
        if plan[i] == run[j]:
            out[j] = i
            i += 1
            j += 1
            continue
        at: dict[str, list[int]] = {}
        for dj in range(min(window, m - j)):
            at.setdefault(run[j + dj], []).append(dj)
        best: tuple[int, int, int] | None = None
        for di in range(min(window, n - i)):
            if best is not None and di >= best[0]:
                break
            for dj in at.get(plan[i + di], ()):
                if best is not None and di + dj >= best[0]:
                    break
                a, b = i + di, j + dj
                if all(a + c >= n or b + c >= m or plan[a + c] == run[b + c] for c in range(1, confirm + 1)):
                    best = (di + dj, di, dj)
                    break
        if best is None:  # no agreement in reach: both kernels unmatched, walk on
            i += 1
            j += 1
        else:
            i += best[1]
            j += best[2]
    return out


class ReplayProfile:
    """A step timed from kernel records only, with the counts of ``source`` (a stopped full CUDA capture of a step
    of the same shapes). The surface of :class:`~tscope_callbacks.capture.profile.Profile`: a context manager or
    ``start()``/``stop()``, ``pause``/``resume``, ``label``, ``phase``; after stop ``ops``, ``layers``, ``info``,
    ``result`` and ``timeline``. Made by ``ts.profile(model, replay=earlier_profile)``."""

    def __init__(self, model: torch.nn.Module, source: Any, *, info: CaptureInfo | None = None,
                 user: dict[str, Any] | None = None, raise_errors: bool = False, min_match: float = MIN_MATCH,
                 faults: Faults | None = None, **other: Any) -> None:
        if other:
            raise TypeError(f"profile(replay=...) takes only info, user, raise_errors and faults (a replay records "
                            f"what its source recorded); got {', '.join(sorted(other))}")
        source = getattr(source, "source", None) or source  # a replay of a replay counts from the same capture
        if not all(hasattr(source, a) for a in ("timeline", "result", "model", "running", "layer_details")):
            raise TypeError(f"replay= needs a stopped ts.profile() of an earlier step, got {type(source).__name__}")
        if source.running:
            raise ValueError("replay=: the source profile is still running; stop it first (leave its `with` block)")
        if source.model is not model:
            raise ValueError("replay=: the source profile is of another model; replay needs a full profile of this "
                             "model's step (run ts.profile(model) once, then ts.profile(model, replay=that))")
        if not can_replay(source):
            raise ValueError("replay= needs a source profile timed on CUDA (it matches this step's kernels to that "
                             "profile's kernel records); on CPU, or with timing=None, profile every step in full")
        self.model, self.source = model, source
        self.raise_errors = raise_errors
        self.faults = faults if faults is not None else Faults("replay", raise_errors=raise_errors)
        self.min_match = min_match
        self.given = info or CaptureInfo()  #: the caller's facts about the step (:meth:`label` adds to them)
        self.user: dict[str, Any] = dict(user or {})
        self.layer_details = source.layer_details
        self.check_finite = False
        self.timing = "cuda"
        self.errors: list[str] = []
        self.result = StepProfile()
        self.timeline: Timeline | None = None
        self._plan = kernel_plan(source.timeline)
        self._kt: Any = None
        #: the cyclic collector waits until the result is built, as in a full capture: the read-out and the build
        #: make a few thousand objects (kernel records, record copies), each young collection a walk of them
        self._collector = DeferredCollection()
        self._start_s = 0.0  #: host seconds start() took (the Kineto session's prepare and enable)
        self._running = False
        self._paused = 0
        self._pause_range: Any = None
        self._pause_t0 = self._paused_ns = self._t0 = 0

    # ---------------- the Profile surface ----------------
    ops = property(lambda self: self.result.ops)
    layers = property(lambda self: self.result.layers)
    info = property(lambda self: self.result.info)
    wall_time_s = property(lambda self: self.result.wall_time_s)
    running = property(lambda self: self._running)  #: between start() and stop()

    def uncounted_ops(self) -> dict[str, int]:
        return self.result.uncounted_ops()

    def coverage(self) -> float:
        return self.result.coverage()

    def __enter__(self) -> ReplayProfile:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def label(self, **fields: Any) -> None:
        self.given = dataclasses.replace(self.given, **fields)

    def set_phase(self, name: str | None) -> None:
        """Phases come from the source's records; accepted for the Profile surface."""

    @contextlib.contextmanager
    def phase(self, name: str | None) -> Iterator[None]:
        yield

    def pause(self) -> None:
        """Kernels launched until :meth:`resume` (tscope's own checks, a validation run) are left out."""
        if self._paused == 0 and self._running:
            self._pause_t0 = time.perf_counter_ns()
            self._pause_range = self._kt.enter(PAUSED_RANGE)
        self._paused += 1

    def resume(self) -> None:
        if self._paused <= 0:
            return
        self._paused -= 1
        if self._paused == 0 and self._pause_range is not None:
            self._paused_ns += time.perf_counter_ns() - self._pause_t0
            self._kt.exit(self._pause_range)
            self._pause_range = None

    def start(self) -> ReplayProfile:
        claim(self)  # paused() and the nesting check see it
        t = time.perf_counter_ns()
        try:
            self._kt = KernelTimeline()
            self._kt.start()
        except BaseException:
            release(self)
            raise
        self._collector.enter()
        self._running = True
        self._paused_ns = 0
        self._t0 = time.perf_counter_ns()
        self._start_s = (self._t0 - t) * 1e-9
        return self

    def stop(self) -> StepProfile:
        if not self._running:
            return self.result
        tl = None
        wall = None
        try:
            if self._paused:
                self._paused = 1
                self.resume()
            tl = self._kt.stop(0)  # no op ranges: every kernel unattributed, tscope's paused ones dropped
            end = self._kt.synced_ns or time.perf_counter_ns()  # the device done; Kineto's read-out is tscope's
            wall = (end - self._t0 - self._paused_ns) * 1e-9
        except Exception as e:
            self._internal_error(e, "stopping the replay")
            with contextlib.suppress(Exception):
                self._kt.abort()
        finally:
            self._running = False
            release(self)
        t = time.perf_counter_ns()
        try:
            try:
                self.result = self._build(tl, wall)
            except Exception as e:
                self._internal_error(e, "building the replay's records")
                self.result = StepProfile(wall_time_s=wall, info=dataclasses.replace(
                    self.given, internal_errors=list(self.errors)), user=dict(self.user))
            cost = {  # as Profile's (see its doc); the records are the source's copies
                "start_s": self._start_s, "region_s": wall, **(self._kt.cost if self._kt else {}),
                "build_s": (time.perf_counter_ns() - t) * 1e-9, "ops": len(self.result.ops)}
            self.result.info = dataclasses.replace(self.result.info, capture_cost=cost)
        finally:
            self._collector.exit()
        return self.result

    def _internal_error(self, e: BaseException, part: str) -> None:
        self.errors.append(f"{type(e).__name__}: {e} (in {part})")
        self.faults.report(part, e)

    # ---------------- the result ----------------
    def _build(self, tl: Timeline | None, wall: float | None) -> StepProfile:
        src = self.source.result
        run = sorted(tl.kernels, key=lambda k: (k.corr, k.start_ns)) if tl is not None else []
        plan_names = [name for name, _ in self._plan]
        matched = align(plan_names, [k.name for k in run])
        n_match = sum(i is not None for i in matched)
        share_plan = n_match / len(self._plan) if self._plan else 0.0
        share_run = n_match / len(run) if run else 0.0
        ok = tl is not None and share_plan >= self.min_match and share_run >= self.min_match
        n_ops = len(src.ops)
        times: list[float | None] = [None] * n_ops
        tcs: list[bool | None] = [None] * n_ops
        kernels: list[KernelRecord] = []
        for k, i in zip(run, matched):
            op = self._plan[i][1] if (ok and i is not None) else None
            kernels.append(KernelRecord(k.name, k.start_ns, k.end_ns, k.stream, k.device, op, k.corr))
            if op is not None:
                times[op] = (times[op] or 0.0) + (k.end_ns - k.start_ns) * 1e-9
                tcs[op] = bool(tcs[op]) or is_tensor_core_kernel(k.name)
        planned = {op for _, op in self._plan}
        if ok:  # ops that launch no kernel took no device time; those whose kernels went unmatched stay untimed
            src_times = self.source.timeline.times
            for i in range(n_ops):
                if times[i] is None and i not in planned and i < len(src_times) and src_times[i] is not None:
                    times[i] = 0.0
        timeline = Timeline(times, tcs, kernels)
        self.timeline = timeline
        starts = timeline.starts
        ops = []
        for r, t, tc, st in zip(src.ops, times, tcs, starts):
            c = _clone(r)
            c.time_s, c.tensor_core, c.start_s = t, tc, st
            ops.append(c)
        layers = _retimed_layers(src.layers, ops)
        info = dataclasses.replace(src.info, **{**dict.fromkeys(_PER_STEP), **step_time(ops, wall, timeline, "cuda")})
        replay = {
            "status": "matched" if ok else "mismatch",
            "source_step": src.info.step,
            "kernels_planned": len(self._plan), "kernels_run": len(run), "kernels_matched": n_match,
            "unmatched_s": sum((k.end_ns - k.start_ns) * 1e-9 for k in kernels if k.op is None),
            "note": ("counts, shapes, layers and memory from the full capture of the source step; times, tensor-core "
                     "flags and the kernel timeline from this step's kernel records") if ok else
                    (f"this step's kernels do not follow the source step's ({n_match} of {len(self._plan)} planned "
                     f"and of {len(run)} run matched): op times unavailable; profile a step in full again"),
        }
        info = dataclasses.replace(info, **self.given.to_dict(), internal_errors=list(self.errors), replay=replay,
                                   **timeline.device_info())
        return StepProfile(ops=ops, layers=layers, wall_time_s=wall, info=info, user=dict(self.user))


#: CaptureInfo fields of the source capture that describe its own step, not this one
_PER_STEP = frozenset({"kernels", "clock_origin_ns", "step_time_s", "step_time_basis", "device_busy_s",
                       "device_idle_s", "outside_ops_s", "internal_errors", "paused_s", "step", "global_step", "epoch",
                       "reason", "micro_batches", "rank_step_times_s", "skew", "capture_cost"})
_TIMES = ("forward_s", "backward_s", "self_forward_s", "self_backward_s", "recompute_s")
_OP_FIELDS = operator.attrgetter(*(f.name for f in dataclasses.fields(OpRecord)))
_LAYER_FIELDS = operator.attrgetter(*(f.name for f in dataclasses.fields(LayerRecord)))


def _clone(r: OpRecord) -> OpRecord:
    """A shallow copy of an op record (its fields read in one C call: ``copy.copy`` of a slotted dataclass goes
    through ``__reduce_ex__``, 5x slower, and a replay copies every record of the step)."""
    return OpRecord(*_OP_FIELDS(r))


def _retimed_layers(layers: dict[str, LayerRecord], ops: list[OpRecord]) -> dict[str, LayerRecord]:
    """The source's layer records with this step's times (sums of their ops', as ``build_layers`` adds them; counts
    stay the source's) and no per-step value flags (a replay checks no values)."""
    out = {}
    for path, L in layers.items():
        c = LayerRecord(*_LAYER_FIELDS(L))  # a shallow copy (as _clone does for op records)
        for f in _TIMES:
            setattr(c, f, 0.0)
        c.nonfinite_output = c.nonfinite_grad_input = c.nonfinite_grad_output = False
        out[path] = c
    add_op_totals(out, ops, counts=False)
    return out
