"""The one report type: every entry point returns the same frozen, typed ``ts.StepReport``, read back from its JSON
unchanged, with its renderings one call away."""

from __future__ import annotations

import dataclasses
import json

import pytest

import tscope_callbacks as ts
from tests.profiles import a100, toy_profile
from tscope_callbacks import AnalyzeOptions, StepReport, analyze, load_step_file

SCHEMA, VERSION = "tscope.step_report", 3


@pytest.mark.parametrize("timed", [True, False])
def test_json_round_trip(timed):
    r = analyze(toy_profile(timed), a100())
    d = r.to_dict()
    assert d["schema"] == SCHEMA and d["version"] == VERSION
    text = json.dumps(d, allow_nan=False)  # no inf/nan anywhere
    back = StepReport.from_dict(json.loads(text))
    assert back.to_dict() == d
    assert back == r  # every typed field read back equal (tuples stay tuples, floats stay floats)


def test_every_entry_point_returns_the_one_report_type(tmp_path):
    import torch

    prof = toy_profile(True)
    reports = [ts.analyze(prof, a100()), ts.roofline(prof, a100())]
    model = torch.nn.Linear(8, 4)
    reports.append(ts.analyze_model(model, input_shape=[(2, 8)], gpu="h100"))
    p = tmp_path / "step_3.json"
    p.write_text(json.dumps({"profile": prof.to_dict(), "device": a100().to_dict(), "report": reports[0].to_dict()}))
    reports.append(ts.load_step_file(p))
    for r in reports:
        assert type(r) is ts.StepReport
        assert r.to_markdown(top=3).startswith("## Roofline")
    # read back from its step file: the same report, its profile too (so its trace can be written)
    assert reports[-1] == reports[0] and reports[-1].profile.to_dict() == prof.to_dict()
    reports[-1].save_trace(tmp_path / "trace.json")
    assert json.loads((tmp_path / "trace.json").read_text())["traceEvents"]


def test_frozen_and_typed_sections():
    r = analyze(toy_profile(True), a100())
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.step = 3  # type: ignore[misc]
    assert set(r.rows) == {"layer_phase", "layer", "inclusive", "category", "op_name", "total"}
    assert len(r.ops) == r.summary.n_ops == 12
    for key in ("step_ms", "estimated_step_ms", "mfu", "mbu", "hfu", "achieved_tflops", "tokens_per_s",
                "samples_per_s", "memory_peak_bytes", "flop_coverage"):
        assert key in r.header and r.header[key].basis
    # the header's MFU is the summary's, its step the measured step in ms
    assert r.header["mfu"].value == r.summary.mfu
    assert r.header["step_ms"].value == pytest.approx(r.summary.measured_step_s * 1e3)
    # rows sum to the total (self attribution): layer x phase FLOPs add up to every op's FLOPs
    assert sum(x.flops for x in r.rows["layer_phase"]) == r.totals.flops == sum(o.flops for o in r.ops)


def test_grouped_table_sums_to_total():
    r = analyze(toy_profile(True), a100())
    rows = r.table("layer_phase", top=2)
    assert rows[-1].name.startswith("(other ")
    assert sum(x.flops for x in rows) == r.totals.flops
    assert sum(x.bytes for x in rows) == r.totals.bytes
    assert sum(x.measured_s or 0.0 for x in rows) == pytest.approx(r.totals.measured_s)


def test_what_if_is_typed():
    r = analyze(toy_profile(True), a100(), AnalyzeOptions(what_if="this machine's CPU"))
    assert r.what_if is not None and r.what_if.measured_on == "this machine's CPU"
    assert r.what_if.roofs_of == "NVIDIA A100-SXM4-80GB"
    assert r.memory is None or r.memory.device_bytes is None  # a what-if is not checked against the roofs' memory


@pytest.mark.parametrize("content, msg", [
    ('{"schema": "tscope.step_report", "version": 3, "step": 3, "dev', "not valid JSON, perhaps half-written"),
    ('{"schema": "tscope.step_report", "version": 7}', "version 7"),
    ('{"profile": {"ops": []}, "device": null, "report": {"version": 1}}', "step file of version 1; this tscope "
                                                                        "reads version 3"),
    ('{"profile": {"ops": []}, "device": null, "report": {"schema": "tscope.step_report", "version": 2}}',
     "step file of version 2; this tscope reads version 3: profile the step again"),
    ('{"profile": {"ops": []}, "device": null, "report": null}', "no report"),
    ('{"schema": "tscope.step_report", "version": 3, "step": 3}', "malformed step report"),
    ("[1, 2]", "JSON object"),
])
def test_load_step_file_errors_are_one_line(tmp_path, content, msg):
    p = tmp_path / "step_3.json"
    p.write_text(content)
    with pytest.raises(ValueError) as e:  # a StepFileError
        load_step_file(p)
    assert msg in str(e.value) and "\n" not in str(e.value)


def test_load_step_file_reads_both_layouts(tmp_path):
    r = analyze(toy_profile(True), a100())
    p = tmp_path / "step_7.json"
    p.write_text(json.dumps(r.to_dict()))
    assert load_step_file(p) == r and load_step_file(p).profile is None
    p.write_text(json.dumps({"profile": toy_profile(True).to_dict(), "device": a100().to_dict(),
                             "report": r.to_dict()}))
    assert load_step_file(p) == r


# ---------------- every output is a function of the StepReport alone ----------------
def _reports():
    from tscope_callbacks import api

    api._WARNED_WHAT_IF.clear()  # warned once per (devices) pair and process: an earlier test may have had it

    yield ts.roofline(toy_profile(True), a100())
    yield ts.roofline(toy_profile(False), a100())
    # a what-if: times of this machine's CPU on an A100's roofs
    p = toy_profile(True)
    p.info = dataclasses.replace(p.info, device="cpu")
    with pytest.warns(UserWarning, match="what-if"):
        yield ts.roofline(p, a100())


def test_markdown_csv_plot_of_the_read_back_report_are_the_originals(tmp_path):
    for i, r in enumerate(_reports()):
        back = StepReport.from_dict(json.loads(json.dumps(r.to_dict(), allow_nan=False)))
        assert back.to_markdown(top=3) == r.to_markdown(top=3)
        assert back.to_markdown() == r.to_markdown()
        r.to_csv(tmp_path / f"a{i}.csv")
        back.to_csv(tmp_path / f"b{i}.csv")
        assert (tmp_path / f"a{i}.csv").read_text() == (tmp_path / f"b{i}.csv").read_text()
        fa, fb = r.figure(), back.figure()
        assert fa.axes[0].get_title() == fb.axes[0].get_title()
        assert [len(c.get_offsets()) for c in fa.axes[0].collections] == [len(c.get_offsets())
                                                                          for c in fb.axes[0].collections]


def test_rendering_does_not_change_the_report(tmp_path):
    """Rendering is pure: the report is the same (equal, and the same JSON) after every rendering."""
    rep = ts.roofline(toy_profile(True), a100())
    first, d = rep.to_markdown(top=5), rep.to_dict()
    rep.to_csv(tmp_path / "r.csv")
    rep.plot(tmp_path / "r.png")
    rep.to_html(tmp_path / "r.html")
    rep.save_trace(tmp_path / "t.json")
    assert rep.to_markdown(top=5) == first and rep.to_dict() == d


def test_cli_report_reads_a_step_file_back(tmp_path, capsys):
    from tests.test_report import cli_main

    rep = ts.roofline(toy_profile(True), a100())
    path = tmp_path / "step_7.json"
    path.write_text(json.dumps({"profile": toy_profile(True).to_dict(), "device": a100().to_dict(),
                                "report": rep.to_dict()}))
    trace = tmp_path / "trace.json"
    assert cli_main(["report", str(path), "--top", "4", "--trace", str(trace), "--print"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(rep.to_markdown(top=4))
    assert json.loads(trace.read_text())["traceEvents"]
    # a file of another version: one line naming it, exit 2
    d = rep.to_dict()
    path.write_text(json.dumps({"profile": toy_profile(True).to_dict(), "report": {**d, "version": 2}}))
    assert cli_main(["report", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert "version 2" in err and "reads version 3" in err and len(err.splitlines()) == 1
    # half-written
    path.write_text(json.dumps(d)[:500])
    assert cli_main(["report", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert "not valid JSON" in err and len(err.splitlines()) == 1


def test_header_figures_by_hand():
    """One bf16 matmul [4096, 4096] x [4096, 4096] timed 2 ms, a 4 ms unprofiled step, on the A100's roofs."""
    from tests.profiles import make_profile, matmul, pointwise

    prof = make_profile([matmul(4096, 4096, 4096, time_s=2e-3, layer="fc"),
                         pointwise(4096 * 4096, dtype="bfloat16", time_s=1e-3, layer="act")],
                        step_time_s=4e-3, step_time_basis="unprofiled-median", step_time_steps=5)
    r = analyze(prof, a100(), AnalyzeOptions(kernel_model=False))
    flops = 2 * 4096**3 + 4096 * 4096  # 137,438,953,472 + 16,777,216 = 137,455,730,688
    # bytes: matmul reads 2 x 4096^2 x 2 B and writes 4096^2 x 2 B = 100,663,296; relu reads + writes 4096^2 x 2 B
    # = 67,108,864; total 167,772,160
    assert r.totals.flops == flops and r.totals.bytes == 167_772_160
    h = r.header
    assert h["step_ms"].value == pytest.approx(4.0) and h["step_ms"].basis == "median of 5 unprofiled steps, wall clock"
    # 137,455,730,688 FLOP / 4 ms = 34.36 TFLOP/s; MFU against the bf16 matrix roof 312 TFLOP/s: 11.01%
    assert h["achieved_tflops"].value == pytest.approx(flops / 4e-3 / 1e12)
    assert h["mfu"].value == pytest.approx(flops / 4e-3 / 312e12)
    # MBU: 167,772,160 B / 4 ms = 41.9 GB/s of 2039 GB/s: 2.06%
    assert h["mbu"].value == pytest.approx(167_772_160 / 4e-3 / 2.039e12)
    # the roofline bound of the matmul: 137.4 GFLOP / 312 TFLOP/s = 0.4405 ms (compute-bound: 100.7 MB at 2039 GB/s
    # is 0.049 ms); the relu's: 67.1 MB / 2039 GB/s = 0.0329 ms; step estimate their sum
    assert h["estimated_step_ms"].value == pytest.approx((2 * 4096**3 / 312e12 + 67_108_864 / 2.039e12) * 1e3)
    assert h["flop_coverage"].value == 1.0
    # time split: the matmul's 2 ms compute-bound, the relu's 1 ms memory-bound
    assert r.time_split.compute_bound_s == pytest.approx(2e-3) and r.time_split.memory_bound_s == pytest.approx(1e-3)
    # the parts add up to the 4 ms unprofiled step: 3 ms of op time and 1 ms outside the ops (not the capture's own
    # wall time, slowed by the capture)
    assert r.time_split.step_s == pytest.approx(4e-3) and r.time_split.idle_s == pytest.approx(1e-3)
    assert r.scalars["mfu"] == h["mfu"].value and r.scalars["measured_step_ms"] == pytest.approx(4.0)


def test_rows_below_their_roof_with_no_known_change_are_not_opportunities_and_read_back():
    """A slow row for which no change is known is in ``below_roof`` (with what the numbers say), never an
    opportunity; every opportunity names a change, a saving and how the saving was predicted. Both survive JSON."""
    r = analyze(toy_profile(True), a100())
    assert r.below_roof and r.below_roof[0].layer == "blocks.0.fc" and r.below_roof[0].phase == "backward"
    assert "no change known" in r.below_roof[0].cause and r.below_roof[0].recoverable_s > 0
    assert all(o.change and o.saving_s and o.predicted_by and o.predicted_text for o in r.opportunities)
    assert not {(b.layer, b.phase) for b in r.below_roof} & {tuple(x) for o in r.opportunities for x in o.rows}
    back = StepReport.from_dict(json.loads(json.dumps(r.to_dict(), allow_nan=False)))
    assert back.below_roof == r.below_roof and back.opportunities == r.opportunities
    assert analyze(toy_profile(False), a100()).below_roof == ()  # untimed: nothing measured below anything
