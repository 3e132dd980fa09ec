"""Rendering: opportunities and their reasons, markdown, CSV, JSON-safe dict, console, and ``tscope report``."""

from __future__ import annotations

import argparse
import csv
import dataclasses
import functools
import json
import re
import sys

import pytest
from profiles import a100, make_profile, matmul, op, pointwise, toy_profile

from tscope_callbacks import api
from tscope_callbacks import api as specs_mod
from tscope_callbacks.analysis.diagnose import explain
from tscope_callbacks.cli import report as report_cli
from tscope_callbacks.devices.spec import DeviceSpec
from tscope_callbacks.render.markdown import COLUMNS

# A CPU-like roof with a low ridge (1e12 / 1e11 = 10 FLOP/B) so small fp32 matmuls are compute-bound.
CPU = DeviceSpec(name="cpu test", flops={"fp32": 1e12}, bandwidth=1e11, vector_flops={"fp32": 1e11}, measured=True)

# these tests check the roofline arithmetic itself: no shape-aware kernel model on top of it
roofline = functools.partial(api.roofline, kernel_model=False)


def _row(ops, spec=None, **meta):
    return roofline(make_profile(ops, **meta), spec or a100()).rows["layer_phase"][0]


def test_rows_below_their_roof_are_ranked_by_recoverable_time_and_are_not_opportunities():
    rep = roofline(toy_profile(), a100())
    below = rep.below_roof[:3]
    # recoverable: fc bwd 2.2 - 0.881 = 1.319 ms; fc fwd 0.801 - 0.4405 = 0.36 ms (1.8x its roof);
    # blocks.1.fc 0.3 - 0.110 = 0.19 ms (2.7x)
    assert [(r.layer, r.phase) for r in below] == [("blocks.0.fc", "backward"), ("blocks.0.fc", "forward"),
                                                   ("blocks.1.fc", "forward")]
    assert below[0].recoverable_s == pytest.approx(2.2e-3 - 2 * 2 * 4096**3 / 312e12)
    assert below[0].type == "Linear" and "compute-bound, 40% of roof" in below[0].cause
    assert "no change known" in below[0].cause
    # an opportunity names a change: these rows are none
    assert all(o.change and o.saving_s for o in rep.opportunities[:10])
    assert not any(o.layer == "blocks.0.fc" for o in rep.opportunities[:10])
    # untimed: nothing was measured to be below anything
    assert roofline(toy_profile(timed=False), a100()).below_roof == ()


def test_reason_memory_bound_bf16_and_fp32():
    # gelu on 2^24 bf16: 2^24 FLOPs / 2^26 B = 0.25 FLOP/B; bf16 vector ridge 39e12/2.039e12 = 19.1
    # estimate 2^26 / 2.039e12 = 32.9 us, measured 100 us -> 32.9% of roof
    r = _row([pointwise(1 << 24, dtype="bfloat16", time_s=100e-6)])
    assert explain(r) == "memory-bound at 0.25 FLOP/B (ridge 19.1); 32.9% of roof"
    r32 = _row([pointwise(1 << 24, time_s=200e-6)])  # fp32: 0.125 FLOP/B, ridge 9.56, 2^27 B -> 65.8 us: 33%
    assert explain(r32) == "memory-bound at 0.125 FLOP/B (ridge 9.56); 32.9% of roof"  # says where, names no change


def test_reason_launch_bound_many_tiny_ops():
    # 100 adds on 1024 fp32 elements, 5 us each: 8 KiB / 2.039e12 = 4 ns each -> 0.0804% of roof (4.02 ns / 5 us), mean 5 us < 10 us
    r = _row([pointwise(1024, name="aten.add", time_s=5e-6) for _ in range(100)])
    assert explain(r) == ("memory-bound at 0.125 FLOP/B (ridge 9.56); 0.0804% of roof; "
                          "100 ops of 5 µs each: dispatch or launch overhead")


def test_reason_small_matmul():
    # 128^3 fp32 on the CPU roof: 2*128^3 = 4194304 FLOPs / (3*128^2*4) B = 21.3 >= ridge 10 -> compute-bound;
    # estimate 4.19 us, measured 50 us -> 8.39% of roof; 4.2e6 FLOPs < 2*512^3 -> small
    r = _row([matmul(128, 128, 128, dtype="float32", time_s=50e-6)], CPU)
    assert explain(r) == "compute-bound, 8.39% of roof: small matmul (MxNxK=128x128x128)"


def test_reason_names_no_change_and_near_roof():
    # fp32 4096^3 on A100 without TF32: estimate 137438953472 / 19.5e12 = 7.048 ms, measured 10 ms -> 70.5%; the
    # change (TF32) is the fp32_matmul opportunity's, not the row's reason; every dimension is a multiple of 64, so
    # nothing is said about shapes
    r = _row([matmul(4096, 4096, 4096, dtype="float32", time_s=10e-3)])
    assert explain(r) == "compute-bound, 70.5% of roof"
    # bf16 4096^3: 0.4405 ms estimate at 0.5 ms -> 88%
    assert explain(_row([matmul(4096, 4096, 4096, time_s=0.5e-3)])) == "compute-bound, 88.1% of roof: near roof"


def test_reason_uncounted_and_untimed():
    r = _row([op("aten.nonzero", counted=False, category="other", read=4096, time_s=1e-4)])
    assert explain(r) == ("no FLOP formula for aten.nonzero (1 calls): the roofline cannot place its time (give it "
                          "one: `ts.profile(model, formulas={\"aten.nonzero\": fn})`)")
    assert explain(_row([matmul(4096, 4096, 4096)])) == "compute-bound"
    assert explain(_row([pointwise(1 << 20)])) == "memory-bound at 0.125 FLOP/B (ridge 9.56)"


def test_markdown_has_columns_header_and_opportunities():
    md = roofline(toy_profile(), a100()).to_markdown(top=20)
    # no kernel model (roofline arithmetic only): no "expected ms" column
    assert "| " + " | ".join(c for c in COLUMNS if c != "expected ms") + " | advice |" in md
    assert "| " + " | ".join(COLUMNS) + " | advice |" in api.roofline(toy_profile(), a100()).to_markdown(top=20)
    # a row below its roof for which no change is known says so in the table, and under its own heading
    bwd = next(ln for ln in md.splitlines() if ln.startswith("| `blocks.0.fc` | Linear | backward"))
    assert bwd.endswith("| no known change |")
    assert "### Below their roof, no known change" in md and "`blocks.0.fc` backward — 1.32 ms above expected" in md
    assert COLUMNS == ["layer", "type", "phase", "GFLOPs", "MiB", "FLOP/B", "bound", "roof ms", "expected ms",
                       "measured ms", "% of roof"]
    for s in ("NVIDIA A100-SXM4-80GB", "**MFU**", "**MBU**", "datasheet", "bf16 matrix 312 TFLOP/s",
              "measured 4 ms (median of 8 unprofiled steps, wall clock)", "captured region 9 ms wall", "FLOP coverage", "### Opportunities", "`blocks.0.fc` | Linear | backward",
              "| **total** |", "### By op class", "aten.nonzero ×1",
              # the time split is of the unprofiled 4 ms step, as the dashboard's: the ops' own time (0.8 + 0.001 +
              # 0.1 + 0.3 + 0.05 + 0.04 + 1.2 + 1.0 + 0.2 + 0.003 + 0.003 + 0.15 = 3.847 ms) by bound, and the
              # remaining 0.153 ms (3.82%) outside ops
              "**Time** (the 4 ms step: measured op time + the rest of the step)",
              "3.82% outside ops (host: Python, hooks, data) (153 µs)"):
        assert s in md, s
    assert "% of achievable" not in md
    ach = DeviceSpec(name="measured", flops={"bf16": 250e12}, bandwidth=1.7e12, vector_flops={"bf16": 30e12,
                                                                                                "fp32": 15e12})
    assert "% of achievable" in roofline(toy_profile(), a100(achievable=ach)).to_markdown()


def test_time_line_names_no_rest_when_the_ops_fill_the_step():
    # ops slower than the unprofiled step (3.847 ms of op time against a 3 ms step): the parts are scaled to the
    # step and nothing is left beside them, so the line does not promise "+ the rest of the step" it then omits
    p = toy_profile()
    p.info = dataclasses.replace(p.info, step_time_s=3.0e-3)
    md = roofline(p, a100()).to_markdown()
    (line,) = [ln for ln in md.splitlines() if ln.startswith("- **Time**")]
    assert line.startswith("- **Time** (the 3 ms step: measured op time, scaled x0.78 to the unprofiled step")
    assert "rest of the step" not in line and "outside ops" not in line


def test_markdown_untimed_has_no_measured_columns():
    md = roofline(toy_profile(timed=False), a100()).to_markdown()
    assert "not timed" in md and "estimated 1.6 ms" in md  # 1.605 ms, 3 significant figures
    assert "**Time** (estimated)" in md and "outside ops" not in md
    assert "untimed: every time is an estimate (roof ms: the roofline bound" in md and "% of roof\" =" not in md
    assert re.search(r"MFU at the estimate [\d.]+%, MBU [\d.]+%", md)
    # an estimate measured nothing: the tables drop the measured time and the % of roof instead of leaving them blank
    (head,) = [ln for ln in md.splitlines() if ln.startswith("| layer |")]
    assert head == "| layer | type | phase | GFLOPs | MiB | FLOP/B | bound | roof ms |"
    line = next(ln for ln in md.splitlines() if ln.startswith("| `blocks.0.fc` | Linear | forward"))
    assert line.endswith("| compute | 0.441 |")  # 0.4405 ms, in the one formatter (3 significant figures)
    (cls,) = [ln for ln in md.splitlines() if ln.startswith("| class |")]
    assert cls == "| class | ops | GFLOPs | MiB | roof ms |" and "### By op class (roof, untimed)" in md
    timed = roofline(toy_profile(), a100()).to_markdown()
    assert "| roof ms | measured ms | % of roof |" in timed and "measured/roof" in timed


def test_csv_has_every_row_ungrouped(tmp_path):
    rep = roofline(toy_profile(), a100(), group_small=0.5)
    path = tmp_path / "r.csv"
    rep.to_csv(path)
    rows = list(csv.DictReader(path.open()))
    n = len(rep.rows["layer_phase"]) + len(rep.rows["layer"]) + len(rep.rows["inclusive"]) + len(rep.rows["category"])
    assert len(rows) == n + len(rep.rows["op_name"]) + 1
    assert not any(r["name"].startswith("(other") for r in rows)
    layer = [r for r in rows if r["table"] == "layer"]
    assert sum(int(r["flops"]) for r in layer) == rep.summary.total_flops


@pytest.mark.parametrize("timed", [True, False])
def test_to_dict_is_json_safe(timed):
    d = roofline(toy_profile(timed), a100()).to_dict()
    s = json.dumps(d, allow_nan=False)
    assert d["schema"] == "tscope.step_report" and {"summary", "rows", "ops", "opportunities", "noise"} <= set(d)
    assert not {"header", "scalars", "area_scalars"} & set(d)  # derived from the stored sections: each figure once
    back = json.loads(s)
    assert back["summary"]["device"] == "NVIDIA A100-SXM4-80GB" and back["rows"]["total"][0]["flops"] > 0


def test_console_rich_and_plain_fallback(capsys, monkeypatch):
    rep = roofline(toy_profile(), a100())
    rep.to_console(top=5)
    out = capsys.readouterr().out
    assert "blocks.0.fc" in out and "% of roof" in out and "total" in out
    monkeypatch.setitem(sys.modules, "rich.console", None)  # rich not installed -> the markdown, printed
    rep.to_console(top=5)
    assert capsys.readouterr().out.strip() == rep.to_markdown(top=5).strip()


# ---------------- tscope report ----------------
def cli_main(argv: list[str]) -> int:
    """``tscope report ...`` as cli.py routes it (add_arguments + run), without importing every other subcommand
    (cli.build_parser imports the demo, hence Lightning: ~10 s)."""
    assert argv[0] == "report"
    p = argparse.ArgumentParser(prog="tscope report")
    report_cli.add_arguments(p)
    return report_cli.run(p.parse_args(argv[1:]))


def _save(tmp_path, wrapped: bool):
    prof = toy_profile()
    path = tmp_path / ("wrapped.json" if wrapped else "plain.json")
    data = {"profile": prof.to_dict(), "device": a100().to_dict()} if wrapped else prof.to_dict()
    path.write_text(json.dumps(data))
    return path


def test_cli_routes_report_here():
    from tscope_callbacks.cli import _COMMANDS

    assert _COMMANDS["report"][0] == "tscope_callbacks.cli.report"


def test_cli_report_prints_table_and_writes_plot(tmp_path, capsys):
    png, out_csv = tmp_path / "roof.png", tmp_path / "roof.csv"
    rc = cli_main(["report", str(_save(tmp_path, True)), "--top", "5", "--plot", str(png), "--csv", str(out_csv),
                   "--print"])  # with file outputs the table is printed when asked
    out = capsys.readouterr().out
    assert rc == 0 and "| layer | type | phase |" in out and "### Opportunities" in out
    assert png.stat().st_size > 10_000 and out_csv.stat().st_size > 0


def test_cli_report_plain_profile_resolves_recorded_device(tmp_path, capsys, monkeypatch):
    names = []
    monkeypatch.setattr(specs_mod, "get_device_spec", lambda n="auto": names.append(n) or a100())
    assert cli_main(["report", str(_save(tmp_path, False))]) == 0
    assert names == ["NVIDIA A100-SXM4-80GB"] and "blocks.0.fc" in capsys.readouterr().out
    assert cli_main(["report", str(_save(tmp_path, False)), "--gpu", "H100"]) == 0 and names[-1] == "H100"


@pytest.mark.parametrize(("content", "msg"), [(None, "cannot read"), ("{not json", "not valid JSON"),
                                              ('{"a": 1}', "not a profiled step"), ("[1, 2]", "not a profiled step")])
def test_cli_report_bad_input_is_one_line_exit_2(tmp_path, capsys, content, msg):
    path = tmp_path / "bad.json"
    if content is not None:
        path.write_text(content)
    assert cli_main(["report", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert msg in err and len(err.splitlines()) == 1


def test_rows_with_no_work_sit_on_no_roof():
    # the dashboard's op classes read "view · % of roof 0%" (no FLOPs, no bytes: a roof time of 0 over 1 µs measured),
    # which reads as far below the roof; a row with no work to place has no % of roof
    rep = roofline(toy_profile(), a100())  # its aten.view: 1 µs, no FLOPs, no bytes
    rows = [r for key in ("category", "op_name", "layer_phase") for r in rep.rows[key]]
    views = [r for r in rows if r.estimate_s == 0 and r.measured_s]
    assert views and all(r.attained is None and r._derived()["pct_of_roof"] is None for r in views)  # (the JSON)
    assert any(r.name == "view" for r in rep.rows["category"] if r in views)
    assert all(o.pct_of_roof is None for o in rep.ops if o.estimate_s == 0)
    worked = [r for r in rows if r.estimate_s and r.measured_s]
    assert worked and all(r.attained == pytest.approx(r.estimate_s / r.measured_s) for r in worked)


def test_a_step_without_layer_details_says_where_its_memory_peak_is():
    # the CLI report of a step without layer details left the Memory line out; the page said why, the report not
    import torch

    import tscope_callbacks as ts

    m = torch.nn.Linear(8, 8)
    opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
    for details in (False, True):
        with ts.profile(m, layer_details=details) as p:
            m(torch.randn(4, 8)).sum().backward()
            opt.step()
        md = ts.roofline(p.result, "auto").to_markdown()
        [line] = [ln for ln in md.splitlines() if ln.startswith("- **Memory**")]
        # 8x8 + 8 fp32 parameters: 288 B = 0.000275 MiB, their gradients the same, momentum buffers the same
        assert line.startswith("- **Memory** (this rank, MiB): weights 0.000275 · gradients 0.000275 · optimizer "
                               "state 0.000275"), line
        assert ("the step peak and saved activations need layer details" in line) is not details
        assert ("step peak about" in line) is details
