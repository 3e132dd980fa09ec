"""``tscope diff`` / ``analysis.diff``: two steps compared on their own bases, per layer and op class."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from profiles import a100, matmul, toy_profile

from tscope_callbacks.analysis.diff import diff_reports
from tscope_callbacks.api import roofline
from tscope_callbacks.cli import main


def _faster() -> object:
    """The toy step with blocks.0.fc's forward matmul at half its time (0.8 -> 0.4 ms) and the unprofiled step at
    3.6 ms instead of 4."""
    p = toy_profile()
    p.ops[0].time_s = 0.4e-3
    p.meta["step_time_s"] = 3.6e-3
    return p


def test_headline_layers_and_classes():
    d = diff_reports(roofline(toy_profile(), a100()), roofline(_faster(), a100()), labels=("before", "after"))
    assert d.same_work and d.basis == "measured op time"
    head = {name: (a, b, ch) for name, a, b, ch in d.headline}
    assert head["step ms"] == ("4", "3.6", "-10.0% (1.11x faster)")  # 4 / 3.6 = 1.11
    assert head["model GFLOP per step"][2] == "+0.0%"
    assert head["op time ms"][:2] == ("3.847", "3.447")  # the toy's op times sum to 3.847 ms; 0.4 ms less
    top = d.layers[0]
    # blocks.0.fc: 0.8 (forward) + 0.001 (its view) + 1.2 + 1.0 (backward) = 3.001 ms, then 2.601 ms
    assert (top.name, round(top.a_s * 1e3, 6), round(top.b_s * 1e3, 6)) == ("blocks.0.fc", 3.001, 2.601)
    assert top.delta_s == pytest.approx(-0.4e-3) and top.ratio == pytest.approx(2.601 / 3.001)
    assert all(r.delta_s == pytest.approx(0.0) for r in d.layers[1:])
    assert (d.classes[0].name, d.classes[0].delta_s) == ("matmul", pytest.approx(-0.4e-3))
    md = d.to_markdown()
    assert md.startswith("## Step diff — before → after") and "| `blocks.0.fc` | 3.001 | 2.601 | -0.4 | 0.867x |" in md
    json.dumps(d.to_dict())


def test_small_changes_and_large_figures_read_plainly():
    # an H200 GPT-2 diff of steps 10 and 100 printed "-0.1% (1x faster)" and "step peak MiB 1.286e+04"
    from tscope_callbacks.analysis.diff import _change, _ms

    assert _change(56.198, 56.129, lower_better=True) == "-0.1%"  # 1.001x: no factor that reads "1x" or "1.00x"
    assert _change(4.0, 3.6, lower_better=True) == "-10.0% (1.11x faster)"
    assert _change(3.6, 4.0, lower_better=True) == "+11.1% (1.11x slower)"
    assert _ms(12.86) == "12,860" and _ms(0.05613) == "56.13"  # thousands separated, never an exponent
    from tscope_callbacks.analysis.diff import _ratio

    assert (_ratio(1.005), _ratio(0.9531), _ratio(1.03), _ratio(12.5), _ratio(None)) == (
        "1.005x", "0.953x", "1.030x", "12.5x", "–")  # one format near 1 (it read "1x", "0.953x" and "1.03x")


def test_different_work_is_said_and_not_timed_against():
    more = toy_profile()
    more.ops.append(matmul(4096, 4096, 4096, layer="blocks.1.fc", time_s=0.5e-3))
    d = diff_reports(roofline(toy_profile(), a100()), roofline(more, a100()))
    assert not d.same_work and any("different work" in n for n in d.notes)
    assert dict((n, ch) for n, _, _, ch in d.headline)["step ms"] == "(different work)"
    assert d.layers[0].name == "blocks.1.fc" and d.layers[0].delta_s == pytest.approx(0.5e-3)


def test_untimed_side_compares_expected_times():
    d = diff_reports(roofline(toy_profile(timed=False), a100()), roofline(toy_profile(), a100()))
    assert d.basis == "expected kernel time" and any("untimed" in n for n in d.notes)


def test_cli_diff(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    a, b, out = tmp_path / "a.json", tmp_path / "b.json", tmp_path / "d.json"
    a.write_text(json.dumps({"profile": toy_profile().to_dict(), "device": "a100"}))
    b.write_text(json.dumps({"profile": _faster().to_dict(), "device": "a100"}))
    assert main(["diff", str(a), str(b), "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "## Step diff — a.json → b.json" in text and "| step ms | 4 | 3.6 | -10.0% (1.11x faster) |" in text
    assert json.loads(out.read_text())["layers"][0]["name"] == "blocks.0.fc"
    assert main(["diff", str(a), str(tmp_path / "missing.json")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("tscope diff: cannot read") and len(err.strip().splitlines()) == 1


def test_mfu_change_is_on_one_roof_when_the_steps_roofs_differ():
    # two CPU steps whose measured matrix roofs were widened by different amounts (99.05 vs 95.43 GFLOP/s in a demo
    # run) showed "MFU +2.5 pts" for the same work in the same time; here the same step on a 312 and a 324.48
    # (4% wider) TFLOP/s bf16 roof
    from dataclasses import replace

    spec_a = a100()
    spec_b = replace(spec_a, flops={**spec_a.flops, "bf16": 312e12 * 1.04})
    a, b = roofline(toy_profile(), spec_a), roofline(toy_profile(), spec_b)
    assert b.mfu == pytest.approx(a.mfu / 1.04)  # the same step reads 4% lower MFU on the wider roof
    d = diff_reports(a, b)
    head = {name: ch for name, _, _, ch in d.headline}
    assert head["MFU"] == "+0 pts"  # on A's roof: B's MFU x 324.48 / 312 = A's
    assert any("MFU roofs differ (312,000 vs 324,480 GFLOP/s)" in n for n in d.notes), d.notes
