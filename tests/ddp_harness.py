"""The one way tests run 2-process DDP on CPU (gloo): the training script is written to a file and run with
``subprocess`` under a timeout (Lightning's DDP launcher re-executes the script it was started from; a hang, one
rank waiting in a collective, then fails the test instead of blocking CI). Each rank writes ``rank<N>.json``; the
helper returns those dicts in rank order. Skip every DDP test with ``TSCOPE_SKIP_DDP=1``."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

__all__ = ["skip_ddp", "run_ddp"]

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent

skip_ddp = pytest.mark.skipif(os.environ.get("TSCOPE_SKIP_DDP") == "1", reason="TSCOPE_SKIP_DDP=1")


def _free_port() -> int:
    """A localhost port nothing listens on now (another test run, or another xdist worker, picks another)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ddp(tmp_path: Path, script: str, *, name: str = "ddp_run.py", timeout: int = 150,
            ranks: int = 2) -> list[dict]:
    """Run ``script`` (gets the output directory as ``sys.argv[1]``; ``tests/`` and the repo root are importable)
    under DDP and return each rank's ``rank<N>.json``."""
    path = tmp_path / name
    path.write_text(textwrap.dedent(script))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1", "PL_DISABLE_FORK": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port())}
    env.pop("LOCAL_RANK", None)
    try:
        proc = subprocess.run([sys.executable, str(path), str(tmp_path)], env=env, cwd=tmp_path,
                              capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"DDP run did not finish in {timeout} s (hang?)\n{(e.stderr or b'')[-3000:]!r}")
    assert proc.returncode == 0, proc.stderr[-4000:]
    return [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(ranks)]
