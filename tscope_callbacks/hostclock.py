"""The host's clock and CPU counters behind tscope's step timing, real unless a scripted host stands in.

Every host-side step time tscope reads goes through :func:`host_time` (``time.perf_counter``): the CPU stamps of the
step clocks (the step-time basis of MFU, the automatic-MFU windows, the step monitor's data wait and host time) and
the step monitor's per-layer forward host times. The other processes' CPU load over those steps (what tells a slowdown
of the run from a busy machine, and the report's "host busy" note) comes from :func:`cpu_counters` (``/proc/stat``).

:func:`scripted` replaces both for a block, so the timing logic runs in a real fit on durations and loads a test
chose (a step of exactly 5 ms, a report that takes 300 ms, an idle or a busy machine), whatever the machine's speed
or load while the test runs.

Not through it: the capture's per-op times (``perf_counter_ns`` around each op: a measurement, never logic under
test) and the roof measurements (``devices.calibrate``), which must read real time.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import NamedTuple

__all__ = ["CpuCounters", "host_time", "cpu_counters", "scripted"]


class CpuCounters(NamedTuple):
    """CPU time counters at one moment: the host clock (s), all CPUs' busy seconds (None where the OS has no
    counters) and this process's own CPU seconds (all its threads)."""

    wall: float
    system_busy_s: float | None
    own_s: float


def _system_busy_s() -> float | None:
    try:
        with open("/proc/stat", encoding="ascii") as f:
            fields = f.readline().split()
        if fields[0] != "cpu":
            return None
        user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in fields[1:9])
        return (user + nice + system + irq + softirq + steal) / float(os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError, AttributeError):
        return None


def _real_counters() -> CpuCounters:
    return CpuCounters(time.perf_counter(), _system_busy_s(), time.process_time())


_clock: Callable[[], float] = time.perf_counter
_counters: Callable[[], CpuCounters] = _real_counters


def host_time() -> float:
    """Seconds on the host clock (monotonic; only differences mean anything)."""
    return _clock()


def cpu_counters() -> CpuCounters:
    """The CPU counters now (see :class:`CpuCounters`)."""
    return _counters()


@contextmanager
def scripted(clock: Callable[[], float], others_busy_s: Callable[[], float] | None = None) -> Iterator[None]:
    """Inside the block, read ``clock()`` instead of ``time.perf_counter()``, and as the CPU counters: the other
    processes' busy CPU seconds so far from ``others_busy_s()`` (None: the OS has no counters, the load is unknown)
    with no CPU time of this process's own (tests: a host that moves only when told)."""
    global _clock, _counters
    previous = _clock, _counters

    def counters() -> CpuCounters:
        return CpuCounters(clock(), None if others_busy_s is None else others_busy_s(), 0.0)

    _clock, _counters = clock, counters
    try:
        yield
    finally:
        _clock, _counters = previous
