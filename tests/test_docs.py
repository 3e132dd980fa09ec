"""The README and the documentation site (docs/, mkdocs.yml) stay true: every Python block runs as written on a CPU,
every page is in the site's nav, and the README stays short and points only at files in the repository. (The site's
build, ``mkdocs build --strict``, and its working from disk and offline: tests/test_docs_site.py.)

Python blocks: every fenced block whose info string is ``python`` runs, page by page, in one fresh interpreter per
page (the blocks of a page share their names, in order, like a reader's session), in a temporary working directory.
A block that needs a CUDA GPU is marked by the HTML comment ``<!-- cuda-only -->`` on the line just before its fence
(it renders as nothing); it runs only where CUDA is available. Blocks of other languages (``bash``, ``text``) never
run. Keep blocks small (tiny models, a few steps): the whole module takes about a minute on a 2-core CPU.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
PAGES = [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]
CUDA_ONLY = "<!-- cuda-only -->"
FENCE = re.compile(r"^```([\w+-]*)[^\n]*\n(.*?)^```[ \t]*$", re.M | re.S)

RUNNER = """
import json, sys, traceback
blocks = json.load(open(sys.argv[1]))
ns = {"__name__": "__main__"}
for where, src in blocks:
    print(f"--- {where}", flush=True)
    exec(compile(src, where, "exec"), ns)
"""


def python_blocks(page: Path) -> list[tuple[str, str, bool]]:
    """(``file:line``, source, cuda_only) of each ``python`` block of ``page``."""
    text = page.read_text()
    out = []
    for m in FENCE.finditer(text):
        if m.group(1) != "python":
            continue
        line = text.count("\n", 0, m.start()) + 1
        before = text[: m.start()].rstrip("\n").rsplit("\n", 1)[-1].strip()
        out.append((f"{page.relative_to(ROOT)}:{line}", m.group(2), before == CUDA_ONLY))
    return out


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One roof cache for every page: the CPU roof is measured once, not once per page."""
    return tmp_path_factory.mktemp("tscope_cache")


#: an optional extra a block needs -> what in a block's source says so (`make test` installs every extra: the dev
#: extra; elsewhere, a page whose blocks need a missing one is skipped with the reason, not failed)
EXTRAS = {"fvcore": ("import fvcore", "from fvcore", "ElemCountAnalysis("), "wandb": ("import wandb", "WandbLogger(")}


def missing_extras(sources: list[str]) -> list[str]:
    """The optional extras the blocks need that this environment does not have."""
    import importlib.util

    return [name for name, marks in EXTRAS.items() if any(m in src for src in sources for m in marks)
            and importlib.util.find_spec(name) is None]


@pytest.mark.timeout(900)
@pytest.mark.parametrize("page", [p for p in PAGES if python_blocks(p)], ids=lambda p: p.name)
def test_python_blocks_run(page: Path, tmp_path: Path, cache_dir: Path) -> None:
    cuda = torch.cuda.is_available()
    blocks = [(where, src) for where, src, cuda_only in python_blocks(page) if cuda or not cuda_only]
    missing = missing_extras([src for _, src in blocks])
    if missing:
        pytest.skip(f"{page.name} needs the extra(s) {missing} (pip install -e '.[dev]' installs every extra)")
    spec = tmp_path / "blocks.json"
    spec.write_text(json.dumps(blocks))
    env = dict(os.environ, TSCOPE_CACHE_DIR=str(cache_dir), MPLBACKEND="Agg", WANDB_MODE="offline",
               PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-c", RUNNER, str(spec)], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=840)
    assert proc.returncode == 0, f"a Python block of {page.name} failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-6000:]}"


def test_cuda_only_marks_a_python_block() -> None:
    """The marker sits right before a ``python`` fence; anywhere else it would silently mark nothing."""
    for page in PAGES:
        lines = page.read_text().splitlines()
        for i, line in enumerate(lines):
            if line.strip() == CUDA_ONLY:
                assert i + 1 < len(lines) and lines[i + 1].startswith("```python"), f"{page.name}:{i + 1}"


def test_every_docs_page_is_in_the_site_nav() -> None:
    nav = (ROOT / "mkdocs.yml").read_text()
    for page in DOCS.glob("*.md"):
        assert f": {page.name}" in nav, f"{page.name} is not in mkdocs.yml's nav"


def test_readme_is_short_and_links_only_inside_the_repository() -> None:
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 250
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
        if "://" in target:
            continue
        path = (ROOT / target).resolve()
        assert path.is_relative_to(ROOT) and path.exists(), f"README links to {target}, which is not in the repository"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_no_paths_outside_the_repository(page: Path) -> None:
    text = page.read_text()
    for bad in ("../shared", "/work/", "shared/gpu", "shared/seeds"):
        assert bad not in text, f"{page.name} points outside the repository: {bad}"
