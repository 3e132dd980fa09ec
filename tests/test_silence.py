"""Where a user expects output and nothing is profiled, the callbacks say why, once (issue: silence)."""

from __future__ import annotations

import lightning.pytorch as pl
import pytest

import tscope_callbacks as ts
from tests.cb_utils import FAST, test_spec
from tests.models import TinyLM


def _fit(tmp_path, cb, **kw):
    trainer = pl.Trainer(default_root_dir=tmp_path, logger=False, callbacks=[cb], **{**FAST, **kw})
    trainer.fit(TinyLM(n_batches=8))
    return trainer


def test_run_shorter_than_start_step(tmp_path):
    cb = ts.RooflineCallback(gpu=test_spec(), outputs=ts.RooflineOutputs(plot=False))  # start_step=10
    with pytest.warns(UserWarning, match=r"ended at step 4, before the first profile \(start_step=10\)"):
        _fit(tmp_path, cb, max_steps=4)
    assert not cb.history


def test_fast_dev_run(tmp_path):
    cb = ts.LayerProfilerCallback()
    with pytest.warns(UserWarning, match="fast_dev_run runs 1 step"):
        _fit(tmp_path, cb, fast_dev_run=True)


def test_standalone_validate_with_default_stages(tmp_path):
    cb = ts.RooflineCallback(gpu=test_spec(), start_step=1, every_n_steps=1, max_profiles=1,
                             outputs=ts.RooflineOutputs(plot=False))
    trainer = pl.Trainer(default_root_dir=tmp_path, logger=False, callbacks=[cb], **FAST, limit_val_batches=2)
    class WithVal(TinyLM):
        def validation_step(self, batch, batch_idx):
            return self.compute_loss(batch)

    module = WithVal(n_batches=8)
    with pytest.warns(UserWarning, match=r"trainer.validate\(\) ran, but this callback profiles stages=\('train',\)"
                                         r".*stages=\('train', 'validation'\)"):
        trainer.validate(module, dataloaders=module.train_dataloader())


def test_every_n_steps_zero_message():
    with pytest.raises(ValueError, match=r"every_n_steps must be >= 1 \(or None: profile start_step only\)"):
        ts.RooflineCallback(every_n_steps=0)


class _WithVal(TinyLM):
    def validation_step(self, batch, batch_idx):
        return self.compute_loss(batch)


def _told(recwarn) -> list[str]:
    return [str(w.message) for w in recwarn if "tscope" in str(w.message)]


def test_validation_stage_on_a_fit_without_validation_says_why_once(tmp_path, recwarn):
    # stages=("validation",) and a fit with no val_dataloader: nothing can be profiled; it says so, once
    cb = ts.RooflineCallback(gpu=test_spec(), start_step=5, stages=("validation",),
                             outputs=ts.RooflineOutputs(plot=False))
    _fit(tmp_path, cb, max_steps=6)
    told = _told(recwarn)
    assert len(told) == 1 and "stages includes 'validation', but no validation batch ran" in told[0], told
    assert "val_dataloader" in told[0] and not cb.history


def test_validation_with_fewer_batches_than_start_step_says_why(tmp_path, recwarn):
    cb = ts.LayerProfilerCallback(start_step=5, stages=("train", "validation"))
    trainer = pl.Trainer(default_root_dir=tmp_path, logger=False, callbacks=[cb], max_steps=6, limit_val_batches=3,
                         val_check_interval=3, **{**FAST, "num_sanity_val_steps": 2})
    module = _WithVal(n_batches=8)
    trainer.fit(module, val_dataloaders=module.train_dataloader())
    told = _told(recwarn)
    # training was profiled at step 5; validation epochs ran 3 batches (the sanity check's are not counted)
    assert cb.schedules["train"].taken == 1 and cb.schedules["validation"].taken == 0
    assert told == ["tscope LayerProfilerCallback: validation epochs ran 3 batches, and the first validation profile "
                    "is due at batch index 5 (start_step counts validation batches): nothing was profiled there; "
                    "lower start_step"], told
    trainer.validate(module, dataloaders=module.train_dataloader(), verbose=False)  # the same reason, for validate
    assert "validation epochs ran 3 batches" in _told(recwarn)[-1]


def test_a_profiled_validation_says_nothing(tmp_path, recwarn):
    cb = ts.LayerProfilerCallback(start_step=1, stages=("validation",))
    trainer = pl.Trainer(default_root_dir=tmp_path, logger=False, callbacks=[cb], max_steps=4, limit_val_batches=3,
                         val_check_interval=2, **FAST)
    module = _WithVal(n_batches=8)
    trainer.fit(module, val_dataloaders=module.train_dataloader())
    assert cb.schedules["validation"].taken >= 1 and _told(recwarn) == []
