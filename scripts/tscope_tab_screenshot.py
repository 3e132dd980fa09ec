"""Photograph the TSCOPE tab inside a real TensorBoard: ``docs/tensorboard_tscope_tab.png``.

A real ``tensorboard --logdir LOGDIR`` on a free localhost port (the tab comes from the package's
``tensorboard_plugins`` entry point), opened in headless Chromium driven by selenium (Debian: ``apt-get install
chromium chromium-driver``; ``pip install selenium``). The page opens on the last profiled step of the first run;
``--diff`` also picks the first step in "diff with". The server and the browser are always stopped; look at the PNG.

    .venv/bin/tscope demo --steps 120 --every 50 --out demo_logs      # or any directory written by the callbacks
    .venv/bin/python scripts/tscope_tab_screenshot.py demo_logs [--out docs/tensorboard_tscope_tab.png]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from tb_server import TensorBoardUnavailable, serve

WAIT_S = 60


def shoot(base: str, out: Path, size: tuple[int, int], chromium: str, chromedriver: str, diff: bool) -> None:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as EC
    from selenium.webdriver.support.ui import Select, WebDriverWait

    opts = webdriver.ChromeOptions()
    for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--hide-scrollbars",
              f"--window-size={size[0]},{size[1]}"):
        opts.add_argument(a)
    opts.binary_location = chromium
    d = webdriver.Chrome(service=Service(chromedriver), options=opts)
    try:
        wait = WebDriverWait(d, WAIT_S)
        d.get(base + "/#tscope")
        d.switch_to.frame(wait.until(EC.presence_of_element_located(
            (By.CSS_SELECTOR, "iframe[src*='plugin_entry.html?name=tscope']"))))
        d.switch_to.frame(wait.until(EC.presence_of_element_located((By.CSS_SELECTOR, "iframe#tscope-page"))))
        wait.until(lambda d: d.find_element(By.TAG_NAME, "body").get_attribute("data-ready") == "1")
        if diff:
            opts_ = [o.get_attribute("value") for o in d.find_elements(By.CSS_SELECTOR, "#diff-select option")
                     if o.get_attribute("value") and not o.get_attribute("disabled")]
            if len(opts_) >= 2:
                Select(d.find_element(By.CSS_SELECTOR, "#diff-select")).select_by_value(opts_[0])
                wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "#diff-headline"))
        d.switch_to.default_content()
        out.parent.mkdir(parents=True, exist_ok=True)
        d.save_screenshot(str(out))
        print(f"wrote {out}")
    finally:
        d.quit()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("logdir", type=Path, help="a log directory written by the callbacks (e.g. `tscope demo --out`)")
    ap.add_argument("--out", type=Path,
                    default=Path(__file__).resolve().parent.parent / "docs" / "tensorboard_tscope_tab.png")
    ap.add_argument("--size", default="1600,1300", help="window width,height in pixels")
    ap.add_argument("--diff", action="store_true", help="also choose a step in 'diff with'")
    ap.add_argument("--chromium", default=os.environ.get("CHROMIUM") or shutil.which("chromium") or "chromium")
    ap.add_argument("--chromedriver", default=os.environ.get("CHROMEDRIVER") or shutil.which("chromedriver")
                    or "chromedriver")
    args = ap.parse_args(argv)
    w, h = (int(v) for v in args.size.split(","))
    try:
        with serve(args.logdir.resolve(), 90.0) as base:
            shoot(base, args.out, (w, h), args.chromium, args.chromedriver, args.diff)
    except TensorBoardUnavailable as e:
        raise SystemExit(f"tscope_tab_screenshot: {e}") from None
    return 0


if __name__ == "__main__":
    sys.exit(main())
