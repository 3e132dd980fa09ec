"""The TSCOPE tab in TensorBoard: a dynamic plugin, registered through the ``tensorboard_plugins`` entry point
(``pip install tscope-callbacks`` is enough; ``tensorboard --logdir LOGDIR`` shows the tab).

Routes, under ``data/plugin/tscope/``:

- ``index.js``: the ES module TensorBoard loads in the tab; it frames ``page``.
- ``page``: the dashboard page (``dashboard.page.page_html(None)``: TensorBoard mode, it fetches the routes below).
- ``runs``, ``step``, ``ops``, ``series``, ``diff``: the page's data routes over the server's log dir
  (``dashboard.routes``, shared with ``tscope view --serve``): every one answers JSON, an ``{"error": ...}`` with
  HTTP 200 for bad input, and never raises into the server.
"""

from __future__ import annotations

import base64
import hashlib
import re
from pathlib import Path
from typing import Any

from tensorboard.backend import http_util
from tensorboard.plugins import base_plugin
from werkzeug import wrappers

from tscope_callbacks.dashboard.routes import ROUTES, Routes

__all__ = ["TscopePlugin"]

PLUGIN_NAME = "tscope"
_STATIC = Path(__file__).resolve().parent / "static"
_SCRIPT_RE = re.compile(r"<script(?P<attrs>[^>]*)>(?P<body>.*?)</script>", re.S | re.I)
_DATA_TYPES = ("application/json", "application/ld+json", "text/plain")

_FALLBACK_PAGE = """<!DOCTYPE html><html><head><meta charset="utf-8"><title>tscope</title></head>
<body style="font-family:sans-serif;margin:2em"><h2>tscope</h2><p id="msg">{msg}</p></body></html>"""


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
        logdir = getattr(context, "logdir", None) or getattr(getattr(context, "flags", None), "logdir", None)
        self._routes = Routes(logdir, no_logdir="tensorboard was started without --logdir")
        self._page: tuple[str, list[str]] | None = None

    # --------------------------------------------------------------------------------------------- TBPlugin
    def get_plugin_apps(self) -> dict[str, Any]:
        apps = {"/index.js": self._serve_index_js, "/page": self._serve_page}
        apps.update({f"/{r}": self._data_route(r) for r in ROUTES})
        return apps

    def is_active(self) -> bool:
        # always shown: a log dir without tscope data gets the tab's hint on how to add the callback
        return True

    def frontend_metadata(self) -> base_plugin.FrontendMetadata:
        return base_plugin.FrontendMetadata(es_module_path="/index.js", tab_name="TSCOPE")

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

    def _data_route(self, route: str) -> Any:
        @wrappers.Request.application
        def serve(request: Any) -> Any:
            return http_util.Respond(request, self._routes.answer(route, request.args), "application/json")

        return serve
