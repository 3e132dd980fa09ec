"""Start a real ``tensorboard`` on a free localhost port and wait (bounded) until it serves the tscope scalars; always
stopped. Shared by ``scripts/screenshots.py`` and ``tests/test_tensorboard_server.py``."""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

__all__ = ["TensorBoardUnavailable", "free_port", "get_json", "serve"]


class TensorBoardUnavailable(RuntimeError):
    """No port, no server, or the server did not serve the logged scalars in time."""


def free_port() -> int:
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
            return s.getsockname()[1]
    except OSError as e:
        raise TensorBoardUnavailable(f"cannot open a localhost port: {e}") from None


def get_json(base: str, path: str, timeout_s: float = 120.0, **params: str) -> object:
    """The JSON a route answers; ``timeout_s`` only guards against a hung server (a busy machine can take many
    seconds to answer the first request, which parses every step file)."""
    url = base + path + ("?" + urllib.parse.urlencode(params) if params else "")
    with urllib.request.urlopen(url, timeout=timeout_s) as r:
        return json.loads(r.read().decode("utf-8"))


@contextlib.contextmanager
def serve(logdir: Path, wait_s: float = 60.0, *, prefix: str = "tscope/roofline/",
          extra_args: tuple[str, ...] = ()) -> Iterator[str]:
    """Base URL of a tensorboard serving ``logdir``, once its scalars endpoint lists a tag starting with ``prefix``."""
    port = free_port()
    exe = Path(sys.executable).with_name("tensorboard")
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "tensorboard.main"]
    cmd += ["--logdir", str(logdir), "--host", "127.0.0.1", "--port", str(port), *extra_args]
    log = tempfile.TemporaryFile()
    try:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    except OSError as e:
        log.close()
        raise TensorBoardUnavailable(f"cannot start tensorboard: {e}") from None
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + wait_s
        while True:
            if proc.poll() is not None:
                log.seek(0)
                raise TensorBoardUnavailable(
                    f"tensorboard exited with {proc.returncode}: {log.read().decode(errors='replace')[-800:]}")
            with contextlib.suppress(OSError, ValueError):
                tags = get_json(base, "/data/plugin/scalars/tags")
                if any(t.startswith(prefix) for run in tags.values() for t in run):  # type: ignore[union-attr]
                    break
            if time.monotonic() > deadline:
                raise TensorBoardUnavailable(f"tensorboard did not serve the logged scalars within {wait_s:.0f} s")
            time.sleep(0.5)
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
