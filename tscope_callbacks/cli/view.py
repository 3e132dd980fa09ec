"""``tscope view LOGDIR``: the dashboard of a log dir's runs as one self-contained HTML file (``tscope_dashboard.html``
in LOGDIR, or ``--out``), or served on a local port (``--serve``: the page reads the log dir on every request, so a
run still being written shows its new steps on reload)."""

from __future__ import annotations

import argparse
import os
import sys

from tscope_callbacks.analysis.fmt import bytes_text

__all__ = ["add_arguments", "run", "serve"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("logdir", help="a log dir (every run under it with tscope/step_<N>.json files), a run directory, "
                                  "or one step JSON")
    p.add_argument("--out", default=None, metavar="OUT.html",
                   help="where to write the page (default: LOGDIR/tscope_dashboard.html; for a step JSON, beside it)")
    p.add_argument("--serve", action="store_true", help="serve the page instead of writing it (Ctrl-C stops)")
    p.add_argument("--port", type=int, default=6007, help="port for --serve (default 6007; 0 picks a free one)")
    p.add_argument("--host", default="127.0.0.1", help="address for --serve (default 127.0.0.1: this machine only)")


def run(args: argparse.Namespace) -> int:
    path = args.logdir
    if not os.path.exists(path):
        print(f"tscope view: {path}: no such file or directory", file=sys.stderr)
        return 2
    if args.serve:
        if not os.path.isdir(path):
            print("tscope view: --serve takes a log dir (a directory); write a step JSON's page without --serve",
                  file=sys.stderr)
            return 2
        return serve(path, args.host, args.port)
    from tscope_callbacks.dashboard.page import run_html, write_html

    try:
        text = run_html(path)
    except (FileNotFoundError, ValueError) as e:
        print(f"tscope view: {e}", file=sys.stderr)
        return 2
    out = args.out or (os.path.join(path, "tscope_dashboard.html") if os.path.isdir(path) else
                       os.path.splitext(path)[0] + ".html")
    try:
        write_html(text, out)
    except OSError as e:
        print(f"tscope view: cannot write {out}: {e.strerror or e}", file=sys.stderr)
        return 2
    print(f"dashboard written to {out} ({bytes_text(len(text.encode('utf-8')))}; open it in a browser, no network "
          "needed)")
    return 0


def serve(logdir: str, host: str = "127.0.0.1", port: int = 6007, *, ready: object = None) -> int:
    """Serve the page in its fetching mode with the plugin's data routes (``dashboard.routes``), read from ``logdir``
    on every request. ``ready``: a ``threading.Event``-like object set once listening (its ``port`` and ``server``
    attributes set), for tests."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    from urllib.parse import parse_qs, urlparse

    from tscope_callbacks.dashboard.page import page_html
    from tscope_callbacks.dashboard.routes import Routes

    page = page_html(None, title=f"tscope · {os.path.basename(os.path.abspath(logdir))}").encode("utf-8")
    routes = Routes(os.path.abspath(logdir))

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, fmt: str, *a: object) -> None:  # quiet: one line per request is noise here
            pass

        def _send(self, body: bytes, ctype: str) -> None:
            self.send_response(200)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            u = urlparse(self.path)
            route = u.path.rstrip("/").rsplit("/", 1)[-1]
            if route in ("", "index.html"):
                return self._send(page, "text/html; charset=utf-8")
            body = routes.answer(route, {k: v[0] for k, v in parse_qs(u.query).items()})
            if body is None:
                self.send_error(404)
                return None
            return self._send(body, "application/json")

    if not 0 <= port <= 65535:
        print(f"tscope view: --port {port} is not a port: pass 0-65535 (0 picks a free one)", file=sys.stderr)
        return 2
    try:
        srv = ThreadingHTTPServer((host, port), Handler)
    except (OSError, UnicodeError) as e:
        # a port in use or not allowed, or a host that is no address of this machine: say which to change
        import errno
        import socket

        bad_host = isinstance(e, (socket.gaierror, UnicodeError)) or getattr(e, "errno", None) == errno.EADDRNOTAVAIL
        fix = "pass --host with an address of this machine" if bad_host else "pass another --port"
        print(f"tscope view: cannot listen on {host}:{port}: {getattr(e, 'strerror', None) or e} ({fix})",
              file=sys.stderr)
        return 2
    print(f"tscope dashboard of {os.path.abspath(logdir)} on http://{host}:{srv.server_address[1]}/ (Ctrl-C stops)", flush=True)
    if ready is not None:
        ready.port = srv.server_address[1]  # type: ignore[attr-defined]
        ready.server = srv  # type: ignore[attr-defined]  (``ready.server.shutdown()`` stops it)
        ready.set()  # type: ignore[attr-defined]
    try:
        srv.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        srv.server_close()
    return 0
