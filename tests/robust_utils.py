"""Helpers of the robustness tests (``tests/test_robustness_*.py``): tiny models, all callbacks at once, the
"nothing left behind" check and a logger that records what Lightning logs."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import lightning.pytorch as pl
import torch
from cb_utils import FAST, hooks_left, test_spec
from lightning.pytorch.loggers import Logger
from torch.nn.modules import module as _mm
from torch.utils._python_dispatch import _get_current_dispatch_mode_stack
from torch.utils.data import DataLoader, TensorDataset

import tscope_callbacks as ts

__all__ = ["FAST", "SCHED", "all_callbacks", "assert_nothing_left", "fit", "RecordingLogger", "MLPModule",
           "loader", "live", "seeded_fit", "assert_same_weights"]

#: profile step 1 (first), then every even step
SCHED: dict[str, Any] = dict(start_step=1, every_n_steps=2)


def all_callbacks(*, plot: bool = False, nan_action: str = "stop", **sched: Any) -> list[pl.Callback]:
    """RooflineCallback + LayerProfilerCallback + NaNGuardCallback, the profiling ones on the same schedule."""
    sched = {**SCHED, **sched}
    return [ts.RooflineCallback(gpu=test_spec(), **sched, outputs=ts.RooflineOutputs(plot=plot)), ts.LayerProfilerCallback(**sched),
            ts.NaNGuardCallback(action=nan_action)]


def assert_nothing_left(model: torch.nn.Module | None = None, optimizers: Any = ()) -> None:
    """No module hook (on ``model``), no global module hook, no dispatch mode, no running tscope profile or
    session, no torch profiler, no optimizer step hook; every tscope callback of the model's trainer let go of the
    trainer's coordinator (teardown)."""
    from tscope_callbacks.capture.profile import active_profile

    if model is not None:
        assert hooks_left(model) == 0, "module hooks left behind"
    assert not (_mm._global_forward_hooks or _mm._global_forward_pre_hooks or _mm._global_backward_hooks
                or getattr(_mm, "_global_backward_pre_hooks", None)), "global module hooks left behind"
    assert len(_get_current_dispatch_mode_stack()) == 0, "a dispatch mode is still active"
    assert active_profile() is None, "a tscope profile is still running"
    trainer = getattr(model, "_trainer", None)
    for cb in getattr(trainer, "callbacks", ()):
        c = getattr(cb, "_coordinator", None)
        assert c is None or c.running is None, f"{type(cb).__name__} holds a running tscope capture"
    assert not torch._C._autograd._profiler_enabled(), "a torch profiler is still running"
    for opt in optimizers or ():
        opt = getattr(opt, "optimizer", opt)
        assert not opt._optimizer_step_post_hooks and not opt._optimizer_step_pre_hooks, "optimizer hooks left"


class RecordingLogger(Logger):
    """Keeps every ``log_metrics`` call: ``metrics[key] == [(step, value), ...]``."""

    def __init__(self) -> None:
        super().__init__()
        self.metrics: dict[str, list[tuple[int, float]]] = {}

    @property
    def name(self) -> str:
        return "recording"

    @property
    def version(self) -> int:
        return 0

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        for k, v in metrics.items():
            self.metrics.setdefault(k, []).append((step, float(v)))

    def log_hyperparams(self, params: Any, *args: Any, **kwargs: Any) -> None:
        pass


def loader(n: int = 64, dim: int = 8, batch_size: int = 4, *, seed: int = 0, style: str = "tuple") -> DataLoader:
    """Random regression batches as a tuple ``(x, y)``, a list ``[x, y]`` or a dict ``{"x", "y"}``."""
    g = torch.Generator().manual_seed(seed)
    x, y = torch.randn(n, dim, generator=g), torch.randn(n, 1, generator=g)
    if style == "tuple":
        return DataLoader(TensorDataset(x, y), batch_size=batch_size)
    items: list[Any] = [[x[i], y[i]] if style == "list" else {"x": x[i], "y": y[i]} for i in range(n)]
    return DataLoader(items, batch_size=batch_size)  # default collate keeps list / dict


class MLPModule(pl.LightningModule):
    """A tiny MLP (dropout on, so RNG consumption matters) trained with MSE; ``self.net`` is the model."""

    def __init__(self, dim: int = 8, hidden: int = 16, *, optimizer: str = "adamw", dropout: float = 0.1,
                 net: torch.nn.Module | None = None, style: str = "tuple", log_loss: bool = True) -> None:
        super().__init__()
        self.net = net if net is not None else torch.nn.Sequential(
            torch.nn.Linear(dim, hidden), torch.nn.GELU(), torch.nn.Dropout(dropout), torch.nn.Linear(hidden, 1))
        self.optimizer_name, self.style, self.log_loss, self.dim = optimizer, style, log_loss, dim

    def forward(self, x: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        return self.net(x)

    def _xy(self, batch: Any) -> tuple[torch.Tensor, torch.Tensor]:
        return (batch["x"], batch["y"]) if isinstance(batch, dict) else (batch[0], batch[1])

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = self._xy(batch)
        loss = torch.nn.functional.mse_loss(self(x), y)
        if self.log_loss:
            self.log("train_loss", loss)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = self._xy(batch)
        self.log("val_loss", torch.nn.functional.mse_loss(self(x), y))

    def configure_optimizers(self) -> Any:
        params = [p for p in self.parameters() if p.requires_grad]
        if self.optimizer_name == "sgd":
            return torch.optim.SGD(params, lr=0.05, momentum=0.9)
        return torch.optim.AdamW(params, lr=1e-2, weight_decay=0.1)

    def train_dataloader(self) -> DataLoader:
        return loader(dim=self.dim, style=self.style)

    def val_dataloader(self) -> DataLoader:
        return loader(n=8, dim=self.dim, seed=1, style=self.style)


def fit(tmp_path: Any, callbacks: list, model: pl.LightningModule, *, max_steps: int = 4, **kw: Any) -> pl.Trainer:
    kw.setdefault("logger", False)
    kw.setdefault("default_root_dir", tmp_path)
    trainer = pl.Trainer(max_steps=max_steps, callbacks=callbacks, **{**FAST, **kw})
    trainer.fit(model)
    return trainer


def seeded_fit(tmp_path: Any, make_model: Callable[[], pl.LightningModule], callbacks: list, *, seed: int = 0,
               **kw: Any) -> tuple[pl.LightningModule, RecordingLogger, pl.Trainer]:
    """Seed, build, fit; returns the model, the logger that recorded Lightning's metrics and the trainer."""
    pl.seed_everything(seed, verbose=False)
    model = make_model()
    logger = RecordingLogger()
    trainer = fit(tmp_path, callbacks, model, logger=logger, **kw)
    return model, logger, trainer


def assert_same_weights(a: torch.nn.Module, b: torch.nn.Module) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for k in sa:
        assert torch.equal(sa[k], sb[k]), f"{k} differs"


def live(cls: type) -> int:
    """Number of live objects of ``cls`` (after a full collection)."""
    import gc
    import warnings

    gc.collect()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return sum(isinstance(o, cls) for o in gc.get_objects())
