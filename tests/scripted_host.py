"""A scripted host for timing logic: a clock that moves only when a test says so, and a chosen load of other processes.

Inside ``with ScriptedHost() as host:`` (or the ``host`` fixture of ``tests/conftest.py``) every host time tscope's
step clocks and the step monitor read (``tscope_callbacks.hostclock``) is ``host.t``: a fit's step takes exactly what
the test spends in it (:func:`spend` in a model or dataset, :class:`StepCost` per optimizer step), so a test asserts
exact durations and verdicts that hold at any load. ``load`` is the other processes' CPU use per CPU while the clock
moves (0.0: an idle machine; None: the OS reports no counters)."""

from __future__ import annotations

import os
from typing import Any

import lightning.pytorch as pl

from tscope_callbacks import hostclock

__all__ = ["ScriptedHost", "StepCost", "spend"]

if __name__ != "tests.scripted_host":  # a second copy of this module would have its own active hosts
    raise ImportError("import the scripted host as tests.scripted_host (from tests.scripted_host import ...)")

_ACTIVE: list[ScriptedHost] = []


class ScriptedHost:
    def __init__(self, load: float | None = 0.0, t0: float = 1000.0) -> None:
        self.t, self.load, self.others_busy_s = t0, load, 0.0
        self._cm: Any = None

    def time(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        """Move the clock by ``seconds`` (the other processes keep ``load`` of every CPU busy meanwhile)."""
        assert seconds >= 0, seconds
        self.t += seconds
        self.others_busy_s += (self.load or 0.0) * seconds * (os.cpu_count() or 1)

    def __enter__(self) -> ScriptedHost:
        self._cm = hostclock.scripted(self.time, None if self.load is None else lambda: self.others_busy_s)
        self._cm.__enter__()
        _ACTIVE.append(self)
        return self

    def __exit__(self, *exc: Any) -> None:
        _ACTIVE.remove(self)
        self._cm.__exit__(*exc)


def spend(seconds: float) -> None:
    """Spend ``seconds`` of host time here (a model's forward, a dataset's ``__getitem__``) on the active scripted
    host; there must be one (a test that reads real time would depend on the machine's load)."""
    assert _ACTIVE, "spend() outside a ScriptedHost: use the `host` fixture"
    _ACTIVE[-1].advance(seconds)


class StepCost(pl.Callback):
    """Each training batch costs ``seconds`` of host time on ``host`` (spent before its backward, inside the step)."""

    def __init__(self, host: ScriptedHost, seconds: float = 0.005) -> None:
        self.host, self.seconds = host, seconds

    def on_before_backward(self, trainer: pl.Trainer, pl_module: pl.LightningModule, loss: Any) -> None:
        self.host.advance(self.seconds)
