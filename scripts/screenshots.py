"""Make every screenshot of the README and docs/ from the current code: ``make screenshots``.

One ``tscope demo`` fit (CPU, or ``--logdir`` an existing log directory) is the data of every picture:

- ``docs/roofline_example.png``: the roofline plot of the last profiled step, as ``tscope report PATH --plot`` draws it;
- ``docs/tensorboard_scalars.png``, ``tensorboard_text.png``, ``tensorboard_images.png``: TensorBoard's own dashboards
  of the ``tscope/`` scalars, the roofline table and the plot (a real ``tensorboard`` on a free localhost port; its
  "Scalars" dashboard, since "Time Series" draws with WebGL, blank in headless Chromium without a GPU);
- ``docs/tensorboard_tscope_tab.png``: the TSCOPE tab inside that TensorBoard, the last step diffed with the first;
- ``docs/dashboard_overview.png``, ``dashboard_tree.png``, ``dashboard_diff.png``: the standalone dashboard page
  (``tscope view``): the cards and roofline with a tooltip; a layer's ops and the layer tree; memory, NaN, the run's
  series and the diff with the first step.

``docs/screenshots.json`` records, for each picture, the files of the code it shows and their SHA-256 (and the PNG's);
``tests/test_screenshots.py`` fails when that code changed since (run ``make screenshots`` again) or when a PNG was
replaced by hand. Needs selenium, ``chromium`` and ``chromedriver`` (Debian: ``apt-get install chromium
chromium-driver``). Look at every PNG after a run.

    .venv/bin/python scripts/screenshots.py [--logdir DIR] [--out docs] [--only NAME ...]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from tb_server import TensorBoardUnavailable, serve  # noqa: E402

MANIFEST = "screenshots.json"
#: the code each picture shows (globs under the repository): a change to any of these files makes it stale
PAGE = ["tscope_callbacks/render/static/**/*", "tscope_callbacks/render/dashboard.py", "tscope_callbacks/dashboard/**/*",
        "tscope_callbacks/analysis/fmt.py"]
SOURCES: dict[str, list[str]] = {
    "roofline_example.png": ["tscope_callbacks/render/plot.py"],
    "tensorboard_scalars.png": ["tscope_callbacks/callbacks/roofline_io.py"],  # the step's scalars
    "tensorboard_text.png": ["tscope_callbacks/render/markdown.py", "tscope_callbacks/analysis/fmt.py"],
    "tensorboard_images.png": ["tscope_callbacks/render/plot.py"],
    "tensorboard_tscope_tab.png": PAGE,
    "dashboard_overview.png": PAGE,
    "dashboard_tree.png": PAGE,
    "dashboard_diff.png": PAGE,
}
DEMO = ["--steps", "160", "--every", "50", "--size", "cpu"]  #: the demo fit behind every picture (profiles 10, 50, 100, 150)


# ------------------------------------------------------------------------------------------------ the manifest
def source_files(globs: list[str], root: Path = ROOT) -> list[Path]:
    """The files ``globs`` match under ``root`` (no caches), sorted."""
    out: set[Path] = set()
    for g in globs:
        out |= {p for p in root.glob(g) if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"}
    return sorted(out)


def source_hashes(globs: list[str], root: Path = ROOT) -> dict[str, str]:
    """Each matched file's repository path -> the SHA-256 of its bytes."""
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in source_files(globs, root)}


def changed_sources(recorded: dict[str, str], globs: list[str], root: Path = ROOT) -> list[str]:
    """The files that differ from ``recorded``: changed, new (``+``) or gone (``-``)."""
    now = source_hashes(globs, root)
    return sorted([f for f in now if f in recorded and now[f] != recorded[f]] + [f"+{f}" for f in now if f not in recorded]
                  + [f"-{f}" for f in recorded if f not in now])


def file_digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def made_on() -> dict[str, Any]:
    """What the pictures' captions state: the date, the machine, the versions."""
    import platform

    import tensorboard
    import torch

    exe = os.environ.get("CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
    try:
        chromium_version = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        chromium_version = "unknown"
    return {"date": time.strftime("%Y-%m-%d", time.gmtime()), "cpus": os.cpu_count(), "machine": platform.machine(),
            "torch": torch.__version__, "tensorboard": tensorboard.__version__, "chromium": chromium_version}


def write_manifest(out: Path, names: list[str], shown: dict[str, str]) -> None:
    path = out / MANIFEST
    old = json.loads(path.read_text()) if path.exists() else {}
    shots = old.get("screenshots", {})
    for name in names:
        shots[name] = {"sources": SOURCES[name], "png_sha256": file_digest(out / name),
                       **({"shows": shown[name]} if name in shown else {}), "files": source_hashes(SOURCES[name])}
    data = {"made_by": "make screenshots (scripts/screenshots.py)", "demo": "tscope demo " + " ".join(DEMO),
            "made_on": made_on(), "screenshots": dict(sorted(shots.items()))}
    path.write_text(json.dumps(data, indent=1) + "\n")
    print(f"wrote {path}")


# ------------------------------------------------------------------------------------------------ the browser
@contextmanager
def chromium(width: int, height: int) -> Iterator[Any]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--hide-scrollbars",
              f"--window-size={width},{height}", "--force-device-scale-factor=1"):
        opts.add_argument(a)
    opts.binary_location = os.environ.get("CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
    driver = os.environ.get("CHROMEDRIVER") or shutil.which("chromedriver") or "/usr/bin/chromedriver"
    d = webdriver.Chrome(service=Service(driver), options=opts)
    d.set_page_load_timeout(90)
    try:
        yield d
    finally:
        d.quit()


def _wait(d: Any, cond: Callable[[Any], Any], timeout: float = 60) -> Any:
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(d, timeout).until(cond)


def _ready(d: Any) -> bool:
    return d.execute_script("return document.body && document.body.dataset.ready === '1'")


def _pick_diff(d: Any) -> None:
    """'diff with' the last step the list offers (the page opens on its richest step, the first with layer details:
    the diff then spans the run)."""
    from selenium.webdriver.support.ui import Select

    values = [o.get_attribute("value") for o in d.find_elements("css selector", "#diff-select option")
              if o.get_attribute("value") and o.is_enabled()]
    if values:
        Select(d.find_element("css selector", "#diff-select")).select_by_value(values[-1])
        _wait(d, lambda d: d.find_elements("css selector", "#diff-headline"), 20)


def _hover_a_point(d: Any) -> Any:
    """Hover the first roofline point in the upper left that nothing covers (its tooltip shows); the point."""
    from selenium.webdriver.common.action_chains import ActionChains

    pt = d.execute_script("""
        const svg = document.querySelector('svg#roofline').getBoundingClientRect();
        for (const c of document.querySelectorAll('svg#roofline circle.pt')) {
          const b = c.getBoundingClientRect();
          const upper = b.y + b.height / 2 < svg.y + svg.height * 0.55 && b.x + b.width / 2 < svg.x + svg.width * 0.6;
          if (upper && document.elementFromPoint(b.x + b.width / 2, b.y + b.height / 2) === c) return c;
        }""")
    if pt is not None:
        ActionChains(d).move_to_element(pt).perform()
    return pt


# ------------------------------------------------------------------------------------------------ the pictures
def roofline_plot(logdir: Path, out: Path) -> list[str]:
    from tscope_callbacks.api import load_profile_file, roofline

    files = sorted(logdir.rglob("tscope/step_*.json"), key=lambda p: int(p.stem.split("_")[-1]))
    if not files:
        raise SystemExit(f"no tscope/step_*.json under {logdir}")
    prof, dev = load_profile_file(str(files[-1]))
    roofline(prof, dev).plot(out / "roofline_example.png")
    SHOWN["roofline_example.png"] = files[-1].stem
    print(f"wrote {out / 'roofline_example.png'} (from {files[-1]})")
    return ["roofline_example.png"]


def _cli_screenshot(url: str, out: Path, size: str, budget_ms: int = 20000) -> None:
    """Chromium's own ``--screenshot`` after ``budget_ms`` of virtual time (TensorBoard's dashboards have no ready
    flag to wait for: virtual time lets every request and timer of the page finish first)."""
    exe = os.environ.get("CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--hide-scrollbars",
             "--disable-background-networking", "--disable-component-update", "--disable-sync"]
    with tempfile.TemporaryDirectory() as profile_dir:
        cmd = [exe, *flags, f"--user-data-dir={profile_dir}", f"--window-size={size}",
               f"--virtual-time-budget={budget_ms}", f"--screenshot={out}", url]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=180)
    if not out.is_file() or out.stat().st_size == 0:
        raise SystemExit(f"chromium wrote no screenshot for {url}")
    print(f"wrote {out} ({url})")


def tensorboard(logdir: Path, out: Path, only: set[str]) -> list[str]:
    """TensorBoard's scalars, text and images dashboards, and the TSCOPE tab, from one server."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as EC

    shots = {"tensorboard_scalars.png": ("#scalars&tagFilter=tscope%2Froofline%2F&_smoothingWeight=0", (1400, 1300)),
             "tensorboard_text.png": ("#text&tagFilter=tscope%2Froofline%2Ftable", (1600, 1000)),
             "tensorboard_images.png": ("#images&tagFilter=tscope%2F", (1400, 700))}
    done = []
    try:
        with serve(logdir.resolve(), 120.0, extra_args=("--reload_interval", "0")) as base:
            for name, (fragment, (w, h)) in shots.items():
                if name in only:
                    _cli_screenshot(f"{base}/{fragment}", out / name, f"{w},{h}")
                    done.append(name)
            if "tensorboard_tscope_tab.png" in only:
                with chromium(1600, 1300) as d:
                    d.get(base + "/#tscope")
                    d.switch_to.frame(_wait(d, EC.presence_of_element_located(
                        (By.CSS_SELECTOR, "iframe[src*='plugin_entry.html?name=tscope']"))))
                    d.switch_to.frame(_wait(d, EC.presence_of_element_located((By.CSS_SELECTOR, "iframe#tscope-page"))))
                    _wait(d, _ready)
                    _pick_diff(d)
                    SHOWN["tensorboard_tscope_tab.png"] = _selected(d)
                    d.switch_to.default_content()
                    time.sleep(0.5)
                    d.save_screenshot(str(out / "tensorboard_tscope_tab.png"))
                print(f"wrote {out / 'tensorboard_tscope_tab.png'}")
                done.append("tensorboard_tscope_tab.png")
    except TensorBoardUnavailable as e:
        raise SystemExit(f"screenshots: {e}") from None
    return done


def _selected(d: Any) -> str:
    """The step the page shows, and the one it is diffed with (the selects' texts)."""
    return d.execute_script("""
        const t = s => { const e = document.querySelector(s); return e && e.selectedIndex >= 0 && e.value
                         ? e.options[e.selectedIndex].text : ''; };
        const diff = t('#diff-select');
        return t('#step-select') + (diff ? ' vs ' + diff : '');""")


SHOWN: dict[str, str] = {}  #: picture -> the step it shows (for its caption)


def dashboard(logdir: Path, out: Path, only: set[str], width: int = 1440) -> list[str]:
    """The standalone page: overview (tooltip), a layer's ops and the tree, memory/NaN/run/diff."""
    from PIL import Image
    from selenium.webdriver.common.action_chains import ActionChains

    from tscope_callbacks.dashboard.page import run_html

    page = Path(tempfile.mkdtemp(prefix="tscope_shots_")) / "dashboard.html"
    page.write_text(run_html(str(logdir)), encoding="utf-8")
    done = []
    with chromium(width, 1000) as d:
        d.get(page.as_uri())
        _wait(d, _ready)

        def shot(name: str, top_sel: str, bottom_sel: str, pad: int = 8) -> None:
            """The page from the top of ``top_sel`` to the bottom of ``bottom_sel``, full width."""
            top, bottom = d.execute_script(
                "const a = document.querySelector(arguments[0]).getBoundingClientRect();"
                "const b = document.querySelector(arguments[1]).getBoundingClientRect();"
                "return [a.top + scrollY, b.bottom + scrollY];", top_sel, bottom_sel)
            height = int(bottom - top) + 2 * pad
            d.set_window_size(width, max(400, height + 200))
            d.execute_script("window.scrollTo(0, arguments[0])", max(0, top - pad))
            time.sleep(0.3)
            png = out / name
            d.save_screenshot(str(png))
            im = Image.open(png)
            im.crop((0, 0, im.width, min(im.height, height))).save(png)
            print(f"wrote {png} ({im.width}x{min(im.height, height)}; {_selected(d)})")
            SHOWN[name] = _selected(d)
            done.append(name)

        pt = _hover_a_point(d)
        if "dashboard_overview.png" in only:
            shot("dashboard_overview.png", "header.bar", ".grid2")
        if "dashboard_tree.png" in only:
            if pt is not None:
                ActionChains(d).click(pt).perform()
                _wait(d, lambda d: d.find_elements("css selector", "#ops-table"), 10)
            ActionChains(d).move_to_element(d.find_element("css selector", "#tree-panel h2")).perform()
            d.execute_script("document.querySelector('#tooltip').style.display = 'none'")
            shot("dashboard_tree.png", "#ops-panel", "#tree-panel")
        if "dashboard_diff.png" in only:
            _pick_diff(d)
            shot("dashboard_diff.png", "#mem-panel", "#diff-panel")
    return done


def run_demo(logdir: Path) -> None:
    cmd = [sys.executable, "-m", "tscope_callbacks.cli", "demo", *DEMO, "--out", str(logdir)]
    print("running", " ".join(cmd[2:]), flush=True)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--logdir", type=Path, default=None,
                    help="a log directory written by the callbacks (default: a fresh `tscope demo` in a temp dir)")
    ap.add_argument("--out", type=Path, default=ROOT / "docs", help="where the PNGs go (default: docs/)")
    ap.add_argument("--only", nargs="+", choices=sorted(SOURCES), default=sorted(SOURCES), metavar="NAME",
                    help="make only these pictures")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    only = set(args.only)
    with tempfile.TemporaryDirectory(prefix="tscope_demo_") as tmp:
        logdir = args.logdir
        if logdir is None:
            logdir = Path(tmp) / "demo_logs"
            run_demo(logdir)
        done = roofline_plot(logdir, args.out) if "roofline_example.png" in only else []
        done += dashboard(logdir, args.out, only)
        done += tensorboard(logdir, args.out, only)
    if args.out.resolve() == (ROOT / "docs").resolve():
        write_manifest(args.out, done, SHOWN)
    return 0


if __name__ == "__main__":
    sys.exit(main())
