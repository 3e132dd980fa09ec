"""Screenshots of the dashboard page for the docs, taken in headless Chromium from a log dir's standalone page.

    python scripts/dashboard_screenshots.py LOGDIR [--out docs]

LOGDIR: a log dir with tscope step files (e.g. ``tscope demo --steps 160 --every 50 --out demo_logs``). Writes
``dashboard_overview.png`` (the cards, the roofline with a tooltip, the opportunities and the time split),
``dashboard_tree.png`` (a layer's ops and the layer tree) and ``dashboard_diff.png`` (the memory, NaN and
over-the-run panels and the diff with another step: the first, or with ``--step`` the last). Needs selenium, ``/usr/bin/chromium`` and
``/usr/bin/chromedriver``.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tscope_callbacks.dashboard.page import run_html


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("logdir")
    ap.add_argument("--out", default=str(Path(__file__).resolve().parents[1] / "docs"))
    ap.add_argument("--width", type=int, default=1440)
    ap.add_argument("--step", default=None, help="the step to show, as '<stage>:<step>' (default: the last)")
    args = ap.parse_args()

    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.support.ui import Select, WebDriverWait

    page = Path(tempfile.mkdtemp(prefix="tscope_shots_")) / "dashboard.html"
    page.write_text(run_html(args.logdir), encoding="utf-8")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    opts = Options()
    for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--hide-scrollbars",
              f"--window-size={args.width},1000", "--force-device-scale-factor=1"):
        opts.add_argument(a)
    opts.binary_location = "/usr/bin/chromium"
    d = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=opts)
    try:
        d.get(page.as_uri())
        WebDriverWait(d, 30).until(lambda d: d.execute_script("return document.body.dataset.ready === '1'"))

        def shot(name: str, top_sel: str, bottom_sel: str, pad: int = 8) -> None:
            """The page from the top of ``top_sel`` to the bottom of ``bottom_sel``, full width."""
            top, bottom = d.execute_script(
                "const a = document.querySelector(arguments[0]).getBoundingClientRect();"
                "const b = document.querySelector(arguments[1]).getBoundingClientRect();"
                "return [a.top + scrollY, b.bottom + scrollY];", top_sel, bottom_sel)
            height = int(bottom - top) + 2 * pad
            d.set_window_size(args.width, max(400, height + 200))
            d.execute_script("window.scrollTo(0, arguments[0])", max(0, top - pad))
            time.sleep(0.3)
            png = out / name
            d.save_screenshot(str(png))
            from PIL import Image

            im = Image.open(png)
            im.crop((0, 0, im.width, min(im.height, height))).save(png)
            print(f"written {png} ({im.width}x{min(im.height, height)})")

        if args.step:
            Select(d.find_element("css selector", "#step-select")).select_by_value(args.step)
            WebDriverWait(d, 10).until(lambda d: d.execute_script(
                "return tscopeDashboard.state.stage + ':' + tscopeDashboard.state.step") == args.step)
            time.sleep(0.5)
        # overview: hover the largest uncovered roofline point so the tooltip shows
        d.set_window_size(args.width, 1000)
        pt = d.execute_script("""
            const svg = document.querySelector('svg#roofline').getBoundingClientRect();
            for (const c of document.querySelectorAll('svg#roofline circle.pt')) {
              const b = c.getBoundingClientRect();
              const upper = b.y + b.height / 2 < svg.y + svg.height * 0.55 && b.x + b.width / 2 < svg.x + svg.width * 0.6;
              if (upper && document.elementFromPoint(b.x + b.width / 2, b.y + b.height / 2) === c) return c;
            }""")
        if pt is not None:
            ActionChains(d).move_to_element(pt).perform()
        shot("dashboard_overview.png", "header.bar", ".grid2")

        # a layer's ops (click) and the tree
        if pt is not None:
            ActionChains(d).click(pt).perform()
            WebDriverWait(d, 10).until(lambda d: d.find_elements("css selector", "#ops-table"))
        ActionChains(d).move_to_element(d.find_element("css selector", "#tree-panel h2")).perform()
        d.execute_script("document.querySelector('#tooltip').style.display = 'none'")
        shot("dashboard_tree.png", "#ops-panel", "#tree-panel")

        # memory, NaN, over the run, and the diff of the first and last steps
        sel = Select(d.find_element("css selector", "#diff-select"))
        others = [o.get_attribute("value") for o in sel.options if o.get_attribute("value") and o.is_enabled()
                  and o.get_attribute("value") != args.step]
        if others:
            sel.select_by_value(others[0] if not args.step else others[-1])
            WebDriverWait(d, 10).until(lambda d: d.find_elements("css selector", "#diff-headline"))
        shot("dashboard_diff.png", "#mem-panel", "#diff-panel")
    finally:
        d.quit()
    return 0


if __name__ == "__main__":
    sys.exit(main())
