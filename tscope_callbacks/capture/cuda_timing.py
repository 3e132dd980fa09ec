"""CUDA op timing from the profiler's kernel records (never host timers around asynchronous launches).

While a profile runs on CUDA, each recorded aten op runs inside a profiler range ``tscope#<index>`` opened with
``torch.autograd._record_function_with_args_enter`` (a USER_SCOPE RecordFunction, ~2 µs, not seen by dispatch
modes); a view (every result a read-only alias of an input: metadata, never a kernel) runs without one, device time
0. Kineto is told to record **only** USER_SCOPE ranges, so it records our ranges (and the few Lightning /
optimizer ranges) instead of every aten op: each kernel, memcpy and memset the GPU ran is linked by the profiler
(``linked_correlation_id``) to the innermost recorded range, which is ours. After the region one pass over the raw
``_KinetoEvent`` list (no ``FunctionEvent`` tree) gives per op its device time, its kernels' names (tensor-core use)
and every kernel interval (device-busy time as the union of kernel intervals, idle time, traces).

Kernels launched while the capture is paused (tscope's own checks) run inside a ``tscope#paused`` range and are
left out of every figure. The pure functions here work on any objects with ``_KinetoEvent``'s methods, so they are
tested with fakes and with the real H100 kernel names recorded in ``tests/data/h100_kernel_names.txt``.
"""

from __future__ import annotations

import bisect
import os
import re
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from tscope_callbacks.formulas.intervals import union_length

__all__ = ["RANGE_PREFIX", "PAUSED_RANGE", "KernelRecord", "Timeline", "KernelTimeline", "TimedState", "assign_kernels",
           "is_tensor_core_kernel", "union_s", "timed_call", "CUPTI_NOTE", "cupti_teardown_note"]

RANGE_PREFIX = "tscope#"
PAUSED_RANGE = "tscope#paused"

# Matrix-unit kernel families (cuBLAS/cuBLASLt/CUTLASS/cuDNN/flash/xformers naming, AMD MFMA).
_TC = re.compile(
    r"nvjet|tensorop|wgmma|gmma|hmma|imma|dmma|tensor\d+x\d+x\d+|_tf32|tf32f32|bf16bf16|f16f16|e4m3|e5m2|"
    r"s1688|h1688|s16816|h16816|i8816|i16832|bf16816|h884|s884|"
    r"flash_fwd|flash_bwd_dq_dk_dv|flash_bwd_kernel|fmha|mfma|sdpa_sm\d+_flash|_sm\d+_flash_[bf]prop"
)
# FP32/FP64/FP16 CUDA-core (SIMT) GEMMs: FMA instructions, "simt" CUTLASS kernels, classic sgemm/dgemm.
_SIMT = re.compile(r"ffma|dfma|hfma2?_|simt|(?<![a-z])sgemm|(?<![a-z])dgemm|gemv")
# Element-wise helpers of the attention libraries (named after their parent kernels' traits).
_HELPER = re.compile(r"convert_dq|dot_do_o")


_TC_SEEN: dict[str, bool] = {}  #: kernel name -> is_tensor_core_kernel (a step runs a few dozen distinct kernels)


def is_tensor_core_kernel(name: str) -> bool:
    """True when a CUDA/ROCm kernel name is one of the matrix-unit (tensor core / MFMA) families (remembered per
    name: the patterns scan names hundreds of characters long, and a step's thousand kernels have a few dozen).

    FP32 SIMT GEMMs (``..._ffma_...``, ``cutlass_80_simt_sgemm...``) are not, although their names share prefixes
    (``sm80_xmma_gemm``) with tensor-core ones; TF32, bf16/fp16/fp8 and FP64-tensor GEMMs (``nvjet_...``,
    ``..._tf32f32_...``, ``..._tensor16x8x16_...``), flash/cuDNN/fmha attention kernels are. Helper kernels of
    those libraries (flash's ``convert_dq``, cuDNN's ``dot_do_o``) are plain CUDA-core kernels."""
    hit = _TC_SEEN.get(name)
    if hit is None:
        hit = _tensor_core_name(name)
        if len(_TC_SEEN) < 4096:
            _TC_SEEN[name] = hit
    return hit


def _tensor_core_name(name: str) -> bool:
    n = name.lower()
    if _HELPER.search(n):
        return False
    if _SIMT.search(n) and "tensorop" not in n and not re.search(r"tensor\d+x\d+x\d+|tf32", n):
        return False
    return bool(_TC.search(n))


@dataclass(slots=True)
class KernelRecord:
    """One device activity (kernel, memcpy, memset) of the region."""

    name: str
    start_ns: int
    end_ns: int
    stream: int  #: the device resource (CUDA stream) it ran on
    device: int
    op: int | None  #: index of the op whose range launched it; None: outside any op range (e.g. DDP's reducer)
    corr: int = 0  #: the profiler's correlation id: increasing in launch order (0: unknown)

    @property
    def duration_s(self) -> float:
        return (self.end_ns - self.start_ns) * 1e-9


@dataclass
class Timeline:
    """The device side of a captured region."""

    times: list[float | None]  #: device seconds per op index (0.0: ran no kernel; None: no range recorded)
    tensor_core: list[bool | None]  #: per op: any of its kernels on matrix units (None: no kernel)
    kernels: list[KernelRecord] = field(default_factory=list)  #: every device activity, tscope's own excluded

    @property
    def starts(self) -> list[float | None]:
        """Per op: its first kernel's start, in seconds after the region's first kernel (None: no kernel)."""
        out: list[float | None] = [None] * len(self.times)
        if not self.kernels:
            return out
        t0 = min(k.start_ns for k in self.kernels)
        for k in self.kernels:
            if k.op is not None and 0 <= k.op < len(out):
                s = (k.start_ns - t0) * 1e-9
                if out[k.op] is None or s < out[k.op]:
                    out[k.op] = s
        return out

    @property
    def busy_s(self) -> float:
        """Device-busy time: the union of all kernel intervals (overlapping streams counted once)."""
        return union_s((k.start_ns, k.end_ns) for k in self.kernels)

    @property
    def span_s(self) -> float:
        """First kernel start to last kernel end."""
        if not self.kernels:
            return 0.0
        return (max(k.end_ns for k in self.kernels) - min(k.start_ns for k in self.kernels)) * 1e-9

    def kernel_names(self, op: int) -> list[str]:
        return [k.name for k in self.kernels if k.op == op]

    def device_info(self) -> dict[str, Any]:
        """The device side as a profile's ``CaptureInfo`` fields carry it (overlap analysis, traces):
        ``clock_origin_ns`` (the first kernel's start) and ``kernels`` ([name, start after the origin, duration,
        stream, op] in ns); {} without kernels."""
        if not self.kernels:
            return {}
        t0 = min(k.start_ns for k in self.kernels)
        return {"clock_origin_ns": t0,
                "kernels": [[k.name, k.start_ns - t0, k.end_ns - k.start_ns, k.stream, k.op] for k in self.kernels]}


def union_s(intervals: Iterable[tuple[int, int]]) -> float:
    """Length in seconds of the union of [start_ns, end_ns) intervals."""
    return union_length(intervals) * 1e-9


class TimedState(Protocol):
    """What :func:`timed_call` reads and writes of a running capture (``state.CaptureState``, which imports this
    module, never the other way round)."""

    timeline: KernelTimeline | None
    timed: bool
    pending: list[tuple]
    op_t0: int


def timed_call(st: TimedState, fn: Any, args: tuple, kwargs: dict) -> tuple[Any, float | None]:
    """Run one op or kernel of the capture ``st`` under its timing: ``(output, seconds)``. On CUDA inside the
    Kineto range ``tscope#<index of its record>`` (its kernel time comes from the timeline: seconds None); on CPU
    timed by ``perf_counter_ns``, its start kept in ``st.op_t0``; untimed, just run."""
    tl = st.timeline
    if tl is not None:
        h = tl.enter(f"{RANGE_PREFIX}{len(st.pending)}")
        try:
            return fn(*args, **kwargs), None
        finally:
            tl.exit(h)
    if st.timed:
        t0 = st.op_t0 = time.perf_counter_ns()
        out = fn(*args, **kwargs)
        return out, (time.perf_counter_ns() - t0) * 1e-9
    return fn(*args, **kwargs), None


_METHODS: dict[tuple[type, str], Any] = {}  #: (event type, method name) -> the class's function, or None


def _method(cls: type, name: str) -> Any:
    """The event class's function ``name``, or None where this torch's events lack it (looked up once per class)."""
    key = (cls, name)
    f = _METHODS.get(key, _method)
    if f is _method:
        f = _METHODS[key] = getattr(cls, name, None)
    return f


def _call(e: Any, name: str, default: Any = None) -> Any:
    """``e.name()``, or ``default`` where this torch's events lack the method (the class's function is looked up
    once per event type: this runs several times for each of a step's thousands of events)."""
    f = _method(type(e), name)
    if f is not None:
        return f(e)
    f = getattr(e, name, None)  # not on the class (an instance attribute, or none at all)
    return f() if callable(f) else default


_RUNTIME = re.compile(r"^(cuda|cu[A-Z]|hip)")  # CUDA runtime/driver (HIP) API calls: the host side of a launch
#: ``_KinetoEvent.activity_type()`` of the host's runtime and driver API calls (libkineto's ActivityType names), and of
#: the device's work; our ranges are "user_annotation" (USER_SCOPE record functions), their device copies
#: "gpu_user_annotation"
_HOST_CALLS = frozenset({"cuda_runtime", "cuda_driver", "hip_runtime", "hip_driver"})
_DEVICE_WORK = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})


def assign_kernels(events: Sequence[Any], n_ops: int, no_range: Iterable[int] = ()) -> Timeline:
    """Per-op device times, tensor-core flags and the kernel list from profiler events (``_KinetoEvent``-like).

    CPU events named ``tscope#<i>`` are op i's range; ``no_range``: the ops run without one because they launch no
    kernel (views), device time 0. A device event belongs to the range that launched it:
    where the profiler links it (``linked_correlation_id``, older torch), that range; otherwise (torch 2.11 with
    only USER_SCOPE recorded: every link is 0, as recorded on an H100) through its launch, the runtime API event
    (``cudaLaunchKernel``, ``cuLaunchKernel``, ``cudaMemcpyAsync``, ...) with the same ``correlation_id``, which ran
    inside one of our ranges on the same host thread. Backward ops run on the autograd engine's device thread, so
    threads matter; a CPU event's ``device_resource_id`` is its system thread id for ranges and runtime calls alike
    (``start_thread_id`` is not: torch numbers its threads 1, 2, ... while CUPTI's runtime records all read 1). Device
    events of ``tscope#paused`` ranges (tscope's own work) and Kineto's GPU-side copies of user annotations are
    dropped.
    """
    cpu = torch.autograd.DeviceType.CPU
    ranges: dict[int, int] = {}  # range correlation id -> op index (-1: paused)
    spans: dict[int, list[tuple[int, int, int]]] = {}  # host thread -> [(start, end, op index or -1)]
    runtime: list[Any] = []  # the runtime API calls: read only when a range may hold them (a replay has none)
    device_events = []  # (event, name, linked correlation id, correlation id)
    # a device event the profiler did not link to a range is paired with its launch by correlation id: only those
    # launches are placed in ranges (a step's other runtime calls -- events, stream queries, memsets' setup -- never
    # hold a kernel of their own)
    need: set[int] = set()
    cls, read_kind = None, None  # the last event class seen and its activity_type (None: this torch lacks it)
    for e in events:
        # Kineto's own kind of the event, where this torch says it: one read sorts most events (a step's tens of
        # thousands of runtime calls are kept without reading their names); any other kind, or none, takes the
        # reads below (device type, name, annotation flag), as before
        if type(e) is not cls:  # (a step's events are of one class: looked up once)
            cls = type(e)
            read_kind = _method(cls, "activity_type")
        kind = read_kind(e) if read_kind is not None else None
        if kind in _HOST_CALLS:
            runtime.append(e)  # a launch is told from the step's other calls by its name, only where one is needed
            continue
        if kind == "gpu_user_annotation":  # Kineto's device-side copy of a range
            continue
        name = e.name()
        if kind in _DEVICE_WORK:
            host = False
        elif kind == "user_annotation":
            host = True
        else:
            host = e.device_type() == cpu
        if host:
            if name.startswith(RANGE_PREFIX):
                if name == PAUSED_RANGE:
                    idx = -1
                else:
                    try:
                        idx = int(name[len(RANGE_PREFIX):])
                    except ValueError:
                        continue
                    if not 0 <= idx < n_ops:
                        continue
                ranges[e.correlation_id()] = idx
                spans.setdefault(_resource(e), []).append((*_interval(e), idx))
            else:  # another host event: a launch only if it is needed and named as one (checked below)
                runtime.append(e)
        elif kind in _DEVICE_WORK or (not name.startswith(RANGE_PREFIX) and not _call(e, "is_user_annotation", False)):
            link, corr = e.linked_correlation_id(), e.correlation_id()
            device_events.append((e, name, link, corr))
            if not link:
                need.add(corr)
    launches = []
    if spans and need:
        for e in runtime:
            corr = e.correlation_id()
            if corr in need and _RUNTIME.match(e.name()):
                launches.append((_resource(e), int(e.start_ns()), corr))
    launched_in = _enclosing_ranges(spans, launches)
    times: list[float | None] = [None] * n_ops
    for idx in ranges.values():
        if idx >= 0:
            times[idx] = 0.0
    for idx in no_range:
        if 0 <= idx < n_ops:
            times[idx] = 0.0
    tc: list[bool | None] = [None] * n_ops
    kernels = []
    for e, name, link, corr in device_events:
        idx = ranges.get(link) if link else launched_in.get(corr)
        if idx == -1:
            continue
        start, end = _interval(e)
        kernels.append(KernelRecord(name, start, end, _resource(e), int(_call(e, "device_index", 0) or 0), idx,
                                    int(corr or 0)))
        if idx is not None:
            times[idx] = (times[idx] or 0.0) + (end - start) * 1e-9
            tc[idx] = bool(tc[idx]) or is_tensor_core_kernel(name)
    return Timeline(times, tc, kernels)


def _interval(e: Any) -> tuple[int, int]:
    start = int(e.start_ns())
    return start, int(_call(e, "end_ns", 0) or start + int(e.duration_ns()))


def _resource(e: Any) -> int:
    """``device_resource_id``: a device event's stream, a CPU event's system thread id."""
    return int(_call(e, "device_resource_id", 0) or 0)


def _enclosing_ranges(spans: dict[int, list[tuple[int, int, int]]],
                      launches: list[tuple[int, int, int]]) -> dict[int, int]:
    """Runtime correlation id -> index of the innermost range on the same thread whose interval holds the call."""
    starts: dict[int, list[int]] = {}
    for tid, lst in spans.items():
        lst.sort()
        starts[tid] = [s for s, _, _ in lst]
    out: dict[int, int] = {}
    for tid, t, corr in launches:
        lst = spans.get(tid)
        if not lst:
            continue
        j = bisect.bisect_right(starts[tid], t) - 1
        while j >= 0:  # ranges do not nest in practice; walk back past any that ended before the call
            s, e, idx = lst[j]
            if t <= e:
                out[corr] = idx
                break
            j -= 1
            if j >= 0 and lst[j][1] < s:  # earlier ranges end before this one starts: none can hold t
                break
    return out


CUPTI_NOTE = ("torch's profiler (Kineto) leaves CUPTI attached after a capture unless TEARDOWN_CUPTI=1 is in the "
              "environment before torch is imported, and every later kernel launch pays for it: on an H100 a "
              "host-bound training step ran 1.27-1.29x slower after two captures (1.02x with TEARDOWN_CUPTI=1 "
              "exported). Launch-bound runs (small models, torch.compile) should export TEARDOWN_CUPTI=1; setting "
              "it from Python after torch is imported was measured to have no effect.")
_noted = False


def cupti_teardown_note() -> str | None:
    """The once-per-process notice about CUPTI staying attached after a capture (``CUPTI_NOTE``), or None when
    ``TEARDOWN_CUPTI`` is set (the user chose) or the notice was already given."""
    global _noted
    if _noted or "TEARDOWN_CUPTI" in os.environ:
        return None
    _noted = True
    return CUPTI_NOTE


def _no_external_correlation() -> Any:
    """Kineto's experimental config without external correlation, None on a torch that has no such switch.

    Kineto pushes every recorded range's id to CUPTI as an external correlation (a CUPTI call on each range's entry
    and exit: per op, as tscope opens one range per op) and adds a device-side copy of each range to the trace (a
    quarter of a profiled step's events, read out and dropped again). :func:`assign_kernels` needs neither: a kernel
    is paired with its launch by CUPTI's own correlation id, and the launch with the range around it on its host
    thread -- the path torch 2.11 already takes (every ``linked_correlation_id`` reads 0 with only USER_SCOPE
    recorded, as recorded on an H100)."""
    try:
        from torch._C._profiler import _ExperimentalConfig

        return _ExperimentalConfig(disable_external_correlation=True)
    except (ImportError, TypeError):
        return None


class KernelTimeline:
    """Owns the Kineto session of a capture: USER_SCOPE-only recording, per-op ranges, one pass at the end."""

    def __init__(self) -> None:
        from torch.autograd import _record_function_with_args_enter, _record_function_with_args_exit

        self.enter = _record_function_with_args_enter
        self.exit = _record_function_with_args_exit
        prof = torch.autograd.profiler.profile(use_device="cuda", use_kineto=True,
                                               experimental_config=_no_external_correlation())
        self._config = prof.config
        self._activities = prof.kineto_activities
        self._running = False
        self.synced_ns: int | None = None  #: perf_counter_ns when the device had finished the region's work
        self.cost: dict[str, float] = {}  #: host seconds of stop: sync (waiting for the device), kineto, assign

    def start(self) -> None:
        from torch._C._profiler import RecordScope
        from torch.autograd.profiler import _enable_profiler, _prepare_profiler

        _prepare_profiler(self._config(create_trace_id=True), self._activities)
        _enable_profiler(self._config(create_trace_id=False), self._activities, {RecordScope.USER_SCOPE})
        self._running = True

    def stop(self, n_ops: int, no_range: Iterable[int] = ()) -> Timeline:
        """Synchronize once, end the Kineto session and assign every device activity to its op (``no_range``: the
        ops run without a range, see :func:`assign_kernels`). Keeps when the device was done (``synced_ns``: the
        region's end; Kineto's teardown and the pass below are tscope's own work) and the host time of each part
        (``cost``)."""
        from torch.autograd.profiler import _disable_profiler

        t0 = time.perf_counter_ns()
        torch.cuda.synchronize()
        self.synced_ns = t1 = time.perf_counter_ns()
        self._running = False
        events = _disable_profiler().events()
        t2 = time.perf_counter_ns()
        timeline = assign_kernels(events, n_ops, no_range)
        self.cost = {"sync_s": (t1 - t0) * 1e-9, "kineto_s": (t2 - t1) * 1e-9,
                     "assign_s": (time.perf_counter_ns() - t2) * 1e-9}
        return timeline

    def abort(self) -> None:
        if self._running:
            self._running = False
            try:
                from torch.autograd.profiler import _disable_profiler

                _disable_profiler()
            except Exception:
                pass
