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
    cb = ts.RooflineCallback(gpu=test_spec(), plot=False)  # start_step=10
    with pytest.warns(UserWarning, match=r"ended at step 4, before the first profile \(start_step=10\)"):
        _fit(tmp_path, cb, max_steps=4)
    assert not cb.history


def test_fast_dev_run(tmp_path):
    cb = ts.LayerProfilerCallback()
    with pytest.warns(UserWarning, match="fast_dev_run runs 1 step"):
        _fit(tmp_path, cb, fast_dev_run=True)


def test_standalone_validate_with_default_stages(tmp_path):
    cb = ts.RooflineCallback(gpu=test_spec(), plot=False, start_step=1, every_n_steps=1, max_profiles=1)
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
