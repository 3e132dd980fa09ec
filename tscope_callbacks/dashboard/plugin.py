"""The TSCOPE tab in TensorBoard: a dynamic plugin, registered through the ``tensorboard_plugins`` entry point
(``pip install tscope-callbacks`` is enough; ``tensorboard --logdir LOGDIR`` shows the tab).

Routes, under ``data/plugin/tscope/`` (every one answers JSON, an ``{"error": ...}`` with HTTP 200 for bad input,
and never raises into the server):

- ``index.js``: the ES module TensorBoard loads in the tab; it frames ``page``.
- ``page``: the dashboard page (``dashboard.page.page_html(None)``: TensorBoard mode, it fetches the routes below).
- ``runs``: ``logdir.scan`` of the server's log dir, read again on every request (runs still being written show new
  steps); ``hint`` says how to add the callback when the log dir holds no tscope data.
- ``step?run=R&step=N&stage=S``: the StepReport dict without its ``ops`` (fetched lazily through ``ops``), or
  ``{"error"}`` for an unreadable or older-schema file. The JSON answer is cached by the file's (path, mtime, size).
- ``ops?run=R&step=N&stage=S&layer=L``: ``{"ops": [...], "total", "note"}`` (L empty: all ops, capped).
- ``series?run=R``: ``logdir.series`` of the run (the ``tscope/roofline/*`` scalars and the profiles' headers).
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import threading
from pathlib import Path
from typing import Any

from tensorboard.backend import http_util
from tensorboard.plugins import base_plugin
from werkzeug import wrappers

from tscope_callbacks.dashboard import logdir as ld

__all__ = ["TscopePlugin"]

PLUGIN_NAME = "tscope"
_STATIC = Path(__file__).resolve().parent / "static"
_SCRIPT_RE = re.compile(r"<script(?P<attrs>[^>]*)>(?P<body>.*?)</script>", re.S | re.I)
_DATA_TYPES = ("application/json", "application/ld+json", "text/plain")

_FALLBACK_PAGE = """<!DOCTYPE html><html><head><meta charset="utf-8"><title>tscope</title></head>
<body style="font-family:sans-serif;margin:2em"><h2>tscope</h2><p id="msg">{msg}</p></body></html>"""


def _json(request: Any, obj: Any) -> Any:
    body = json.dumps(obj, allow_nan=False, separators=(",", ":"))
    return http_util.Respond(request, body, "application/json")


def _script_hashes(html: str) -> list[str]:
    """sha256 of each inline script the page runs (TensorBoard's CSP allows inline scripts by hash only)."""
    out = []
    for m in _SCRIPT_RE.finditer(html):
        attrs = m["attrs"].lower()
        if "src=" in attrs or any(t in attrs for t in _DATA_TYPES):
            continue
        out.append(base64.b64encode(hashlib.sha256(m["body"].encode("utf-8")).digest()).decode("ascii"))
    return out


class TscopePlugin(base_plugin.TBPlugin):
    """The TSCOPE tab: every run of the log dir that holds ``tscope/step_<N>.json`` files."""

    plugin_name = PLUGIN_NAME

    def __init__(self, context: base_plugin.TBContext) -> None:
        self._logdir = getattr(context, "logdir", None) or getattr(getattr(context, "flags", None), "logdir", None)
        self._page: tuple[str, list[str]] | None = None
        self._step_cache: dict[tuple, bytes] = {}
        self._lock = threading.Lock()

    # --------------------------------------------------------------------------------------------- TBPlugin
    def get_plugin_apps(self) -> dict[str, Any]:
        return {"/index.js": self._serve_index_js, "/page": self._serve_page, "/runs": self._serve_runs,
                "/step": self._serve_step, "/ops": self._serve_ops, "/series": self._serve_series}

    def is_active(self) -> bool:
        # always shown: a log dir without tscope data gets the tab's hint on how to add the callback
        return True

    def frontend_metadata(self) -> base_plugin.FrontendMetadata:
        return base_plugin.FrontendMetadata(es_module_path="/index.js", tab_name="TSCOPE")

    # --------------------------------------------------------------------------------------------- helpers
    def _run_dir(self, run: str | None) -> Path:
        """The directory of run ``run`` (TensorBoard's name: a path relative to the log dir), inside the log dir."""
        if not self._logdir:
            raise ValueError("tensorboard was started without --logdir")
        if run is None or run == "":
            raise ValueError("missing ?run=")
        root = Path(self._logdir).resolve()
        path = (root / run).resolve()
        if path != root and root not in path.parents:
            raise ValueError(f"run {run!r} is outside the log dir")
        return path

    @staticmethod
    def _step_args(request: Any) -> tuple[int, str]:
        raw = request.args.get("step")
        try:
            step = int(raw)
        except (TypeError, ValueError):
            raise ValueError(f"step={raw!r}: expected an integer step") from None
        stage = request.args.get("stage") or "train"
        if not re.fullmatch(r"[a-z]+", stage):
            raise ValueError(f"stage={stage!r}: expected a stage name such as train")
        return step, stage

    # --------------------------------------------------------------------------------------------- routes
    @wrappers.Request.application
    def _serve_index_js(self, request: Any) -> Any:
        try:
            body = (_STATIC / "index.js").read_text(encoding="utf-8")
            return http_util.Respond(request, body, "application/javascript")
        except Exception as e:
            return http_util.Respond(request, f"// tscope: {e}", "application/javascript")

    @wrappers.Request.application
    def _serve_page(self, request: Any) -> Any:
        try:
            if self._page is None:
                try:
                    from tscope_callbacks.dashboard.page import page_html

                    html = page_html(None)
                except ImportError as e:
                    html = _FALLBACK_PAGE.format(msg=f"The dashboard page is not installed ({e}).")
                self._page = (html, _script_hashes(html))
            html, hashes = self._page
            return http_util.Respond(request, html, "text/html", csp_scripts_sha256s=hashes)
        except Exception as e:
            return http_util.Respond(request, _FALLBACK_PAGE.format(msg=f"tscope page error: {type(e).__name__}"),
                                     "text/html")

    @wrappers.Request.application
    def _serve_runs(self, request: Any) -> Any:
        try:
            if not self._logdir:
                return _json(request, {"runs": [], "hint": "tensorboard was started without --logdir. " + ld.HINT})
            idx = ld.scan(self._logdir)  # parses new or changed files (cached): their readability
            for r in idx["runs"]:
                run_dir = Path(r.pop("dir"))  # the server's paths stay on the server
                ok = [s for s in r["steps"] if s["readable"]]
                if ok:  # the page opens a run on its last step: its answer ready before it is asked for
                    self._step_body(run_dir, ok[-1]["step"], ok[-1]["stage"], r["run"])
            return _json(request, idx)
        except Exception as e:
            return _json(request, {"runs": [], "hint": None, "error": f"listing the runs: {type(e).__name__}: {e}"})

    def _step_body(self, run_dir: Path, step: int, stage: str, run: str | None) -> bytes:
        """The ``step`` route's JSON answer, cached by the file's (path, mtime, size)."""
        key = ld._key(ld.step_path(run_dir, step, stage))
        if key is None:
            return json.dumps({"error": f"run {run!r} has no step {step} ({stage})"}).encode("utf-8")
        with self._lock:
            body = self._step_cache.get(key)
        if body is None:
            rep = ld.load(run_dir, step, stage)
            if "error" not in rep or "schema" in rep:
                ops = rep.get("ops") or []
                rep = {k: v for k, v in rep.items() if k != "ops"}
                rep["ops_count"] = len(ops)
            body = json.dumps(rep, allow_nan=False, separators=(",", ":")).encode("utf-8")
            with self._lock:
                if len(self._step_cache) > 32:
                    self._step_cache.clear()
                self._step_cache[key] = body
        return body

    @wrappers.Request.application
    def _serve_step(self, request: Any) -> Any:
        try:
            step, stage = self._step_args(request)
            run = request.args.get("run")
            body = self._step_body(self._run_dir(run), step, stage, run)
            return http_util.Respond(request, body, "application/json")
        except Exception as e:
            return _json(request, {"error": f"{type(e).__name__}: {e}" if not isinstance(e, ValueError) else str(e)})

    @wrappers.Request.application
    def _serve_ops(self, request: Any) -> Any:
        try:
            step, stage = self._step_args(request)
            run_dir = self._run_dir(request.args.get("run"))
            return _json(request, ld.ops(run_dir, step, stage, request.args.get("layer") or ""))
        except Exception as e:
            return _json(request, {"error": f"{type(e).__name__}: {e}" if not isinstance(e, ValueError) else str(e)})

    @wrappers.Request.application
    def _serve_series(self, request: Any) -> Any:
        try:
            return _json(request, ld.series(self._run_dir(request.args.get("run"))))
        except Exception as e:
            return _json(request, {"error": f"{type(e).__name__}: {e}" if not isinstance(e, ValueError) else str(e)})
