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
import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]

# file name -> (URL fragment, window size)
SHOTS = {
    "tensorboard_scalars.png": ("#scalars&tagFilter=tscope%2Froofline%2F&_smoothingWeight=0", "1400,1300"),
    "tensorboard_text.png": ("#text&tagFilter=tscope%2Froofline%2Ftable", "1600,1000"),
}


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def latest_step_json(logdir: Path) -> Path:
    files = sorted(logdir.rglob("tscope/step_*.json"), key=lambda p: (p.stat().st_mtime, p.name))
    if not files:
        raise SystemExit(f"no tscope/step_*.json under {logdir}: run `tscope demo --out {logdir}` first")
    return files[-1]


def render_plot(step_json: Path, out: Path) -> None:
    from tscope_callbacks.api import roofline
    from tscope_callbacks.cli.report import load

    prof, dev = load(str(step_json))
    roofline(prof, dev).plot(out)
    print(f"wrote {out} (from {step_json})")


def _get_json(url: str) -> object:
    with urllib.request.urlopen(url, timeout=5) as r:
        return json.loads(r.read().decode("utf-8"))


@contextlib.contextmanager
def tensorboard(logdir: Path, port: int, wait_s: float = 90.0) -> Iterator[str]:
    """A ``tensorboard`` server on 127.0.0.1:port, up once it serves the tscope scalar tags; always stopped."""
    exe = Path(sys.executable).with_name("tensorboard")
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "tensorboard.main"]
    cmd += ["--logdir", str(logdir), "--host", "127.0.0.1", "--port", str(port), "--reload_interval", "0"]
    log = tempfile.TemporaryFile()
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + wait_s
        while True:
            if proc.poll() is not None:
                log.seek(0)
                raise SystemExit(f"tensorboard exited ({proc.returncode}):\n{log.read().decode(errors='replace')}")
            with contextlib.suppress(OSError, ValueError):
                tags = _get_json(base + "/data/plugin/scalars/tags")
                if any(t.startswith("tscope/roofline/") for run in tags.values() for t in run):
                    break
            if time.monotonic() > deadline:
                raise SystemExit(f"tensorboard did not serve tscope scalars within {wait_s:.0f} s")
            time.sleep(1.0)
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


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
    with tensorboard(args.logdir.resolve(), free_port()) as base:
        for name, (fragment, size) in SHOTS.items():
            screenshot(args.chromium, f"{base}/{fragment}", args.out / name, size, args.budget_ms)
    return 0


if __name__ == "__main__":
    sys.exit(main())
