"""The page's data routes over one log dir, answered the same by the TensorBoard plugin (``dashboard/plugin.py``) and
``tscope view --serve`` (``cli/view.py``): each takes the request's query arguments and answers JSON bytes. Bad input
or an unreadable file is an ``{"error": "<one line>"}`` answer, never an exception.

- ``runs``: ``logdir.scan`` of the log dir, read again on every request (runs still being written show new steps),
  without the server's paths; ``hint`` says how to add the callback when the log dir holds no tscope data. The step
  each run opens on (``open``) is prepared before it is asked for.
- ``step?run=R&step=N&stage=S``: the step's report as the page reads it (``render.dashboard.page_step``: without
  its ops, with its ``page`` section), or ``{"error"}``; cached by the file's (path, mtime, size).
- ``ops?run=R&step=N&stage=S&layer=L``: ``{"ops": [...], "total", "note"}`` (L empty: all ops, capped).
- ``series?run=R``: ``logdir.series`` of the run.
- ``diff?run=R&a=S:N&b=S:N``: the diff of two of the run's steps, ``a`` before ``b``
  (``render.dashboard.step_diff``: ``analysis.diff``), cached by both files' (path, mtime, size).
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from tscope_callbacks.dashboard import logdir as ld
from tscope_callbacks.render.dashboard import page_step, step_diff, step_label

__all__ = ["Routes", "ROUTES"]

ROUTES = ("runs", "step", "ops", "series", "diff")
_CACHED = 32  #: step answers kept (the diff's twice that)


def _dumps(obj: Any) -> bytes:
    return json.dumps(obj, allow_nan=False, separators=(",", ":")).encode("utf-8")


def _step_of(raw: Any, stage: str, name: str = "step") -> tuple[int, str]:
    try:
        step = int(raw)
    except (TypeError, ValueError):
        raise ValueError(f"{name}={raw!r}: expected an integer step") from None
    if not re.fullmatch(r"[a-z]+", stage):
        raise ValueError(f"stage={stage!r}: expected a stage name such as train")
    return step, stage


def stage_step(raw: str | None, name: str) -> tuple[int, str]:
    """``"<stage>:<step>"`` (``"train:200"``) -> (200, "train")."""
    stage, sep, step = (raw or "").partition(":")
    if not sep:
        raise ValueError(f"{name}={raw!r}: expected <stage>:<step>, such as train:200")
    return _step_of(step, stage, name)


class Routes:
    """The routes over ``logdir`` (None: a server started without one; every route says so, in ``no_logdir``'s
    words)."""

    def __init__(self, logdir: str | Path | None, no_logdir: str = "the server was started without a log dir") -> None:
        self.logdir = Path(logdir) if logdir else None
        self.no_logdir = no_logdir
        self._steps: dict[tuple, bytes] = {}
        self._diffs: dict[tuple, bytes] = {}
        self._lock = threading.Lock()

    def answer(self, route: str, args: Mapping[str, str]) -> bytes | None:
        """The JSON answer of ``route`` to the query ``args``; None for an unknown route."""
        fn: Callable[[Mapping[str, str]], bytes] | None = getattr(self, f"{route}_route", None) if route in ROUTES else None
        if fn is None:
            return None
        try:
            return fn(args)
        except ValueError as e:
            return _dumps({"error": str(e)})
        except Exception as e:  # never takes the server down
            return _dumps({"error": f"{type(e).__name__}: {e}"})

    # ------------------------------------------------------------------------------------------------ helpers
    def _run_dir(self, run: str | None) -> Path:
        """The directory of run ``run`` (TensorBoard's name: a path relative to the log dir), inside the log dir."""
        if self.logdir is None:
            raise ValueError(self.no_logdir)
        if run is None or run == "":
            raise ValueError("missing ?run=")
        root = self.logdir.resolve()
        path = (root / run).resolve()
        if path != root and root not in path.parents:
            raise ValueError(f"run {run!r} is outside the log dir")
        return path

    @staticmethod
    def _step_args(args: Mapping[str, str]) -> tuple[int, str]:
        return _step_of(args.get("step"), args.get("stage") or "train")

    def _cached(self, cache: dict[tuple, bytes], keys: tuple, size: int, make: Callable[[], tuple[bytes, bool]]) -> bytes:
        """``make()``'s answer, kept under ``keys`` (files' (path, mtime, size)) when it says it may be."""
        with self._lock:
            body = cache.get(keys) if None not in keys else None
        if body is None:
            body, keep = make()
            if keep and None not in keys:
                with self._lock:
                    if len(cache) > size:
                        cache.clear()
                    cache[keys] = body
        return body

    def step_body(self, run_dir: Path, step: int, stage: str, run: str | None) -> bytes:
        """The ``step`` route's answer for one step of ``run_dir``."""
        key = ld._key(ld.step_path(run_dir, step, stage))
        if key is None:
            return _dumps({"error": f"run {run!r} has no step {step} ({stage})"})

        def make() -> tuple[bytes, bool]:
            rep = ld.load(run_dir, step, stage)
            return _dumps(page_step(rep) if "error" not in rep or "schema" in rep else rep), True

        return self._cached(self._steps, (key,), _CACHED, make)

    # ------------------------------------------------------------------------------------------------ routes
    def runs_route(self, args: Mapping[str, str]) -> bytes:
        if self.logdir is None:
            return _dumps({"runs": [], "hint": f"{self.no_logdir}. " + ld.HINT})
        idx = ld.scan(self.logdir)  # parses new or changed files (cached): their readability
        for r in idx["runs"]:
            run_dir = Path(r.pop("dir"))  # the server's paths stay on the server
            if r["open"] is not None:  # the step the page opens the run on: ready before it is asked for
                step, stage = stage_step(r["open"], "open")
                self.step_body(run_dir, step, stage, r["run"])
        return _dumps(idx)

    def step_route(self, args: Mapping[str, str]) -> bytes:
        step, stage = self._step_args(args)
        run = args.get("run")
        return self.step_body(self._run_dir(run), step, stage, run)

    def ops_route(self, args: Mapping[str, str]) -> bytes:
        step, stage = self._step_args(args)
        return _dumps(ld.ops(self._run_dir(args.get("run")), step, stage, args.get("layer") or ""))

    def series_route(self, args: Mapping[str, str]) -> bytes:
        return _dumps(ld.series(self._run_dir(args.get("run"))))

    def diff_route(self, args: Mapping[str, str]) -> bytes:
        a, b = stage_step(args.get("a"), "a"), stage_step(args.get("b"), "b")
        run_dir = self._run_dir(args.get("run"))
        keys = tuple(ld._key(ld.step_path(run_dir, step, stage)) for step, stage in (a, b))

        def make() -> tuple[bytes, bool]:
            da, db = (ld.load(run_dir, step, stage) for step, stage in (a, b))
            bad = next((d for d in (da, db) if "error" in d and "schema" not in d), None)
            out = bad or step_diff(da, db, (step_label(a[1], a[0]), step_label(b[1], b[0])))
            return _dumps(out), bad is None and "error" not in out

        return self._cached(self._diffs, keys, 2 * _CACHED, make)
