"""Model FLOPs are defined once (``records.model_flops``): the profiled step's report, the automatic MFU windows
between profiles and ``tscope diff`` count the same FLOPs, under the callback's ``attention_flops`` convention."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import lightning.pytorch as pl
import pytest
from cb_utils import FAST, test_spec
from models import TINY_CFG, TinyLM

import tscope_callbacks as ts
from tscope_callbacks.analysis.diff import diff_reports
from tscope_callbacks.records import model_flops


def test_full_square_attention_reaches_the_report_and_the_windows(tmp_path: Path) -> None:
    cb = ts.RooflineCallback(gpu=test_spec(), start_step=1, every_n_steps=100,
                             mfu=ts.MFUOptions(attention_flops="full"),
                             capture=ts.CaptureOptions(steps=1, wait_for_warmup=False),
                             outputs=ts.RooflineOutputs(plot=False, save_json=False))
    trainer = pl.Trainer(max_steps=6, default_root_dir=tmp_path, callbacks=[cb], logger=False, **FAST)
    trainer.fit(TinyLM())
    rep, prof = cb.last_report, cb.last_profile
    assert rep is not None and [h["step"] for h in cb.history] == [1]
    # TinyLM: causal SDPA, B=4 sequences, H=2 heads, L=16, head dim 16 (d_model 32 / 2), 2 layers. Forward per layer
    # 2 * pairs * (d_qk + d_v) * B * H = 2 * pairs * 32 * 8 = 512 pairs; model backward 2x forward: 1536 pairs per
    # layer. Attended pairs L(L+1)/2 = 136, the full square L*L = 256: "full" adds 1536 * 120 * 2 layers = 368,640
    b, h, length, dh = 4, TINY_CFG.n_head, TINY_CFG.seq_len, TINY_CFG.d_model // TINY_CFG.n_head
    per_pair = 3 * 2 * (dh + dh) * b * h
    assert per_pair == 1536
    extra = per_pair * (length * length - length * (length + 1) // 2) * TINY_CFG.n_layer
    assert extra == 368_640
    attended = model_flops(prof.ops, "attended")
    assert rep.summary.model_flops == prof.model_flops == attended + extra
    # the windows between profiles count the report's FLOPs per step, against the report's roof
    windows = list(cb.throughput.windows)
    assert windows and all(w.flops == w.steps * rep.summary.model_flops for w in windows)
    assert cb.throughput.peak_flops == rep.summary.mfu_peak_flops
    w = windows[-1]
    assert cb.throughput.compute()["mfu"] == pytest.approx(w.flops / w.time_s / rep.summary.mfu_peak_flops, rel=1e-12)
    assert rep.summary.mfu == pytest.approx(rep.summary.model_flops / rep.summary.measured_step_s / rep.summary.mfu_peak_flops, rel=1e-12)
    # the typed report: its op rows count each op under the same convention, and sum to its model FLOPs
    step = ts.analyze(prof, test_spec())
    assert step.summary.model_flops == rep.summary.model_flops
    assert sum(r.model_flops for r in step.ops if r.phase in ("forward", "backward")) == rep.summary.model_flops
    # tscope diff: the same step counted both ways is the same work, said so
    prof2 = type(prof).from_dict(prof.to_dict())
    prof2.info = dataclasses.replace(prof2.info, attention_flops="attended")
    other = ts.roofline(prof2, test_spec())
    assert other.summary.model_flops == attended
    d = diff_reports(rep, other)
    assert d.same_work and any("count causal attention differently (full vs attended)" in n for n in d.notes)


def test_an_unknown_convention_is_a_one_line_error() -> None:
    with pytest.raises(ValueError, match="attention_flops must be one of"):
        model_flops([], "square")
