"""GPU telemetry through NVML (the optional ``nvml`` extra: ``pip install tscope-callbacks[nvml]``, which installs
``nvidia-ml-py`` and its ``pynvml`` module). NVML reads the driver's counters; it never touches a CUDA stream, so
sampling costs no CUDA sync.

:meth:`Telemetry.sample` reads, once per call: the total-energy counter (``nvmlDeviceGetTotalEnergyConsumption``, mJ
since the driver loaded), power (mW), the SM clock (MHz), the current clock-event ("throttle") reasons (a bit mask,
decoded by :func:`decode_reasons`), the GPU temperature (C), memory used (bytes) and, on Hopper and later, a GPM
sample (``nvmlGpmSampleGet``). :func:`interval` turns two samples into the interval's figures: energy per step and
per token from the energy counter's difference, the GPM tensor-pipe active share between the two GPM samples
(``NVML_GPM_METRIC_ANY_TENSOR_UTIL``; ``NVML_GPM_METRIC_HMMA_TENSOR_UTIL`` where that is missing), and the
instantaneous readings of the later sample.

The monitor samples at logging steps only (one sample per ``log_every_n_steps``: a few NVML calls, tens of
microseconds each). Without the package, the driver or a GPU, :func:`open_telemetry` returns None and a reason.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Telemetry", "THROTTLING", "Sample", "open_telemetry", "interval", "decode_reasons", "REASONS"]

#: NVML's clock-event reason bits (nvml.h ``nvmlClocksEventReason*``) and the names the keys and alerts use
REASONS: dict[int, str] = {
    0x1: "gpu_idle", 0x2: "applications_clocks", 0x4: "sw_power_cap", 0x8: "hw_slowdown", 0x10: "sync_boost",
    0x20: "sw_thermal", 0x40: "hw_thermal", 0x80: "hw_power_brake", 0x100: "display_clocks", 0x200: "board_limit",
    0x400: "reliability",
}
#: reasons that slow a busy GPU (idle, application clocks and sync boost are not throttling)
THROTTLING = frozenset({"sw_power_cap", "hw_slowdown", "sw_thermal", "hw_thermal", "hw_power_brake", "board_limit",
                        "reliability"})
_HOPPER_ARCH = 9  #: ``NVML_DEVICE_ARCH_HOPPER``; GPM needs Hopper or later
_ANY_TENSOR, _HMMA_TENSOR = 5, 7  #: ``NVML_GPM_METRIC_ANY_TENSOR_UTIL``, ``NVML_GPM_METRIC_HMMA_TENSOR_UTIL``


def decode_reasons(mask: int) -> list[str]:
    """Names of the set bits of a clock-event reason mask (unknown bits as ``bit_0x...``)."""
    out = [name for bit, name in REASONS.items() if mask & bit]
    rest = mask & ~sum(REASONS)
    if rest:
        out.append(f"bit_{rest:#x}")
    return out


@dataclass
class Sample:
    """One reading of a device (see the module doc); ``step`` and ``tokens`` are the run's counts at the reading."""

    step: int
    tokens: int
    energy_mj: int | None
    power_w: float | None
    sm_clock_mhz: float | None
    reasons: list[str] = field(default_factory=list)
    temperature_c: float | None = None
    memory_used_b: int | None = None
    gpm: Any = None  #: the GPM sample handle (Hopper and later), freed by :meth:`Telemetry.close`


class Telemetry:
    """One GPU's NVML handle and the calls a sample makes (the ``pynvml`` module is passed in: tests give a fake)."""

    def __init__(self, nvml: Any, index: int) -> None:
        self.nvml = nvml
        self.handle = nvml.nvmlDeviceGetHandleByIndex(index)
        self.name = _text(nvml.nvmlDeviceGetName(self.handle))
        self.gpm = False
        try:
            arch = nvml.nvmlDeviceGetArchitecture(self.handle)
            self.gpm = arch >= _HOPPER_ARCH and bool(nvml.nvmlGpmQueryDeviceSupport(self.handle).isSupportedDevice)
        except Exception:  # an older driver or package: no GPM
            self.gpm = False
        self._free: list[Any] = []  #: GPM samples to free, oldest first (two are alive at most)
        self.last: Sample | None = None  #: the latest sample of :meth:`window`
        self.tokens = 0  #: tokens counted by :meth:`window` so far

    def window(self, step: int, tokens_per_step: int = 0) -> dict[str, Any]:
        """Sample now (at optimizer step ``step``) and return :func:`interval` since the previous call ({} the first
        time); tokens over the window are ``tokens_per_step`` x its steps (the logging step's batch)."""
        prev = self.last
        if prev is not None:
            self.tokens += tokens_per_step * max(step - prev.step, 0)
        self.last = self.sample(step, self.tokens)
        return {} if prev is None else interval(self, prev, self.last)

    def _try(self, fn: str, *args: Any) -> Any:
        try:
            return getattr(self.nvml, fn)(self.handle, *args)
        except Exception:  # not supported on this device / driver: the figure is left out
            return None

    def sample(self, step: int, tokens: int = 0) -> Sample:
        n = self.nvml
        energy = self._try("nvmlDeviceGetTotalEnergyConsumption")
        power = self._try("nvmlDeviceGetPowerUsage")
        clock = self._try("nvmlDeviceGetClockInfo", getattr(n, "NVML_CLOCK_SM", 1))
        mask = self._try("nvmlDeviceGetCurrentClocksEventReasons")
        if mask is None:
            mask = self._try("nvmlDeviceGetCurrentClocksThrottleReasons")
        temp = self._try("nvmlDeviceGetTemperature", getattr(n, "NVML_TEMPERATURE_GPU", 0))
        mem = self._try("nvmlDeviceGetMemoryInfo")
        gpm = None
        if self.gpm:
            try:
                gpm = n.nvmlGpmSampleGet(self.handle, n.nvmlGpmSampleAlloc())
                self._free.append(gpm)
                while len(self._free) > 2:
                    n.nvmlGpmSampleFree(self._free.pop(0))
            except Exception:
                self.gpm = False
        return Sample(step, tokens, None if energy is None else int(energy), None if power is None else power / 1e3,
                      None if clock is None else float(clock), decode_reasons(int(mask)) if mask is not None else [],
                      None if temp is None else float(temp), None if mem is None else int(mem.used), gpm)

    def tensor_active(self, a: Sample, b: Sample) -> float | None:
        """The tensor pipes' active share (0-1) between two GPM samples; None without GPM."""
        if a.gpm is None or b.gpm is None:
            return None
        n = self.nvml
        for metric in (getattr(n, "NVML_GPM_METRIC_ANY_TENSOR_UTIL", _ANY_TENSOR),
                       getattr(n, "NVML_GPM_METRIC_HMMA_TENSOR_UTIL", _HMMA_TENSOR)):
            try:
                req = n.c_nvmlGpmMetricsGet_t()
                req.version = getattr(n, "NVML_GPM_METRICS_GET_VERSION", 1)
                req.numMetrics = 1
                req.sample1, req.sample2 = a.gpm, b.gpm
                req.metrics[0].metricId = metric
                out = n.nvmlGpmMetricsGet(req)
                m = out.metrics[0]
                if getattr(m, "nvmlReturn", 0) == 0:
                    return float(m.value) / 100.0
            except Exception:
                continue
        return None

    def close(self) -> None:
        for s in self._free:
            try:
                self.nvml.nvmlGpmSampleFree(s)
            except Exception:
                pass
        self._free.clear()


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def open_telemetry(index: int = 0, module: str = "pynvml") -> tuple[Telemetry | None, str]:
    """(Telemetry of GPU ``index``, "") or (None, why not: the package is missing, NVML would not start, ...)."""
    try:
        nvml = importlib.import_module(module)
    except ImportError:
        return None, "GPU telemetry needs the nvml extra: pip install 'tscope-callbacks[nvml]' (nvidia-ml-py)"
    try:
        nvml.nvmlInit()
        return Telemetry(nvml, index), ""
    except Exception as e:
        return None, f"NVML did not start ({type(e).__name__}: {e}); GPU telemetry is off"


def interval(tel: Telemetry | None, a: Sample, b: Sample) -> dict[str, Any]:
    """Bare keys for the interval from sample ``a`` to ``b``: ``energy_j_per_step`` (the energy counter's difference
    over the steps between them), ``energy_j_per_token`` (over the tokens, when counted), ``power_w``,
    ``sm_clock_mhz``, ``temperature_c``, ``memory_used_mb`` (``b``'s readings), ``throttled`` (1 when a throttling
    reason is set), ``throttle_reasons`` (names, not a scalar) and ``tensor_active`` (GPM, 0-1)."""
    out: dict[str, Any] = {}
    steps, tokens = b.step - a.step, b.tokens - a.tokens
    if a.energy_mj is not None and b.energy_mj is not None and b.energy_mj >= a.energy_mj and steps > 0:
        joules = (b.energy_mj - a.energy_mj) / 1e3
        out["energy_j_per_step"] = joules / steps
        if tokens > 0:
            out["energy_j_per_token"] = joules / tokens
    for key, v in (("power_w", b.power_w), ("sm_clock_mhz", b.sm_clock_mhz), ("temperature_c", b.temperature_c)):
        if v is not None:
            out[key] = v
    if b.memory_used_b is not None:
        out["memory_used_mb"] = b.memory_used_b / 2**20
    out["throttle_reasons"] = list(b.reasons)
    out["throttled"] = float(bool(THROTTLING & set(b.reasons)))
    if tel is not None:
        u = tel.tensor_active(a, b)
        if u is not None:
            out["tensor_active"] = u
    return out
