"""Nothing of the step monitor's survives an interrupt: a ``KeyboardInterrupt`` (or an exception) at any step of a
40-step fit and any point of the step -- the fetch, forward, backward, optimizer, a callback's batch end, a logger,
inside tscope's own code -- including the steps where a profile runs, where the monitor times each layer and where a
slowdown's diagnosis profiles, leaves no module hook, global hook, dispatch mode, profile, optimizer hook or patched
attribute (the Lightning profiler's ``start``/``stop``, the logger connector's and epoch loop's methods, the
loggers' ``log_metrics``/``save``); and the next fit in the same process is clean too.

The fast test takes the steps where tscope does something (the points taking turns) and a few others;
``test_interrupt_sweep_every_step_and_point`` (slow) takes every step and every point, each with a
``KeyboardInterrupt`` and with an exception."""

from __future__ import annotations

import signal
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from cb_utils import FAST, test_spec
from lightning.pytorch.loggers import CSVLogger
from robust_utils import assert_nothing_left
from torch.utils.data import DataLoader, Dataset

import tscope_callbacks as ts
from tscope_callbacks.callbacks.loop_probe import LoopProbe
from tscope_callbacks.callbacks.monitor import MonitorOptions

STEPS = 40
#: the loss spikes at this step: a trigger the monitor diagnoses (a profile, layer timing) inside the fit, whatever
#: the machine's load
SPIKE = 22
POINTS = ("fetch", "forward", "backward", "optimizer", "batch_end", "log", "tscope")


class _Boom:
    """Where and what to raise: at ``point``, the first time it is reached at or after global step ``step`` (a
    logger is called at logging steps only). A step's fetch comes before its batch starts, while ``gs`` still holds
    the step before: the fetch of step ``step`` is the first one once ``gs + 1 >= step`` (with ``gs >= step``, the
    last step's fetch was never reached and nothing was raised: the fast test failed so whenever the steps where
    tscope captured made step 39 the fetch's turn)."""

    def __init__(self, step: int, point: str, exc: type[BaseException]) -> None:
        self.step, self.point, self.exc, self.fired = step, point, exc, False
        self.gs = 0

    def __call__(self, point: str) -> None:
        if not self.fired and point == self.point and self.gs + (point == "fetch") >= self.step:
            self.fired = True
            raise self.exc(f"interrupt at step {self.step}, {point}")


class _Data(Dataset):
    def __init__(self, boom: _Boom) -> None:
        g = torch.Generator().manual_seed(0)
        self.x, self.y, self.boom = torch.randn(512, 16, generator=g), torch.randn(512, 4, generator=g), boom

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        self.boom("fetch")
        return self.x[i], self.y[i]


class _Raise(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, boom: _Boom) -> torch.Tensor:
        ctx.boom = boom
        return x.clone()

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor):
        ctx.boom("backward")
        return g, None


class _Layer(torch.nn.Module):
    def __init__(self, boom: _Boom) -> None:
        super().__init__()
        self.lin, self.boom = torch.nn.Linear(32, 32), boom

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.boom("forward")
        return _Raise.apply(torch.relu(self.lin(x)), self.boom)


class _SGD(torch.optim.SGD):
    boom: _Boom

    def step(self, closure=None):  # type: ignore[override]
        loss = super().step(closure)
        self.boom("optimizer")
        return loss


class _Net(pl.LightningModule):
    def __init__(self, boom: _Boom) -> None:
        super().__init__()
        self.boom = boom
        self.net = torch.nn.Sequential(torch.nn.Linear(16, 32), _Layer(boom), torch.nn.Linear(32, 4))

    def training_step(self, batch, batch_idx):
        self.boom.gs = self.global_step
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        self.log("loss", loss)
        return loss * 50 if self.global_step == SPIKE else loss

    def configure_optimizers(self):
        opt = _SGD(self.parameters(), lr=1e-3)
        opt.boom = self.boom
        return opt

    def train_dataloader(self):
        return DataLoader(_Data(self.boom), batch_size=8)


class _BatchEnd(pl.Callback):
    def __init__(self, boom: _Boom) -> None:
        self.boom = boom

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.boom.gs = trainer.global_step  # (the fetch of a step happens before its training_step)

    def on_train_batch_end(self, *args) -> None:
        self.boom("batch_end")


class _Logger(CSVLogger):
    boom: _Boom

    def log_metrics(self, metrics, step=None):  # type: ignore[override]
        if "loss" in metrics:  # Lightning's own call (tscope's sinks report a failing logger and carry on)
            self.boom("log")
        super().log_metrics(metrics, step)


def _callbacks() -> list[pl.Callback]:
    # a scheduled profile at step 3 (the monitor joins it: its baseline), the layers timed after it, and a loss
    # spike at step 22 diagnosed with a profile and layer timing before step 40
    # (min_rise=100: no slow-steps trigger, whose timing is the machine's; the loss spike is deterministic)
    mon = ts.StepMonitor(MonitorOptions(min_steps=8, recent_steps=4, window=16, confirm_steps=2, min_gap_steps=1,
                                        min_rise=100.0), telemetry=False)
    roof = ts.RooflineCallback(gpu=test_spec(), start_step=3, every_n_steps=None, monitor=mon,
                               capture=ts.CaptureOptions(steps=1, wait_for_warmup=False),
                               outputs=ts.RooflineOutputs(plot=False, save_json=False))
    return [roof]


@pytest.fixture(autouse=True)
def _one_thread():
    """One torch thread: on a shared 2-core machine more threads spin on each other (steps 10x slower)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def _probe_marks(trainer: pl.Trainer) -> list[str]:
    """The attributes the step-parts probe sets, still set on the trainer's objects."""
    left = []
    for name, obj, attrs in (("profiler", trainer.profiler, ("start", "stop")),
                             ("logger connector", trainer._logger_connector,
                              ("on_batch_start", "on_batch_end", "update_train_step_metrics")),
                             ("epoch loop", trainer.fit_loop.epoch_loop,
                              ("_save_loggers_on_train_batch_end", "_broadcast_sigterm_tensor"))):
        left += [f"{name}.{a}" for a in attrs if a in vars(obj)]
    for lg in trainer.loggers:
        left += [f"logger.{a}" for a in ("save",) if a in vars(lg)]
        if getattr(vars(lg).get("log_metrics"), "__qualname__", "").startswith("LoopProbe"):
            left.append("logger.log_metrics")
    return left


def _run(tmp_path, step: int, point: str, exc: type[BaseException], monkeypatch) -> None:
    boom = _Boom(step, point, exc)
    if point == "tscope":  # an interrupt inside tscope's own code: the probe's step boundary of this step
        real = LoopProbe._boundary

        def boundary(self, t):
            if self._t0 is not None:
                boom.gs = self.step + 1
            boom("tscope")
            return real(self, t)

        monkeypatch.setattr(LoopProbe, "_boundary", boundary)
    model = _Net(boom)
    logger = _Logger(str(tmp_path))
    logger.boom = boom
    cbs = _callbacks()
    trainer = pl.Trainer(max_steps=STEPS, callbacks=[_BatchEnd(boom), *cbs], logger=logger,
                         **{**FAST, "log_every_n_steps": 5})
    handler = signal.getsignal(signal.SIGINT)
    try:
        if point == "tscope" and not issubclass(exc, KeyboardInterrupt):
            trainer.fit(model)  # tscope's own errors are reported, not raised: the fit goes on
        else:
            with pytest.raises((SystemExit, exc)):  # Lightning turns a KeyboardInterrupt into sys.exit(1)
                trainer.fit(model)
    finally:
        signal.signal(signal.SIGINT, handler)  # Lightning ignores SIGINT after a KeyboardInterrupt
    assert boom.fired, f"step {step} {point}: nothing was raised"
    assert_nothing_left(model, trainer.optimizers)
    assert _probe_marks(trainer) == [], f"step {step} {point}"
    monkeypatch.undo()


def _special() -> list[int]:
    """The steps where tscope does something in the fit (a dry run: its captures)."""
    boom = _Boom(-1, "none", RuntimeError)
    cbs = _callbacks()
    pl.Trainer(max_steps=STEPS, callbacks=cbs, logger=False, **{**FAST, "log_every_n_steps": 5}).fit(_Net(boom))
    mon = cbs[0].monitor
    assert mon.healthy is not None and mon.healthy.step == 3, "the scheduled profile is the baseline"
    spikes = [a for a in mon.alerts if a["trigger"]["kind"] == "loss-spike"]
    assert spikes and spikes[0]["profile_step"] == SPIKE + 1, [a["text"] for a in mon.alerts]  # profiled
    return sorted({3, *mon.captures})


def test_interrupt_at_every_step_leaves_nothing(tmp_path, monkeypatch) -> None:
    special = _special()
    assert len(special) >= 8  # the baseline profile, 3 layer steps, the diagnosis' profile and 3 layer steps
    # every step where tscope does something, the points taking turns (an interrupt inside tscope's own code at
    # the baseline's and the diagnosis' first step), the first steps and an ordinary one
    steps = sorted({0, 1, 2, 15, STEPS - 1, *special})
    cases = [(s, POINTS[i % len(POINTS)]) for i, s in enumerate(steps)]
    cases += [(special[1], "tscope"), (SPIKE + 1, "tscope")]
    for i, (step, point) in enumerate(cases):
        _run(tmp_path / str(i), step, point, KeyboardInterrupt if i % 2 == 0 else RuntimeError, monkeypatch)
    # and the next fit in the same process, on the same model, is clean throughout
    from cb_utils import LeakCheck

    boom = _Boom(-1, "none", RuntimeError)
    model, check = _Net(boom), LeakCheck()
    trainer = pl.Trainer(max_steps=8, callbacks=[check, *_callbacks()], logger=False, **FAST)
    trainer.fit(model)
    assert check.checked == 8
    assert_nothing_left(model, trainer.optimizers)
    assert _probe_marks(trainer) == []


@pytest.mark.slow
def test_interrupt_sweep_every_step_and_point(tmp_path, monkeypatch) -> None:
    i = 0
    for step in range(STEPS):
        for point in POINTS:
            for exc in (KeyboardInterrupt, RuntimeError):
                _run(tmp_path / str(i), step, point, exc, monkeypatch)
                i += 1
