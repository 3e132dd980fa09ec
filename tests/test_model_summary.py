"""The model level (issue: the profiling tutorial's summary): parameters, size, FLOPs and MACs, activations,
latency and throughput -- each against a hand count, the allocator or the report's own step basis."""

from __future__ import annotations

from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
import yaml
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

import tscope_callbacks as ts
from tests.cb_utils import FAST, test_spec
from tests.models import TinyLM
from tscope_callbacks.analysis.fmt import sig, time_text
from tscope_callbacks.analysis.report import model_scalars
from tscope_callbacks.demo.model import GPTConfig, TinyGPT, matmul_flops
from tscope_callbacks.render.plot import layer_bars


def test_summary_of_an_analysis_on_meta():
    cfg = GPTConfig()
    model = TinyGPT(cfg)
    rep = ts.analyze_model(model, input_shape=[(8, cfg.seq_len)], gpu="h100", precision="bf16")
    m = rep.model
    n = sum(p.numel() for p in model.parameters())
    assert m["params"] == m["params_trainable"] == n
    assert m["size_mb"] == pytest.approx(n * 2 / 2**20)  # bf16: 2 bytes per parameter
    # the Linear layers' multiply-adds: FLOPs / 2 (demo.model's analytic count), plus attention's
    mm = matmul_flops(cfg, 8)["total"]
    att = sum(o.flops for o in rep.ops if o.category == "attention")
    assert m["macs_forward"] == (mm + att) // 2
    assert m["flops_forward"] == m["flops_step"] == rep.summary.model_flops  # forward only
    # untimed: latency = the sum of expected kernel times; throughput from it; 2-D int ids: tokens
    assert "latency_ms" not in m and rep.step_s == rep.summary.estimated_step_s  # stored once, in the summary
    assert m["samples_per_s"] == pytest.approx(8 / rep.summary.estimated_step_s)
    assert m["tokens_per_s"] == pytest.approx(8 * cfg.seq_len / rep.summary.estimated_step_s)
    md = rep.to_markdown()
    assert md.splitlines()[2].startswith(f"- **Model**: {sig(n / 1e6)} M parameters")
    assert f"{time_text(rep.summary.estimated_step_s)} per batch (estimated" in md.splitlines()[2]
    sc = model_scalars(m, rep.step_s)
    assert {"params_m", "size_mb", "gflops_forward", "gmacs_step", "latency_ms", "tokens_per_s"} <= set(sc)
    assert sc["latency_ms"] == pytest.approx(rep.summary.estimated_step_s * 1e3)
    assert rep.area_scalars["model"]["latency_ms"] == sc["latency_ms"]


def test_activations_from_saved_bytes_with_layer_details():
    cfg = GPTConfig()
    model = TinyGPT(cfg)
    x = torch.randint(0, cfg.vocab_size, (4, cfg.seq_len))
    with ts.profile(model, layer_details=True) as p:
        model(x).sum().backward()
    rep = ts.roofline(p.result, test_spec())
    m = rep.model
    root = p.layers[""]
    assert m["activations_mb"] == pytest.approx((root.peak_fwd_bytes or root.saved_bytes) / 2**20)
    assert m["activations_mb"] > 0
    assert m["batch"] == 4 and rep.summary.step_time_source == "op-time"
    assert "per batch (op-time" in rep.to_markdown()


def _tb_hparams(log_dir: str) -> dict[str, object]:
    """The hyperparameters of the run's last ``_hparams_/session_start_info`` (TensorBoard's HPARAMS tab)."""
    from tensorboard.backend.event_processing.event_file_loader import LegacyEventFileLoader
    from tensorboard.plugins.hparams import plugin_data_pb2

    out: dict[str, object] = {}
    for f in sorted(Path(log_dir).glob("events.out.tfevents*")):
        for ev in LegacyEventFileLoader(str(f)).Load():
            for v in ev.summary.value:
                if v.tag == "_hparams_/session_start_info":
                    data = plugin_data_pb2.HParamsPluginData.FromString(v.metadata.plugin_data.content)
                    out = {k: getattr(h, h.WhichOneof("kind")) for k, h in data.session_start_info.hparams.items()}
    return out


def test_callback_logs_the_model_once(tmp_path: Path):
    roof = ts.RooflineCallback(gpu=test_spec(), start_step=1, every_n_steps=2, outputs=ts.RooflineOutputs(plot=False))
    lay = ts.LayerProfilerCallback(start_step=1, every_n_steps=2)
    trainer = pl.Trainer(max_steps=5, default_root_dir=tmp_path, callbacks=[roof, lay],
                         logger=pl.loggers.TensorBoardLogger(tmp_path, name="tb"), **FAST)
    trainer.fit(TinyLM())
    acc = EventAccumulator(trainer.logger.log_dir, size_guidance={"scalars": 0, "images": 0, "tensors": 0})
    acc.Reload()
    # the model summary is a fact of the fit: the logger's hyperparameters (hparams.yaml, the HPARAMS tab), no
    # one-point scalar charts
    assert not [t for t in acc.Tags()["scalars"] if t.startswith("tscope/model/")]
    hp = yaml.safe_load((Path(trainer.logger.log_dir) / "hparams.yaml").read_text())
    model_keys = [k for k in hp if k.startswith("tscope/model/")]
    # tokens/s was here too, measured at the first profile only: not a fact of the fit (the tscope/roofline series
    # carries it), so it is no longer a hyperparameter
    assert "tscope/model/params_m" in model_keys and "tscope/model/tokens_per_s" not in model_keys
    assert "tscope/model/params_m" in _tb_hparams(trainer.logger.log_dir)  # what the HPARAMS tab reads
    n = sum(p.numel() for p in trainer.lightning_module.parameters())
    assert hp["tscope/model/params_m"] == pytest.approx(n / 1e6, rel=1e-5)
    assert "tscope/layers/bars" in acc.Tags()["images"]
    # the step's measured memory peak at each profile (layer details from the LayerProfilerCallback); the
    # categories fixed for the model and batch shape in the hyperparameters
    mem = {t: acc.Scalars(t) for t in acc.Tags()["scalars"] if t.startswith("tscope/memory/")}
    assert "tscope/memory/step_peak_mb" in mem and not {"tscope/memory/weights_mb", "tscope/memory/optimizer_state_mb",
                                                       "tscope/memory/activations_saved_mb"} & set(mem)
    assert {"tscope/memory/weights_mb", "tscope/memory/optimizer_state_mb", "tscope/memory/activations_saved_mb"} <= set(hp)
    profiles = len(list((Path(trainer.logger.log_dir) / "tscope").glob("step_*.json")))
    assert profiles >= 2 and {t: len(v) for t, v in mem.items()} == {t: profiles for t in mem}
    assert hp["tscope/memory/weights_mb"] == pytest.approx(n * 4 / 2**20, rel=1e-5)  # fp32 weights
    peak = mem["tscope/memory/step_peak_mb"][-1].value
    assert peak > hp["tscope/memory/weights_mb"] + hp["tscope/memory/optimizer_state_mb"]


def test_layer_bars_largest_first():
    cfg = GPTConfig()
    model = TinyGPT(cfg)
    with ts.profile(model, layer_details=True) as p:
        model(torch.randint(0, cfg.vocab_size, (2, cfg.seq_len))).sum().backward()
    fig = layer_bars(p.layers, top=5)
    ax = fig.axes[0]
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert len(labels) == 5
    by_time = sorted((L for k, L in p.layers.items() if k), key=lambda L: -(L.self_forward_s + L.self_backward_s))
    assert labels[::-1] == [L.path for L in by_time[:5]]  # every layer listed: its own time, the largest at the top


def test_layer_bars_of_a_depth_cut_carry_the_sub_layers_time():
    """Under a depth cut (the demo's LayerProfilerCallback(depth=3)) a listed block's own ops are a sliver; its MLP,
    the step's largest layer, is not listed: the bars dropped it. Now each listed layer's bar is its time without its
    listed sub-layers, so the listed layers split the step and the block carries its MLP."""
    from tscope_callbacks.analysis.layers import select_layers
    from tscope_callbacks.render.plot import BAR_BASIS, bar_rows, card_layer_bars

    cfg = GPTConfig()
    model = TinyGPT(cfg)
    with ts.profile(model) as p:
        model(torch.randint(0, cfg.vocab_size, (2, cfg.seq_len))).sum().backward()
    cut = select_layers(p.layers, None, 2)  # "blocks.0", not "blocks.0.mlp"
    assert "blocks.0" in cut and "blocks.0.mlp" not in cut
    rows = {L.path: (f, b) for L, f, b in bar_rows(cut, top=50)}
    full = p.layers
    # a listed leaf of the cut: its whole time (its own ops and every sub-layer's)
    assert rows["blocks.0"] == (pytest.approx(full["blocks.0"].forward_s), pytest.approx(full["blocks.0"].backward_s))
    # the listed layers (the root left out) split the step's op time: their bars add up to the root's total
    assert sum(f + b for f, b in rows.values()) == pytest.approx(full[""].forward_s + full[""].backward_s
                                                                  - full[""].self_forward_s - full[""].self_backward_s)
    # with every layer listed, a bar is the layer's own time
    every = {L.path: (f, b) for L, f, b in bar_rows(full, top=500)}
    assert all(f == pytest.approx(full[k].self_forward_s, abs=1e-12) and b == pytest.approx(full[k].self_backward_s,
               abs=1e-12) for k, (f, b) in every.items())
    ax = card_layer_bars(cut, top=3).axes[0]
    assert ax.get_xlabel() == BAR_BASIS and ax.get_title() == "layers by time (top 3)"
    assert [t.get_text() for t in ax.get_yticklabels()][-1] in ("blocks.0", "blocks.1", "head")
