"""Which time a figure stands on, one rule for every surface: "measured, else expected".

A profile is *timed* when its ops were timed (``StepProfile.timed``, ``Summary.timed``). In a timed profile an op's or
a row's time is its measured time (0 for one no kernel or host time was recorded for: nothing ran that took time);
in an untimed profile (an estimate: the meta device, ``ts.analyze`` of a shape-only capture) it is the expected,
shape-aware kernel time. The step time is the measured one when the run measured it, else the expected one.

Every surface reads these: the tables' order, the time split, the roofline plot's points, the layer-summary
figures, the step diff and the advice's times; the page's JavaScript (``render/static/js/report.js`` ``timeOf``)
applies the same rule with the report's ``summary.timed``.
"""

from __future__ import annotations

from typing import Protocol

__all__ = ["HasTimes", "time_of", "step_time_of"]


class HasTimes(Protocol):
    """An op or a row: its measured time (None when not timed) and its expected kernel time."""

    @property
    def measured_s(self) -> float | None: ...

    @property
    def expected_s(self) -> float: ...


def time_of(x: HasTimes, timed: bool) -> float:
    """``x``'s time: measured when the profile was ``timed`` (0 when ``x`` itself has none), else expected."""
    return (x.measured_s or 0.0) if timed else x.expected_s


def step_time_of(measured_step_s: float | None, expected_step_s: float | None) -> float | None:
    """The step time: the measured one when there is one, else the expected one (None when neither)."""
    return measured_step_s if measured_step_s is not None else expected_step_s
