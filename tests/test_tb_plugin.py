"""The TSCOPE tab in a real TensorBoard, opened in headless Chromium.

A small test fit (``TinyLM`` from tests/models.py, ``RooflineCallback`` profiling three steps, a
``TensorBoardLogger``) writes the log dir; a corrupt step file and an older-schema step file are added to its run.
``tensorboard --logdir`` is started on a free localhost port (the plugin is found through the package's
``tensorboard_plugins`` entry point, as for a user), and:

- over HTTP: the plugin is listed as the TSCOPE tab; ``runs`` lists the profiled steps and the two bad files as
  unreadable with their reasons; ``step`` answers a profiled step's report (timed) and an error JSON for the bad
  files and bad parameters, after which the server keeps answering;
- in the browser (Debian ``chromium`` + ``chromium-driver``, driven by selenium): the TSCOPE tab shows the page; a
  step is selected; the cards show the report's numbers; the roofline has one point per layer and phase; hovering a
  point shows the tooltip; the layer tree expands; the diff of two steps shows a change; the bad files are listed
  with their reasons. Selectors are the page's (``tscope_callbacks/dashboard/page.py``'s docstring).

The browser tests skip, saying why, when Chromium, chromedriver or selenium is missing (``.ci/run`` installs them
as root); with ``TSCOPE_REQUIRE_BROWSER=1`` (set by ``.ci/run`` once the browser is there) a missing piece fails.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
from pathlib import Path

import lightning.pytorch as pl
import pytest
from cb_utils import FAST, test_spec
from lightning.pytorch.loggers import TensorBoardLogger
from models import TinyLM

import tscope_callbacks as ts
from tests.browser import wait

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
from tb_server import TensorBoardUnavailable, get_json, serve


def _plugin_missing() -> str | None:
    """TensorBoard finds the tab through the package's ``tensorboard_plugins`` entry point, which only an installed
    package has (``pip install -e .``; ``make`` does it): without it the tab cannot appear."""
    from importlib.metadata import entry_points

    if any(ep.name == "tscope" for ep in entry_points(group="tensorboard_plugins")):
        return None
    return "tscope_callbacks is not installed here (no tensorboard_plugins entry point): pip install -e ."


if _plugin_missing() and os.environ.get("CI") == "true":  # .ci/run installs the package: there it must be found
    raise RuntimeError(f"CI: {_plugin_missing()}")
pytestmark = pytest.mark.skipif(_plugin_missing() is not None, reason=str(_plugin_missing()))

RUN = "demo/version_0"
STARTUP_S = 90.0
WAIT_S = 30.0
CHROMIUM = os.environ.get("CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = os.environ.get("CHROMEDRIVER") or shutil.which("chromedriver") or "/usr/bin/chromedriver"


# ------------------------------------------------------------------------------------------------ fixtures
@pytest.fixture(scope="module")
def logdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("tbplugin")
    roof = ts.RooflineCallback(gpu=test_spec(), start_step=1, every_n_steps=3,
                               capture=ts.CaptureOptions(wait_for_warmup=False))
    trainer = pl.Trainer(**{**FAST, "log_every_n_steps": 2}, max_steps=8, callbacks=[roof],
                         logger=TensorBoardLogger(str(root), name="demo"))
    trainer.fit(TinyLM(n_batches=10))
    tdir = root / RUN / "tscope"
    good = sorted(tdir.glob("step_*.json"), key=lambda p: int(p.stem.split("_")[1]))
    assert len(good) >= 2, [p.name for p in tdir.iterdir()]
    text = good[0].read_text()
    (tdir / "step_1001.json").write_text(text[: len(text) // 3])  # half-written: a run still writing
    (tdir / "step_1002.json").write_text(json.dumps({"schema": "tscope.step_report", "version": 1, "step": 1002}))
    return root


@pytest.fixture(scope="module")
def server(logdir: Path):
    try:
        ctx = serve(logdir, STARTUP_S)
        base = ctx.__enter__()
    except TensorBoardUnavailable as e:
        pytest.skip(str(e))
    try:
        yield base
    finally:
        ctx.__exit__(None, None, None)


def _get(base: str, route: str, **params: object) -> object:
    return get_json(base, f"/data/plugin/tscope/{route}", **{k: str(v) for k, v in params.items()})


def _good_steps(base: str) -> list[int]:
    run = next(r for r in _get(base, "runs")["runs"] if r["run"] == RUN)
    return [s["step"] for s in run["steps"] if s["readable"] and s["stage"] == "train"]


# ------------------------------------------------------------------------------------------------ HTTP
def test_the_tab_is_registered(server: str) -> None:
    listing = get_json(server, "/data/plugins_listing")
    tab = listing["tscope"]
    assert tab["enabled"] and tab["tab_name"] == "TSCOPE"
    assert tab["loading_mechanism"] == {"type": "IFRAME", "module_path": "/data/plugin/tscope/index.js"}


def test_runs_steps_and_unreadable_files(server: str, logdir: Path) -> None:
    idx = _get(server, "runs")
    assert idx["hint"] is None
    run = next(r for r in idx["runs"] if r["run"] == RUN)
    on_disk = sorted(int(p.stem.split("_")[1]) for p in (logdir / RUN / "tscope").glob("step_*.json"))
    assert [s["step"] for s in run["steps"]] == on_disk
    bad = {s["step"]: s["error"] for s in run["steps"] if not s["readable"]}
    assert set(bad) == {1001, 1002}
    assert "half-written" in bad[1001]
    assert "schema version 1" in bad[1002] and "version 3" in bad[1002]


def test_step_route_answers_the_report(server: str, logdir: Path) -> None:
    step = _good_steps(server)[0]
    first = _get(server, "step", run=RUN, step=step, stage="train")  # parsed once, cached by (path, mtime, size)
    # the file's bytes garbled in place, its size and mtime kept: a second request that parsed it again would fail,
    # the cached parse answers the same report
    path = logdir / RUN / "tscope" / f"step_{step}.json"
    text, st = path.read_bytes(), path.stat()
    path.write_bytes(b" " * len(text))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    try:
        rep = _get(server, "step", run=RUN, step=step, stage="train")
    finally:
        path.write_bytes(text)
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert rep == first
    assert rep["schema"] == "tscope.step_report" and rep["version"] == 3 and rep["step"] == step
    assert "ops" not in rep and rep["ops_count"] > 0  # ops come lazily through the ops route
    from tscope_callbacks.dashboard import logdir as ld

    full = ld.load(logdir / RUN, step)
    assert rep["summary"] == full["summary"] and "header" not in full  # the header is derived for the page
    assert rep["header"]["mfu"]["value"] == full["summary"]["mfu"]
    assert len(_get(server, "ops", run=RUN, step=step, stage="train", layer="")["ops"]) == rep["ops_count"]
    series = _get(server, "series", run=RUN)
    assert len(series["mfu"]) >= 2 and all(v > 0 for _, v in series["mfu"])


def test_bad_files_and_parameters_never_break_the_server(server: str) -> None:
    assert "half-written" in _get(server, "step", run=RUN, step=1001, stage="train")["error"]
    assert "schema version 1" in _get(server, "step", run=RUN, step=1002, stage="train")["error"]
    for params in ({"run": RUN, "step": "x"}, {"run": "../../..", "step": 1}, {}, {"run": RUN, "step": 1,
                                                                                    "stage": "<script>"}):
        assert "error" in _get(server, "step", **params)
        assert "error" in _get(server, "ops", **params)
    assert "error" in _get(server, "series", run="/")
    assert get_json(server, "/data/runs") == [RUN]  # the server still answers
    assert _get(server, "runs")["runs"]


def test_empty_logdir_hint(tmp_path: Path) -> None:
    from torch.utils.tensorboard import SummaryWriter

    w = SummaryWriter(str(tmp_path / "plain"))
    w.add_scalar("tscope/roofline/loss", 1.0, 0)  # a run TensorBoard serves, without tscope step files
    w.close()
    try:
        with serve(tmp_path, STARTUP_S) as base:
            idx = _get(base, "runs")
    except TensorBoardUnavailable as e:
        pytest.skip(str(e))
    assert idx["runs"] == [] and "RooflineCallback" in idx["hint"]


# ------------------------------------------------------------------------------------------------ the browser
def _browser_missing() -> str | None:
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (pip install -e '.[dev]')"
    for exe, pkg in ((CHROMIUM, "chromium"), (CHROMEDRIVER, "chromium-driver")):
        if not Path(exe).exists() and not shutil.which(exe):
            return f"{exe} not found (apt-get install -y {pkg}; .ci/run installs it when run as root)"
    return None


@pytest.fixture(scope="module")
def driver():
    why = _browser_missing()
    if why:
        if os.environ.get("TSCOPE_REQUIRE_BROWSER") == "1":
            pytest.fail(f"TSCOPE_REQUIRE_BROWSER=1 but {why}")
        pytest.skip(f"no headless browser: {why}")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1600,1200"):
        opts.add_argument(a)
    opts.binary_location = CHROMIUM
    d = webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)
    d.set_page_load_timeout(WAIT_S)
    try:
        yield d
    finally:
        d.quit()


def _wait(d, cond, what: str):
    return wait(d, cond, what, WAIT_S)


def _open_tab(d, base: str) -> None:
    """TensorBoard at its TSCOPE tab; the driver ends inside the page's frame, once a step is drawn."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as EC

    d.switch_to.default_content()
    d.get("about:blank")  # a fresh load (the same URL again would only be a hash change)
    d.get(base + "/#tscope")
    outer = _wait(d, EC.presence_of_element_located((By.CSS_SELECTOR, "iframe[src*='plugin_entry.html?name=tscope']")),
                  "TensorBoard's frame of the TSCOPE tab")
    d.switch_to.frame(outer)
    d.switch_to.frame(_wait(d, EC.presence_of_element_located((By.CSS_SELECTOR, "iframe#tscope-page")),
                            "the plugin's page frame"))
    _wait(d, lambda d: d.find_element(By.TAG_NAME, "body").get_attribute("data-ready") == "1", "a step drawn")
    # no JavaScript value printed as text ("null", "[object HTMLSpanElement]")
    text = d.find_element(By.TAG_NAME, "body").text
    bad = re.findall(r".{0,30}(?:\b(?:null|undefined|Infinity)\b|\bNaN\b(?! ?/ ?Inf)|\[object ).{0,30}", text)
    assert not bad, bad


@pytest.fixture(scope="module")
def tab(driver, server: str):
    _open_tab(driver, server)
    return driver


def _select(d, css: str, value: str) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    Select(d.find_element(By.CSS_SELECTOR, css)).select_by_value(value)


CARDS = {"step_time": "step_ms", "mfu": "mfu", "mbu": "mbu", "hfu": "hfu", "tokens_per_s": "tokens_per_s",
         "memory": "memory_peak_bytes", "flop_coverage": "flop_coverage"}


def test_tab_cards_roofline_tooltip_tree_and_diff(tab, server: str) -> None:
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By

    from tscope_callbacks.analysis.fmt import figure_text

    def fmt_figure(fig):
        return figure_text((fig or {}).get("value"), (fig or {}).get("unit") or "")

    d = tab
    steps = _good_steps(server)
    first, last = steps[0], steps[-1]
    # select a step (the page opens on the last): the cards show that step's header figures as the page formats them
    _select(d, "#step-select", f"train:{first}")
    rep = _get(server, "step", run=RUN, step=first, stage="train")
    want = {card: fmt_figure(rep["header"].get(key)) for card, key in CARDS.items()}
    card_text = lambda c: d.find_element(By.CSS_SELECTOR, f"[data-card={c}] .value").text  # noqa: E731
    _wait(d, lambda _: card_text("mfu") == want["mfu"], f"the MFU card to read {want['mfu']}")
    assert {c: card_text(c) for c in CARDS} == want
    assert want["mfu"] != "–" and want["step_time"] != "–"
    # the roofline: one point per layer and phase with FLOPs, bytes and a time
    drawn = [r for r in rep["rows"]["layer_phase"]
             if r["flops"] > 0 and r["bytes"] > 0 and ((r.get("measured_s") or 0) > 0 or (r.get("expected_s") or 0) > 0)]
    pts = d.find_elements(By.CSS_SELECTOR, "svg#roofline circle.pt")
    assert len(pts) == len(drawn) > 3
    assert sorted((p.get_attribute("data-layer"), p.get_attribute("data-phase")) for p in pts) == sorted(
        (r["layer"], r["phase"]) for r in drawn)
    # hovering a point shows its tooltip: the layer's name and figures
    tip = d.find_element(By.CSS_SELECTOR, "#tooltip")
    assert not tip.is_displayed()
    d.execute_script("arguments[0].scrollIntoView({block: 'center'})", d.find_element(By.CSS_SELECTOR, "svg#roofline"))
    big = d.execute_script(  # a point not covered by another at its centre (the largest such)
        "return [...document.querySelectorAll('svg#roofline circle.pt')].filter((c) => {"
        " const b = c.getBoundingClientRect(); return document.elementFromPoint(b.x + b.width / 2, b.y + b.height / 2)"
        " === c; }).sort((a, b) => b.r.baseVal.value - a.r.baseVal.value)[0];")
    assert big is not None
    ActionChains(d).move_to_element(big).perform()
    _wait(d, lambda _: tip.is_displayed(), "the tooltip")
    assert tip.text.splitlines()[0] == (big.get_attribute("data-layer") or "(root)")
    assert "FLOPs" in tip.text and "% of roof" in tip.text
    # the layer tree expands: a closed row with children opens and shows them
    rows = lambda: d.find_elements(By.CSS_SELECTOR, "#tree-table tr.tree-row")  # noqa: E731
    closed = [r for r in rows() if "open" not in (r.get_attribute("class") or "")
              and r.find_element(By.CSS_SELECTOR, ".tg").text == "▸"]
    assert closed, "no collapsed layer with children in the tree"
    n_before, path = len(rows()), closed[0].get_attribute("data-path")
    d.execute_script("arguments[0].scrollIntoView({block: 'center'})", closed[0])
    closed[0].find_element(By.CSS_SELECTOR, "td").click()
    opened = d.find_element(By.CSS_SELECTOR, f"#tree-table tr.tree-row[data-path='{path}']")
    assert "open" in opened.get_attribute("class")
    kids = [r.get_attribute("data-path") for r in rows() if (r.get_attribute("data-path") or "").startswith(path + ".")]
    assert len(rows()) > n_before and kids
    # the diff of two steps shows a change
    _select(d, "#diff-select", f"train:{last}")
    _wait(d, lambda _: d.find_elements(By.CSS_SELECTOR, "#diff-headline tr[data-figure]"), "the diff")
    head = {r.get_attribute("data-figure"): r.find_elements(By.TAG_NAME, "td")
            for r in d.find_elements(By.CSS_SELECTOR, "#diff-headline tr[data-figure]")}
    [key] = [k for k in head if k.startswith("MFU")]  # "MFU on step N's roof" where the roofs differ
    mfu = [c.text for c in head[key]]
    other = _get(server, "step", run=RUN, step=last, stage="train")
    assert mfu[1] == fmt_figure(rep["header"]["mfu"])
    if key == "MFU":
        assert mfu[2] == fmt_figure(other["header"]["mfu"])
    assert mfu[3].endswith("pts") and mfu[3] not in ("+0 pts", "0 pts")  # two profiles never time exactly alike
    assert d.find_elements(By.CSS_SELECTOR, "#diff-layers tr")


def test_tab_lists_the_unreadable_files(tab, server: str) -> None:
    from selenium.webdriver.common.by import By

    d = tab
    _open_tab(d, server)  # afresh: the page lists them when it opens
    banner = d.find_element(By.CSS_SELECTOR, "#banner").text
    assert "half-written" in banner and "step 1001" in banner
    assert "schema version 1" in banner and "step 1002" in banner
    opts = {o.get_attribute("value"): o for o in d.find_elements(By.CSS_SELECTOR, "#step-select option")}
    assert opts["train:1001"].get_attribute("disabled") and opts["train:1002"].get_attribute("disabled")
    assert not opts[f"train:{_good_steps(server)[0]}"].get_attribute("disabled")
    assert get_json(server, "/data/runs") == [RUN]  # the server still answers


def test_tab_shows_the_hint_for_a_logdir_without_tscope_data(driver, tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By
    from torch.utils.tensorboard import SummaryWriter

    w = SummaryWriter(str(tmp_path / "plain"))
    w.add_scalar("tscope/roofline/loss", 1.0, 0)
    w.close()
    try:
        with serve(tmp_path, STARTUP_S) as base:
            driver.switch_to.default_content()
            driver.get(base + "/#tscope")
            from selenium.webdriver.support import expected_conditions as EC

            driver.switch_to.frame(_wait(driver, EC.presence_of_element_located(
                (By.CSS_SELECTOR, "iframe[src*='plugin_entry.html?name=tscope']")), "the TSCOPE tab's frame"))
            driver.switch_to.frame(_wait(driver, EC.presence_of_element_located(
                (By.CSS_SELECTOR, "iframe#tscope-page")), "the page frame"))
            _wait(driver, lambda d: "RooflineCallback" in d.find_element(By.CSS_SELECTOR, "#banner").text, "the hint")
    except TensorBoardUnavailable as e:
        pytest.skip(str(e))
    finally:
        driver.switch_to.default_content()
