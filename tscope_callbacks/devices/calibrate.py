"""Measured roofs: the CPU roof behind ``get_device_spec("auto")`` and ``calibrate()`` for CPU and CUDA/ROCm.

CPU: best-of-N square matmuls per dtype (fp32, bf16, fp16, fp64; sizes grown adaptively inside a time budget,
2.5 s by default) and a large tensor copy (read + write bytes). Results are cached per machine in
``$TSCOPE_CACHE_DIR/cpu_roofs.json`` (default ``~/.cache/tscope``), keyed on CPU model, core count, torch threads and
torch version; a corrupted cache is ignored and rewritten. The CPU roof is measured once per machine: a measurement
taken while other processes kept the CPUs busy (``BUSY_LOAD_PER_CPU``: their CPU time over the measurement, from
``/proc/stat`` less this process's own) is cached as provisional and says so in one line on the ``tscope_callbacks``
logger; later runs reuse it while the machine is still busy and replace it at the first idle moment.

CUDA: square matmuls in bf16 / fp16 / fp32 with TF32 off and on, and a device-to-device copy, each timed with CUDA
events after warm-up. The timer is a parameter (``timer(bench) -> seconds``) so the path is testable without a GPU.
Calibrations are cached (``devices.cache``) in ``gpu_roofs.json`` and attached as ``.achievable`` by ``get_device_spec("auto")``.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import platform
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from tscope_callbacks.devices import table as spec_table
from tscope_callbacks.devices.cache import cache_dir, cache_get, cache_put, spec_from_entry
from tscope_callbacks.devices.gemm import gemm_flops
from tscope_callbacks.devices.spec import DeviceSpec, UnknownDeviceError
from tscope_callbacks.hostclock import CpuCounters, cpu_counters
from tscope_callbacks.rng import rng_preserving

__all__ = ["DEFAULT_CPU_BUDGET_S", "BUSY_LOAD_PER_CPU", "CpuSnapshot", "cpu_snapshot", "others_load_per_cpu",
           "host_environment", "Benchmark", "calibrate", "cpu_spec", "measure_cpu", "measure_cuda",
           "cuda_benchmarks", "cuda_event_timer", "cached_achievable", "cpu_cache_key"]

log = logging.getLogger("tscope_callbacks")

DEFAULT_CPU_BUDGET_S = 2.5
#: other processes' CPU use per CPU (0.25: half a core of a 2-core machine) at or above which the machine is busy: a CPU
#: roof measured then is provisional, and reports name the load
BUSY_LOAD_PER_CPU = 0.25
_told_busy: set[str] = set()  #: cache keys whose busy measurement was already told (one line per process)
# share of the CPU budget per measurement
_CPU_SHARES = {"fp32": 0.34, "bf16": 0.18, "fp16": 0.12, "fp64": 0.14, "copy": 0.22}
_CPU_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16, "fp64": torch.float64}


# ---------------- CPU ----------------
def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.lower().startswith(("model name", "hardware", "cpu model")):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def cpu_cache_key() -> str:
    """Cache key of this machine's CPU roof: platform, CPU model, cores, torch threads, torch version."""
    return (f"{platform.system()}-{platform.machine()}|{_cpu_model()}|{os.cpu_count()} cpus|"
            f"{torch.get_num_threads()} threads|torch {torch.__version__}|method 2")  # 2: GEMMs from n=512


def _time_matmul(dtype: torch.dtype, allot_s: float, *, max_n: int = 2048, start_n: int = 128) -> tuple[float, int]:
    """Best FLOP/s of an n x n matmul, n doubled from ``start_n`` while two runs of the next size fit ``allot_s``."""
    deadline = time.perf_counter() + allot_s
    n = start_n
    while True:
        a = torch.randn(n, n).to(dtype)
        b, c = torch.randn(n, n).to(dtype), torch.empty(n, n, dtype=dtype)
        best, reps = float("inf"), 0
        while reps < 2:  # the first run pays warm-up (packing, thread start): grow on the better of two
            t0 = time.perf_counter()
            torch.mm(a, b, out=c)
            best = min(best, time.perf_counter() - t0)
            reps += 1
            if best > allot_s / 4:
                break
        if n >= max_n or 2 * 8 * best > deadline - time.perf_counter():
            break
        n *= 2
    while reps < 2 or (time.perf_counter() < deadline and reps < 25):
        t0 = time.perf_counter()
        torch.mm(a, b, out=c)
        best = min(best, time.perf_counter() - t0)
        reps += 1
        if best > allot_s:  # very slow dtype: one timed run is all the budget allows
            break
    return gemm_flops(n, n, n) / best, n


def _time_copy(allot_s: float, *, max_bytes: int = 256 << 20) -> tuple[float, int]:
    """Best bytes/s (read + write) of ``dst.copy_(src)``; size doubles from 16 MB while the next step fits."""
    deadline = time.perf_counter() + allot_s
    nbytes = 16 << 20
    while True:
        t0 = time.perf_counter()
        src = torch.ones(nbytes // 4)
        dst = torch.empty_like(src)
        dst.copy_(src)  # first touch of dst pages
        t1 = time.perf_counter()
        dst.copy_(src)
        best = time.perf_counter() - t1
        step = time.perf_counter() - t0
        if nbytes >= max_bytes or 2.5 * step > deadline - time.perf_counter():
            break
        nbytes *= 2
    reps = 1
    while reps < 2 or (time.perf_counter() < deadline and reps < 25):
        t0 = time.perf_counter()
        dst.copy_(src)
        best = min(best, time.perf_counter() - t0)
        reps += 1
    return 2.0 * nbytes / best, nbytes


#: CPU time counters at one moment (``hostclock.CpuCounters``: wall clock, all CPUs' busy seconds, own CPU seconds)
CpuSnapshot = CpuCounters


def cpu_snapshot() -> CpuSnapshot:
    return cpu_counters()


def others_load_per_cpu(since: CpuSnapshot, now: CpuSnapshot | None = None) -> float | None:
    """CPUs' worth of work other processes did between two snapshots, per CPU (0.5: half of every CPU busy with
    someone else's work); None where the OS reports no CPU counters or the interval is too short to tell."""
    now = now or cpu_snapshot()
    wall = now.wall - since.wall
    if since.system_busy_s is None or now.system_busy_s is None or wall < 0.05:
        return None
    others = (now.system_busy_s - since.system_busy_s) - (now.own_s - since.own_s)
    return max(0.0, others / wall / (os.cpu_count() or 1))


def _load_per_cpu(since: CpuSnapshot | None = None) -> float:
    """Other processes' CPU use per CPU since ``since`` (default: over the next 0.1 s); where the OS has no CPU
    counters, the 1-minute load average per CPU (which counts this process too)."""
    if since is None:
        since = cpu_snapshot()
        time.sleep(0.1)
    load = others_load_per_cpu(since)
    if load is not None:
        return load
    try:
        return os.getloadavg()[0] / (os.cpu_count() or 1)
    except (AttributeError, OSError):
        return 0.0


def host_environment(since: CpuSnapshot | None, threads: int | None = None) -> dict[str, Any]:
    """What shared the CPUs with a run since ``since``: ``host_cpus`` (CPUs this process may use),
    ``torch_threads``, ``host_others_load_per_cpu`` (None: unknown), ``host_busy`` and ``host_oversubscribed``
    (torch's threads plus the other processes' busy cores exceed the CPUs)."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    threads = threads if threads is not None else torch.get_num_threads()
    load = others_load_per_cpu(since) if since is not None else None
    busy_cores = (load or 0.0) * (os.cpu_count() or cpus)
    return {"host_cpus": cpus, "torch_threads": threads,
            "host_others_load_per_cpu": None if load is None else round(load, 3),
            "host_busy": bool(load is not None and load >= BUSY_LOAD_PER_CPU),
            "host_oversubscribed": bool(threads > cpus or (load is not None and load >= BUSY_LOAD_PER_CPU
                                                          and threads + busy_cores > cpus + 0.5))}


@rng_preserving  # random matrices: the user's seeded streams stay where they were
def measure_cpu(*, budget_s: float = DEFAULT_CPU_BUDGET_S) -> DeviceSpec:
    """Measure this CPU's roofs now (no cache); returns a ``DeviceSpec`` with ``measured=True``; its
    ``extra["load_per_cpu"]`` is the other processes' CPU use per CPU while it measured."""
    snap = cpu_snapshot()
    flops: dict[str, float] = {}
    sizes: dict[str, int] = {}
    with torch.inference_mode():
        for prec, dtype in _CPU_DTYPES.items():
            allot = budget_s * _CPU_SHARES[prec]
            # small GEMMs are misleading (a 256x256 bf16 matmul reached a tenth of what a model's GEMMs then did):
            # start at 512 whenever the share allows; bf16/fp16 can be 50x slower than fp32 without AVX512
            start = 512 if allot >= 0.25 else 256
            flops[prec], sizes[prec] = _time_matmul(dtype, allot, start_n=start)
        bandwidth, copy_bytes = _time_copy(budget_s * _CPU_SHARES["copy"])
    load = _load_per_cpu(snap)
    threads = torch.get_num_threads()
    return DeviceSpec(
        name=f"CPU ({_cpu_model()}, {threads} thread{'s' if threads != 1 else ''})", flops=flops,
        bandwidth=bandwidth, measured=True,
        vendor="cpu", vector_flops={"fp32": flops["fp32"], "fp64": flops["fp64"]},
        source=(f"measured by tscope_callbacks on {time.strftime('%Y-%m-%d')}: best-of-N square matmul per dtype "
                f"(n={sizes}), {copy_bytes >> 20} MB copy counting read+write, torch {torch.__version__}, "
                f"other processes' load {load:.2f}/cpu"),
        extra={"cache_key": cpu_cache_key(), "budget_s": budget_s, "matmul_n": sizes, "copy_bytes": copy_bytes,
               "load_per_cpu": round(load, 3)},
    )


def cpu_spec(*, cache: bool = True, budget_s: float = DEFAULT_CPU_BUDGET_S) -> DeviceSpec:
    """This machine's measured CPU roof, measured once and cached (a measurement with at least half this budget is
    reused). A measurement taken while the machine was busy is cached as provisional: reused while the machine is
    still busy (no 2.5 s re-measurement on every busy run), replaced at the first idle moment; telling so is one
    line on the ``tscope_callbacks`` logger."""
    path, key = cache_dir() / "cpu_roofs.json", cpu_cache_key()
    if cache:
        entry = cache_get(path, key)
        spec = spec_from_entry(entry, str(path))
        if spec is not None and float(entry.get("budget_s", 0)) >= 0.5 * budget_s:  # type: ignore[union-attr]
            if float(spec.extra.get("load_per_cpu", 0.0)) < BUSY_LOAD_PER_CPU or _load_per_cpu() >= BUSY_LOAD_PER_CPU:
                return spec  # an idle measurement; or a provisional one while the machine is still busy
    spec = measure_cpu(budget_s=budget_s)
    load = float(spec.extra.get("load_per_cpu", 0.0))
    cache_put(path, key, {"budget_s": budget_s, "created": time.time(), "load_per_cpu": load, "spec": spec.to_dict()})
    if load >= BUSY_LOAD_PER_CPU and key not in _told_busy:  # other work shared the cores: low numbers
        _told_busy.add(key)
        log.warning("tscope: the CPU roof was measured while other processes kept %.2f of each CPU busy; its roofs may "
                    "be low. Cached as provisional and measured again on the next idle run (or `tscope calibrate "
                    "--no-cache` on an idle machine)", load)
    return spec


# ---------------- CUDA ----------------
@dataclass
class Benchmark:
    """One CUDA measurement. ``setup()`` allocates on the device and returns the callable to time."""

    key: str  #: "fp32" (TF32 off), "tf32" (fp32 with TF32 on), "bf16", "fp16" or "copy"
    work: float  #: FLOPs (matmul) or bytes read + written (copy) per call
    setup: Callable[[], Callable[[], Any]]
    tf32: bool = False  #: run with ``torch.set_float32_matmul_precision("high")`` (else "highest")
    warmup: int = 3
    reps: int = 10


def cuda_benchmarks(device: int, *, quick: bool = False, precisions: tuple[str, ...] = ("bf16", "fp16", "fp32", "tf32"),
                    free_bytes: int | None = None) -> list[Benchmark]:
    """The matmul and copy benchmarks for ``cuda:<device>``; sizes shrink to fit ``free_bytes`` when given."""
    n = 4096 if quick else 8192
    copy_bytes = (256 << 20) if quick else (1 << 30)
    if free_bytes is not None:
        while n > 1024 and 3 * n * n * 4 > free_bytes // 2:
            n //= 2
        while copy_bytes > (16 << 20) and 2 * copy_bytes > free_bytes // 2:
            copy_bytes //= 2
    dev = torch.device("cuda", device)
    dtypes = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32, "tf32": torch.float32}

    def matmul(dtype: torch.dtype) -> Callable[[], Callable[[], Any]]:
        def setup() -> Callable[[], Any]:
            a, b = torch.randn(n, n, device=dev).to(dtype), torch.randn(n, n, device=dev).to(dtype)
            c = torch.empty(n, n, device=dev, dtype=dtype)
            return lambda: torch.mm(a, b, out=c)
        return setup

    def copy_setup() -> Callable[[], Any]:
        src = torch.ones(copy_bytes // 4, device=dev)
        dst = torch.empty_like(src)
        return lambda: dst.copy_(src)

    benches = [Benchmark(p, float(gemm_flops(n, n, n)), matmul(dtypes[p]), tf32=(p == "tf32")) for p in precisions if p in dtypes]
    return [*benches, Benchmark("copy", 2.0 * copy_bytes, copy_setup)]


def cuda_event_timer(bench: Benchmark, device: int = 0) -> float:
    """Best seconds per call of ``bench`` on ``cuda:<device>``, timed with CUDA events after warm-up."""
    prev = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high" if bench.tf32 else "highest")
    try:
        with torch.cuda.device(device):
            fn = bench.setup()
            for _ in range(bench.warmup):
                fn()
            torch.cuda.synchronize()
            best = float("inf")
            for _ in range(bench.reps):
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                fn()
                end.record()
                end.synchronize()
                best = min(best, start.elapsed_time(end) / 1e3)
            del fn
            torch.cuda.empty_cache()
        return best
    finally:
        torch.set_float32_matmul_precision(prev)


@rng_preserving  # random matrices on the GPU
def measure_cuda(device: int = 0, *, quick: bool = False, timer: Callable[[Benchmark], float] | None = None,
                 precisions: tuple[str, ...] = ("bf16", "fp16", "fp32", "tf32")) -> dict[str, float]:
    """Achievable rates on ``cuda:<device>``: precision -> FLOP/s, plus ``"bandwidth"`` (bytes/s)."""
    free = None
    if timer is None:
        free = torch.cuda.mem_get_info(device)[0]
        timer = lambda b: cuda_event_timer(b, device)  # noqa: E731
    out: dict[str, float] = {}
    for b in cuda_benchmarks(device, quick=quick, precisions=precisions, free_bytes=free):
        seconds = timer(b)
        if not seconds > 0:
            raise RuntimeError(f"calibrate: benchmark {b.key!r} timed {seconds!r} s")
        out["bandwidth" if b.key == "copy" else b.key] = b.work / seconds
    return out


def _gpu_key(name: str, quick: bool) -> str:
    return f"cuda|{name}|torch {torch.__version__}|{'quick' if quick else 'full'}"


def cached_achievable(name: str) -> DeviceSpec | None:
    """The cached calibration of GPU ``name`` (full preferred over quick), None when there is none."""
    path = cache_dir() / "gpu_roofs.json"
    for quick in (False, True):
        spec = spec_from_entry(cache_get(path, _gpu_key(name, quick)), str(path))
        if spec is not None:
            return spec
    return None


def calibrate(gpu: str | int | torch.device | None = None, *, quick: bool = False, cache: bool = True,
              timer: Callable[[Benchmark], float] | None = None, budget_s: float | None = None) -> DeviceSpec:
    """Measure the achievable roofs of ``gpu``: "cpu", "cuda", "cuda:N", a CUDA index, a ``torch.device`` or "auto"
    (default: the current CUDA device, else the CPU).

    Returns the datasheet spec with ``.achievable`` set to the measured one. On CPU the measured roof is the
    datasheet too (``achievable`` is a copy of it). On a GPU missing from the table a warning is issued and the
    measured spec is returned in both roles. ``cache=False`` re-measures (and refreshes the cache); ``timer``
    replaces the CUDA event timer (tests); ``budget_s`` is the CPU time budget (default 2.5 s, quick 1 s).
    """
    device = gpu
    if isinstance(device, str) and device.strip().lower() == "auto":
        device = None
    dev = torch.device(device) if isinstance(device, (str, torch.device)) else (
        torch.device("cuda", device) if isinstance(device, int) else
        torch.device("cuda" if torch.cuda.is_available() else "cpu"))
    if dev.type == "cpu":
        if budget_s is None:
            budget_s = 1.0 if quick else DEFAULT_CPU_BUDGET_S
        spec = cpu_spec(cache=cache, budget_s=budget_s)
        return spec.with_achievable(dataclasses.replace(spec, achievable=None))
    if dev.type != "cuda":
        raise ValueError(f"calibrate: unsupported device {str(dev)!r} (use 'cpu' or 'cuda[:N]')")
    index = dev.index if dev.index is not None else torch.cuda.current_device()
    name = torch.cuda.get_device_name(index)
    try:
        datasheet: DeviceSpec | None = spec_table.resolve(name)
    except UnknownDeviceError:
        warnings.warn(f"calibrate: {name!r} is not in gpu_specs.json; showing measured roofs only", stacklevel=2)
        datasheet = None
    path, key = cache_dir() / "gpu_roofs.json", _gpu_key(name, quick)
    achievable = spec_from_entry(cache_get(path, key), str(path)) if cache else None
    if achievable is None:
        wanted = ("bf16", "fp16", "fp32", "tf32") if datasheet is None else tuple(
            p for p in ("bf16", "fp16", "fp32", "tf32") if p in datasheet.flops or p == "fp32")
        rates = measure_cuda(index, quick=quick, timer=timer, precisions=wanted)
        bandwidth = rates.pop("bandwidth")
        achievable = DeviceSpec(
            name=f"{name} (measured)", flops=rates, bandwidth=bandwidth, measured=True,
            vendor=datasheet.vendor if datasheet else "", vector_flops={"fp32": rates["fp32"]},
            source=f"tscope calibrate {time.strftime('%Y-%m-%d')}: {'quick' if quick else 'full'} matmul/copy, "
                   f"torch {torch.__version__}")
        cache_put(path, key, {"created": time.time(), "spec": achievable.to_dict()})
    if datasheet is None:
        return achievable.with_achievable(dataclasses.replace(achievable))
    return datasheet.with_achievable(achievable)
