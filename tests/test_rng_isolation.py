"""Profiling never changes training: no tscope code draws from the user's random streams (torch, Python, numpy).

The default ``gpu="auto"`` measures a CPU roof from random matrices when none is cached (first run on a machine, and
every run on a busy one); ``analyze_model`` builds random inputs and may run dropout. Each test empties the roof
cache so the measurement really runs, and compares with a plain run bit for bit."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from robust_utils import SCHED, MLPModule, assert_same_weights, seeded_fit
from torch.utils.data import DataLoader, TensorDataset

import tscope_callbacks as ts
from tscope_callbacks.devices import calibrate
from tscope_callbacks.rng import RngState, preserved_rng


@pytest.fixture
def empty_roof_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """No cached CPU roof: gpu="auto" measures (with a short budget, as the real one would)."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("TSCOPE_CACHE_DIR", str(cache))
    monkeypatch.setattr(calibrate, "DEFAULT_CPU_BUDGET_S", 0.2)
    return cache


class ShuffledDropoutModule(MLPModule):
    """Draws from every global stream a user's step may use: a shuffled loader (torch), dropout (torch), a noise
    scale from Python's ``random`` and a jitter from numpy's."""

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        x = x * (1 + 0.01 * random.random()) + float(np.random.normal(0, 0.01))
        loss = torch.nn.functional.mse_loss(self(x), y)
        self.log("train_loss", loss)
        return loss

    def train_dataloader(self) -> DataLoader:
        g = torch.Generator().manual_seed(3)
        x, y = torch.randn(64, 8, generator=g), torch.randn(64, 1, generator=g)
        return DataLoader(TensorDataset(x, y), batch_size=4, shuffle=True)  # shuffled by the global torch RNG


def _streams() -> tuple[Any, ...]:
    return torch.rand(4), random.random(), np.random.rand()


@pytest.mark.parametrize("start_step", [SCHED["start_step"], 10_000], ids=["profiling", "never-profiles"])
def test_a_seeded_fit_with_every_callback_and_gpu_auto_equals_the_plain_fit(
        tmp_path: Path, empty_roof_cache: Path, start_step: int) -> None:
    plain, plain_log, _ = seeded_fit(tmp_path / "a", ShuffledDropoutModule, [], max_steps=6)
    after_plain = _streams()
    sched = {**SCHED, "start_step": start_step}
    roof = ts.RooflineCallback(gpu="auto", **sched)
    cbs = [roof, ts.LayerProfilerCallback(**sched), ts.NaNGuardCallback(), ts.WatchCallback(every_n_steps=2)]
    model, log, _ = seeded_fit(tmp_path / "b", ShuffledDropoutModule, cbs, max_steps=6)
    after = _streams()
    assert roof.spec is not None and roof.spec.measured, "the CPU roof was measured in this fit"
    assert_same_weights(plain, model)
    assert plain_log.metrics["train_loss"] == log.metrics["train_loss"]
    assert _same(after, after_plain), "the fit left the global streams elsewhere"
    if start_step == SCHED["start_step"]:
        assert [h["step"] for h in roof.history] == [1, 2, 4]


def _draws_after(fn: Any) -> tuple[Any, ...]:
    torch.manual_seed(7)
    random.seed(7)
    np.random.seed(7)
    fn()
    return _streams()


def _same(a: tuple[Any, ...], b: tuple[Any, ...]) -> bool:
    return torch.equal(a[0], b[0]) and a[1:] == b[1:]


def test_roofline_with_the_default_roof_leaves_the_random_streams(empty_roof_cache: Path) -> None:
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Dropout(0.5), torch.nn.Linear(16, 1))
    x = torch.randn(4, 8)
    with ts.profile(model) as prof:
        model(x).sum().backward()
    reference = _draws_after(lambda: None)
    reports: list[Any] = []
    assert _same(_draws_after(lambda: reports.append(ts.roofline(prof))), reference)
    assert reports[0].device.measured, "the default roof was measured here"


@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_analyze_model_leaves_the_random_streams(empty_roof_cache: Path, device: str) -> None:
    # random inputs, dropout in a real CPU step, and (gpu="auto") a CPU roof measured from random matrices
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Dropout(0.5), torch.nn.Linear(16, 1))
    reference = _draws_after(lambda: None)
    got = _draws_after(lambda: ts.analyze_model(model, input_shape=[(4, 8)], gpu="auto", device=device,
                                                backward=True))
    assert _same(got, reference)


def test_preserved_rng_restores_every_stream_even_when_the_block_raises() -> None:
    reference = _draws_after(lambda: None)

    def draw_and_raise() -> None:
        with preserved_rng():
            torch.randn(100)
            random.random()
            np.random.rand(3)
            raise RuntimeError("inside")

    torch.manual_seed(7)
    random.seed(7)
    np.random.seed(7)
    with pytest.raises(RuntimeError):
        draw_and_raise()
    assert _same(_streams(), reference)
    state = RngState()
    torch.rand(3)
    state.restore()
    assert torch.equal(torch.get_rng_state(), state.cpu)
