"""Shared fixtures, one torch thread per test process, and each test in its own working directory.

The suite's models are tiny: a second intra-op thread buys nothing, and on a shared 2-core machine torch's threads
stall on each other (tests/test_grad_history.py took 33 s with the default threads and 10 s with one, at load 2.8).
``OMP_NUM_THREADS=1`` reaches the subprocesses tests start (DDP ranks, the docs' code blocks, the CLI) unless the
caller set it.

Each test runs in a fresh empty working directory: what a fit writes by default (``<cwd>/tscope/``, ``lightning_logs``,
``wandb``) never lands in the checkout, where it mixed with other runs' files and, as a ``wandb/`` folder, made ruff
read ``wandb`` as a first-party package. Tests reach the repository by absolute paths (``Path(__file__)``)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
import torch

from tests.scripted_host import ScriptedHost

os.environ.setdefault("OMP_NUM_THREADS", "1")
torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _own_working_directory(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path_factory.mktemp("cwd"))


@pytest.fixture
def host() -> Iterator[ScriptedHost]:
    """A scripted host (tests/scripted_host.py) on an idle machine: tscope's step clocks read ``host.t``."""
    with ScriptedHost() as h:
        yield h
