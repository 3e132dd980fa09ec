"""``analysis.throughput``: the automatic MFU's windows, and the one line that says why it differs from the profiled
step's MFU (the demo printed "MFU 27%" then "Automatic MFU ... 15.68%" with no word on why)."""

from __future__ import annotations

import dataclasses
from dataclasses import replace

import pytest
from profiles import a100, toy_profile

from tscope_callbacks.analysis.throughput import Throughput, Window, mfu_bases
from tscope_callbacks.api import roofline


def _report(step_dev=None):
    p = toy_profile()  # the callbacks' basis: the median of 8 unprofiled steps, 4 ms
    p.info = dataclasses.replace(p.info, step_time_window=[95, 107])
    return roofline(p, a100())


def test_same_flops_and_roof_the_difference_is_the_step_time():
    r = _report()
    peak, f = r.summary.mfu_peak_flops, r.summary.model_flops
    # 10 steps of the same work in 50 ms: 5 ms a step against the profiled step's 4 ms, so MFU x 4/5
    w = Window(end_step=300, time_s=0.05, steps=10, flops=10 * f)
    tp = Throughput(peak)
    tp.update(w)
    assert tp.compute()["mfu"] == pytest.approx(r.summary.mfu * 4 / 5)
    line = mfu_bases(r, w, peak)
    auto = f * 10 / 0.05 / peak
    assert line.startswith(f"Automatic MFU {auto * 100:.3g}% (steps 291-300: 5 ms a step, the window's time over its "
                           "10 steps, every step and its logging included) vs MFU ")
    assert f"of the profiled step 7 (4 ms a step: {r.summary.step_time_basis_text}, steps 95-107)" in line
    assert line.endswith(": the same model FLOPs per step on the same roof, so the difference is the step time (the "
                         "window's step time is 1.250x the profiled step's)")


def test_other_flops_or_roof_are_named():
    r = _report()
    f, peak = r.summary.model_flops, r.summary.mfu_peak_flops
    line = mfu_bases(r, Window(end_step=20, time_s=0.04, steps=10, flops=20 * f), peak * 1.04)
    assert "model FLOPs per step" in line and "roofs " in line and "the window's step time is 1.000x" in line


def test_nothing_to_explain_without_both_mfus():
    r = _report()
    w = Window(end_step=20, time_s=0.04, steps=10, flops=10 * r.summary.model_flops)
    assert mfu_bases(r, w, None) is None
    untimed = roofline(toy_profile(timed=False), a100())
    assert mfu_bases(untimed, w, 312e12) is None
    assert mfu_bases(replace(r, summary=replace(r.summary, mfu=None)), w, 312e12) is None
