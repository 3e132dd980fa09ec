"""All callbacks on the models people train: compiled, checkpointed, tied/shared, Hugging Face, odd batches, frozen,
parameter-free, very deep. Each fit is compared bit for bit with the same fit without the callbacks."""

from __future__ import annotations

import gc
import logging
import time
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from cb_utils import test_spec
from robust_utils import (
    MLPModule,
    all_callbacks,
    assert_nothing_left,
    assert_same_weights,
    loader,
    seeded_fit,
)
from torch import nn
from torch.utils.checkpoint import checkpoint

import tscope_callbacks as ts


def _check(tmp_path: Path, make: Any, *, max_steps: int = 3, **kw: Any) -> tuple[list, pl.LightningModule]:
    """Fit with and without all callbacks (profiling steps 1 and 2): same weights and losses, nothing left."""
    plain, plain_log, _ = seeded_fit(tmp_path / "plain", make, [], max_steps=max_steps, **kw)
    cbs = all_callbacks()
    model, log, trainer = seeded_fit(tmp_path / "cb", make, cbs, max_steps=max_steps, **kw)
    assert [h["step"] for h in cbs[0].history] == [s for s in (1, 2, 4, 6, 8) if s < max_steps]
    assert cbs[0].last_report is not None and cbs[1].last_layers
    assert not cbs[0].last_profile.info.internal_errors
    assert_same_weights(plain, model)
    assert plain_log.metrics.get("train_loss") == log.metrics.get("train_loss")
    assert_nothing_left(model, trainer.optimizers)
    return cbs, model


# ---------------------------------------------------------------- torch.compile
def test_compiled_submodule_runs_eagerly_under_capture_and_warns_once(tmp_path: Path,
                                                                      caplog: pytest.LogCaptureFixture) -> None:
    def make() -> MLPModule:
        m = MLPModule(dropout=0.0)
        m.net = torch.compile(m.net, backend="eager")
        return m

    from tscope_callbacks.capture import region

    region._WARNED_COMPILED.clear()  # the warning is once per model and process
    with caplog.at_level(logging.WARNING, logger="tscope_callbacks"):
        cbs, _ = _check(tmp_path, make, max_steps=5)
    assert [h["step"] for h in cbs[0].history] == [1, 2, 4]
    assert cbs[0].last_profile.info.compiled_modules_run_eagerly == ["net"]
    assert sum(r.category == "matmul" and r.phase == "forward" for r in cbs[0].last_profile.ops) == 2
    assert "net.0" in cbs[1].last_layers  # paths without torch.compile's _orig_mod
    assert sum("torch.compile" in r.getMessage() for r in caplog.records) == 1  # once, not per profiled step


def test_compiled_lightning_module(tmp_path: Path) -> None:
    # trainer.fit(torch.compile(module)): Lightning compiles forward/training_step in place (no self.log inside:
    # dynamo in this torch/Lightning pair cannot trace LightningModule.log, with or without tscope)
    cbs, _ = _check(tmp_path, lambda: torch.compile(MLPModule(dropout=0.0, log_loss=False), backend="eager"))
    prof = cbs[0].last_profile
    assert prof.info.compiled_modules_run_eagerly == [""]
    assert sum(r.category == "matmul" and r.phase == "forward" for r in prof.ops) == 2


# ---------------------------------------------------------------- activation checkpointing
class _Ckpt(MLPModule):
    def __init__(self, reentrant: bool) -> None:
        super().__init__(dropout=0.0)
        self.reentrant = reentrant
        self.block = nn.Sequential(nn.Linear(16, 16), nn.GELU(), nn.Linear(16, 16))

    def forward(self, x: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        h = self.net[1](self.net[0](x))
        h = checkpoint(self.block, h, use_reentrant=self.reentrant)
        return self.net[3](h)


@pytest.mark.parametrize("reentrant", [False, True])
def test_activation_checkpointing_counts_recompute_and_reports_hfu(tmp_path: Path, reentrant: bool) -> None:
    cbs, _ = _check(tmp_path, lambda: _Ckpt(reentrant))
    prof, rep = cbs[0].last_profile, cbs[0].last_report
    rec = [r for r in prof.ops if r.phase == "recompute"]
    # non-reentrant checkpointing stops recomputing once the saved tensors are back (block.2's output is not one)
    assert {r.layer for r in rec if r.category == "matmul"} == ({"block.0", "block.2"} if reentrant else {"block.0"})
    rec_flops = sum(r.flops for r in rec)
    assert rec_flops > 0 and prof.layers["block"].flops_recompute == rec_flops
    s = rep.summary
    opt_flops = sum(r.flops for r in prof.ops if r.phase == "optimizer")  # the update: hardware work, not model
    assert opt_flops > 0
    assert s.hardware_flops == rep.summary.total_flops and s.model_flops == rep.summary.total_flops - rec_flops - opt_flops
    assert s.recompute_flops == rec_flops
    assert s.hfu > s.mfu > 0 and s.hfu / s.mfu == pytest.approx(rep.summary.total_flops / s.model_flops)
    assert "HFU" in rep.to_markdown()
    assert cbs[1].last_layers["block.0"].calls == 1  # the recompute is not a second call


def test_nan_guard_locates_inside_a_checkpointed_block(tmp_path: Path) -> None:
    model = _Ckpt(reentrant=False)
    model.net[3].weight.register_hook(lambda g: g * float("nan") if model.trainer.global_step == 2 else g)
    cbs = all_callbacks(nan_action="warn")
    trainer = pl.Trainer(max_steps=3, default_root_dir=tmp_path, callbacks=cbs, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, accelerator="cpu")
    trainer.fit(model)
    ev = cbs[2].events
    assert len(ev) == 1 and ev[0].step == 2 and ev[0].kind == "gradient" and ev[0].layer == "net.3", ev
    assert "internal" not in ev[0].note.lower(), ev[0].note


# ---------------------------------------------------------------- shared / tied modules
class _Shared(MLPModule):
    """The same Linear applied twice, and an output layer tied to the input layer's weight (transposed use)."""

    def __init__(self) -> None:
        super().__init__(dim=8, hidden=8, dropout=0.0)
        self.shared = nn.Linear(8, 8)
        self.out = nn.Linear(8, 8, bias=False)
        self.out.weight = self.net[0].weight  # tied

    def forward(self, x: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        h = self.shared(torch.relu(self.shared(x)))
        return self.net[3](self.out(h))


def test_shared_and_tied_modules(tmp_path: Path) -> None:
    cbs, model = _check(tmp_path, _Shared)
    layers = cbs[1].last_layers
    assert layers["shared"].calls == 2
    assert layers["shared"].flops_fwd == 2 * layers["out"].flops_fwd
    assert layers["shared"].flops_bwd > 0 and layers["net.0"].calls == 0
    bwd_layers = {r.layer for r in cbs[0].last_profile.ops if r.phase == "backward"}
    assert "shared" in bwd_layers and "out" in bwd_layers


# ---------------------------------------------------------------- Hugging Face
def test_huggingface_gpt2_with_model_output(tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    cfg = transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64, n_positions=16, bos_token_id=0,
                                  eos_token_id=0, attn_implementation="sdpa")

    class HF(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.model = transformers.GPT2LMHeadModel(cfg)

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            out = self.model(input_ids=batch["input_ids"], labels=batch["input_ids"])  # a ModelOutput
            self.log("train_loss", out.loss)
            return out.loss

        def configure_optimizers(self) -> Any:
            return torch.optim.AdamW(self.parameters(), lr=1e-3)

        def train_dataloader(self) -> Any:
            g = torch.Generator().manual_seed(0)
            ids = torch.randint(0, 64, (16, 16), generator=g)
            return torch.utils.data.DataLoader([{"input_ids": t} for t in ids], batch_size=4)

    cbs, _ = _check(tmp_path, HF)
    layers = cbs[1].last_layers
    assert layers["model.transformer.h.0.attn"].flops_fwd > 0 and layers["model.transformer.h.0.attn"].flops_bwd > 0
    assert layers["model.lm_head"].output_shapes == [[4, 16, 64]]
    assert cbs[0].last_report.summary.flop_coverage > 0.95


# ---------------------------------------------------------------- batches, kwargs, frozen, parameter-free
class _KwargsNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(8, 16)
        self.head = nn.Linear(16, 1)

    def forward(self, *, x: torch.Tensor, scale: float = 1.0, extra: dict | None = None) -> dict[str, Any]:
        h = torch.relu(self.proj(x)) * scale
        return {"out": self.head(h), "aux": [h.mean(), (h, None)], "note": "not a tensor"}


class _KwargsModule(MLPModule):
    def __init__(self, style: str) -> None:
        super().__init__(style=style, net=_KwargsNet())

    def forward(self, x: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        out = self.net(x=x, scale=0.5, extra={"k": x})  # called with keyword arguments only
        return out["out"] + 0.0 * out["aux"][0]


@pytest.mark.parametrize("style", ["dict", "list"])
def test_dict_and_list_batches_and_kwargs_only_calls(tmp_path: Path, style: str) -> None:
    cbs, _ = _check(tmp_path, lambda: _KwargsModule(style))
    layers = cbs[1].last_layers
    assert layers["net"].calls == 1 and layers["net.proj"].input_shapes == [[4, 8]]
    assert layers["net"].output_shapes == [[4, 1], [], [4, 16]]  # tensors of the dict output, in order


class _Frozen(MLPModule):
    def __init__(self) -> None:
        super().__init__(dropout=0.0)
        self.net[0].requires_grad_(False)


def test_frozen_layers(tmp_path: Path) -> None:
    cbs, model = _check(tmp_path, _Frozen)
    layers = cbs[1].last_layers
    assert layers["net.0"].num_trainable_parameters == 0 and layers["net.0"].grad_bytes == 0
    assert not any(r.layer == "net.0" and r.phase == "backward" and r.category == "matmul"
                   for r in cbs[0].last_profile.ops)  # no weight gradient for a frozen layer
    assert model.net[0].weight.grad is None


class _NoParams(pl.LightningModule):
    """No parameters and no optimizer: Lightning runs ``training_step`` only (with a mock optimizer step)."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.ReLU(), nn.Softmax(dim=-1))

    def training_step(self, batch: Any, batch_idx: int) -> None:
        self.log("train_loss", self.net(batch[0]).sum())

    def configure_optimizers(self) -> None:
        return None

    def train_dataloader(self) -> Any:
        return loader(n=16)


def test_parameter_free_model(tmp_path: Path) -> None:
    cbs = all_callbacks(start_step=0)
    model = _NoParams()
    trainer = pl.Trainer(max_epochs=1, limit_train_batches=3, default_root_dir=tmp_path, callbacks=cbs,
                         logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, accelerator="cpu")
    trainer.fit(model)
    assert [h["step"] for h in cbs[0].history] == [0, 2]
    assert cbs[1].last_layers["net.0"].flops_fwd > 0 and cbs[1].last_layers[""].num_parameters == 0
    assert_nothing_left(model)
    with ts.profile(nn.Softmax(dim=-1)) as p:  # the engine alone on a module without parameters
        nn.Softmax(dim=-1)(torch.randn(2, 3))
    assert p.info.device == "cpu"


# ---------------------------------------------------------------- very deep
def _deep_profile_time(n: int) -> float:
    """CPU seconds of this process (not wall time: other processes' load does not stretch it) to profile an
    ``n``-layer model and render its report and layer tree, the garbage collector off (its sweeps grow with the
    whole suite's heap, not with ``n``)."""
    model = nn.Sequential(*(nn.Linear(4, 4) for _ in range(n)))
    x = torch.randn(2, 4)
    gc.collect()  # the garbage the suite's earlier tests left is not this profile's to sweep
    from tscope_callbacks.render.layer_table import render_tree_table

    gc.disable()
    try:
        t0 = time.process_time()
        with ts.profile(model, layer_details=True, check_finite=True) as p:
            model(x).sum().backward()
        report = ts.roofline(p.result, test_spec())
        report.to_markdown(top=20)
        render_tree_table(p.layers, root_name="Sequential")
        dt = time.process_time() - t0
    finally:
        gc.enable()
    assert len(p.layers) == n + 1 and p.layers[str(n - 1)].calls == 1
    return dt


def test_deep_models_profile_and_report_in_linear_time() -> None:
    _deep_profile_time(50)  # warm-up (formula plans, imports)
    t200 = min(_deep_profile_time(200) for _ in range(3))
    t800 = min(_deep_profile_time(800) for _ in range(3))
    assert t800 / t200 < 8, (t200, t800)  # linear: ~4, quadratic: ~16
