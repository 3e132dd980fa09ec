"""The page's JavaScript: the unit tests of its pure modules (``node --test tests/js``), and the inlined bundle the
page carries parses. Skipped, with the reason, only where node is not installed."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from tscope_callbacks.render.dashboard import page_html, page_script

NODE = shutil.which("node")
JS_TESTS = Path(__file__).parent / "js"
pytestmark = pytest.mark.skipif(NODE is None, reason="node is not installed: the page's JavaScript tests need node 18+")


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([NODE, *args], capture_output=True, text=True, timeout=120)


def test_node_unit_tests_pass():
    files = sorted(str(p) for p in JS_TESTS.glob("*.test.js"))
    assert len(files) >= 6, files
    out = _run("--test", *files)
    assert out.returncode == 0, out.stdout[-6000:] + out.stderr[-2000:]
    assert "# fail 0" in out.stdout


def test_the_inlined_bundle_parses_and_carries_every_module(tmp_path):
    js = tmp_path / "page.js"
    js.write_text(page_script(), encoding="utf-8")
    out = _run("--check", str(js))
    assert out.returncode == 0, out.stderr
    modules = sorted(p.stem for p in (Path(__file__).parents[1] / "tscope_callbacks/render/static/js").glob("*.js"))
    for m in modules:
        assert f'defs["{m}"] = function (module, exports, require)' in page_script()
    assert page_script().rstrip().endswith('require("main");\n})();'.rstrip())
    assert page_script() in page_html(None)  # the TensorBoard page inlines the same script (hashed in its CSP)
