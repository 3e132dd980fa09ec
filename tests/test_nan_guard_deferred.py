"""The NaN guard without a host sync on healthy steps (the GPU default, forced here with ``sync=False``): flags read
one step late, bad updates masked on the device through fused optimizers' ``found_inf``, same guarantees."""

from __future__ import annotations

import sys

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.callbacks import Callback
from models import TinyLM

from tscope_callbacks.analysis import nonfinite as nl
from tscope_callbacks.callbacks.nan_guard import NaNGuardCallback, NonFiniteError

NAN = float("nan")


def make_trainer(*callbacks, max_steps: int = 8) -> pl.Trainer:
    return pl.Trainer(max_steps=max_steps, accelerator="cpu", devices=1, callbacks=list(callbacks), logger=False,
                      enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)


MARK = 63  #: a token id that poisons the batch it starts (the data, not the step counter: a replay reproduces it)


class PoisonedLM(TinyLM):
    """TinyLM whose batch at optimizer step ``step`` starts with ``MARK``; block 1's MLP output is NaN for it."""

    def __init__(self, step: int, optimizer: str = "adamw-fused") -> None:
        super().__init__(optimizer=optimizer)
        self.poison_step, self._poisoned = step, False
        self.model.register_forward_pre_hook(self._look)
        self.model.blocks[1].mlp.register_forward_hook(lambda m, a, o: o * NAN if self._poisoned else o)

    def _look(self, mod, args):
        self._poisoned = bool(args[0][0, 0] == MARK)

    def train_dataloader(self):
        dl = super().train_dataloader()
        x, y = dl.dataset.tensors
        x = x.clone()
        x[:, 0] = torch.where(x[:, 0] == MARK, MARK - 1, x[:, 0])
        x[self.poison_step * self.batch_size, 0] = MARK
        return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=self.batch_size)


class _HostReadSpy:
    """Counts ``.item()`` / ``bool()`` / ``float()`` called from tscope's own code (each one a host sync on a GPU)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: list[str] = []
        for name in ("item", "__bool__", "__float__"):
            orig = getattr(torch.Tensor, name)
            monkeypatch.setattr(torch.Tensor, name, self._wrap(orig, name))

    def _wrap(self, orig, name):
        def f(t, *a, **k):
            caller = sys._getframe(1).f_code.co_filename
            if "tscope_callbacks" in caller:
                self.calls.append(f"{name} from {caller}")
            return orig(t, *a, **k)

        return f


class StateProbe(Callback):
    """Weights and optimizer state at the start and at the end of optimizer step ``step``."""

    def __init__(self, step: int) -> None:
        self.step, self.before, self.after = step, None, None

    @staticmethod
    def _snap(trainer, pl_module):
        opt = trainer.optimizers[0]
        state = {k: {n: v.clone() for n, v in s.items() if torch.is_tensor(v)} for k, s in enumerate(opt.state.values())}
        return {n: p.detach().clone() for n, p in pl_module.named_parameters()}, state

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.global_step == self.step:
            self.before = self._snap(trainer, pl_module)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step == self.step + 1 and self.after is None:
            self.after = self._snap(trainer, pl_module)


def test_healthy_steps_read_nothing_on_the_host(monkeypatch):
    spy = _HostReadSpy(monkeypatch)
    syncs = nl.sync_points()
    guard = NaNGuardCallback(action="stop", sync=False)
    make_trainer(guard, max_steps=6).fit(TinyLM(optimizer="adamw-fused"))
    assert guard.mode == "deferred" and guard.host_syncs == 0 and not guard.events
    assert nl.sync_points() == syncs  # no read_now: every flag went through the late, copied read
    assert spy.calls == []  # and no .item()/bool()/float() anywhere in tscope's code


@pytest.mark.parametrize("optimizer", ["adamw-fused", "sgd-fused"])
def test_skip_leaves_weights_and_optimizer_state_as_if_the_update_never_happened(optimizer):
    model = PoisonedLM(3, optimizer)
    probe = StateProbe(3)
    guard = NaNGuardCallback(action="skip", sync=False)
    trainer = make_trainer(guard, probe, max_steps=6)
    trainer.fit(model)
    assert trainer.global_step == 6 and guard.skipped_steps == 1 and guard.host_syncs == 0
    (ev,) = guard.events
    assert ev.step == 3 and ev.layer == "model.blocks.1.mlp" and "read 1 step(s) later" in ev.action
    (w0, s0), (w1, s1) = probe.before, probe.after
    assert all(torch.equal(w0[n], w1[n]) for n in w0)  # weights bit-identical across the masked step
    assert all(torch.equal(s0[k][n], s1[k][n]) for k in s0 for n in s0[k])  # moments, momentum and step counters
    assert all(torch.isfinite(p).all() for p in model.parameters())


def test_stop_keeps_the_weights_from_before_the_bad_step():
    model = PoisonedLM(3)
    probe = StateProbe(3)
    guard = NaNGuardCallback(action="stop", sync=False)
    trainer = make_trainer(guard, probe, max_steps=10)
    trainer.fit(model)
    assert trainer.global_step == 5  # read at step 4's start: steps 3 and 4 ran, both masked on the device
    (ev,) = guard.events
    assert ev.step == 3 and ev.kind == "activation" and ev.layer == "model.blocks.1.mlp"
    assert ev.parameters and all(c > 0 for c in ev.parameters.values())  # exact counts from the exact replay
    final = {n: p.detach() for n, p in model.named_parameters()}
    assert all(torch.equal(probe.before[0][n], final[n]) for n in final)  # nothing applied since step 3 began


def test_raise_names_the_bad_step():
    model = PoisonedLM(2)
    with pytest.raises(NonFiniteError, match="model.blocks.1.mlp") as exc:
        make_trainer(NaNGuardCallback(action="raise", sync=False)).fit(model)
    assert exc.value.event.step == 2


def test_an_optimizer_without_found_inf_falls_back_to_one_sync_per_step():
    model = PoisonedLM(3, "adamw")  # the foreach implementation cannot skip on the device
    guard = NaNGuardCallback(action="stop", sync=False)
    trainer = make_trainer(guard)
    trainer.fit(model)
    assert guard.host_syncs == 4 and trainer.global_step == 4  # steps 0-3 read at the step; stop after step 3
    warn = NaNGuardCallback(action="warn", sync=False)  # nothing to mask: warn stays sync-free on any optimizer
    make_trainer(warn, max_steps=4).fit(TinyLM(optimizer="adamw"))
    assert warn.host_syncs == 0


def test_a_nan_in_the_last_step_is_still_reported():
    model = PoisonedLM(5)
    guard = NaNGuardCallback(action="warn", sync=False)
    make_trainer(guard, max_steps=6).fit(model)  # step 5 is the last: its flag is read at the end of training
    assert [e.step for e in guard.events] == [5]
