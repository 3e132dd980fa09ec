"""The callbacks never change the user's training: bit-identical weights and logged losses with and without them
(profiled steps included), profiles that contain only the user's work, and memory that stays flat."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
import torch
from models import TINY_CFG, TinyLM
from robust_utils import (
    MLPModule,
    all_callbacks,
    assert_nothing_left,
    assert_same_weights,
    fit,
    live,
    seeded_fit,
)

import tscope_callbacks as ts
from tscope_callbacks.demo.model import GPTConfig
from tscope_callbacks.records import LayerRecord, OpRecord, StepProfile


@pytest.fixture
def deterministic():
    prev, warn_only = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(True)
    yield
    torch.use_deterministic_algorithms(prev, warn_only=warn_only)


def test_weights_and_logged_losses_are_bit_identical_with_all_callbacks(tmp_path: Path, deterministic: None) -> None:
    cfg = GPTConfig(**{**TINY_CFG.__dict__, "dropout": 0.1, "tie_weights": True})  # RNG use + tied weights

    def make() -> TinyLM:
        return TinyLM(cfg, optimizer="adamw", n_batches=8)

    plain, plain_log, _ = seeded_fit(tmp_path / "a", make, [], max_steps=6)
    cbs = all_callbacks()
    profiled, prof_log, trainer = seeded_fit(tmp_path / "b", make, cbs, max_steps=6)
    roof, layers, guard = cbs
    assert [h["step"] for h in roof.history] == [1, 2, 4]  # several profiled steps, interleaved with plain ones
    assert layers.schedules["train"].taken == 3 and guard.num_events == 0
    assert_same_weights(plain, profiled)
    loss_a, loss_b = plain_log.metrics["train_loss"], prof_log.metrics["train_loss"]
    assert len(loss_a) == 6 and loss_a == loss_b  # same values at the same steps
    assert_nothing_left(profiled, trainer.optimizers)


def test_profile_holds_only_the_users_ops() -> None:
    """Tscope's own checks (per-layer finite flags, the NaN guard's check) are not recorded as the user's ops."""
    m = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 1))
    x = torch.randn(2, 4)

    def run(**kw: object) -> Counter:
        m.zero_grad(set_to_none=True)
        with ts.profile(m, **kw) as p:
            m(x).sum().backward()
        return Counter((r.op, r.phase, r.layer) for r in p.ops)

    assert run(layer_details=True, check_finite=True) == run()


def test_nan_guard_check_inside_a_profiled_step_is_not_profiled(tmp_path: Path) -> None:
    cbs = all_callbacks(start_step=1, every_n_steps=100)
    fit(tmp_path / "a", cbs, MLPModule(), max_steps=2)
    guarded = Counter(r.op for r in cbs[0].last_profile.ops)
    cbs2 = all_callbacks(start_step=1, every_n_steps=100)[:2]
    fit(tmp_path / "b", cbs2, MLPModule(), max_steps=2)
    assert guarded == Counter(r.op for r in cbs2[0].last_profile.ops)


def test_memory_flat_over_50_profiled_steps(tmp_path: Path) -> None:
    import gc

    import lightning.pytorch as pl

    counts: dict[int, tuple[int, int, int]] = {}
    objects: dict[int, int] = {}

    class Probe(pl.Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):  # type: ignore[no-untyped-def]
            # the held records are the last profile and the running k-step series' first step; step 48's carries
            # 4 more root ops (clone/detach x2 from Lightning near the end of the fit), so the probes stop at 45
            if trainer.global_step in (10, 30, 45):
                counts[trainer.global_step] = (live(OpRecord), live(LayerRecord), live(StepProfile))
                objects[trainer.global_step] = len(gc.get_objects())

    cbs = all_callbacks(start_step=0, every_n_steps=1)
    cbs[0].history = type(cbs[0].history)(maxlen=4)
    model = MLPModule(dropout=0.0)
    trainer = fit(tmp_path, [Probe(), *cbs], model, max_steps=51, log_every_n_steps=50)
    assert cbs[0].schedules["train"].taken == 51
    ops10, layers10, profiles10 = counts[10]
    assert 0 < ops10 and counts[30] == counts[45] == counts[10], counts  # retained records do not grow
    assert profiles10 <= 3, counts  # the last profile per callback (shared), not one per step
    assert objects[45] - objects[30] < 200, objects  # nothing else piles up either (flat in practice)
    assert_nothing_left(model, trainer.optimizers)
