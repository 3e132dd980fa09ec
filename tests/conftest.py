"""Shared fixtures, one torch thread per test process, and each test in its own working directory.

The suite's models are tiny: a second intra-op thread buys nothing, and on a shared 2-core machine torch's threads
stall on each other (tests/test_grad_history.py took 33 s with the default threads and 10 s with one, at load 2.8).
``OMP_NUM_THREADS=1`` reaches the subprocesses tests start (DDP ranks, the docs' code blocks, the CLI) unless the
caller set it.

Each test runs in a fresh empty working directory: what a fit writes by default (``<cwd>/tscope/``, ``lightning_logs``,
``wandb``) never lands in the checkout, where it mixed with other runs' files and, as a ``wandb/`` folder, made ruff
read ``wandb`` as a first-party package. Tests reach the repository by absolute paths (``Path(__file__)``)."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from collections.abc import Iterator

import pytest
import torch

from tests.scripted_host import ScriptedHost

os.environ.setdefault("OMP_NUM_THREADS", "1")
torch.set_num_threads(1)
# the roofs tscope measures and caches (the CPU roof of gpu="auto") go to this test process's own directory, not the
# user's ~/.cache/tscope: a run never reads what another run (or a user's session) measured
if "TSCOPE_CACHE_DIR" not in os.environ:
    os.environ["TSCOPE_CACHE_DIR"] = tempfile.mkdtemp(prefix="tscope_test_cache_")
    atexit.register(shutil.rmtree, os.environ["TSCOPE_CACHE_DIR"], True)


#: the test files that take longest (multi-process fits, subprocesses, servers), run first: `make test` runs
#: `-n 2 --dist loadfile --no-loadscope-reorder`, each file in one worker, so a long file left for the end would keep
#: one worker busy while the other idles (xdist's own order puts files with few tests, these, last). Measured on the
#: 2-core VM; a stale list only costs balance, never a result.
HEAVY_FIRST = ["test_fsdp_tp.py", "test_robustness_results.py", "test_robustness_ddp.py", "test_docs.py",
               "test_nan_guard_ddp.py", "test_callbacks_ddp.py", "test_error_messages.py", "test_fsdp_whatif.py",
               "test_robustness_models.py", "test_tensorboard_server.py", "test_tb_plugin.py", "test_docs_site.py",
               "test_dashboard_page.py", "test_grad_history.py", "test_cli.py", "test_compiled_capture.py",
               "test_compile_graphs.py"]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(HEAVY_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: each file's tests keep their order


def _chdir_for(path: str) -> Iterator[None]:
    """The working directory is ``path`` until the fixture ends (not through ``monkeypatch``: a test's
    ``monkeypatch.undo()`` would take the test back to the checkout)."""
    old = os.getcwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(old)


@pytest.fixture(scope="session", autouse=True)
def _session_working_directory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    yield from _chdir_for(str(tmp_path_factory.mktemp("session_cwd")))  # module-scoped fixtures run here


@pytest.fixture(autouse=True)
def _own_working_directory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    yield from _chdir_for(str(tmp_path_factory.mktemp("cwd")))


@pytest.fixture
def host() -> Iterator[ScriptedHost]:
    """A scripted host (tests/scripted_host.py) on an idle machine: tscope's step clocks read ``host.t``."""
    with ScriptedHost() as h:
        yield h
