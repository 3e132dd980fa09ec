"""The dashboard page in a real browser (headless Chromium through selenium), over the standalone HTML of a small
test fit (TinyLM, three profiled steps): the cards show the report's numbers, the roofline has one point per layer
and phase, hovering shows the tooltip, a click lists the layer's ops, the tree expands, the diff shows a change, a
corrupt step file is listed as unreadable while the rest is shown. One browser session for the module.

Skipped, with the reason, only when selenium, ``/usr/bin/chromium`` or ``/usr/bin/chromedriver`` is missing
(Debian: ``apt-get install -y chromium chromium-driver``; ``pip install selenium``)."""

from __future__ import annotations

import json
import os
import re
import shutil

import pytest

from tscope_callbacks.dashboard import logdir as ld
from tscope_callbacks.dashboard.page import fmt_figure, page_html, report_html, run_html, sig, standalone_data

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
DRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"


def _browser_missing() -> str | None:
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (pip install selenium, in the dev extra)"
    for path, pkg in ((CHROMIUM, "chromium"), (DRIVER, "chromium-driver")):
        if not os.path.exists(path):
            return f"{path} is missing (apt-get install -y {pkg})"
    return None


@pytest.fixture(scope="module")
def fit_logdir(tmp_path_factory):
    """A TinyLM fit profiled at steps 2, 5 and 8 (one step per profile, on schedule), plus a corrupt step file."""
    import lightning.pytorch as pl

    from tests.models import TinyLM
    from tscope_callbacks import RooflineCallback

    root = tmp_path_factory.mktemp("dash")
    cb = RooflineCallback(every_n_steps=3, start_step=2, profile_steps=1, wait_for_warmup=False, plot=False,
                          compare_eager=False, replay=False)
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
    why = _browser_missing()
    if why:
        pytest.skip(f"browser tests need headless Chromium: {why}")
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    opts = Options()
    for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1440,1800"):
        opts.add_argument(a)
    opts.binary_location = CHROMIUM
    d = webdriver.Chrome(service=Service(DRIVER), options=opts)
    d.set_page_load_timeout(60)
    d.get(page_file.as_uri())
    _wait(d, lambda d: d.find_element("css selector", "body").get_attribute("data-ready") == "1")
    yield d
    d.quit()


def _wait(d, cond, timeout: float = 20):
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(d, timeout).until(cond)


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


# ---------- no browser needed ----------

def test_sig_and_figures_format_with_units():
    assert sig(0.002163) == "0.00216" and sig(28.58) == "28.6" and sig(1611.4) == "1,611" and sig(0) == "0"
    assert fmt_figure({"value": 28.58, "unit": "ms"}) == "28.6 ms"
    assert fmt_figure({"value": 0.4, "unit": "ms"}) == "400 µs"
    assert fmt_figure({"value": 0.002163, "unit": "ratio"}) == "0.216%"
    assert fmt_figure({"value": 675976, "unit": "B"}) == "660 KiB"  # 675,976 / 1024 = 660.1
    assert fmt_figure({"value": 3 * 2**30, "unit": "B"}) == "3 GiB"
    assert fmt_figure({"value": 0.0004, "unit": "TFLOP/s"}) == "400 MFLOP/s"  # 4e-4 x 1e12 = 4e8
    assert fmt_figure({"value": 2239.3, "unit": "tokens/s"}) == "2,239 tokens/s"
    assert fmt_figure({"value": 2.5e6, "unit": "tokens/s"}) == "2.5 M tokens/s"
    assert fmt_figure({"value": None, "unit": "ms"}) == "–"


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
    assert data["schema"] == "tscope.step_report" and data["header"] == rep.to_dict()["header"]
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
    rep = {"schema": "tscope.step_report", "version": 2, "step": 4, "stage": "train",
           "header": {"mfu": {"value": 0.5, "unit": "ratio", "basis": "b"}}, "ops": []}
    d = standalone_data([("r", rep), ("r", {**rep, "step": 2, "header": {"mfu": {"value": 0.25, "unit": "ratio"}}})])
    assert [s["step"] for s in d["runs"][0]["steps"]] == [2, 4]
    assert d["series"]["r"]["mfu"] == [[2, 0.25], [4, 0.5]]
    assert "ops" not in d["steps"]["r/train/4"]


# ---------- in the browser ----------

def test_cards_show_the_reports_numbers(driver, fit_logdir):
    rep = _shown_report(fit_logdir)
    h = rep["header"]
    card = lambda k: driver.find_element("css selector", f"[data-card={k}] .value").text  # noqa: E731
    assert card("step_time") == fmt_figure(h["step_ms"])
    assert re.fullmatch(r"[\d.,]+ (ms|s|µs)", card("step_time"))
    mfu_pct = float(f"{h['mfu']['value'] * 100:.3g}")  # 3 significant digits of the percentage, by hand
    assert card("mfu") == fmt_figure(h["mfu"]) == f"{mfu_pct:g}%"
    assert card("mbu") == fmt_figure(h["mbu"]) and card("hfu") == fmt_figure(h["hfu"])
    assert card("tokens_per_s") == fmt_figure(h["tokens_per_s"]) and card("tokens_per_s").endswith("tokens/s")
    assert card("memory") == fmt_figure(h["memory_peak_bytes"])
    assert card("flop_coverage") == fmt_figure(h["flop_coverage"])
    basis = driver.find_element("css selector", "[data-card=step_time] .sub").text
    assert basis and basis.split(",")[0] in h["step_ms"]["basis"]


def test_roofline_has_one_point_per_layer_and_phase(driver, fit_logdir):
    rep = _shown_report(fit_logdir)
    pts = driver.find_elements("css selector", "svg#roofline circle.pt")
    drawn = [(p.get_attribute("data-layer"), p.get_attribute("data-phase")) for p in pts]
    assert len(drawn) == len(set(drawn)) == len(_plotted(rep)) > 5
    assert set(drawn) == _plotted(rep)
    roofs = {r.get_attribute("data-precision") for r in driver.find_elements("css selector", "svg#roofline path.roof")}
    assert roofs == {k for k, v in rep["device"]["peaks"].items() if v}


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
    n_ops = sum(1 for o in rep["ops"] if o["layer"] == layer or o["layer"].startswith(layer + "."))
    assert head == f"Ops of {layer or '(root)'} ({n_ops})"
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
    a, b = ld.load(run_dir, steps[0], "train"), ld.load(run_dir, steps[-1], "train")
    heads = [c.text for c in driver.find_elements("css selector", "#diff-headline th")]
    assert heads[1:3] == [f"step {steps[0]}", f"step {steps[-1]}"]
    row = driver.find_element("css selector", '#diff-headline tr[data-figure="MFU"]')
    cells = [c.text for c in row.find_elements("css selector", "td")]
    assert cells[1] == fmt_figure(a["header"]["mfu"]) and cells[2] == fmt_figure(b["header"]["mfu"])
    d_pts = (b["header"]["mfu"]["value"] - a["header"]["mfu"]["value"]) * 100
    assert cells[3] == f"{'+' if d_pts >= 0 else ''}{sig(d_pts)} pts"
    step_row = driver.find_element("css selector", "#diff-headline tr[data-figure='step time']")
    assert re.search(r"[+-][\d.,]+% \([\d.,]+x (faster|slower)\)", step_row.find_elements("css selector", "td")[3].text)
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
    import threading

    from tscope_callbacks.cli.view import serve

    root, _, _ = fit_logdir
    file_cards = {k: driver.find_element("css selector", f"[data-card={k}] .value").text
                  for k in ("step_time", "mfu", "memory")}
    ready = threading.Event()
    threading.Thread(target=serve, args=(str(root), "127.0.0.1", 0), kwargs={"ready": ready}, daemon=True).start()
    assert ready.wait(10)
    try:
        driver.get(f"http://127.0.0.1:{ready.port}/")
        _wait(driver, lambda d: d.find_element("css selector", "body").get_attribute("data-ready") == "1")
        assert {k: driver.find_element("css selector", f"[data-card={k}] .value").text
                for k in file_cards} == file_cards
        assert driver.find_elements("css selector", "svg#roofline circle.pt")
        assert "step 999" in driver.find_element("css selector", "#banner").text
    finally:
        ready.server.shutdown()


def test_tscope_report_html(fit_logdir, tmp_path):
    from tscope_callbacks.cli import main

    _, run_dir, steps = fit_logdir
    out = tmp_path / "step.html"
    assert main(["report", str(run_dir / "tscope" / f"step_{steps[-1]}.json"), "--html", str(out)]) == 0
    text = out.read_text(encoding="utf-8")
    data = json.loads(re.search(r'data-tscope-step="[^"]+">(.*?)</script>', text, re.S)[1])
    assert data["header"]["mfu"] == ld.load(run_dir, steps[-1], "train")["header"]["mfu"]


def test_wandb_gets_the_page_at_each_profile(tmp_path, monkeypatch):
    """W&B (offline): each profile logs the step's dashboard page as ``wandb.Html`` under tscope/roofline/dashboard."""
    wandb = pytest.importorskip("wandb")
    import lightning.pytorch as pl
    from lightning.pytorch.loggers import WandbLogger

    from tests.models import TinyLM
    from tscope_callbacks import RooflineCallback

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    settings = wandb.Settings(x_disable_stats=True, x_disable_meta=True, console="off", disable_git=True,
                              save_code=False)
    logger = WandbLogger(offline=True, save_dir=str(tmp_path), project="tscope-test", settings=settings)
    cb = RooflineCallback(gpu="NVIDIA A100-SXM4-80GB", every_n_steps=3, start_step=1, profile_steps=1,
                          wait_for_warmup=False, plot=False, compare_eager=False, replay=False)
    try:
        pl.Trainer(max_steps=5, logger=logger, callbacks=[cb], enable_checkpointing=False, enable_progress_bar=False,
                   enable_model_summary=False, accelerator="cpu", devices=1).fit(TinyLM())
    finally:
        wandb.finish()
    pages = sorted((tmp_path / "wandb").glob("offline-run-*/files/media/html/tscope/roofline/dashboard*.html"))
    assert len(pages) == 2, pages  # steps 1 and 4
    text = pages[-1].read_text(encoding="utf-8")
    assert text.startswith("<!DOCTYPE html>") and 'data-tscope-step="run/train/' in text and "<script src" not in text
