"""The typed StepReport: built once by ``analyze``, frozen, and read back from its JSON unchanged."""

from __future__ import annotations

import dataclasses
import json

import pytest

import tscope_callbacks as ts
from tests.profiles import a100, toy_profile
from tscope_callbacks.analysis.analyze import AnalyzeOptions, analyze
from tscope_callbacks.analysis.report import SCHEMA, VERSION, StepFileError, StepReport, load_step_file


@pytest.mark.parametrize("timed", [True, False])
def test_json_round_trip(timed):
    r = analyze(toy_profile(timed), a100())
    d = r.to_dict()
    assert d["schema"] == SCHEMA and d["version"] == VERSION == 2
    text = json.dumps(d, allow_nan=False)  # no inf/nan anywhere
    back = StepReport.from_dict(json.loads(text))
    assert back.to_dict() == d
    assert back == r  # every typed field read back equal (tuples stay tuples, floats stay floats)


def test_top_level_names():
    assert ts.StepReport is StepReport and ts.analyze is analyze and ts.load_step_file is load_step_file


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
    ('{"schema": "tscope.step_report", "version": 2, "step": 3, "dev', "not valid JSON, perhaps half-written"),
    ('{"schema": "tscope.step_report", "version": 7}', "version 7"),
    ('{"profile": {"ops": []}, "device": null, "report": null}', "version 1 step file"),
    ('{"schema": "tscope.step_report", "version": 2, "step": 3}', "malformed step report"),
    ("[1, 2]", "JSON object"),
])
def test_load_step_file_errors_are_one_line(tmp_path, content, msg):
    p = tmp_path / "step_3.json"
    p.write_text(content)
    with pytest.raises(StepFileError) as e:
        load_step_file(p)
    assert msg in str(e.value) and "\n" not in str(e.value)


def test_load_step_file_reads_extra_keys(tmp_path):
    r = analyze(toy_profile(True), a100())
    p = tmp_path / "step_7.json"
    p.write_text(json.dumps({**r.to_dict(), "profile": toy_profile(True).to_dict()}))
    assert load_step_file(p) == r
