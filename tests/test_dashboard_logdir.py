"""``dashboard/logdir.py`` and the TensorBoard plugin's routes, in process (no server, no fit: synthetic files).

A log dir with readable, corrupt, half-written, empty, older- and newer-schema step files: the readable ones are
shown, the others listed as unreadable with a one-line reason naming the schema version; trace/layers outputs are not
steps; runs are named as TensorBoard names them; a run still being written shows new steps and a file completed
after a half-written read. The plugin's routes answer JSON for every bad input (werkzeug's test client on the WSGI
apps TensorBoard mounts).
"""

from __future__ import annotations

import functools
import json
import os
import time
from pathlib import Path

import pytest
from profiles import a100, toy_profile

import tscope_callbacks as ts
from tscope_callbacks.dashboard import logdir as ld

V3 = {"schema": "tscope.step_report", "version": 3}


@functools.cache
def _base() -> str:
    return json.dumps(ts.analyze(toy_profile(), a100()).to_dict())


def _report(step: int, mfu: float, n_ops: int = 3) -> dict:
    """A report (the toy profile's) with this MFU and a step of ``10 * step`` ms (its header's figures), and
    ``n_ops`` made-up ops."""
    ops = [{"i": i, "op": "aten::mm", "layer": ("model.fc" if i % 2 == 0 else "model.fc.sub") if i < n_ops - 1
            else "model.head", "phase": "forward"} for i in range(n_ops)]
    d = json.loads(_base())
    d["summary"].update(mfu=mfu, measured_step_s=step / 100)
    return {**d, "step": step, "stage": "train", "ops": ops}


def _write(path: Path, obj: object | str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(obj if isinstance(obj, str) else json.dumps(obj))
    return path


@pytest.fixture()
def logdir(tmp_path: Path) -> Path:
    run = tmp_path / "demo" / "version_0" / "tscope"
    _write(run / "step_1.json", {"profile": {}, "device": None, "report": _report(1, 0.25)})  # report under a key
    _write(run / "step_3.json", {**_report(3, 0.5), "profile": {"ops": []}, "device_spec": {}})  # at the top level
    full = json.dumps(_report(5, 0.75))
    _write(run / "step_5.json", full[: len(full) // 2])  # half-written
    _write(run / "step_7.json", "")  # created, nothing written yet
    _write(run / "step_9.json", "{not json")  # corrupt
    _write(run / "step_11.json", {"report": {"rows": [], "summary": {}}})  # before schemas: no version field
    _write(run / "step_13.json", {"schema": "tscope.step_report", "version": 1, "rows": {}})
    _write(run / "step_15.json", {"schema": "tscope.step_report", "version": 4})
    _write(run / "validation_step_2.json", _report(2, 0.1))
    _write(run / "trace_step_3.json", {"traceEvents": []})  # not a step report
    _write(run / "layers_step_3.json", {"layers": []})
    _write(run / "validation_trace_step_3.json", {"traceEvents": []})
    _write(tmp_path / "tscope" / "step_4.json", _report(4, 0.3))  # the log dir itself is a run: "."
    (tmp_path / "other" / "version_0").mkdir(parents=True)  # no tscope data: not a run
    return tmp_path


def _steps(idx: dict, run: str) -> dict[tuple[str, int], dict]:
    r = next(r for r in idx["runs"] if r["run"] == run)
    return {(s["stage"], s["step"]): s for s in r["steps"]}


def test_scan_lists_every_step_and_why_one_cannot_be_read(logdir: Path) -> None:
    idx = ld.scan(logdir)
    assert idx["hint"] is None
    assert [r["run"] for r in idx["runs"]] == [".", "demo/version_0"]
    steps = _steps(idx, "demo/version_0")
    assert list(steps) == [("train", n) for n in (1, 3, 5, 7, 9, 11, 13, 15)] + [("validation", 2)]
    assert {k for k, s in steps.items() if s["readable"]} == {("train", 1), ("train", 3), ("validation", 2)}
    err = {k[1]: s["error"] for k, s in steps.items() if not s["readable"]}
    assert "half-written" in err[5] and "step_5.json" in err[5]
    assert "empty" in err[7]
    assert "corrupt" in err[9]
    assert "no schema version" in err[11] and "version 3" in err[11]
    assert "schema version 1" in err[13]
    assert "schema version 4" in err[15] and "upgrade" in err[15]
    assert all("\n" not in e for e in err.values())  # one line each
    assert _steps(idx, ".")[("train", 4)]["readable"]


def test_load_answers_the_report_or_an_error(logdir: Path) -> None:
    run = logdir / "demo" / "version_0"
    assert ld.load(run, 1)["summary"]["mfu"] == 0.25  # the "report" key of the file
    assert ld.load(run, 3)["step"] == 3
    assert "profile" not in ld.load(run, 3) and "device_spec" not in ld.load(run, 3)  # file-only keys
    assert ld.load(run, 2, "validation")["step"] == 2
    assert "schema version 1" in ld.load(run, 13)["error"]
    assert "no such step file" in ld.load(run, 99)["error"]
    assert "error" in ld.load(logdir / "missing", 1)


def test_a_run_being_written_shows_new_and_completed_steps(logdir: Path) -> None:
    run = logdir / "demo" / "version_0"
    assert not _steps(ld.scan(logdir), "demo/version_0")[("train", 5)]["readable"]
    path = _write(run / "tscope" / "step_5.json", _report(5, 0.75))  # the writer finished the file
    os.utime(path, ns=(time.time_ns(), time.time_ns() + 10**9))
    _write(run / "tscope" / "step_17.json", _report(17, 0.8))  # a new profile
    steps = _steps(ld.scan(logdir), "demo/version_0")
    assert steps[("train", 5)]["readable"] and steps[("train", 17)]["readable"]
    assert ld.load(run, 5)["summary"]["mfu"] == 0.75


def test_no_tscope_data_gives_the_hint(tmp_path: Path) -> None:
    (tmp_path / "lightning_logs" / "version_0").mkdir(parents=True)
    idx = ld.scan(tmp_path)
    assert idx["runs"] == [] and "RooflineCallback" in idx["hint"]
    assert "does not exist" in ld.scan(tmp_path / "nope")["hint"]


def test_ops_of_a_layer_and_the_cap(logdir: Path) -> None:
    run = logdir / "demo" / "version_0"
    _write(run / "tscope" / "step_21.json", _report(21, 0.5, n_ops=7))
    fc = ld.ops(run, 21, layer="model.fc")  # the layer and its sub-modules, in execution order
    assert [o["i"] for o in fc["ops"]] == [0, 1, 2, 3, 4, 5] and fc["note"] is None
    assert [o["i"] for o in ld.ops(run, 21, layer="model.head")["ops"]] == [6]
    capped = ld.ops(run, 21, cap=4)
    assert len(capped["ops"]) == 4 and capped["total"] == 7 and "first 4 of 7" in capped["note"]
    assert "error" in ld.ops(run, 9)


def test_series_from_the_event_files_and_the_headers(logdir: Path) -> None:
    from torch.utils.tensorboard import SummaryWriter

    run = logdir / "demo" / "version_0"
    w = SummaryWriter(str(run))
    for step, v in ((1, 0.2), (2, 0.3), (3, 0.4)):  # a profile at 1 and 3, an automatic window at 2
        w.add_scalar("tscope/roofline/mfu", v, step)
    w.add_scalar("tscope/roofline/validation/mfu", 9.0, 2)  # another stage: not in the training series
    w.add_scalar("tscope/layers/model.fc/forward_ms", 1.0, 1)
    w.close()
    s = ld.series(run)
    assert s["mfu"] == [[1, pytest.approx(0.2)], [2, pytest.approx(0.3)], [3, pytest.approx(0.4)]]
    assert s["step_ms"] == [[1, pytest.approx(10.0)], [3, pytest.approx(30.0)]]  # no event series: the profiles'
    # header figures fill it
    assert s["profiles"]["mfu"] == [[1, 0.25], [3, 0.5]]
    assert not any(k.startswith("model.") for k in s)


def test_series_holds_the_step_monitors_scalars_and_alerts(tmp_path: Path) -> None:
    """``tscope/step/*`` and ``tscope/gpu/*`` become ``step/<key>`` and ``gpu/<key>``; the text ``tscope/step/alerts``
    (torch's add_text writes it as ``tscope/step/alerts/text_summary``) becomes ``alerts``: [step, text]."""
    from torch.utils.tensorboard import SummaryWriter

    w = SummaryWriter(str(tmp_path))
    for st in (10, 20):
        w.add_scalar("tscope/step/data_wait_ms", st / 10, st)
        w.add_scalar("tscope/gpu/power_w", 300.0 + st, st)
        w.add_scalar("tscope/step/sub/key", 1.0, st)  # deeper keys are not series
    w.add_text("tscope/step/alerts", "steps 30-34 took 33 ms: host time grew", 34)
    w.add_text("tscope/nan", "NaN guard: non-finite gradient at step 36", 36)  # the NaN guard's: an alert too
    w.add_text("tscope/roofline/table", "not an alert", 34)
    w.close()
    s = ld.series(tmp_path)
    assert s["step/data_wait_ms"] == [[10, 1.0], [20, 2.0]] and s["gpu/power_w"] == [[10, 310.0], [20, 320.0]]
    assert s["alerts"] == [[34, "steps 30-34 took 33 ms: host time grew"],
                           [36, "NaN guard: non-finite gradient at step 36"]]
    assert not any(k.startswith("step/sub") for k in s)
    # the run's alerts file says the same alert (the sinks write both): shown once; one only in the file is added,
    # the NaN guard's too (it was left out: a run's NaN event showed on no page); another key and a half-written
    # last line are not alerts
    lines = [{"step": 34, "key": "tscope/step/alerts", "title": "Slow steps", "text": "steps 30-34 took 33 ms: host "
              "time grew"}, {"step": 12, "key": "tscope/step/alerts", "title": "Loss spike", "text": "loss spike at 12"},
             {"step": 13, "key": "tscope/nan", "title": "NaN", "text": "a NaN"},
             {"step": 14, "key": "tscope/other", "title": "x", "text": "not an alert"}]
    _write(tmp_path / "tscope" / "alerts.jsonl", "".join(json.dumps(a) + "\n" for a in lines) + '{"step": 50, "te')
    assert ld.series(tmp_path)["alerts"] == [[12, "loss spike at 12"], [13, "a NaN"],
                                             [34, "steps 30-34 took 33 ms: host time grew"],
                                             [36, "NaN guard: non-finite gradient at step 36"]]


def test_a_csv_run_shows_the_step_monitors_alerts_from_its_alerts_file(tmp_path: Path) -> None:
    # no event files (CSVLogger, W&B): the alerts come from <log_dir>/tscope/alerts.jsonl, which the sinks write
    from lightning.pytorch.loggers import CSVLogger

    from tscope_callbacks.callbacks.sinks import CSVSink, SinkGroup

    logger = CSVLogger(str(tmp_path), name="run")
    group = SinkGroup([CSVSink(logger)], logger.log_dir)
    group.alert("tscope/step/alerts", "Slow steps at step 40", "steps 36-40 took 2.1x the median: data wait grew", 40)
    group.alert("tscope/nan", "Non-finite gradient at step 41", "NaN guard: ...", 41)
    run = Path(logger.log_dir)
    saved = [json.loads(x) for x in (run / "tscope" / "alerts.jsonl").read_text().splitlines()]
    assert [(a["step"], a["key"], a["title"]) for a in saved] == [
        (40, "tscope/step/alerts", "Slow steps at step 40"), (41, "tscope/nan", "Non-finite gradient at step 41")]
    assert not any(p.name.startswith("events.out") for p in run.iterdir())
    assert ld.series(run)["alerts"] == [[40, "steps 36-40 took 2.1x the median: data wait grew"], [41, "NaN guard: ..."]]


# ------------------------------------------------------------------------------------------------ plugin routes
@pytest.fixture()
def client(logdir: Path):
    from tensorboard.plugins import base_plugin
    from werkzeug.test import Client
    from werkzeug.wrappers import Response

    from tscope_callbacks.dashboard.plugin import TscopePlugin

    plugin = TscopePlugin(base_plugin.TBContext(logdir=str(logdir)))
    apps = plugin.get_plugin_apps()

    def get(route: str, **params: str) -> tuple[int, object]:
        r = Client(apps[route], Response).get(route, query_string=params)
        return r.status_code, (json.loads(r.data) if r.mimetype == "application/json" else r.data.decode())
    return get


def test_plugin_routes(client) -> None:
    code, runs = client("/runs")
    assert code == 200 and [r["run"] for r in runs["runs"]] == [".", "demo/version_0"]
    assert all("dir" not in r for r in runs["runs"])  # server paths stay on the server
    code, step = client("/step", run="demo/version_0", step="3", stage="train")
    assert code == 200 and step["step"] == 3 and "ops" not in step and step["ops_count"] == 3
    _, ops = client("/ops", run="demo/version_0", step="3", layer="model.head")
    assert [o["i"] for o in ops["ops"]] == [2]
    _, series = client("/series", run="demo/version_0")
    assert series["profiles"]["mfu"] == [[1, 0.25], [3, 0.5]]
    code, js = client("/index.js")
    assert code == 200 and "export async function render" in js
    code, page = client("/page")
    assert code == 200 and "<html" in page.lower()


@pytest.mark.parametrize("route,params,needle", [
    ("/step", {"run": "demo/version_0", "step": "9"}, "corrupt"),
    ("/step", {"run": "demo/version_0", "step": "13"}, "schema version 1"),
    ("/step", {"run": "demo/version_0", "step": "x"}, "integer"),
    ("/step", {"run": "demo/version_0"}, "integer"),
    ("/step", {"step": "1"}, "run"),
    ("/step", {"run": "../..", "step": "1"}, "outside the log dir"),
    ("/step", {"run": "demo/version_0", "step": "1", "stage": "x/../y"}, "stage"),
    ("/step", {"run": "nope", "step": "1"}, "no step 1"),
    ("/ops", {"run": "demo/version_0", "step": "5"}, "half-written"),
    ("/series", {"run": "/etc"}, "outside the log dir"),
])
def test_plugin_answers_bad_input_with_an_error_json(client, route: str, params: dict, needle: str) -> None:
    code, body = client(route, **params)
    assert code == 200 and needle in body["error"]


def test_plugin_without_logdir_hints() -> None:
    from tensorboard.plugins import base_plugin
    from werkzeug.test import Client
    from werkzeug.wrappers import Response

    from tscope_callbacks.dashboard.plugin import TscopePlugin

    plugin = TscopePlugin(base_plugin.TBContext(logdir=None))
    r = Client(plugin.get_plugin_apps()["/runs"], Response).get("/runs")
    assert json.loads(r.data)["hint"].startswith("tensorboard was started without --logdir")
    assert plugin.is_active() and plugin.frontend_metadata().tab_name == "TSCOPE"


def test_series_of_a_run_still_writing_grows(tmp_path: Path) -> None:
    from torch.utils.tensorboard import SummaryWriter

    run = tmp_path / "live"
    w = SummaryWriter(str(run))
    w.add_scalar("tscope/roofline/mfu", 0.1, 1)
    w.flush()
    assert ld.series(run)["mfu"] == [[1, pytest.approx(0.1)]]
    w.add_scalar("tscope/roofline/mfu", 0.2, 2)  # the same file, appended: read from where the last call stopped
    w.add_scalar("tscope/roofline/tokens_per_s", 50.0, 2)
    w.flush()
    s = ld.series(run)
    assert s["mfu"] == [[1, pytest.approx(0.1)], [2, pytest.approx(0.2)]] and s["tokens_per_s"] == [[2, 50.0]]
    assert ld.series(run)["mfu"] == s["mfu"]  # unchanged file: the same points, not read twice
    w.close()


def test_parsed_files_kept_by_count_and_bytes() -> None:
    c = ld._Cache(3, max_bytes=100)
    for i, size in enumerate((40, 40, 40)):  # 120 bytes together: the oldest goes
        c.put((f"f{i}", 0, size), i)
    assert ("f0", 0, 40) not in c and ("f1", 0, 40) in c and ("f2", 0, 40) in c
    c.put(("big", 0, 500), "b")  # larger than the budget alone: kept (the newest always is), the rest go
    assert ("big", 0, 500) in c and ("f2", 0, 40) not in c
    d = ld._Cache(2)
    for i in range(3):
        d.put((f"g{i}", 0, 1), i)
    assert ("g0", 0, 1) not in d and d.get(("g2", 0, 1)) == 2
