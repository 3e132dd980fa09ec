"""The dashboard page in a real browser (headless Chromium through selenium), over the standalone HTML of a small
test fit (TinyLM, three profiled steps): the cards show the report's numbers, the roofline has one point per layer
and phase, hovering shows the tooltip, a click lists the layer's ops, the tree expands, the diff shows a change, a
corrupt step file is listed as unreadable while the rest is shown. One browser session for the module.

Skipped, with the reason, only when selenium, ``chromium`` or ``chromedriver`` is missing (Debian: ``apt-get install
-y chromium chromium-driver``; ``pip install selenium``), and then a failure under ``TSCOPE_REQUIRE_BROWSER=1`` (CI):
tests/browser.py."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import re
import shutil
import warnings

import pytest

from tests.browser import chromium, wait
from tscope_callbacks.analysis.fmt import figure_text, sig
from tscope_callbacks.dashboard import logdir as ld
from tscope_callbacks.dashboard.page import page_html, report_html, run_html, standalone_data
from tscope_callbacks.render.dashboard import page_step


@pytest.fixture(scope="module")
def fit_logdir(tmp_path_factory):
    """A TinyLM fit profiled at steps 2, 5 and 8 (one step per profile, on schedule), plus a corrupt step file."""
    import lightning.pytorch as pl

    import tscope_callbacks as ts
    from tests.models import TinyLM
    from tscope_callbacks import RooflineCallback

    root = tmp_path_factory.mktemp("dash")
    cb = RooflineCallback(every_n_steps=3, start_step=2,
                          capture=ts.CaptureOptions(steps=1, wait_for_warmup=False, compare_eager=False, replay=False),
                          outputs=ts.RooflineOutputs(plot=False))
    tr = pl.Trainer(max_steps=10, logger=pl.loggers.TensorBoardLogger(str(root), name="tiny"), callbacks=[cb],
                    enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                    accelerator="cpu", devices=1)
    tr.fit(TinyLM())
    run_dir = root / "tiny" / "version_0"
    steps = sorted(int(m.group(1)) for p in (run_dir / "tscope").iterdir()
                   if (m := re.fullmatch(r"step_(\d+)\.json", p.name)))
    assert len(steps) >= 2, steps
    (run_dir / "tscope" / "step_999.json").write_text('{"profile": {"ops": [')  # half-written
    return root, run_dir, steps


@pytest.fixture(scope="module")
def page_file(fit_logdir, tmp_path_factory):
    root, _, _ = fit_logdir
    out = tmp_path_factory.mktemp("html") / "dash.html"
    out.write_text(run_html(str(root)), encoding="utf-8")
    return out


@pytest.fixture(scope="module")
def driver(page_file):
    with chromium(1440, 1800) as d:  # skips without a browser; fails under TSCOPE_REQUIRE_BROWSER=1 (CI)
        _open(d, page_file.as_uri())
        yield d


def _wait(d, cond, timeout: float = 20):
    return wait(d, cond, timeout=timeout)


def _open(d, url: str) -> None:
    """Load ``url`` and wait until the page has drawn its data (``body[data-ready=1]``)."""
    d.get(url)
    _wait(d, lambda d: d.find_element("css selector", "body").get_attribute("data-ready") == "1")
    # no JavaScript value printed as text (a null appended to the opportunities once read "null")
    text = d.find_element("css selector", "body").text
    bad = re.findall(r".{0,30}(?:\b(?:null|undefined|Infinity)\b|\bNaN\b(?! ?/ ?Inf)|\[object ).{0,30}", text)
    assert not bad, bad


@contextlib.contextmanager
def _served(driver, root):
    """``tscope view --serve`` of ``root`` on a free port, its page open in ``driver``; the server stopped after."""
    import threading

    from tscope_callbacks.cli.view import serve

    ready = threading.Event()
    threading.Thread(target=serve, args=(str(root), "127.0.0.1", 0), kwargs={"ready": ready}, daemon=True).start()
    assert ready.wait(10)
    try:
        _open(driver, f"http://127.0.0.1:{ready.port}/")
        yield
    finally:
        ready.server.shutdown()


def _shown_report(fit_logdir) -> dict:
    _, run_dir, steps = fit_logdir
    rep = ld.load(run_dir, steps[-1], "train")
    assert "schema" in rep, rep
    return rep


def _plotted(rep: dict) -> set[tuple[str, str]]:
    """(layer, phase) of the rows the roofline draws: FLOPs > 0, bytes > 0 and a time (measured, else expected)."""
    out = set()
    for r in rep["rows"]["layer_phase"]:
        t = r["measured_s"] if r.get("measured_s") else r.get("expected_s")
        if (r.get("flops") or 0) > 0 and (r.get("bytes") or 0) > 0 and t and t > 0:
            out.add((r["layer"], r["phase"]))
    return out


def _card_text(fig: dict | None) -> str:
    """A header figure as its card shows it: the one formatter's text (the page's JavaScript prints the same:
    tests/js/format_cases.json)."""
    return figure_text((fig or {}).get("value"), (fig or {}).get("unit") or "")


# ---------- no browser needed ----------

def test_standalone_file_is_self_contained(page_file):
    text = page_file.read_text(encoding="utf-8")
    assert "<script src" not in text and "<link" not in text and "@import" not in text
    assert not re.search(r"""(src|href)\s*=\s*["']?https?:""", text)
    assert "fetch(" in text  # the TensorBoard half of the data layer is there but unused: the data is inline
    idx = json.loads(re.search(r'<script type="application/json" id="tscope-data">(.*?)</script>', text, re.S)[1])
    assert idx["runs"] and idx["runs"][0]["run"] == "tiny/version_0"
    bad = [s for s in idx["runs"][0]["steps"] if not s["readable"]]
    assert [s["step"] for s in bad] == [999] and "half-written" in bad[0]["error"]


def test_report_html_of_a_step_report_and_of_a_roofline_report():
    import torch

    import tscope_callbacks as ts
    from tscope_callbacks.analysis.analyze import analyze

    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    x = torch.randn(4, 8)
    with ts.profile(model) as prof:
        model(x).sum().backward()
    spec = ts.get_device_spec("NVIDIA A100-SXM4-80GB")
    rep = analyze(prof, spec)
    text = report_html(rep, run="mlp")
    data = json.loads(re.search(r'data-tscope-step="mlp/[a-z]+/\d+">(.*?)</script>', text, re.S)[1])
    assert data["schema"] == "tscope.step_report" and data["header"] == rep.header_json()
    assert "header" not in rep.to_dict()  # derived, not stored
    assert "</html>" in report_html(ts.roofline(prof, spec))


def test_tensorboard_mode_page_has_no_inline_data():
    text = page_html(None)
    assert '<script type="application/json"' not in text


def test_ops_are_summarised_over_the_budget():
    from tscope_callbacks.dashboard.page import pack_ops

    ops = [{"i": i, "op": "aten.mm", "layer": f"l{i % 7}", "phase": "forward", "flops": 10, "bytes": 4,
            "time_s": (i + 1) * 1e-6, "input_shapes": [[64, 64], [64, 64]], "output_shapes": [[64, 64]]}
           for i in range(2000)]
    full = pack_ops(ops)
    assert len(full["rows"]) == 2000 and full["note"] is None
    small = pack_ops(ops, budget=20_000)
    assert 0 < len(small["rows"]) < 2000 and "ops kept" in small["note"]
    kept_i = [r[0] for r in small["rows"]]
    assert kept_i == sorted(kept_i) and kept_i[-1] == 1999  # execution order; the longest op is kept
    assert len(json.dumps(small)) <= 20_000 * 1.2


def test_standalone_data_lists_steps_and_series():
    import tscope_callbacks as ts
    from tests.profiles import a100, toy_profile

    rep = json.loads(json.dumps(ts.analyze(toy_profile(), a100()).to_dict()))
    rep.update(step=4, stage="train", summary={**rep["summary"], "mfu": 0.5})
    d = standalone_data([("r", rep), ("r", {**rep, "step": 2, "summary": {**rep["summary"], "mfu": 0.25}})])
    assert [s["step"] for s in d["runs"][0]["steps"]] == [2, 4]
    assert d["series"]["r"]["mfu"] == [[2, 0.25], [4, 0.5]]
    assert "ops" not in d["steps"]["r/train/4"]


# ---------- in the browser ----------

def test_cards_show_the_reports_numbers(driver, fit_logdir):
    h = page_step(_shown_report(fit_logdir))["header"]  # as the page reads it: derived from the report
    card = lambda k: driver.find_element("css selector", f"[data-card={k}] .value").text  # noqa: E731
    assert card("step_time") == _card_text(h["step_ms"])
    assert re.fullmatch(r"[\d.,]+ (ms|s|µs)", card("step_time"))
    mfu = h["mfu"]["value"]  # 3 significant digits of the percentage, by hand ("<0.01%" below a ten-thousandth)
    assert card("mfu") == _card_text(h["mfu"]) == (f"{float(f'{mfu * 100:.3g}'):g}%" if mfu >= 1e-4 else "<0.01%")
    assert card("mbu") == _card_text(h["mbu"]) and card("hfu") == _card_text(h["hfu"])
    assert card("tokens_per_s") == _card_text(h["tokens_per_s"]) and card("tokens_per_s").endswith("tokens/s")
    assert card("memory") == _card_text(h["memory_peak_bytes"])
    assert card("flop_coverage") == _card_text(h["flop_coverage"])
    basis = driver.find_element("css selector", "[data-card=step_time] .sub").text
    assert basis and basis.split(",")[0] in h["step_ms"]["basis"]


def test_roofline_has_one_point_per_layer_and_phase(driver, fit_logdir):
    rep = _shown_report(fit_logdir)
    pts = driver.find_elements("css selector", "svg#roofline circle.pt")
    drawn = [(p.get_attribute("data-layer"), p.get_attribute("data-phase")) for p in pts]
    assert len(drawn) == len(set(drawn)) == len(_plotted(rep)) > 5
    assert set(drawn) == _plotted(rep)
    roofs = {r.get_attribute("data-precision") for r in driver.find_elements("css selector", "svg#roofline path.roof")}
    # the precisions the step ran in (its roofs, as the text report's "Roofs used"), not every peak of the device
    assert roofs == {r["precision"] for r in rep["roofs"]} and roofs <= {k for k, v in rep["device"]["peaks"].items() if v}
    # the memory slope is drawn in the colour of its key (one line, the roofs' shared bandwidth)
    (mem,) = driver.find_elements("css selector", "svg#roofline path.roof-memory")
    key = driver.find_element("css selector", "#roof-key-memory")
    assert mem.get_attribute("data-bandwidth") == key.get_attribute("data-bandwidth")
    assert mem.get_attribute("stroke") == "#3c4043" and "#3c4043" in key.get_attribute("innerHTML").replace(
        "rgb(60, 64, 67)", "#3c4043")


def test_hover_shows_the_tooltip_and_click_lists_the_ops(driver, fit_logdir):
    from selenium.webdriver.common.action_chains import ActionChains

    rep = _shown_report(fit_logdir)
    # the largest point not covered by another (points are drawn largest first)
    pt = driver.execute_script("""
        for (const c of document.querySelectorAll('svg#roofline circle.pt')) {
          const b = c.getBoundingClientRect();
          if (document.elementFromPoint(b.x + b.width / 2, b.y + b.height / 2) === c) return c;
        }""")
    layer, phase = pt.get_attribute("data-layer"), pt.get_attribute("data-phase")
    row = next(r for r in rep["rows"]["layer_phase"] if r["layer"] == layer and r["phase"] == phase)
    ActionChains(driver).move_to_element(pt).perform()
    tip = driver.find_element("css selector", "#tooltip")
    _wait(driver, lambda d: tip.is_displayed())
    text = tip.text
    assert (layer or "(root)") in text and phase in text and row["type"] in text
    for label in ("FLOPs", "bytes", "intensity", "measured", "expected", "% of roof"):
        assert label in text
    assert f"{sig(row['measured_s'] * 1e3)} ms" in text
    ActionChains(driver).click(pt).perform()
    _wait(driver, lambda d: d.find_elements("css selector", "#ops-table tr td.mono"))
    head = driver.find_element("css selector", "#ops-panel h2").text
    of_layer = [o for o in rep["ops"] if o["layer"] == layer or o["layer"].startswith(layer + ".")]
    # the clicked phase's ops; "all phases" lists the layer's ops of every phase
    assert head == f"Ops of {layer or '(root)'} · {phase} ({sum(o['phase'] == phase for o in of_layer)})"
    driver.find_element("css selector", "#ops-all-phases").click()
    _wait(driver, lambda d: "·" not in d.find_element("css selector", "#ops-panel h2").text)
    head = driver.find_element("css selector", "#ops-panel h2").text
    n_ops = len(of_layer)
    assert head == f"Ops of {layer or '(root)'} ({n_ops})"
    driver.find_element("css selector", "#ops-all-phases").click()
    ActionChains(driver).move_by_offset(0, 0).move_to_element(driver.find_element("css selector", "header")).perform()


def test_ops_on_demand(driver, fit_logdir):
    rep = _shown_report(fit_logdir)
    want = sum(1 for o in rep["ops"] if (o["flops"] or 0) > 0 and (o["bytes"] or 0) > 0
               and ((o["time_s"] or 0) > 0 or (o["expected_s"] or 0) > 0))
    assert not driver.find_elements("css selector", "svg#roofline circle.op-pt")
    driver.find_element("css selector", "#show-ops").click()
    _wait(driver, lambda d: d.find_elements("css selector", "svg#roofline circle.op-pt"))
    assert len(driver.find_elements("css selector", "svg#roofline circle.op-pt")) == want > 0
    assert len(driver.find_elements("css selector", "svg#roofline circle.pt")) == len(_plotted(rep))
    driver.find_element("css selector", "#show-ops").click()
    assert not driver.find_elements("css selector", "svg#roofline circle.op-pt")


def test_tree_expands_and_collapses(driver):
    rows = lambda: driver.find_elements("css selector", "#tree-table tr.tree-row")  # noqa: E731
    closed = [r for r in rows() if r.find_element("css selector", ".tg").text == "▸"]
    assert closed, "a collapsed layer with children"
    before = len(rows())
    target = closed[0]
    path = target.get_attribute("data-path")
    target.find_element("css selector", "td").click()
    after = len(rows())
    assert after > before
    kids = [r.get_attribute("data-path") for r in rows() if r.get_attribute("data-path").startswith(path + ".")]
    assert kids and "open" in target.get_attribute("class")
    target.find_element("css selector", "td").click()
    assert len(rows()) == before
    driver.find_element("css selector", "#tree-expand").click()
    assert len(rows()) > after
    assert all(r.find_element("css selector", ".tg").text in ("▾", "") for r in rows())


def test_diff_shows_a_change(driver, fit_logdir):
    from selenium.webdriver.support.ui import Select

    _, run_dir, steps = fit_logdir
    Select(driver.find_element("css selector", "#diff-select")).select_by_value(f"train:{steps[0]}")
    _wait(driver, lambda d: d.find_elements("css selector", "#diff-headline tr[data-figure]"))
    # shown: the last step; diffed with the first. The diff reads before -> after: the earlier step is A
    a, b = (page_step(ld.load(run_dir, s, "train")) for s in (steps[0], steps[-1]))
    heads = [c.text for c in driver.find_elements("css selector", "#diff-headline th")]
    assert heads[1:3] == [f"step {steps[0]}", f"step {steps[-1]}"]
    row = driver.find_element("css selector", '#diff-headline tr[data-figure^="MFU"]')
    cells = [c.text for c in row.find_elements("css selector", "td")]
    # where the steps' MFU roofs differ (a measured CPU roof widened where an op beat it; a busy machine does this)
    # the row is on the first step's roof: B's MFU scaled to it, the figures its change is the difference of
    pa, pb = a["summary"]["mfu_peak_flops"], b["summary"]["mfu_peak_flops"]
    differ = bool(pa and pb and abs(pb / pa - 1) > 1e-3)
    mfu_b = b["header"]["mfu"]["value"] * (pb / pa if differ else 1.0)
    assert cells[0] == (f"MFU on step {steps[0]}'s roof" if differ else "MFU")
    assert cells[1] == _card_text(a["header"]["mfu"]) and cells[2] == figure_text(mfu_b, "fraction")
    d_pts = round(mfu_b - a["header"]["mfu"]["value"], 12) * 100
    assert cells[3] == f"{'+' if d_pts >= 0 else ''}{sig(d_pts)} pts"
    step_row = driver.find_element("css selector", "#diff-headline tr[data-figure='step time']")
    sa, sb = a["header"]["step_ms"]["value"], b["header"]["step_ms"]["value"]
    f = max(sa, sb) / min(sa, sb)  # the factor is said where it reads as more than 1.00x
    # (the diff's rule: two decimals under 10x, three figures from 10x, which a busy machine's steps can reach)
    factor = f"{f:.2f}" if f < 10 else sig(f)
    want = f" ({factor}x {'faster' if sb < sa else 'slower'})" if f >= 1.005 else ""
    got = step_row.find_elements("css selector", "td")[3].text
    assert re.fullmatch(r"[+-][\d.,]+%" + re.escape(want), got), (got, want)
    layers = driver.find_elements("css selector", "#diff-layers tr")
    assert len(layers) > 3  # header + the layers, largest change first
    changes = [abs(float(r.find_elements("css selector", "td")[3].text.replace(",", "")))
               for r in layers[1:] if "more)" not in r.text]
    assert changes == sorted(changes, reverse=True) and changes[0] > 0


def test_unreadable_step_is_listed_and_the_rest_shown(driver):
    from selenium.webdriver.support.ui import Select

    opts = Select(driver.find_element("css selector", "#step-select")).options
    bad = [o for o in opts if o.get_attribute("value") == "train:999"]
    assert bad and "unreadable" in bad[0].text and not bad[0].is_enabled()
    assert "step 999" in driver.find_element("css selector", "#banner").text
    assert driver.find_elements("css selector", "svg#roofline circle.pt")


def test_over_time_charts_have_the_profiled_steps(driver, fit_logdir):
    _, _, steps = fit_logdir
    for k in ("mfu", "step_ms", "tokens_per_s"):
        pts = driver.find_elements("css selector", f"#charts [data-series={k}] svg circle")
        assert len(pts) >= len(steps), k
    assert not [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]


def test_tscope_view_writes_the_page(fit_logdir, tmp_path, capsys):
    from tscope_callbacks.cli import main

    root, _, _ = fit_logdir
    out = tmp_path / "d.html"
    assert main(["view", str(root), "--out", str(out)]) == 0
    assert 'data-tscope-step="tiny/version_0/train/' in out.read_text(encoding="utf-8")
    assert main(["view", str(tmp_path / "nothing")]) == 2
    (tmp_path / "empty").mkdir()
    assert main(["view", str(tmp_path / "empty")]) == 2
    err = capsys.readouterr().err
    assert "no such file or directory" in err and "RooflineCallback()" in err


def test_served_page_fetches_the_same_numbers(driver, fit_logdir):
    """``tscope view --serve``: the page in its fetching mode (the plugin's four routes) shows what the file shows."""
    root, _, _ = fit_logdir
    file_cards = {k: driver.find_element("css selector", f"[data-card={k}] .value").text
                  for k in ("step_time", "mfu", "memory")}
    with _served(driver, root):
        assert {k: driver.find_element("css selector", f"[data-card={k}] .value").text
                for k in file_cards} == file_cards
        assert driver.find_elements("css selector", "svg#roofline circle.pt")
        assert "step 999" in driver.find_element("css selector", "#banner").text


def test_tscope_report_html(fit_logdir, tmp_path):
    from tscope_callbacks.cli import main

    _, run_dir, steps = fit_logdir
    out = tmp_path / "step.html"
    assert main(["report", str(run_dir / "tscope" / f"step_{steps[-1]}.json"), "--html", str(out)]) == 0
    text = out.read_text(encoding="utf-8")
    data = json.loads(re.search(r'data-tscope-step="[^"]+">(.*?)</script>', text, re.S)[1])
    assert data["header"]["mfu"] == page_step(ld.load(run_dir, steps[-1], "train"))["header"]["mfu"]
    # the run is named by the step file's run directory (tiny/version_0), not "run"
    assert "<title>tscope · tiny/version_0 · step" in text and '"run": "tiny/version_0"' in text.replace('":"', '": "')


def test_wandb_gets_the_page_at_each_profile(tmp_path, monkeypatch):
    """W&B (offline): each profile logs the step's dashboard page as ``wandb.Html`` under tscope/roofline/dashboard."""
    wandb = pytest.importorskip("wandb")
    import lightning.pytorch as pl
    from lightning.pytorch.loggers import WandbLogger

    import tscope_callbacks as ts
    from tests.models import TinyLM
    from tscope_callbacks import RooflineCallback

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    settings = wandb.Settings(x_disable_stats=True, x_disable_meta=True, console="off", disable_git=True,
                              save_code=False)
    logger = WandbLogger(offline=True, save_dir=str(tmp_path), project="tscope-test", settings=settings)
    cb = RooflineCallback(gpu="NVIDIA A100-SXM4-80GB", every_n_steps=3, start_step=1,
                          capture=ts.CaptureOptions(steps=1, wait_for_warmup=False, compare_eager=False, replay=False),
                          outputs=ts.RooflineOutputs(plot=False))
    try:
        pl.Trainer(max_steps=5, logger=logger, callbacks=[cb], enable_checkpointing=False, enable_progress_bar=False,
                   enable_model_summary=False, accelerator="cpu", devices=1).fit(TinyLM())
    finally:
        wandb.finish()
    pages = sorted((tmp_path / "wandb").glob("offline-run-*/files/media/html/tscope/roofline/dashboard*.html"))
    assert len(pages) == 2, pages  # steps 1 and 4
    text = pages[-1].read_text(encoding="utf-8")
    assert text.startswith("<!DOCTYPE html>") and 'data-tscope-step="run/train/' in text and "<script src" not in text


# ---------- measured or not; the report's optional sections; the step monitor; new steps ----------

def _mlp_profile(layer_details: bool):
    import torch

    import tscope_callbacks as ts

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
    with ts.profile(model, layer_details=layer_details) as prof:
        model(torch.randn(16, 32)).sum().backward()
    return model, prof.result, ts.get_device_spec("NVIDIA A100-SXM4-80GB")


_LAYER_MEMORY = ("memory_fwd_bytes", "memory_bwd_bytes", "peak_fwd_bytes", "peak_bwd_bytes", "saved_bytes")


def test_layer_memory_is_null_when_not_measured():
    """Without layer details the capture's memory tracker does not run and leaves the per-layer memory at 0: the
    report says null (not measured), and reads back null; with layer details the measured bytes stay."""
    from tscope_callbacks import StepReport
    from tscope_callbacks.analysis.analyze import analyze

    _, res, spec = _mlp_profile(False)
    d = analyze(res, spec).to_dict()
    assert d["layers"] and all(L[k] is None for L in d["layers"] for k in _LAYER_MEMORY)
    assert StepReport.from_dict(json.loads(json.dumps(d))).to_dict()["layers"] == d["layers"]
    _, res, spec = _mlp_profile(True)
    layers = {L["path"]: L for L in analyze(res, spec).to_dict()["layers"]}
    # Linear(32, 64) forward on 16 rows creates its 16 x 64 fp32 output: 4,096 bytes of growth (a multiple of 512)
    assert layers["0"]["memory_fwd_bytes"] == 16 * 64 * 4
    assert all(isinstance(L[k], int) for L in layers.values() for k in _LAYER_MEMORY)


def test_layer_memory_kept_when_the_tracker_ran():
    """GPU semantics: a profile whose memory tracker ran (its step_tracked_peak is set, as on CUDA with layer
    details) keeps every layer's figures, zeros included (a measured zero)."""
    from tests.profiles import a100, toy_profile
    from tscope_callbacks.analysis.analyze import analyze

    p = toy_profile(True)
    p.info = dataclasses.replace(p.info, device="cuda")
    p.info = dataclasses.replace(p.info, memory_categories={"params": 1 << 20, "grads": 1 << 20, "step_tracked_peak": 3 << 20})
    p.layers["blocks.0.fc"].memory_fwd_bytes = 1 << 25
    layers = {L.path: L for L in analyze(p, a100()).layers}
    assert layers["blocks.0.fc"].memory_fwd_bytes == 1 << 25 and layers["blocks.1.fc"].memory_fwd_bytes == 0
    del p.info.memory_categories["step_tracked_peak"]
    assert analyze(p, a100()).layers[0].memory_fwd_bytes is None


def _sections_logdir(root):
    """A run whose step carries every optional section, each from its own code path (the FSDP what-if, an eager
    reference, a what-if device, a gradient spike from GradHistory, the step monitor's data wait), and an event file
    with the step monitor's series and one anomaly alert."""
    from torch.utils.tensorboard import SummaryWriter

    import tscope_callbacks as ts
    from tscope_callbacks.analysis.analyze import AnalyzeOptions, analyze
    from tscope_callbacks.analysis.fsdp import fsdp_whatif
    from tscope_callbacks.analysis.grad_history import GradHistory

    model, res, spec = _mlp_profile(True)
    res.info = dataclasses.replace(res.info, step=5)
    # the step monitor's fetch (the DataLoader's next 2 ms and the transfer 0.5 ms) and its input-bound verdict
    res.info = dataclasses.replace(res.info, step_breakdown={
        "parts_ms": {"fetch": 2.0, "transfer": 0.5}, "fetch_share": 0.25, "steps": 12, "step_ms": 10.0,
        "input_bound": True,
        "input_fixes": ["num_workers=0: set num_workers"]})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # CPU times on an A100's roofs: the what-if warning, said once per process
        fsdp = fsdp_whatif(ts.roofline(res, spec), model, 8)
    hist = GradHistory(min_steps=3, spike_factor=5.0)
    names = ["0.weight", "0.bias", "2.weight", "2.bias"]
    for i in range(4):
        hist.add(i, names, [1.0, 0.1, 1.0, 0.1])
    spike = hist.add(4, names, [1.0, 0.1, 40.0, 0.1])
    assert spike is not None and spike["layer"] == "2"
    rep = analyze(res, spec, AnalyzeOptions(what_if="a 2-core CPU", fsdp_whatif=fsdp, eager=analyze(res, spec),
                                            grad_spikes=(spike,))).to_dict()
    # a finding with how its saving was predicted and what applying that kind of change measured (the closed loop)
    rep["opportunities"] = [{
        "title": "activation after pooling", "layer": "1", "op": "", "phase": "forward", "type": "ReLU",
        "kind": "pool_order", "cause": "the ReLU runs on 4x the elements the pooling keeps",
        "change": "apply the ReLU after the max-pooling: `nn.MaxPool2d(2)` then `nn.ReLU()`", "saving_s": 7.3e-3,
        "saving_frac": 0.12,
        "recoverable_s": None, "measured_s": 9e-3, "estimate_s": 1e-3, "bound": "memory", "intensity": 0.25,
        "ridge": 50.0, "attained": 0.1, "evidence": {}, "predicted_by": "elements",
        "predicted_text": "3.1 M elements fewer at 25.7 GB/s", "measured_ratio": 0.93,
        "measured_on": "applied in tscope's closed loop on CPU, the measured saving was 0.930x the predicted one (a CNN)"}]
    run = root / "sec"
    (run / "tscope").mkdir(parents=True)
    (run / "tscope" / "step_5.json").write_text(json.dumps({"profile": None, "device": None, "report": rep}))
    w = SummaryWriter(str(run))
    for st in range(10, 101, 10):
        slow = st >= 60
        w.add_scalar("tscope/step/device_busy_ms", 18.0, st)
        w.add_scalar("tscope/step/idle_ms", 11.0 if slow else 2.5, st)
        for r, ms in (("0", 30.0), ("1", 36.0 if slow else 30.5)):  # two ranks, rank 1 late from step 60
            w.add_scalar(f"tscope/ranks/step_ms/{r}", ms, st)
        w.add_scalar("tscope/ranks/late_rank", 1.0, st)
        w.add_scalar("tscope/ranks/late_cost_ms", 6.0 if slow else 0.5, st)
        w.add_scalar("tscope/gpu/energy_j_per_token", 0.02 + st / 1e4, st)
        w.add_scalar("tscope/gpu/power_w", 350.0 - st, st)
        w.add_scalar("tscope/gpu/sm_clock_mhz", 1980.0 - (300 if slow else 0), st)
        for part, ms in (("fetch", 9.0 if slow else 0.5), ("forward", 6.0), ("backward", 12.0), ("other", 1.5)):
            w.add_scalar(f"tscope/step/{part}_ms", ms, st)  # the parts of a step, adding up to it
    w.add_text("tscope/step/alerts", "steps 60-64 took 36 ms: data wait 0.5 -> 9 ms", 65)
    w.close()
    return rep


def test_unmeasured_layer_memory_shows_a_dash(driver, tmp_path):
    from tscope_callbacks.analysis.analyze import analyze

    _, res, spec = _mlp_profile(False)
    page = tmp_path / "nomem.html"
    page.write_text(report_html(analyze(res, spec), run="nomem"), encoding="utf-8")
    _open(driver, page.as_uri())
    driver.find_element("css selector", "#tree-expand").click()
    rows = driver.find_elements("css selector", "#tree-table tr.tree-row")
    assert len(rows) == 4  # (model), 0, 1, 2
    for r in rows:
        cells = r.find_elements("css selector", "td")
        for c in cells[8:10]:  # mem fwd, mem bwd
            assert c.text == "–" and "not measured" in c.get_attribute("title")
    assert "0 B" not in driver.find_element("css selector", "#tree-table").text


def _details_run(root):
    """A run whose step 3 has layer details (per-layer memory and shapes) and whose later step 7 has not."""
    from tscope_callbacks.analysis.analyze import analyze

    (root / "tscope").mkdir(parents=True)
    for step, details in ((3, True), (7, False)):
        _, res, spec = _mlp_profile(details)
        rep = {**analyze(res, spec).to_dict(), "step": step}
        (root / "tscope" / f"step_{step}.json").write_text(json.dumps(rep), encoding="utf-8")
    return root


def test_the_page_opens_on_the_richest_step(driver, tmp_path):
    """The first view is the latest step with layer details (the demo's TSCOPE tab opened on step 200: "MEMORY PEAK
    – not measured", empty shape columns); a later step without them says where they are, one click away."""
    from selenium.webdriver.support.ui import Select

    run = _details_run(tmp_path / "run")
    assert ld.scan(str(run))["runs"][0]["open"] == "train:3"  # the TSCOPE tab opens there too (the runs route)
    page = tmp_path / "rich.html"
    page.write_text(run_html(str(run)), encoding="utf-8")
    _open(driver, page.as_uri())
    sel = Select(driver.find_element("css selector", "#step-select"))
    assert sel.first_selected_option.get_attribute("value") == "train:3"
    assert [o.text for o in sel.options] == ["step 3 · layer details", "step 7"]
    assert driver.find_element("css selector", "[data-card=memory] .value").text != "–"
    shapes = [c.text for c in driver.find_elements("css selector", "#tree-table tr.tree-row td:nth-child(12)")]
    assert "16×32" in shapes and not driver.find_elements("css selector", "#details-banner")
    sel.select_by_value("train:7")
    _wait(driver, lambda d: d.find_elements("css selector", "#details-banner"))
    assert "step 3 has them" in driver.find_element("css selector", "#details-banner").text
    assert driver.find_element("css selector", "[data-card=memory] .sub").text == (
        "not measured in this step: step 3 has the layer details")
    driver.find_element("css selector", "#details-goto").click()
    _wait(driver, lambda d: Select(d.find_element("css selector", "#step-select")).first_selected_option
          .get_attribute("value") == "train:3" and not d.find_elements("css selector", "#details-banner"))


def test_untimed_step_shows_expected_layer_times(driver, tmp_path):
    """An untimed analysis (an estimate) leaves the layer hooks' times at 0, which is no measurement: the tree shows
    each layer's expected kernel time instead, marked expected -- self from its own ops' rows, total with its
    children's -- never a 0."""
    from tests.profiles import a100, toy_profile
    from tscope_callbacks.analysis.analyze import analyze

    rep = analyze(toy_profile(False), a100())
    page = tmp_path / "untimed.html"
    page.write_text(report_html(rep, run="untimed"), encoding="utf-8")
    _open(driver, page.as_uri())
    # expected seconds per (layer, phase) from the report's own rows
    exp: dict[tuple[str, str], float] = {}
    for x in rep.rows["layer_phase"]:
        exp[(x.layer, x.phase)] = exp.get((x.layer, x.phase), 0.0) + x.expected_s
    rows = driver.find_elements("css selector", "#tree-table tr.tree-row")
    basis = driver.find_element("css selector", "#tree-basis").text
    assert rows and "expected kernel time per layer" in basis
    # the root's FLOPs (forward + backward) beside the report's totals: the caption says what is not in them
    assert "FLOPs and bytes = forward + backward (recompute and the optimizer's update are not in them" in basis
    heads = [th.text for th in driver.find_elements("css selector", "#tree-table th")][2:6]
    assert heads == ["fwd self ms, expected", "fwd total ms, expected", "bwd self ms, expected",
                     "bwd total ms, expected"]
    ms = lambda s: sig(s * 1e3)  # noqa: E731  (the page's F.ms)
    checked = 0
    for r in rows:
        path = r.get_attribute("data-path")
        cells = r.find_elements("css selector", "td")[2:6]  # fwd self, fwd total, bwd self, bwd total
        assert all(c.get_attribute("data-expected") == "1" and "expected" in c.get_attribute("title") for c in cells)
        below = [k for k in exp if k[0] == path or k[0].startswith(path + ".") or path == ""]
        want = [exp.get((path, "forward"), 0.0), sum(exp[k] for k in below if k[1] == "forward"),
                exp.get((path, "backward"), 0.0), sum(exp[k] for k in below if k[1] == "backward")]
        assert [c.text for c in cells] == [ms(v) for v in want], path
        checked += any(v > 0 for v in want)
    assert checked >= 3  # blocks.0.fc's matmuls (forward and backward), and the blocks above them


def test_sections_and_step_monitor_are_shown(driver, tmp_path):
    rep = _sections_logdir(tmp_path)
    page = tmp_path / "sec.html"
    page.write_text(run_html(str(tmp_path)), encoding="utf-8")
    driver.get_log("browser")  # the earlier pages' entries (a served page's favicon 404)
    _open(driver, page.as_uri())
    css = lambda sel: driver.find_elements("css selector", sel)  # noqa: E731
    # compiled vs eager: one row per layer and the total, speedup = eager / compiled
    rows = css("#cve-table tr[data-layer]")
    assert [r.get_attribute("data-layer") for r in rows] == [x["layer"] for x in rep["compiled_vs_eager"]]
    total = rows[-1].find_elements("css selector", "td")
    t = rep["compiled_vs_eager"][-1]
    assert total[1].text == sig(t["compiled_ms"]) and total[3].text == sig(t["speedup"]) + "x"
    # the FSDP what-if: its per-GPU peak, and the collectives
    assert css("#fsdp-panel")[0].is_displayed()
    peak = driver.find_element("css selector", '#fsdp-memory [data-key="peak"]').text
    assert peak == _card_text({"value": rep["fsdp_whatif"]["memory"]["peak"], "unit": "B"})
    assert "all gather" in driver.find_element("css selector", "#fsdp-comm").text
    # the what-if device
    banner = driver.find_element("css selector", "#whatif-banner").text
    assert "a 2-core CPU" in banner and rep["what_if"]["roofs_of"] in banner
    # the gradient spike: step, layer and the norm ratio
    sp = rep["grad_spikes"][0]
    cells = [c.text for c in driver.find_elements("css selector", "#spike-table tr.spike td")]
    assert cells[:3] == ["4", "2", sig(sp["ratio"]) + "x"]
    # the batch's fetch beside the time split (a host-side wait, not a part of the step's bar), with the verdict and
    # fix: the text report's own sentence
    wait = driver.find_element("css selector", "#split-input").text
    # (the share is of those steps' own 10 ms mean, said so: beside the header's median step it read as a share of it)
    assert wait == ("Input: each step spends 2.5 ms fetching its batch (mean of the last 12 steps, 25% of their mean "
                    "10 ms step) -- input-bound: the device waits for data: num_workers=0: set num_workers")
    assert "fetching" not in driver.find_element("css selector", "#split .stack").get_attribute("innerHTML")
    # the step monitor's series, read through logdir.series; the alert at its step
    lines = css("#charts [data-series=step_device] path[data-line]")
    assert [x.get_attribute("data-line") for x in lines] == ["step/device_busy_ms", "step/idle_ms"]
    ranks = css("#charts [data-series=rank_step_ms] path[data-line]")
    assert [x.get_attribute("data-line") for x in ranks] == ["rank/0", "rank/1"]
    late = css("#charts [data-series=late_rank] svg circle title")
    assert len(late) == 10 and "(rank 1 late)" in late[-1].get_attribute("textContent")
    for k in ("energy_per_token", "power", "sm_clock"):
        assert len(css(f"#charts [data-series={k}] svg circle")) == 10, k
    parts = css("#charts [data-series=step_parts] path[data-line]")
    assert [x.get_attribute("data-line") for x in parts] == [
        "step/fetch_ms", "step/forward_ms", "step/backward_ms", "step/other_ms"]  # in the order a step runs
    # a mark on each chart whose steps span step 65: the monitor's four (10-100), not MFU, step time and samples/s
    # (their one point, step 5)
    marked = [m.find_element("xpath", "ancestor::div[@data-series]").get_attribute("data-series")
              for m in css("#charts line.alert-mark[data-step='65']")]
    assert sorted(marked) == ["energy_per_token", "late_rank", "power", "rank_step_ms", "sm_clock", "step_device",
                              "step_parts"]
    alert = driver.find_element("css selector", "#alerts li.alert[data-step='65']").text
    assert "data wait 0.5 -> 9 ms" in alert
    # the finding: its change, how its saving was predicted, and the closed loop's measured ratio
    opp = driver.find_element("css selector", "#opps li.opp")
    assert "−7.3 ms (12%)" in opp.text
    # the markdown's `code` as code, without its backticks
    assert "change: apply the ReLU after the max-pooling: nn.MaxPool2d(2) then nn.ReLU()" in opp.text
    assert "`" not in opp.text
    assert [c.text for c in opp.find_elements("css selector", ".why code")] == ["nn.MaxPool2d(2)", "nn.ReLU()"]
    assert opp.find_element("css selector", "[data-evidence=predicted]").text == (
        "predicted from: 3.1 M elements fewer at 25.7 GB/s")
    assert opp.find_element("css selector", "[data-evidence=measured]").text == (
        "checked: applied in tscope's closed loop on CPU, the measured saving was 0.930x the predicted one (a CNN)")
    assert not [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]


def test_sections_absent_are_not_shown(driver, fit_logdir, page_file):
    _open(driver, page_file.as_uri())
    rep = _shown_report(fit_logdir)
    assert rep["compiled_vs_eager"] is None and rep["fsdp_whatif"] is None and rep["what_if"] is None
    for sel in ("#cve-panel", "#fsdp-panel"):
        assert not driver.find_element("css selector", sel).is_displayed()
    assert not driver.find_elements("css selector", "#whatif-banner, #spike-table, #charts [data-series=power]")
    assert "no gradient spike" in driver.find_element("css selector", "#nan").text


def test_tensorboard_mode_picks_up_new_steps(driver, fit_logdir, tmp_path):
    """The fetching page polls ``runs`` (every 10 s while visible): a step written after it opened joins the step
    selector, and the step the user picked stays selected."""
    from selenium.webdriver.support.ui import Select

    root, run_dir, steps = fit_logdir
    live = tmp_path / "live"
    shutil.copytree(root, live)
    live_run = live / run_dir.relative_to(root)
    with _served(driver, live):
        assert driver.execute_script("return window.tscopeDashboard.state.pollMs") == 10000
        Select(driver.find_element("css selector", "#step-select")).select_by_value(f"train:{steps[0]}")
        _wait(driver, lambda d: d.execute_script("return window.tscopeDashboard.state.rep.step") == steps[0])
        new = steps[-1] + 100
        shutil.copy(live_run / "tscope" / f"step_{steps[-1]}.json", live_run / "tscope" / f"step_{new}.json")
        changed = driver.execute_async_script(
            "const done = arguments[arguments.length - 1]; window.tscopeDashboard.poll().then(done);")
        assert changed is True
        values = [o.get_attribute("value") for o in Select(driver.find_element("css selector", "#step-select")).options]
        assert f"train:{new}" in values
        assert driver.find_element("css selector", "#step-select").get_attribute("value") == f"train:{steps[0]}"
        assert driver.execute_script("return window.tscopeDashboard.state.step") == steps[0]
        assert driver.execute_async_script(
            "const done = arguments[arguments.length - 1]; window.tscopeDashboard.poll().then(done);") is False


def test_fresh_fit_writes_step_files_the_dashboard_reads_as_they_are(fit_logdir):
    """The callbacks write ``{"profile", "device", "report": report.to_dict()}``; the dashboard reads the report as it
    is (no re-analysis: its dict is the file's, less the raw profile)."""
    _, run_dir, steps = fit_logdir
    for st in steps:
        path = run_dir / "tscope" / f"step_{st}.json"
        raw = json.loads(path.read_text())
        assert set(raw) == {"profile", "device", "report"}
        assert raw["report"]["schema"] == "tscope.step_report" and raw["report"]["version"] == 3
        d = ld.read_step_file(path)
        assert d["summary"] == raw["report"]["summary"] and d["step"] == st


def test_fit_reports_the_guards_gradient_spikes(tmp_path):
    """RooflineCallback beside a NaNGuardCallback: the step file's report carries the guard's spikes up to its step
    (the loss x1000 at step 12 makes its gradient norm ~1000x the median of the 12 steps before it)."""
    import lightning.pytorch as pl

    import tscope_callbacks as ts
    from tests.models import TinyLM
    from tscope_callbacks import NaNGuardCallback, RooflineCallback

    class Spiky(TinyLM):
        def training_step(self, batch, batch_idx):
            loss = super().training_step(batch, batch_idx)
            return loss * 1000.0 if self.global_step == 12 else loss

    guard = NaNGuardCallback(action="warn")
    cb = RooflineCallback(gpu="NVIDIA A100-SXM4-80GB", every_n_steps=100, start_step=13,
                          capture=ts.CaptureOptions(steps=1, wait_for_warmup=False, compare_eager=False, replay=False),
                          outputs=ts.RooflineOutputs(plot=False))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pl.Trainer(max_steps=14, logger=pl.loggers.CSVLogger(str(tmp_path)), callbacks=[guard, cb],
                   enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                   accelerator="cpu", devices=1, log_every_n_steps=1).fit(Spiky())
    assert [s["step"] for s in guard.spikes][:1] == [12]
    (path,) = tmp_path.rglob("step_13.json")
    spikes = ld.read_step_file(path)["grad_spikes"]
    assert [s["step"] for s in spikes] == [12] and spikes[0]["ratio"] > 100
    assert spikes[0] == pytest.approx(guard.spikes[0])


# ---------- a measured roof an op beat, a busy machine, identical layers: one step on its own page ----------
def _widened_report() -> dict:
    """A measured CPU-like roof (fp32 100 GFLOP/s, 25 GB/s) that a relu beat: 1e6 fp32 elements read and written =
    8e6 B in 0.2 ms = 40 GB/s, so the analysis widens the bandwidth roof to 40 GB/s (analysis.roofs.widen). Two
    identical layers (blocks.0.fc, blocks.1.fc: the same 256^3 fp32 matmul in 1 ms) sit on one spot; blocks.0.fc
    has a backward op too. The machine was busy and torch oversubscribed it (2 threads, 1.5 of 2 CPUs busy)."""
    from tests.profiles import make_profile, matmul, pointwise
    from tscope_callbacks import api
    from tscope_callbacks.devices.spec import DeviceSpec

    spec = DeviceSpec(name="cpu", flops={"fp32": 100e9}, bandwidth=25e9, measured=True)
    prof = make_profile([pointwise(1_000_000, time_s=2e-4, layer="act"),
                         matmul(256, 256, 256, dtype="float32", layer="blocks.0.fc", time_s=1e-3),
                         matmul(256, 256, 256, dtype="float32", layer="blocks.1.fc", time_s=1e-3),
                         matmul(256, 256, 512, dtype="float32", layer="blocks.0.fc", phase="backward", time_s=3e-3)],
                        host_cpus=2, host_others_load_per_cpu=0.75, host_busy=True, host_oversubscribed=True,
                        torch_threads=2, step=7)
    return api.roofline(prof, spec).to_dict()


@pytest.fixture(scope="module")
def widened_page(driver, tmp_path_factory):
    rep = _widened_report()
    page = tmp_path_factory.mktemp("widened") / "step.html"
    page.write_text(report_html(rep, run="busy"), encoding="utf-8")
    _open(driver, page.as_uri())
    return rep


def test_the_drawn_memory_roof_is_the_one_percent_of_roof_uses(driver, widened_page):
    rep = widened_page
    assert rep["summary"]["bandwidth"] == 25e9 and rep["roofs"][0]["bandwidth"] == 40e9  # 8e6 B / 2e-4 s
    ax = json.loads(driver.find_element("css selector", "svg#roofline").get_attribute("data-axes"))

    def data(px: float, py: float) -> tuple[float, float]:  # pixels -> (FLOP/B, FLOP/s) on the log axes
        fx = (px - ax["left"]) / (ax["right"] - ax["left"])
        fy = (ax["bottom"] - py) / (ax["bottom"] - ax["top"])
        return 10 ** (ax["x0"] + fx * (ax["x1"] - ax["x0"])), 10 ** (ax["y0"] + fy * (ax["y1"] - ax["y0"]))

    def slope(path) -> float:
        pts = [tuple(map(float, p.split(","))) for p in re.findall(r"[-\d.e]+,[-\d.e]+", path.get_attribute("d"))]
        (xa, ya), (xb, yb) = data(*pts[0]), data(*pts[1])
        return ya / xa if abs(yb / xb - ya / xa) < 1e-3 * ya / xa else float("nan")

    roof = driver.find_element("css selector", 'svg#roofline path.roof[data-precision="fp32"]')
    assert abs(slope(roof) / rep["roofs"][0]["bandwidth"] - 1) < 0.02, slope(roof)  # the widened 40 GB/s
    dev = driver.find_element("css selector", "svg#roofline path.roof-device[data-bandwidth]")
    assert dev.get_attribute("stroke-dasharray") and abs(slope(dev) / 25e9 - 1) < 0.02  # the measured one, dashed
    keys = driver.find_element("css selector", "#roof-keys").text
    assert "memory 40 GB/s" in keys and "measured 25 GB/s" in keys, keys
    # the % of roof of the relu: 40 GB/s on a 40 GB/s roof = 100%, which only the drawn roof gives
    relu = next(r for r in rep["rows"]["layer_phase"] if r["layer"] == "act")
    assert abs(relu["pct_of_roof"] - 1.0) < 1e-9
    assert "measured bandwidth 25 GB/s" in driver.find_element("css selector", '[data-card="mbu"] .sub').text
    assert driver.find_element("css selector", "#device").text.endswith("40 GB/s (widened from 25 GB/s)")


def test_environment_warnings_are_a_banner(driver, widened_page):
    items = {li.get_attribute("data-warning"): li.text
             for li in driver.find_elements("css selector", "#env-banner li")}
    assert "1.5 busy cores" in items["oversubscribed"] and "torch.set_num_threads(1)" in items["oversubscribed"]
    assert "0.75 of each of the 2 CPUs" in items["busy"]
    assert "bandwidth roof widened from 25 GB/s to 40 GB/s" in items["roof-note"]
    # at the top of the page: above the cards
    top = driver.find_element("css selector", "#env-banner").location["y"]
    assert top < driver.find_element("css selector", "#cards").location["y"]


def test_points_at_one_spot_can_each_be_hovered_and_phase_ops_listed(driver, widened_page):
    from selenium.webdriver.common.action_chains import ActionChains

    pts = driver.find_elements("css selector", 'svg#roofline circle.pt[data-phase="forward"][data-same="2"]')
    assert sorted(p.get_attribute("data-layer") for p in pts) == ["blocks.0.fc", "blocks.1.fc"]
    assert len({(p.get_attribute("cx"), p.get_attribute("cy")) for p in pts}) == 2  # spread apart
    for p in pts:  # each one on top somewhere: hoverable
        assert driver.execute_script("""const c = arguments[0], b = c.getBoundingClientRect();
            for (const [fx, fy] of [[.5,.5],[.2,.5],[.8,.5],[.5,.2],[.5,.8]])
              if (document.elementFromPoint(b.x + b.width * fx, b.y + b.height * fy) === c) return true;
            return false;""", p)
    ActionChains(driver).move_to_element(pts[0]).perform()
    tip = driver.find_element("css selector", "#tooltip")
    _wait(driver, lambda d: tip.is_displayed())
    assert "2 layers here" in tip.text and "blocks.0.fc forward" in tip.text and "blocks.1.fc forward" in tip.text
    legend = [e.get_attribute("data-phase") for e in driver.find_elements("css selector", "#roof-legend .phase-key")]
    assert legend == ["forward", "backward"]
    bwd = driver.find_element("css selector", 'svg#roofline circle.pt[data-layer="blocks.0.fc"][data-phase="backward"]')
    driver.execute_script("arguments[0].dispatchEvent(new MouseEvent('click', {bubbles: true}))", bwd)
    _wait(driver, lambda d: d.find_elements("css selector", "#ops-table tr td.mono"))
    phases = lambda: [r.find_elements("css selector", "td")[2].text  # noqa: E731
                      for r in driver.find_elements("css selector", "#ops-table tr") if r.find_elements("css selector", "td")]
    assert phases() == ["backward"]
    driver.find_element("css selector", "#ops-all-phases").click()
    _wait(driver, lambda d: len(phases()) == 2)
    assert sorted(phases()) == ["backward", "forward"]
    ActionChains(driver).move_to_element(driver.find_element("css selector", "header")).perform()


def test_single_step_page_has_no_diff_and_no_one_dot_charts(driver, widened_page):
    assert Select_value(driver, "#run-select") == "busy"
    assert not driver.find_element("css selector", "#diff-select").is_displayed()
    assert not driver.find_element("css selector", "#diff-panel").is_displayed()
    assert "2 or more steps" in driver.find_element("css selector", "#series-few").text
    assert not driver.find_elements("css selector", "#charts svg")


def Select_value(driver, css: str) -> str:
    from selenium.webdriver.support.ui import Select

    return Select(driver.find_element("css selector", css)).first_selected_option.get_attribute("value")


def test_diff_offers_only_the_other_steps(driver, page_file, fit_logdir):
    from selenium.webdriver.support.ui import Select

    _, _, steps = fit_logdir
    _open(driver, page_file.as_uri())
    cur = Select_value(driver, "#step-select")
    offered = [o.get_attribute("value") for o in Select(driver.find_element("css selector", "#diff-select")).options]
    assert cur not in offered and f"train:{steps[0]}" in offered
    Select(driver.find_element("css selector", "#step-select")).select_by_value(f"train:{steps[0]}")
    offered = [o.get_attribute("value") for o in Select(driver.find_element("css selector", "#diff-select")).options]
    assert f"train:{steps[0]}" not in offered and cur in offered


def test_tree_last_column_header_is_not_clipped_when_expanded(driver, page_file):
    _open(driver, page_file.as_uri())
    driver.find_element("css selector", "#tree-expand").click()
    over = driver.execute_script("""const t = document.querySelector('#tree'), th = [...document.querySelectorAll('#tree-table th')].pop();
        return [th.textContent, th.getBoundingClientRect().right - t.getBoundingClientRect().left - t.clientWidth, t.scrollWidth - t.clientWidth];""")
    assert over[0] == "NaN/Inf" and over[1] <= 0.5 and over[2] <= 0, over


# ---------- TensorBoard's Text tab: the tables fit, no word broken ----------
def _tb_text_page(markdown_texts: list[str], path, width: int = 1106) -> None:
    """The markdown as TensorBoard's Text tab shows it: its own renderer (plugin_util.markdown_to_safe_html), each
    text in a cell that breaks words anywhere once the content overflows (``word-break: break-word``), 1106 px wide
    (the card in a 1600 px window; about 940 in a 1400 px one), table cells as TensorBoard 2.21 styles them (padding
    6px 13px, 16 px Roboto, 1 px borders, collapsed): all read from the computed styles of its Text tab in headless
    Chromium."""
    from tensorboard.plugin_util import markdown_to_safe_html

    cards = "".join(f'<div class="card" style="width:{width}px;word-break:break-word;margin:8px 0">'
                    f'{markdown_to_safe_html(t)}</div>' for t in markdown_texts)
    css = ("body{font:16px Roboto,sans-serif}table{border-collapse:collapse}"
           "td,th{padding:6px 13px;border:1px solid #e0e0e0;font-size:16px}")
    path.write_text(f"<!doctype html><html><head><style>{css}</style></head><body>{cards}</body></html>",
                    encoding="utf-8")


_BROKEN_WORDS_JS = """
  const broken = [];
  for (const c of document.querySelectorAll('td, th')) {
    const tw = document.createTreeWalker(c, NodeFilter.SHOW_TEXT);
    let n;
    while ((n = tw.nextNode())) {
      const re = /[^\\s\\u00a0]+/g; let m;
      while ((m = re.exec(n.data))) {
        const rg = document.createRange(); rg.setStart(n, m.index); rg.setEnd(n, m.index + m[0].length);
        if (new Set([...rg.getClientRects()].filter((r) => r.width > 0).map((r) => Math.round(r.top))).size > 1)
          broken.push(m[0]);
      }
    }
  }
  return broken;"""


def _deep_layers():
    """A GPT-like tree four levels deep (model.blocks.N.attn.qkv ...), times of tens of ms, MB of memory."""
    from tscope_callbacks.records import LayerRecord

    paths = [("", "DemoLM"), ("model", "TinyGPT"), ("model.blocks", "ModuleList")]
    for b in range(2):
        paths += [(f"model.blocks.{b}", "Block"), (f"model.blocks.{b}.attn", "CausalSelfAttention"),
                  (f"model.blocks.{b}.attn.qkv", "Linear"), (f"model.blocks.{b}.attn.proj", "Linear"),
                  (f"model.blocks.{b}.mlp", "MLP"), (f"model.blocks.{b}.mlp.fc", "Linear"),
                  (f"model.blocks.{b}.mlp.proj", "Linear")]
    return {p: LayerRecord(path=p, type=t, forward_s=0.023917, backward_s=0.031657, self_forward_s=0.001249,
                           self_backward_s=0.012345, calls=1, flops_fwd=986_100_000, flops_bwd=1_987_800_000,
                           output_bytes=2_097_152, memory_fwd_bytes=19_997_000, memory_bwd_bytes=-17_853_000)
            for p, t in paths}


def test_tensorboard_text_tables_break_no_word(driver, tmp_path):
    from tscope_callbacks.render.layer_table import render_tree_markdown
    from tscope_callbacks.render.tables import rows_to_markdown

    tree = render_tree_markdown(_deep_layers(), root_name="DemoLM", title="tscope layers -- train step 10")
    # the roofline callback's layer rows (roofline_io: tscope/roofline/layers), as the TensorBoard sink logs them
    rows = [{"layer": f"model.blocks.{b}.mlp.{n}", "type": "Linear", "bound": "compute", "intensity": 37.5,
             "achieved_gflops_per_s": 74.78, "gflops": 0.4032, "mb": 10.75, "measured_ms": 23.917,
             "estimated_ms": 4.27, "calls": 1} for b in range(2) for n in ("fc", "proj")]
    table = rows_to_markdown(rows, max_cols=9)
    assert "| layer | type | bound | FLOP/B | GFLOP/s | GFLOP | MiB | ms | exp. ms |" in table
    assert "\u00a0ms" in tree and "`qkv`" in tree
    page = tmp_path / "tb_text.html"
    _tb_text_page([tree, table], page)
    driver.get(page.as_uri())
    assert driver.find_elements("css selector", "td")
    assert driver.execute_script(_BROKEN_WORDS_JS) == []


def test_tensorboard_text_report_tables_break_no_word(driver, tmp_path):
    """The whole report (tscope/roofline/table) as the TensorBoard sink logs it: its layer x phase table with GPT-like
    paths and types fits the card once narrowed (short headers, fwd/bwd, no type column); the markdown the files get
    is the full one, and it would break words there."""
    from tests.profiles import a100, make_profile, matmul
    from tscope_callbacks import api
    from tscope_callbacks.records import LayerRecord
    from tscope_callbacks.render.markdown import to_markdown
    from tscope_callbacks.render.tables import narrow_markdown

    ops, layers = [], {}
    for b in range(2):
        for name, typ in (("attn", "CausalSelfAttention"), ("attn.qkv", "Linear"), ("mlp.fc", "Linear"),
                          ("mlp.proj", "Linear")):
            path = f"model.blocks.{b}.{name}"
            layers[path] = LayerRecord(path=path, type=typ)
            for ph, t in (("forward", 1.6e-3), ("backward", 3.2e-3)):
                ops.append(matmul(512, 768, 768, dtype="float32", layer=path, phase=ph, time_s=t))
    md = to_markdown(api.roofline(make_profile(ops, layers=layers), a100()), top=12)
    assert "| advice |" in md  # its advice column, the widest cells
    narrow = narrow_markdown(md)
    assert "| layer | phase | GFLOP | MiB | bound |" in narrow and "| bwd |" in narrow
    assert "CausalSelfAttention" not in narrow and "| advice |" not in narrow
    note = "(narrowed for this view: the wide tables' type, advice, FLOP/B columns are in `tscope report` and the TSCOPE tab)"
    assert narrow.endswith("\n\n" + note)
    assert [ln for ln in md.splitlines() if not ln.startswith("|")] == [  # the text around the tables unchanged
        ln for ln in narrow.removesuffix("\n\n" + note).splitlines() if not ln.startswith("|")]
    page = tmp_path / "tb_report.html"
    _tb_text_page([md], page)
    driver.get(page.as_uri())
    assert driver.execute_script(_BROKEN_WORDS_JS)  # the full markdown breaks words in the card
    for width in (1106, 940):  # a 1600 px window's card and a 1400 px one's ("compu te", "72.7 %" there)
        _tb_text_page([narrow], page, width)
        driver.get(page.as_uri())
        assert driver.execute_script(_BROKEN_WORDS_JS) == [], width


def test_switching_steps_keeps_one_roof_key(driver, fit_logdir, page_file):
    # each render of the roofline replaces its key of roofs under the chart: after three switches there is one key,
    # and it lists the roofs of the step shown
    from selenium.webdriver.support.ui import Select

    _, run_dir, steps = fit_logdir
    _open(driver, page_file.as_uri())  # the fit's page (a test above may have opened another)
    for st in (steps[0], steps[-1], steps[0]):
        Select(driver.find_element("css selector", "#step-select")).select_by_value(f"train:{st}")
        _wait(driver, lambda d, st=st: d.execute_script("return window.tscopeDashboard.state.rep.step") == st)
    keys = driver.find_elements("css selector", ".roof-keys")
    assert len(keys) == 1 and len(driver.find_elements("css selector", "#roof-legend")) == 1
    bw = ld.load(run_dir, steps[0], "train")["device"]["bandwidth"]
    assert keys[0].text.count("GB/s") >= 1 and f"{bw / 1e9:.3g}" in keys[0].text.replace(",", "")


def test_an_estimate_page_says_estimate_and_shows_its_expected_mfu(driver, tmp_path):
    # tscope analyze --json, then tscope report --html: no trained step, so the page is labelled an estimate, named
    # after its file, and its MFU card is the MFU at the expected step time (what the text report prints)
    from tscope_callbacks.cli import main

    out = tmp_path / "tinygpt.json"
    assert main(["analyze", "tscope_callbacks.demo.model:TinyGPT", "--input-shape", "8,64", "--gpu", "h100",
                 "--precision", "bf16", "--json", str(out)]) == 0
    page = tmp_path / "tinygpt.html"
    assert main(["report", str(out), "--html", str(page)]) == 0
    from tscope_callbacks.api import load_profile_file, roofline

    prof, dev = load_profile_file(str(out))
    sm = roofline(prof, dev).summary
    est = sm.estimated_mfu
    assert est is not None and est > 0
    # MBU and HFU at the expected step time, by their definitions: bytes (FLOPs) / expected step / the roof
    assert sm.estimated_mbu == pytest.approx(sm.total_bytes / sm.estimated_step_s / sm.bandwidth, rel=1e-12)
    assert sm.estimated_hfu == pytest.approx(sm.hardware_flops / sm.estimated_step_s / sm.mfu_peak_flops, rel=1e-12)
    _open(driver, page.as_uri())
    assert driver.title == "tscope · tinygpt · estimate"
    sel = driver.find_element("css selector", "#step-select")
    assert sel.find_elements("css selector", "option")[0].text == "estimate (no trained step)"
    assert driver.find_element("css selector", "[data-card=mfu] .label").text.lower() == "mfu (expected)"  # CSS caps
    assert driver.find_element("css selector", "[data-card=mfu] .value").text == _card_text(
        {"value": est, "unit": "fraction"})
    assert "at the expected step time" in driver.find_element("css selector", "[data-card=mfu] .sub").text
    for k, v in (("mbu", sm.estimated_mbu), ("hfu", sm.estimated_hfu)):
        assert driver.find_element("css selector", f"[data-card={k}] .label").text.lower() == f"{k} (expected)"
        assert driver.find_element("css selector", f"[data-card={k}] .value").text == _card_text(
            {"value": v, "unit": "fraction"})
    # the roofs drawn are the precisions the estimate ran in, as in its text report and PNG: not the H100's fp8/int8
    drawn = {r.get_attribute("data-precision") for r in driver.find_elements("css selector", "svg#roofline path.roof")}
    assert "bf16" in drawn and not drawn & {"fp8", "int8"}, drawn
    # its opportunities: each fix said once (the cause may already carry it), and a finding without a timed saving
    # shows "–", not "−–"
    opps = driver.find_elements("css selector", "#opps li.opp")
    assert opps and not any("below expected" in li.text for li in opps)  # nothing was measured to be below it
    for li in opps:
        text = li.text
        assert "−–" not in text, text
        for line in (ln for ln in text.splitlines() if ln.startswith("change: ")):
            assert text.count(line.removeprefix("change: ")) == 1, text
        fix = re.search(r"Fix: (.+?)\. Saves", text)
        if fix:
            assert text.count(fix.group(1)) == 1, text


@pytest.mark.parametrize("timing", ["cuda", "cpu"])
def test_time_split_adds_up_to_the_measured_step(driver, tmp_path, timing):
    """The split is on the step's basis: op time by bound plus the rest of the unprofiled step, never the capture's
    own idle time (on a real H200 GPT-2 fit the GPU idled 117 ms inside a capture of a 56 ms step, and the bar read
    86% idle)."""
    from tests.profiles import a100, make_profile, matmul, pointwise
    from tscope_callbacks.analysis.analyze import AnalyzeOptions, analyze

    prof = make_profile([matmul(4096, 4096, 4096, time_s=2e-3, layer="fc"),
                         pointwise(4096 * 4096, dtype="bfloat16", time_s=1e-3, layer="act")],
                        wall_time_s=0.4, device_idle_s=0.397, timing=timing, step_time_s=4e-3,
                        step_time_basis="unprofiled-median", step_time_steps=10)
    rep = analyze(prof, a100(), AnalyzeOptions(kernel_model=False))
    page = tmp_path / f"split_{timing}.html"
    page.write_text(report_html(rep, run="split"), encoding="utf-8")
    _open(driver, page.as_uri())
    text = driver.find_element("css selector", "#split").text
    # 2 ms compute-bound + 1 ms memory-bound + 1 ms outside the ops = the 4 ms step: 50%, 25%, 25%
    rest = "no kernel running (gaps between kernels, waits for the host)" if timing == "cuda" else "outside ops (host: Python, hooks, data)"
    assert f"{rest}\n1 ms\n25%" in text and "compute-bound\n2 ms\n50%" in text and "memory-bound\n1 ms\n25%" in text
    assert "397" not in text and not driver.find_elements("css selector", "#split-input")
    assert "the 4 ms step" in driver.find_element("css selector", "#split-basis").text


def test_diff_marks_changes_within_the_steps_noise(driver, tmp_path):
    """The diff the page shows is the Python one (analysis.diff), served inline: a change within the two steps'
    noise is marked so and not coloured, one beyond it is; near-1 ratios keep their digits (an H200 diff of steps 10
    and 100 read "1x" for 1.005 and painted +0.006 ms red); MFU is compared on one roof."""
    from dataclasses import replace

    from selenium.webdriver.support.ui import Select

    from tests.profiles import a100, make_profile, matmul, pointwise
    from tscope_callbacks.analysis.analyze import AnalyzeOptions, analyze

    def step(n: int, fc_ms: float, act_ms: float, step_ms: float, wider: float = 1.0) -> dict:
        fc = matmul(4096, 4096, 4096, time_s=fc_ms * 1e-3, layer="fc")
        act = pointwise(4096 * 4096, dtype="bfloat16", time_s=act_ms * 1e-3, layer="act")
        for o in (fc, act):  # three profiled steps each, 10 µs apart: a spread of 0.02 ms per row
            o.time_samples = [o.time_s - 1e-5, o.time_s, o.time_s + 1e-5]
        p = make_profile([fc, act], step=n, step_time_s=step_ms * 1e-3, step_time_basis="unprofiled-median",
                         step_time_steps=5, step_time_spread_s=0.05e-3, merged_steps=[n, n + 1, n + 2])
        spec = replace(a100(), flops={**a100().flops, "bf16": 312e12 * wider})
        return {"profile": None, "device": None,
                "report": analyze(p, spec, AnalyzeOptions(kernel_model=False)).to_dict()}

    run = tmp_path / "run"
    (run / "tscope").mkdir(parents=True)
    # fc 2 -> 2.01 ms (1.005x, within its noise of sqrt(2) x 0.02 ms), act 1 -> 1.2 ms (1.2x, beyond it), the step
    # 4 -> 4.0001 ms (+0.0025%, within 0.07 ms); step 3: step 1 again on a 4% wider matrix roof
    for n, args in ((1, (2.0, 1.0, 4.0)), (2, (2.01, 1.2, 4.0001)), (3, (2.0, 1.0, 4.0, 1.04))):
        (run / "tscope" / f"step_{n}.json").write_text(json.dumps(step(n, *args)))
    page = tmp_path / "diff.html"
    page.write_text(run_html(str(run)), encoding="utf-8")
    _open(driver, page.as_uri())
    Select(driver.find_element("css selector", "#step-select")).select_by_value("train:2")
    Select(driver.find_element("css selector", "#diff-select")).select_by_value("train:1")
    _wait(driver, lambda d: d.find_elements("css selector", "#diff-layers tr"))
    rows = {r.find_elements("css selector", "td")[0].text: r.find_elements("css selector", "td")
            for r in driver.find_elements("css selector", "#diff-layers tr")[1:]}
    assert rows["fc"][4].text == "1.005x" and rows["act"][4].text == "1.200x"
    assert rows["fc"][3].get_attribute("data-verdict") == "noise" and "chg-bad" not in rows["fc"][3].get_attribute("class")
    assert rows["act"][3].get_attribute("data-verdict") == "worse" and "chg-bad" in rows["act"][3].get_attribute("class")
    cells = driver.find_element("css selector", "#diff-headline tr[data-figure='step time']").find_elements(
        "css selector", "td")
    assert cells[3].text == "+0.00%" and cells[3].get_attribute("data-verdict") == "noise"
    assert cells[4].text == "±70.7 µs"  # sqrt(2) x 0.05 ms: both steps' typical deviation
    # the same step on a wider roof: MFU reads lower, and the change is on one roof: none
    Select(driver.find_element("css selector", "#step-select")).select_by_value("train:3")
    _wait(driver, lambda d: d.find_elements("css selector", "#diff-headline tr[data-figure^='MFU']"))
    Select(driver.find_element("css selector", "#diff-select")).select_by_value("train:1")
    _wait(driver, lambda d: "MFU roofs differ" in d.find_element("css selector", "#diff").text)
    mfu = driver.find_element("css selector", "#diff-headline tr[data-figure^='MFU']").find_elements("css selector", "td")
    # the row shows the two figures its change is the difference of: step 3's MFU on step 1's roof (its own, lower
    # on its wider roof, is in the note)
    assert mfu[0].text == "MFU on step 1's roof" and mfu[1].text == mfu[2].text and mfu[3].text == "+0 pts"
    assert mfu[3].get_attribute("data-verdict") == "noise"




def test_no_card_cuts_its_subtitle_at_a_laptop_width(driver, page_file):
    """At 1400 px the MBU and HFU cards cut their basis mid-word ("measured bandwidth 25.7…", "/ step time / fp3…"):
    each card's subtitle shows whole."""
    try:
        driver.set_window_size(1400, 1000)
        _open(driver, page_file.as_uri())
        subs = driver.find_elements("css selector", "#cards .card .sub")
        assert len(subs) >= 6
        clipped = driver.execute_script(
            "return Array.from(document.querySelectorAll('#cards .card .sub'))"
            ".filter((e) => e.scrollHeight > e.clientHeight + 1).map((e) => e.textContent)")
        assert clipped == []
    finally:
        driver.set_window_size(1440, 1800)
        _open(driver, page_file.as_uri())


def test_switching_runs_clears_the_diff(driver, fit_logdir, page_file, tmp_path):
    """The step diff of one run stayed on the page after switching to another run (its selectors reset to '—'), so
    its figures read as the new run's."""
    from selenium.webdriver.support.ui import Select

    root, run_dir, steps = fit_logdir
    two = tmp_path / "two"
    shutil.copytree(root, two)
    shutil.copytree(two / run_dir.relative_to(root), two / run_dir.relative_to(root).parent / "version_1")
    page = tmp_path / "two.html"
    page.write_text(run_html(str(two)), encoding="utf-8")
    try:
        _open(driver, page.as_uri())
        Select(driver.find_element("css selector", "#diff-select")).select_by_value(f"train:{steps[0]}")
        _wait(driver, lambda d: d.find_elements("css selector", "#diff-headline tr[data-figure]"))
        runs = Select(driver.find_element("css selector", "#run-select"))
        other = next(o.get_attribute("value") for o in runs.options if not o.is_selected())
        runs.select_by_value(other)
        _wait(driver, lambda d: not d.find_elements("css selector", "#diff-headline"))
        assert driver.find_element("css selector", "#diff-select").get_attribute("value") == ""
        assert "diff with" in driver.find_element("css selector", "#diff").text
    finally:
        _open(driver, page_file.as_uri())


def test_a_run_charts_last_point_names_its_step(driver, page_file):
    """The MFU chart's 'last 58.5%' (an automatic window) sat beside the MFU card (the profiled step's 57%) with
    nothing saying they are two steps: the last point says its step."""
    _open(driver, page_file.as_uri())
    titles = [e.text for e in driver.find_elements("css selector", "#charts .chart h3")]
    mfu = next(t for t in titles if t.startswith("MFU"))
    steps = [int(c.get_attribute("textContent").split("step ")[1].split(":")[0])
             for c in driver.find_elements("css selector", "#charts [data-series=mfu] svg circle title")]
    assert re.fullmatch(r"MFU · last [\d.]+% \(step \d+\)", mfu) and mfu.endswith(f"(step {max(steps)})"), mfu
