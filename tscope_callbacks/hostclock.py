"""The host's clock and CPU counters behind tscope's step timing, real unless a scripted host stands in.

Every host-side step time tscope reads goes through :func:`host_time` (``time.perf_counter``): the CPU stamps of the
step clocks (the step-time basis of MFU, the automatic-MFU windows, the step monitor's data wait and host time) and
the step monitor's per-layer forward host times. The other processes' CPU load over those steps (what tells a slowdown
of the run from a busy machine, and the report's "host busy" note) comes from :func:`cpu_counters` (``/proc/stat``),
and the training thread's own wait for a CPU (ready to run, but another process had it) from :func:`cpu_wait`
(``/proc/thread-self/schedstat``).

:func:`scripted` replaces both for a block, so the timing logic runs in a real fit on durations and loads a test
chose (a step of exactly 5 ms, a report that takes 300 ms, an idle or a busy machine), whatever the machine's speed
or load while the test runs.

Not through it: the capture's per-op times (``perf_counter_ns`` around each op: a measurement, never logic under
test) and the roof measurements (``devices.calibrate``), which must read real time.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import NamedTuple

__all__ = ["CpuCounters", "host_time", "cpu_counters", "cpu_wait", "scripted", "SCHEDSTAT"]

#: the calling thread's scheduler statistics: time on a CPU, time waiting on a run queue (ns), timeslices
SCHEDSTAT = "/proc/thread-self/schedstat"


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


class _ThreadWait:
    """One thread's run-queue wait from its schedstat (opened once per thread, read with ``pread``: a few us)."""

    def __init__(self) -> None:
        self.local = threading.local()

    def __call__(self) -> float | None:
        fd = getattr(self.local, "fd", False)
        if fd is False:
            try:
                fd = os.open(SCHEDSTAT, os.O_RDONLY)
            except (OSError, AttributeError):
                fd = None
            self.local.fd = fd
        if fd is None:
            return None
        try:
            return int(os.pread(fd, 128, 0).split()[1]) * 1e-9
        except (OSError, ValueError, IndexError):
            return None


_clock: Callable[[], float] = time.perf_counter
_counters: Callable[[], CpuCounters] = _real_counters
_wait: Callable[[], float | None] = _ThreadWait()


def host_time() -> float:
    """Seconds on the host clock (monotonic; only differences mean anything)."""
    return _clock()


def cpu_counters() -> CpuCounters:
    """The CPU counters now (see :class:`CpuCounters`)."""
    return _counters()


def cpu_wait() -> float | None:
    """The calling thread's wait for a CPU so far, in seconds: the time it was ready to run while other work had
    the CPU (the kernel's run-queue wait); None where the OS does not say (no schedstat), or under a script that
    gives none. Only differences mean anything."""
    return _wait()


@contextmanager
def scripted(clock: Callable[[], float], others_busy_s: Callable[[], float] | None = None,
             waited_s: Callable[[], float | None] | None = None) -> Iterator[None]:
    """Inside the block, read ``clock()`` instead of ``time.perf_counter()``, and as the CPU counters: the other
    processes' busy CPU seconds so far from ``others_busy_s()`` (None: the OS has no counters, the load is unknown)
    with no CPU time of this process's own, and as the thread's wait for a CPU ``waited_s()`` (None: not known)
    (tests: a host that moves only when told)."""
    global _clock, _counters, _wait
    previous = _clock, _counters, _wait

    def counters() -> CpuCounters:
        return CpuCounters(clock(), None if others_busy_s is None else others_busy_s(), 0.0)

    _clock, _counters, _wait = clock, counters, (waited_s or (lambda: None))
    try:
        yield
    finally:
        _clock, _counters, _wait = previous
