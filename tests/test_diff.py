"""``tscope diff`` / ``analysis.diff``: two steps compared like with like, per layer and op class, each change
judged against the two steps' own noise."""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import replace
from pathlib import Path

import pytest
from profiles import a100, matmul, toy_profile

from tscope_callbacks.analysis.diff import diff_reports, verdict
from tscope_callbacks.analysis.fmt import pct_text
from tscope_callbacks.analysis.report import MemorySection, NoiseSection
from tscope_callbacks.api import roofline
from tscope_callbacks.cli import main

GPT_INPUTS = [[[8, 512], "int64"]]  # 8 samples of 512 token ids: 4,096 tokens a step
CNN_INPUTS = [[[64, 3, 32, 32], "float32"]]  # 64 images: samples, no tokens


def _faster(**meta) -> object:
    """The toy step with blocks.0.fc's forward matmul at half its time (0.8 -> 0.4 ms) and the unprofiled step at
    3.6 ms instead of 4."""
    p = toy_profile()
    p.ops[0].time_s = 0.4e-3
    p.info = dataclasses.replace(p.info, step_time_s=3.6e-3, **meta)
    return p


def _with_inputs(p, inputs=GPT_INPUTS):
    p.info = dataclasses.replace(p.info, inputs=inputs)
    return p


def _toy(**meta) -> object:
    p = toy_profile()
    p.info = dataclasses.replace(p.info, **meta)
    return p


def _report(prof, *, step_dev: float | None = None, spread: tuple = (), steps: int = 1, floor: float = 0.0):
    """The toy's StepReport with the noise its callback would have measured: the unprofiled steps' typical
    deviation (``step_dev``) and the layer x phase spreads over ``steps`` profiled steps."""
    r = roofline(prof, a100())
    return replace(r, context=replace(r.context, step_time_spread_s=step_dev),
                   noise=NoiseSection(steps=steps, floor_s=floor, spread=spread))


def test_headline_layers_and_classes():
    d = diff_reports(_report(_toy(inputs=GPT_INPUTS)), _report(_faster(inputs=GPT_INPUTS)), labels=("before", "after"))
    assert d.same_work and d.basis == "measured op time"
    step = d.change("step time")
    assert (step.a, step.b, step.change) == (4e-3, 3.6e-3, "-10% (1.11x faster)")  # 4 / 3.6 = 1.11
    assert (step.text(step.a), step.text(step.b)) == ("4 ms", "3.6 ms")
    assert step.verdict == "unknown"  # neither report measured its step time's spread
    assert d.change("model FLOPs per step").change == "+0.00%"
    op = d.change("op time")
    assert (op.text(op.a), op.text(op.b)) == ("3.85 ms", "3.45 ms")  # the toy's op times sum to 3.847 ms; 0.4 less
    # 8 samples and 4,096 tokens a step: 2,000 and 2,222 samples/s (8 / 4 ms, 8 / 3.6 ms), x512 tokens
    samples, tokens = d.change("samples/s"), d.change("tokens/s")
    assert (samples.a, samples.b) == (pytest.approx(2000), pytest.approx(2222.2222))
    assert (tokens.a, tokens.b) == (pytest.approx(1_024_000), pytest.approx(1_137_777.78))
    assert samples.change == tokens.change == "+11.1%"
    top = d.layers[0]
    # blocks.0.fc: 0.8 (forward) + 0.001 (its view) + 1.2 + 1.0 (backward) = 3.001 ms, then 2.601 ms
    assert (top.name, round(top.a_s * 1e3, 6), round(top.b_s * 1e3, 6)) == ("blocks.0.fc", 3.001, 2.601)
    assert top.delta_s == pytest.approx(-0.4e-3) and top.ratio == pytest.approx(2.601 / 3.001)
    assert all(r.delta_s == pytest.approx(0.0) for r in d.layers[1:])
    assert (d.classes[0].name, d.classes[0].delta_s) == ("matmul", pytest.approx(-0.4e-3))
    md = d.to_markdown()
    assert md.startswith("## Step diff — before → after")
    assert "| `blocks.0.fc` | 3 | 2.6 | -0.4 | 0.867x | noise not measured |" in md, md
    assert "| step time | 4 ms | 3.6 ms | -10% (1.11x faster) |  | noise not measured |" in md
    page = json.loads(json.dumps(d.to_dict(top=2)))
    assert [r["name"] for r in page["layers"]["rows"]] == ["blocks.0.fc", ""]  # "": the root (shown "(root)")
    # the rows past the top are summed once each: 4 more layers
    rest = d.layers[2:]
    assert page["layers"]["more"]["n"] == 4
    assert page["layers"]["more"]["a_s"] == pytest.approx(sum(r.a_s or 0 for r in rest))


def test_like_with_like_samples_with_samples_and_tokens_only_when_both_have_them():
    # a CNN step and a GPT-2 step printed "samples/s | 708 | 8,412": 8,412 was GPT-2's tokens/s
    cnn, gpt = _report(_toy(inputs=CNN_INPUTS)), _report(_faster(inputs=GPT_INPUTS))
    d = diff_reports(cnn, gpt, labels=("cnn", "gpt2"))
    samples = d.change("samples/s")
    assert samples.a == pytest.approx(64 / 4e-3) and samples.b == pytest.approx(8 / 3.6e-3)
    assert samples.text(samples.a) == "16,000" and samples.text(samples.b) == "2,222"
    assert d.change("tokens/s") is None
    assert any("tokens/s is not compared: only gpt2 has tokens" in n for n in d.notes), d.notes
    md = d.to_markdown()
    assert "| samples/s | 16,000 | 2,222 |" in md and "tokens/s |" not in md


def test_changes_within_the_steps_noise_are_marked_so():
    # step time 4 -> 3.6 ms; each step's unprofiled steps deviate by 0.15 / 0.2 ms: noise sqrt(0.15^2 + 0.2^2) =
    # 0.25 ms < 0.4 ms, a real change
    spread = (("blocks.0.fc", "forward", 0.3e-3), ("blocks.0.fc", "backward", 0.4e-3))
    a = _report(_toy(inputs=GPT_INPUTS), step_dev=0.15e-3, spread=spread, steps=3)
    b = _report(_faster(inputs=GPT_INPUTS), step_dev=0.2e-3, spread=spread, steps=3)
    d = diff_reports(a, b)
    step = d.change("step time")
    assert step.noise == pytest.approx(0.25e-3) and step.verdict == "better" and step.noise_text == "250 µs"
    # MFU and throughput carry the step's relative noise: MFU_a x 0.15/4 and MFU_b x 0.2/3.6, in quadrature
    mfu = d.change("MFU")
    want = math.hypot(mfu.a * 0.15 / 4, mfu.b * 0.2 / 3.6)
    assert mfu.noise == pytest.approx(want) and mfu.verdict == "better"
    # blocks.0.fc: its phases' spreads in quadrature on each side (0.5 ms), the two sides again: 0.707 ms > 0.4 ms
    top = d.layers[0]
    assert top.name == "blocks.0.fc" and top.noise_s == pytest.approx(math.hypot(0.5e-3, 0.5e-3))
    assert top.verdict == "noise"
    assert "| `blocks.0.fc` | 3 | 2.6 | -0.4 | 0.867x | within noise |" in d.to_markdown()
    # a layer without a spread on a 3-step report: measured as steady (0), so its change is judged: none here
    assert {r.verdict for r in d.layers[1:]} == {"noise"}
    # on a busy machine the floor (the unprofiled steps' typical deviation) applies to every row, classes too
    busy = diff_reports(_report(_toy(), steps=3, floor=1e-3), _report(_faster(), steps=3, floor=1e-3))
    assert busy.layers[0].noise_s == pytest.approx(math.hypot(1e-3, 1e-3)) and busy.layers[0].verdict == "noise"
    assert busy.classes[0].verdict == "noise"
    # the step got slower by more than its noise: worse
    slow = diff_reports(b, a)
    assert slow.change("step time").verdict == "worse" and slow.change("MFU").verdict == "worse"


def test_verdict_rule():
    assert verdict(-0.4, 0.25, higher_better=False) == "better"
    assert verdict(0.4, 0.25, higher_better=False) == "worse"
    assert verdict(0.2, 0.25, higher_better=True) == "noise"
    assert verdict(0.2, None, higher_better=True) == "unknown"
    assert verdict(None, 0.1, higher_better=True) == ""


def test_small_changes_and_large_figures_read_plainly():
    # an H200 GPT-2 diff of steps 10 and 100 printed "-0.1% (1x faster)" and "step peak MiB 1.286e+04"
    from tscope_callbacks.analysis.diff import _rel_text

    assert _rel_text(56.198, 56.129, lower_better=True) == "-0.12%"  # 1.001x: no factor that reads "1x" or "1.00x"
    assert _rel_text(4.0, 3.6, lower_better=True) == "-10% (1.11x faster)"
    assert _rel_text(3.6, 4.0, lower_better=True) == "+11.1% (1.11x slower)"
    a = _report(_toy())
    b = replace(a, memory=MemorySection(peak_bytes=round(12.86 * 2**30), device_bytes=None, fits=None, verdict="",
                                        share=None, states_bytes=None, rest_bytes=None, shard_over=None, basis="b",
                                        categories={}))
    peak = diff_reports(b, b).change("step memory peak")
    assert peak.text(peak.a) == "12.9 GiB"  # thousands separated, never an exponent
    # an allocator peak repeats exactly: an equal one reads "unchanged" (it read "+0.00% ±0 B within noise")
    assert (peak.change, peak.noise_text, peak.verdict) == ("unchanged", "", "")
    assert "| step memory peak | 12.9 GiB | 12.9 GiB | unchanged |  |  |" in diff_reports(b, b).to_markdown()
    # a side without the peak (a step profiled without layer details) reads "–", and a note says why
    d = diff_reports(b, a, labels=("step 10", "step 200"))
    assert d.change("step memory peak").b is None
    assert "step 200 has no step memory peak: it is measured in a step profiled with layer details " \
           "(a LayerProfilerCallback's)" in d.notes
    assert not any("memory peak" in n for n in diff_reports(b, b).notes)


def test_different_work_is_said_and_not_timed_against():
    more = toy_profile()
    more.ops.append(matmul(4096, 4096, 4096, layer="blocks.1.fc", time_s=0.5e-3))
    d = diff_reports(_report(toy_profile()), _report(more))
    assert not d.same_work and any("different work" in n for n in d.notes)
    assert d.change("step time").change == "(different work)" and d.change("step time").verdict == ""
    assert d.change("op time").change == "(different work)"  # more work takes longer: no "slower" verdict
    assert d.layers[0].name == "blocks.1.fc" and d.layers[0].delta_s == pytest.approx(0.5e-3)
    # another model's throughput is shown, never judged better or worse (a CNN against GPT-2 said "better")
    more.info = dataclasses.replace(more.info, inputs=CNN_INPUTS)
    d = diff_reports(_report(_toy(inputs=GPT_INPUTS)), _report(more))
    samples = d.change("samples/s")
    assert samples.a == pytest.approx(8 / 4e-3) and samples.b > 0
    assert (samples.change, samples.verdict) == ("(different work)", "")
    assert "better" not in d.to_markdown() and "worse" not in d.to_markdown()


def test_untimed_side_compares_expected_step_times():
    est, real = roofline(toy_profile(timed=False), a100()), roofline(toy_profile(), a100())
    d = diff_reports(est, real)
    assert d.basis == "expected kernel time" and any("untimed" in n for n in d.notes)
    step = d.change("step time")  # like with like: the expected step time on both sides, never measured vs expected
    assert step.figure == "step time (expected)"
    assert step.a == pytest.approx(est.summary.estimated_step_s)
    assert step.b == pytest.approx(real.summary.estimated_step_s)
    assert d.change("MFU").figure == "MFU (expected)"
    # throughput on the same basis: samples per expected step on both sides (the measured side printed its
    # measured step's samples/s beside the expected step time)
    est, real = (roofline(_with_inputs(toy_profile(timed=t)), a100()) for t in (False, True))
    samples = diff_reports(est, real).change("samples/s")
    assert samples.figure == "samples/s (expected)"
    assert samples.a == pytest.approx(8 / est.summary.estimated_step_s)
    assert samples.b == pytest.approx(8 / real.summary.estimated_step_s)  # 8 samples a step, not 8 / 4 ms


def test_cli_diff(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    a, b, out = tmp_path / "a.json", tmp_path / "b.json", tmp_path / "d.json"
    a.write_text(json.dumps({"profile": toy_profile().to_dict(), "device": "a100"}))
    b.write_text(json.dumps({"profile": _faster().to_dict(), "device": "a100"}))
    assert main(["diff", str(a), str(b), "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "## Step diff — a.json → b.json" in text and "| step time | 4 ms | 3.6 ms | -10% (1.11x faster) |" in text
    assert json.loads(out.read_text())["layers"]["rows"][0]["name"] == "blocks.0.fc"
    # a saved step report is read as the callback wrote it (the numbers the dashboard shows)
    rep = tmp_path / "step_5.json"
    rep.write_text(json.dumps(_report(_faster(), step_dev=0.2e-3).to_dict()))
    assert main(["diff", str(a), str(rep)]) == 0
    assert "| step time | 4 ms | 3.6 ms |" in capsys.readouterr().out
    assert main(["diff", str(a), str(tmp_path / "missing.json")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("tscope diff: cannot read") and len(err.strip().splitlines()) == 1


def test_mfu_change_is_on_one_roof_when_the_steps_roofs_differ():
    # two CPU steps whose measured matrix roofs were widened by different amounts (99.05 vs 95.43 GFLOP/s in a demo
    # run) showed "MFU +2.5 pts" for the same work in the same time; here the same step on a 312 and a 324.48
    # (4% wider) TFLOP/s bf16 roof
    spec_a = a100()
    spec_b = replace(spec_a, flops={**spec_a.flops, "bf16": 312e12 * 1.04})
    a, b = roofline(toy_profile(), spec_a), roofline(toy_profile(), spec_b)
    assert b.summary.mfu == pytest.approx(a.summary.mfu / 1.04)  # the same step reads 4% lower MFU on the wider roof
    d = diff_reports(a, b)
    mfu = d.change("MFU")
    assert mfu.change == "+0 pts"  # on A's roof: B's MFU x 324.48 / 312 = A's
    # the row shows the figures its change is the difference of: B on A's roof (B's own beside a change on another
    # roof read "61.4% -> 59.5%: -3.34 pts, worse")
    assert mfu.figure == "MFU on A's roof" and mfu.b == pytest.approx(a.summary.mfu) and mfu.text(mfu.b) == \
        mfu.text(mfu.a)
    assert any(f"B on its own roof: {pct_text(b.summary.mfu)}" in n for n in d.notes), d.notes
    assert any("MFU roofs differ (312 TFLOP/s vs 324 TFLOP/s)" in n for n in d.notes), d.notes


def test_a_what_if_side_is_said_in_the_diff():
    # `tscope diff --gpu h100` of two CPU steps warned "a what-if, labelled so in the report" and the diff said nothing
    cpu = dataclasses.replace(toy_profile().info, device_name="CPU (test)", device="cpu", timing="cpu-wall")
    a, b = toy_profile(), toy_profile()
    a.info = b.info = cpu
    with pytest.warns(UserWarning, match="Leave the device out"):
        ra = roofline(a, a100())
    rb = roofline(b, a100())
    assert ra.what_if is not None and rb.what_if is not None
    d = diff_reports(ra, rb, labels=("before", "after"))
    notes = [n for n in d.notes if "is a what-if" in n]
    assert notes == [f"{x} is a what-if: times measured on {ra.what_if.measured_on} placed on the roofs of "
                     f"{a100().name} (its MFU and % of roof compare two devices)" for x in ("before", "after")]
    assert not [n for n in diff_reports(_report(toy_profile()), _report(toy_profile())).notes if "what-if" in n]


def test_cli_labels_say_which_run_each_file_is():
    from tscope_callbacks.cli.diff import labels

    a, b = "logs/tscope_demo/version_0/tscope/step_10.json", "logs2/tscope_demo/version_0/tscope/step_10.json"
    assert labels(a, b) == ("logs/…/step_10.json", "logs2/…/step_10.json")
    assert labels("logs/tscope_demo/version_0/tscope/step_150.json", "logs2/tscope_demo/version_0/tscope/step_80.json") \
        == ("logs/…/step_150.json", "logs2/…/step_80.json")  # two names, two runs: each run said
    assert labels("run/tscope/step_10.json", "run/tscope/step_50.json") == ("step_10.json", "step_50.json")
    assert labels("d/version_0/tscope/step_10.json", "d/version_1/tscope/step_10.json") == (
        "version_0/tscope/step_10.json", "version_1/tscope/step_10.json")


def test_cli_and_page_list_the_same_rows_and_sum_the_rest_alike():
    # the CLI listed 15 layers and "(9 more)", the page 12 and "(12 more)" without a ratio: one row count for both,
    # and the rest's row has its ratio on both
    import inspect

    from tscope_callbacks.analysis.diff import DIFF_TOP
    from tscope_callbacks.render.dashboard import step_diff

    assert inspect.signature(step_diff).parameters["top"].default == DIFF_TOP
    assert inspect.signature(diff_reports(_report(_toy()), _report(_toy())).to_markdown).parameters["top"].default \
        == DIFF_TOP
    slower = _toy()
    slower.ops = [dataclasses.replace(o, time_s=o.time_s * 1.5) if o.time_s else o for o in slower.ops]
    d = diff_reports(_report(_toy()), _report(slower))
    more = d.to_dict(top=2)["layers"]["more"]
    assert more["n"] == len(d.layers) - 2 and more["ratio_text"] == "1.500x"  # every op 1.5x: the rest too
    (line,) = [ln for ln in d.to_markdown(top=2).splitlines() if ln.startswith(f"| ({more['n']} more)")]
    assert "| 1.500x |" in line
