"""Helpers shared by the callback tests: fast Trainer flags, a fixed device roof, leak checks, a hook spy."""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
import torch
from torch.nn.modules import module as _mm
from torch.utils._python_dispatch import _get_current_dispatch_mode

import tscope_callbacks as ts

__all__ = ["FAST", "test_spec", "hooks_left", "assert_clean", "LeakCheck"]

#: fast, quiet Trainer flags
FAST: dict[str, Any] = dict(enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                            accelerator="cpu", devices=1, log_every_n_steps=1, num_sanity_val_steps=0)


def test_spec() -> Any:
    """A fixed, made-up CPU roof (no measurement): 100 GFLOP/s fp32, 20 GB/s."""
    # a CPU roof as if measured here (what gpu="auto" gives on CPU): times and roofs are of the same device
    return ts.DeviceSpec(name="test-cpu", flops={"fp32": 1e11, "bf16": 2e11, "fp16": 2e11}, bandwidth=2e10,
                         source="tests", measured=True, vendor="cpu")


test_spec.__test__ = False  # type: ignore[attr-defined]  # not a pytest test


def hooks_left(model: torch.nn.Module) -> int:
    """Module hooks on ``model`` plus torch's global module hooks."""
    n = 0
    for m in model.modules():
        n += len(m._forward_hooks) + len(m._forward_pre_hooks) + len(m._backward_hooks)
        n += len(getattr(m, "_backward_pre_hooks", {}))
    n += len(_mm._global_forward_hooks) + len(_mm._global_forward_pre_hooks) + len(_mm._global_backward_hooks)
    n += len(getattr(_mm, "_global_backward_pre_hooks", {}))
    return n


def assert_clean(model: torch.nn.Module, optimizers: list | tuple = ()) -> None:
    """No hook on any module, no global hook, no dispatch mode, no optimizer hook, no running tscope profile."""
    from tscope_callbacks.capture.profile import active_profile

    assert hooks_left(model) == 0, "module hooks left behind"
    assert _get_current_dispatch_mode() is None, "a dispatch mode is still active"
    assert active_profile() is None, "a tscope profile is still running"
    for opt in optimizers:
        assert not opt._optimizer_step_post_hooks and not opt._optimizer_step_pre_hooks


class LeakCheck(pl.Callback):
    """Checks, at every batch start (before the tscope callbacks run) and after fit, that nothing is installed."""

    def __init__(self) -> None:
        self.checked = 0

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any,
                             batch_idx: int) -> None:
        assert_clean(pl_module, trainer.optimizers)
        self.checked += 1
