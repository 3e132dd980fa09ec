"""Reproduce the README screenshots from a ``tscope demo`` log directory.

1. ``docs/roofline_example.png``: the roofline plot of the last profiled step (``<logdir>/**/tscope/step_*.json``,
   rendered exactly as ``tscope report PATH --plot`` does).
2. ``docs/tensorboard_scalars.png`` (the ``tscope/roofline/*`` scalars) and ``docs/tensorboard_text.png`` (the
   ``tscope/roofline/table`` markdown table): a real
   ``tensorboard`` server on a free localhost port, photographed by headless Chromium (Debian: ``apt-get install
   chromium``). The scalars come from TensorBoard's "Scalars" dashboard: its "Time Series" dashboard draws its line
   charts with WebGL, which headless Chromium without a GPU leaves blank.

    .venv/bin/tscope demo --out demo_logs          # or any directory written by the callbacks
    .venv/bin/python scripts/screenshots.py demo_logs [--out docs]

The server is always stopped; each PNG should still be looked at (a slow machine can need a larger ``--budget-ms``).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from tb_server import TensorBoardUnavailable, serve

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]

# file name -> (URL fragment, window size)
SHOTS = {
    "tensorboard_scalars.png": ("#scalars&tagFilter=tscope%2Froofline%2F&_smoothingWeight=0", "1400,1300"),
    "tensorboard_text.png": ("#text&tagFilter=tscope%2Froofline%2Ftable", "1600,1000"),
    "tensorboard_images.png": ("#images&tagFilter=tscope%2F", "1400,700"),
}


def latest_step_json(logdir: Path) -> Path:
    files = sorted(logdir.rglob("tscope/step_*.json"), key=lambda p: (p.stat().st_mtime, p.name))
    if not files:
        raise SystemExit(f"no tscope/step_*.json under {logdir}: run `tscope demo --out {logdir}` first")
    return files[-1]


def render_plot(step_json: Path, out: Path) -> None:
    from tscope_callbacks.api import load_profile_file, roofline

    prof, dev = load_profile_file(str(step_json))
    roofline(prof, dev).plot(out)
    print(f"wrote {out} (from {step_json})")


def screenshot(chromium: str, url: str, out: Path, size: str, budget_ms: int) -> None:
    with tempfile.TemporaryDirectory() as profile_dir:
        cmd = [chromium, *CHROMIUM_FLAGS, f"--user-data-dir={profile_dir}", f"--window-size={size}",
               f"--virtual-time-budget={budget_ms}", f"--screenshot={out}", url]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=180)
    if not out.is_file() or out.stat().st_size == 0:
        raise SystemExit(f"chromium wrote no screenshot for {url}")
    print(f"wrote {out} ({url})")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("logdir", type=Path, help="a `tscope demo` log directory (its --out)")
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parent.parent / "docs",
                    help="where the PNGs go (default: the repository's docs/)")
    ap.add_argument("--chromium", default=os.environ.get("CHROMIUM") or shutil.which("chromium")
                    or shutil.which("chromium-browser") or "chromium", help="the Chromium binary")
    ap.add_argument("--budget-ms", type=int, default=20000, help="virtual time Chromium gives each page to render")
    ap.add_argument("--no-plot", action="store_true", help="skip docs/roofline_example.png")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if not args.no_plot:
        render_plot(latest_step_json(args.logdir), args.out / "roofline_example.png")
    try:
        server = serve(args.logdir.resolve(), 90.0, extra_args=("--reload_interval", "0"))
        base = server.__enter__()
    except TensorBoardUnavailable as e:
        raise SystemExit(f"screenshots: {e}") from None
    try:
        for name, (fragment, size) in SHOTS.items():
            screenshot(args.chromium, f"{base}/{fragment}", args.out / name, size, args.budget_ms)
    finally:
        server.__exit__(None, None, None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
