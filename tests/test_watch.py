"""WatchCallback and ``analysis.histograms``: device-side histograms checked against numpy on the same values, the
non-finite counts wandb.watch drops, every backend's output, update ratios against a hand computation."""

from __future__ import annotations

import csv
import logging
import math
from types import SimpleNamespace

import lightning.pytorch as pl
import numpy as np
import pytest
import torch
from cb_utils import FAST
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger
from models import TinyLM

import tscope_callbacks as ts
from tscope_callbacks import WatchCallback
from tscope_callbacks.analysis import histograms as H
from tscope_callbacks.callbacks.sinks import WandbSink

NAN, INF = float("nan"), float("inf")


def _numpy_hist(t: torch.Tensor, bins: int) -> tuple[list[int], np.ndarray]:
    v = t.detach().double().reshape(-1).numpy()
    v = v[np.isfinite(v)]
    counts, edges = np.histogram(v, bins=bins, range=(v.min(), v.max()))
    return counts.tolist(), edges


# ---------------------------------------------------------------------------------------------------- histograms
@pytest.mark.parametrize("device_path", [False, True])
def test_histograms_equal_numpy_and_count_what_it_drops(monkeypatch, device_path):
    # device_path: the GPU's sync-free masked passes on every chunk (on CPU clean chunks take a shorter path)
    if device_path:
        monkeypatch.setattr(H, "_reads_are_free", lambda device: False)
    torch.manual_seed(0)
    clean = torch.randn(10_000)
    (hc,) = H.histograms([("clean", clean)], bins=32)
    assert hc.counts == _numpy_hist(clean, 32)[0] and (hc.num, hc.nan, hc.inf) == (10_000, 0, 0)
    assert math.isclose(hc.std, clean.double().std(unbiased=False).item(), rel_tol=1e-9)
    x = torch.randn(10_000)
    x[[3, 50, 700]] = torch.tensor([NAN, INF, -INF])
    for chunk in (H.CHUNK, 1000, 333):  # one pass, and chunked passes with a ragged last chunk: the same counts
        monkeypatch.setattr(H, "CHUNK", chunk)
        (h,) = H.histograms([("x", x)], bins=32)
        counts, edges = _numpy_hist(x, 32)
        assert h.counts == counts and np.allclose(h.edges, edges, rtol=0, atol=1e-12)
        assert (h.num, h.nan, h.inf) == (9997, 1, 2) and sum(h.counts) == h.num
        fin = x[torch.isfinite(x)].double()
        assert h.min == fin.min().item() and h.max == fin.max().item()
        assert math.isclose(h.mean, fin.mean().item(), rel_tol=1e-9)
        assert math.isclose(h.std, fin.std(unbiased=False).item(), rel_tol=1e-9)


def test_histograms_edge_cases():
    b16 = torch.randn(999, generator=torch.Generator().manual_seed(1)).bfloat16()
    zero, nan, empty, bf = H.histograms([("z", torch.zeros(5)), ("n", torch.full((3,), NAN)),
                                         ("e", torch.zeros(0)), ("b", b16)], bins=4)
    assert zero.edges == [-0.5, -0.25, 0.0, 0.25, 0.5] and zero.counts == [0, 0, 5, 0]  # centred unit range
    assert nan.counts == [0, 0, 0, 0] and (nan.num, nan.nan, nan.min, nan.max) == (0, 3, None, None)
    assert empty.num == 0 and empty.counts == [0] * 4 and empty.mean is None
    assert bf.counts == _numpy_hist(b16.float(), 4)[0] and sum(bf.counts) == 999  # bf16: binned as its fp32 values


@pytest.mark.parametrize("device_path", [False, True])
def test_float64_values_closer_than_float32_resolution_are_binned_exactly(monkeypatch, device_path):
    if device_path:
        monkeypatch.setattr(H, "_reads_are_free", lambda device: False)
    x = 1.0 + torch.arange(16, dtype=torch.float64) * 1e-12  # all the same number in fp32
    (h,) = H.histograms([("x", x)], bins=4)
    assert h.min == 1.0 and h.max == x[-1].item() and h.counts == _numpy_hist(x, 4)[0] == [4, 4, 4, 4]


def test_counts_past_float32_precision_are_exact(monkeypatch):
    # each chunk's fp32 counts are exact below 2**24; the sum is float64: a bin of 2**24 + 3 values is exact
    monkeypatch.setattr(H, "CHUNK", 1 << 22)
    x = torch.zeros((1 << 24) + 3)
    x[-1] = 1.0
    (h,) = H.histograms([("big", x)], bins=2)
    assert h.counts == [(1 << 24) + 2, 1]


# ---------------------------------------------------------------------------------------------------- callback
class GradProbe(Callback):
    """Copies of every gradient and parameter at on_before_optimizer_step, and of the weights after the step."""

    def __init__(self) -> None:
        self.grads, self.params, self.after = {}, {}, {}

    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        s = trainer.global_step
        self.grads[s] = {n: p.grad.detach().clone() for n, p in pl_module.named_parameters() if p.grad is not None}
        self.params[s] = {n: p.detach().clone() for n, p in pl_module.named_parameters()}

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.after[trainer.global_step - 1] = {n: p.detach().clone() for n, p in pl_module.named_parameters()}


def _fit(*callbacks, max_steps=5, **kw):
    kw = {**FAST, "logger": False, **kw}
    model = TinyLM(optimizer="adamw", lr=1e-2)
    pl.Trainer(max_steps=max_steps, callbacks=list(callbacks), **kw).fit(model)
    return model


def test_callback_histograms_equal_the_gradients_and_parameters_the_optimizer_saw():
    probe, watch = GradProbe(), WatchCallback("all", every_n_steps=2, bins=16, raise_errors=True)
    model = _fit(probe, watch)
    assert watch.last["step"] == 4  # steps 0, 2, 4 logged; the last one kept
    names = [n for n, _ in model.named_parameters()]
    grads = {h.name: h for h in watch.last["gradients"]}
    params = {h.name: h for h in watch.last["parameters"]}
    assert sorted(grads) == sorted(params) == sorted(names)
    for n in names:
        for h, t in ((grads[n], probe.grads[4][n]), (params[n], probe.params[4][n])):
            counts, edges = _numpy_hist(t, 16) if t.min() < t.max() else (None, None)
            assert h.num == t.numel()
            if counts is not None:
                assert h.counts == counts, n
    assert watch.host_waits == 0  # CPU: read right away, nothing waited for


def test_nonfinite_gradients_are_counted_and_every_tensor_is_logged(tmp_path):
    class Poison(Callback):  # NaN in one gradient at step 2 (after backward, before the watch reads it)
        def on_before_optimizer_step(self, trainer, pl_module, optimizer):
            if trainer.global_step == 2:
                g = pl_module.model.blocks[1].mlp.fc.weight.grad
                g[0, :3] = NAN
                g[1, 0] = INF

    seen = {}

    class Scalars(Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            if trainer.global_step == 3:
                seen.update(watch.last)

    watch = WatchCallback(every_n_steps=2, bins=8)
    logged = {}
    import tscope_callbacks.callbacks.sinks as sinks_mod

    class Grab(sinks_mod.FileSink):
        def log_scalars(self, scalars, step):
            logged.setdefault(step, {}).update(scalars)

    from unittest import mock

    with mock.patch.object(sinks_mod, "FileSink", Grab), mock.patch("tscope_callbacks.callbacks.sink_setup.FileSink",
                                                                    Grab):
        model = _fit(Poison(), watch, Scalars(), max_steps=3, default_root_dir=str(tmp_path))
    assert logged[2]["tscope/watch/nonfinite_grads"] == 4.0 and logged[0]["tscope/watch/nonfinite_grads"] == 0.0
    assert [k for k in logged[2] if k.startswith("tscope/watch/nonfinite/")] == [
        "tscope/watch/nonfinite/model.blocks.1.mlp.fc.weight"]
    hists = {h.name: h for h in seen["gradients"]}
    bad = hists["model.blocks.1.mlp.fc.weight"]
    assert (bad.nan, bad.inf) == (3, 1) and bad.num == bad_numel(model) - 4 and sum(bad.counts) == bad.num
    assert len(hists) == sum(1 for _ in model.parameters())  # wandb.watch drops tensors, here all are logged
    assert all(h.nonfinite == 0 for n, h in hists.items() if n != "model.blocks.1.mlp.fc.weight")


def bad_numel(model) -> int:
    return model.model.blocks[1].mlp.fc.weight.numel()


def test_update_ratio_equals_the_hand_computation():
    probe, watch = GradProbe(), WatchCallback(every_n_steps=2, update_ratio=True)
    model = _fit(probe, watch, max_steps=3)
    r = watch.last["update_ratio"]
    step = watch.last["step"]
    assert step == 2
    before, after = probe.params[2], probe.after[2]
    d, w = {}, {}
    for n, _ in model.named_parameters():
        layer = n.rpartition(".")[0]
        d[layer] = d.get(layer, 0.0) + (after[n] - before[n]).double().norm().item() ** 2
        w[layer] = w.get(layer, 0.0) + after[n].double().norm().item() ** 2
    for layer in d:
        assert math.isclose(r[layer], math.sqrt(d[layer] / w[layer]), rel_tol=1e-4), layer
    assert math.isclose(r["total"], math.sqrt(sum(d.values()) / sum(w.values())), rel_tol=1e-4)
    assert 1e-5 < r["total"] < 1  # AdamW at lr 1e-2 on a freshly initialised model
    _check_unchanged(model, watch, probe)


def _check_unchanged(model, watch, probe) -> dict:
    """``update_unchanged`` per layer equals (after == before) counted by hand, over the layer's elements."""
    got = watch.last["update_unchanged"]
    step = watch.last["step"]
    same, numel = {}, {}
    for n, prm in model.named_parameters():
        layer = n.rpartition(".")[0]
        same[layer] = same.get(layer, 0) + int((probe.after[step][n] == probe.params[step][n]).sum())
        numel[layer] = numel.get(layer, 0) + prm.numel()
    assert got == {**{k: same[k] / numel[k] for k in same}, "total": sum(same.values()) / sum(numel.values())}
    return got


def test_weights_an_update_did_not_change_bf16_true_against_fp32():
    """Weights stored in bf16 round away an update smaller than half their bf16 step: with SGD at lr 1e-4 nearly
    every weight stays as it was, and the share says so; the same run in fp32 changes nearly every weight."""
    shares = {}
    for precision in ("bf16-true", "32-true"):
        probe, watch = GradProbe(), WatchCallback(every_n_steps=2, update_ratio=True)
        kw = {**FAST, "logger": False}
        model = TinyLM(optimizer="sgd", lr=1e-4)
        pl.Trainer(max_steps=3, callbacks=[probe, watch], precision=precision, **kw).fit(model)
        shares[precision] = _check_unchanged(model, watch, probe)["total"]
    # fp32: only what had no gradient stays (embedding rows of tokens absent from the batches: 2.9% here)
    assert shares["bf16-true"] > 0.9 and shares["32-true"] < 0.05, shares


def test_tensorboard_and_csv_backends(tmp_path):
    tb = TensorBoardLogger(str(tmp_path), name="tb")
    csvl = CSVLogger(str(tmp_path), name="csv")
    watch = WatchCallback(every_n_steps=2, bins=8)
    model = _fit(watch, max_steps=3, logger=[tb, csvl])
    tb.experiment.flush()
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(tb.log_dir, size_guidance={"histograms": 0})
    acc.Reload()
    tags = [t for t in acc.Tags()["histograms"] if t.startswith("tscope/grad_hist/")]
    assert len(tags) == sum(1 for _ in model.parameters())
    ev = acc.Histograms("tscope/grad_hist/model.head.weight")
    assert [e.step for e in ev] == [0, 2]
    assert ev[-1].histogram_value.num == model.model.head.weight.numel()
    assert "tscope/watch/nonfinite_grads" in acc.Tags()["scalars"]
    path = tmp_path / "csv" / "version_0" / "tscope" / "grad_hist_step_2.csv"
    rows = list(csv.DictReader(path.open()))
    assert len(rows) == len(tags) and {"name", "num", "nan", "inf", "edges", "counts"} <= set(rows[0])


def test_wandb_sink_logs_wandb_histograms():
    wandb = pytest.importorskip("wandb")
    logged = []
    sink = WandbSink(SimpleNamespace(log_metrics=lambda d, step: logged.append((d, step))))
    hs = H.histograms([("a", torch.arange(10.0)), ("nan", torch.full((2,), NAN))], bins=5)
    sink.log_histograms("tscope/grad_hist", hs, 7)
    ((d, step),) = logged
    assert step == 7 and list(d) == ["tscope/grad_hist/a"]  # nothing finite to draw: counted, not drawn
    h = d["tscope/grad_hist/a"]
    assert isinstance(h, wandb.Histogram) and list(h.histogram) == [2, 2, 2, 2, 2]


def test_config_errors_and_failures_never_break_training(monkeypatch, caplog):
    with pytest.raises(ValueError, match="log must be one of"):
        WatchCallback("grads")
    with pytest.raises(ValueError, match="every_n_steps"):
        WatchCallback(every_n_steps=0)
    with pytest.raises(TypeError, match="update_ratio"):
        WatchCallback(update_ratio=1)

    def boom(*a, **k):
        raise RuntimeError("boom")

    monkeypatch.setattr(H, "device_stats", boom)
    caplog.set_level(logging.WARNING, logger="tscope_callbacks")
    _fit(WatchCallback(every_n_steps=1), max_steps=2)  # training completes
    assert any("WatchCallback" in r.getMessage() and "boom" in r.getMessage() for r in caplog.records)
    with pytest.raises(RuntimeError, match="boom"):
        _fit(WatchCallback(every_n_steps=1, raise_errors=True), max_steps=1)


def test_inside_a_profiled_step_the_watch_ops_are_not_the_users():
    roof = ts.LayerProfilerCallback(every_n_steps=None, start_step=2, check_finite=False,
                                    outputs=ts.LayerOutputs(save_json=False, plot=False))
    seen = []

    class Grab(Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            if roof.last_layers is not None and not seen:
                seen.append(trainer.global_step)

    watch = WatchCallback(every_n_steps=2, update_ratio=True)
    captured = []
    import tscope_callbacks.callbacks.layers_cb as lc

    orig = lc.LayerProfilerCallback._on_profile

    def spy(self, trainer, pl_module, result, ctx):
        captured.append(result)
        return orig(self, trainer, pl_module, result, ctx)

    lc.LayerProfilerCallback._on_profile = spy
    try:
        _fit(roof, watch, Grab(), max_steps=3)
    finally:
        lc.LayerProfilerCallback._on_profile = orig
    assert captured and watch.last["step"] == 2
    ops = {r.op for r in captured[0].ops}
    assert "aten.histc" not in ops and "aten.linalg_vector_norm" not in ops


def test_names_are_the_users_under_torch_compile():
    # a compiled submodule's parameters are named without torch.compile's `_orig_mod` segment, as the NaN guard
    # and the reports name them (the wrapper is not called here: nothing is compiled)
    net = torch.nn.Sequential(torch.nn.Linear(2, 2))
    module = torch.nn.Module()
    module.net = torch.compile(net)
    assert [n for n, _ in module.named_parameters()] == ["net._orig_mod.0.weight", "net._orig_mod.0.bias"]
    watch = WatchCallback()
    watch.on_fit_start(None, module)
    opt = torch.optim.SGD(module.parameters(), lr=0.1)
    assert [n for n, _ in watch._params(SimpleNamespace(lightning_module=module), opt)] == ["net.0.weight",
                                                                                            "net.0.bias"]


def test_a_watched_step_is_no_step_time_basis_nor_mfu_window():
    """The histograms, the update ratios and their read-out are tscope's work inside the user's steps: the clocks
    behind the step-time basis and the automatic MFU are told (the coordinator's dirty_clocks), at the watched step and at the
    step its read-out runs in, and at no other."""
    told: list[int] = []
    watch = WatchCallback(every_n_steps=3)

    class Clock(Callback):  # a registered clock, as RooflineCallback registers its own
        def on_fit_start(self, trainer, pl_module):
            self.trainer = trainer
            watch.coordinator(trainer).register_clock(self)  # the trainer's coordinator, as RooflineCallback does

        def mark_dirty(self):
            told.append(self.trainer.global_step)

    _fit(Clock(), watch, max_steps=8)
    # steps 0, 3, 6 watched (global_step before the update: 0, 3, 6); on CPU the read-out runs at the same step's
    # batch end, where global_step already counts its update (1, 4, 7): each time the same step's interval
    assert sorted(set(told)) == [0, 1, 3, 4, 6, 7], told
