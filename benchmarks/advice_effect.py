"""The closed loop: apply each finding's change to the model it was found on and measure the saving.

For each model (the demo transformer, HF GPT-2 built from a config, the CNN of the issue -- conv/BN/ReLU/max-pool x2,
Linear 4096->256->10, batch 64 --, a ResNet-style CNN and an LSTM language model):

1. time the unprofiled training step (forward, backward, optimizer), profile ``--profile-steps`` steps with
   ``ts.profile``, merge them (``analysis.noise.merge_steps``: each op's median) and take the report's opportunities
   (``ts.roofline``: the same findings a user sees, with the saving each predicts);
2. for every finding whose change this script knows how to apply (``CHANGES``), build the same model with that change
   (same weights, same batch) and time both steps in interleaved A/B rounds in one process: each round times
   ``--per`` steps of A and of B in alternating order; the saving is the median of the rounds' paired differences,
   with a distribution-free 95% interval of that median;
3. compare: the sign, and measured / predicted; then apply every change at once and profile again (the "after"
   report: the applied findings must be gone).

On CPU the steps run on one thread (``torch.set_num_threads(1)``): the machine's other cores are shared, and the
paired rounds make the saving a difference taken within one round. ``--device cuda`` runs the same on a GPU (CUDA
events around each round's steps; GPU-sized models; the CUDA-only changes: vocabulary padding, TF32, cuDNN's
autotuner, CUDA graphs).

``--write``: the table to ``benchmarks/results/advice_effect.md`` (CPU) or ``advice_effect_cuda.md``, and the measured /
predicted ratio per kind of change and device kind to the package's
``tscope_callbacks/analysis/data/advice_effect.json``, which the report reads (``analysis.finding.measured_effect``).

    python benchmarks/advice_effect.py --write            # CPU, about 20 minutes on one busy core
    python benchmarks/advice_effect.py --smoke            # a quick end-to-end run (figures mean nothing)
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import math
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RESULTS, gpt2

import tscope_callbacks as ts
from tscope_callbacks.analysis import advice
from tscope_callbacks.analysis.finding import effect_key
from tscope_callbacks.analysis.noise import merge_steps

EFFECT_TABLE = Path(__file__).resolve().parent.parent / "tscope_callbacks" / "analysis" / "data" / "advice_effect.json"


# ---------------------------------------------------------------- models
class CNN(nn.Module):
    """The issue's CNN: conv/BN/ReLU/max-pool twice, then Linear 4096 -> 256 -> 10 (32x32 RGB inputs)."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
                                      nn.Conv2d(32, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(2))
        self.classifier = nn.Sequential(nn.Flatten(), nn.Linear(4096, 256), nn.ReLU(), nn.Linear(256, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


class Block(nn.Module):
    """A ResNet basic block: relu(bn(conv(relu(bn(conv(x))))) + x)."""

    def __init__(self, c: int) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c), nn.ReLU(),
                                  nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c))
        self.act = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.body(x) + x)


class ResNetish(nn.Module):
    """A small ResNet: a conv/BN/ReLU/max-pool stem, two basic blocks, global average pooling, a linear head."""

    def __init__(self, c: int = 32) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, c, 3, padding=1, bias=False), nn.BatchNorm2d(c), nn.ReLU(),
                                  nn.MaxPool2d(2))
        self.blocks = nn.Sequential(Block(c), Block(c))
        self.head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(c, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(self.stem(x)))


class LSTMLM(nn.Module):
    """A word-level LSTM language model (PTB-style): embedding, 2-layer LSTM, linear decoder."""

    def __init__(self, vocab: int = 10000, d: int = 256) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.rnn = nn.LSTM(d, d, 2, batch_first=True)
        self.head = nn.Linear(d, vocab)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.rnn(self.emb(x))[0])


# ---------------------------------------------------------------- a training step and its variants
def _ce(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))


def _shifted_ce(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Hugging Face's causal-LM loss (``ForCausalLMLoss``): predict token t+1 from position t, in fp32, the labels
    shifted by padding (the logits are not sliced: no copy)."""
    labels = F.pad(y, (0, 1), value=-100)[..., 1:]
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=-100)


@dataclass
class Variant:
    """One way to run a model's training step: the model, its optimizer, the batch, the loss and the settings."""

    name: str
    model: nn.Module
    x: torch.Tensor
    y: torch.Tensor
    call: Callable[[nn.Module, torch.Tensor], Any]  #: (model, x) -> the model's output
    loss: Callable[[Any, torch.Tensor], torch.Tensor]  #: (output, y) -> the loss
    opt_cls: type = torch.optim.SGD
    opt_kwargs: dict[str, Any] = field(default_factory=dict)
    settings: dict[str, Any] = field(default_factory=dict)  #: float32 matmul precision, cuDNN autotuner
    autocast: torch.dtype | None = None
    applied: list[str] = field(default_factory=list)
    inference: bool = False  #: a forward under no_grad in eval mode (no loss, no backward, no optimizer)
    opt: Any = None

    def __post_init__(self) -> None:
        self.rebuild_optimizer()

    def clone(self) -> Variant:
        return Variant(self.name, copy.deepcopy(self.model), self.x, self.y, self.call, self.loss, self.opt_cls,
                       dict(self.opt_kwargs), dict(self.settings), self.autocast, list(self.applied), self.inference)

    def rebuild_optimizer(self) -> None:
        """The optimizer(s): sparse embedding weights get ``torch.optim.SparseAdam`` under an Adam-family optimizer
        (SGD takes sparse gradients itself)."""
        sparse = [m.weight for m in self.model.modules() if isinstance(m, nn.Embedding) and m.sparse]
        if sparse and self.opt_cls is not torch.optim.SGD:
            ids = {id(p) for p in sparse}
            rest = [p for p in self.model.parameters() if id(p) not in ids]
            self.opt = [self.opt_cls(rest, **self.opt_kwargs),
                        torch.optim.SparseAdam(sparse, lr=self.opt_kwargs.get("lr", 1e-3))]
        else:
            self.opt = [self.opt_cls(self.model.parameters(), **self.opt_kwargs)]

    @contextlib.contextmanager
    def flags(self) -> Iterator[None]:
        """The process-wide settings (float32 matmul precision, cuDNN's autotuner) as a user sets them: for the whole
        step, backward and optimizer included, and around a capture (which reads them when it stops)."""
        old_prec, old_bench = torch.get_float32_matmul_precision(), torch.backends.cudnn.benchmark
        torch.set_float32_matmul_precision(self.settings.get("float32_matmul_precision", "highest"))
        torch.backends.cudnn.benchmark = bool(self.settings.get("cudnn_benchmark", False))
        try:
            yield
        finally:
            torch.set_float32_matmul_precision(old_prec)
            torch.backends.cudnn.benchmark = old_bench

    def _autocast(self) -> contextlib.AbstractContextManager:
        return torch.autocast(self.x.device.type, dtype=self.autocast) if self.autocast is not None else \
            contextlib.nullcontext()

    def step(self) -> None:
        with self.flags():
            if self.inference:
                with self._autocast(), torch.no_grad():
                    self.call(self.model, self.x)
                return
            with self._autocast():
                loss = self.loss(self.call(self.model, self.x), self.y)
            loss.backward()
            for o in self.opt:
                o.step()
                o.zero_grad(set_to_none=True)


def _call(m: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return m(x)


def _hf_call(m: nn.Module, x: torch.Tensor) -> Any:
    """Hugging Face's causal LM computes its own loss from ``labels``."""
    return m(input_ids=x, labels=x)


def _hf_loss(out: Any, y: torch.Tensor) -> torch.Tensor:
    return out.loss


def _hf_logits(m: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return m(input_ids=x).logits


def _image_ce(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits, y)


_COMPILED: dict[Any, Any] = {}


def _compiled(fn: Callable, **kw: Any) -> Callable:
    """``torch.compile(fn)`` with static shapes: several models here share one loss function, and Dynamo's cache is
    per code object, so a second model's shape would otherwise recompile it with dynamic shapes (slower kernels than
    a user with one model gets)."""
    kw.setdefault("dynamic", False)
    key = (fn, tuple(sorted(kw.items())))
    if key not in _COMPILED:
        _COMPILED[key] = torch.compile(fn, **kw)
    return _COMPILED[key]


def models(device: str, smoke: bool) -> dict[str, Callable[[], Variant]]:
    """The workloads: name -> a builder of the unchanged variant (A). GPU-sized on CUDA."""
    gpu = device == "cuda"
    g = torch.Generator().manual_seed(0)

    def img(b: int) -> tuple[torch.Tensor, torch.Tensor]:
        return (torch.randn(b, 3, 32, 32, generator=g).to(device), torch.randint(0, 10, (b,), generator=g).to(device))

    def cnn() -> Variant:
        torch.manual_seed(0)
        x, y = img(8 if smoke else 256 if gpu else 64)
        return Variant("CNN", CNN().to(device), x, y, _call, _image_ce, torch.optim.SGD,
                       {"lr": 0.01, "momentum": 0.9}, autocast=torch.bfloat16 if gpu else None)

    def resnet() -> Variant:
        torch.manual_seed(0)
        x, y = img(8 if smoke else 256 if gpu else 32)
        return Variant("ResNet-style CNN", ResNetish().to(device), x, y, _call, _image_ce, torch.optim.SGD, {"lr": 0.01, "momentum": 0.9}, autocast=torch.bfloat16 if gpu else None)

    def cnn_inference() -> Variant:
        torch.manual_seed(0)
        x, y = img(8 if smoke else 256 if gpu else 64)
        return Variant("CNN inference", CNN().to(device).eval(), x, y, _call, _image_ce,
                       autocast=torch.bfloat16 if gpu else None, inference=True)

    def lstm() -> Variant:
        torch.manual_seed(0)
        b, t = (4, 8) if smoke else (64, 70) if gpu else (20, 35)
        x = torch.randint(0, 10000, (b, t), generator=g).to(device)
        y = torch.randint(0, 10000, (b, t), generator=g).to(device)
        return Variant("LSTM", LSTMLM(d=512 if gpu else 128).to(device), x, y, _call, _ce, torch.optim.SGD,
                       {"lr": 0.1}, autocast=torch.bfloat16 if gpu else None)

    def demo() -> Variant:
        from tscope_callbacks.demo.model import TinyGPT, random_tokens

        torch.manual_seed(0)
        m = TinyGPT(n_layer=1, d_model=64) if smoke else TinyGPT(n_layer=12, d_model=768, seq_len=1024,
                                                                     vocab_size=50304) if gpu else TinyGPT()
        x, y = random_tokens(m.cfg, 2 if smoke else 8 if gpu else 16, device=device)
        return Variant("demo transformer", m.to(device), x, y, _call, _ce, torch.optim.AdamW,
                       {"lr": 1e-3}, autocast=torch.bfloat16 if gpu else None)

    def hf_gpt2() -> Variant:
        m = gpt2(n_layer=1, n_embd=32, n_head=2, n_positions=32) if smoke else gpt2() if gpu else gpt2(
            n_layer=2, n_embd=128, n_head=4, n_positions=128)
        b, t = (2, 16) if smoke else (8, 1024) if gpu else (2, 128)
        x = torch.randint(0, 50257, (b, t), generator=g).to(device)
        return Variant("HF GPT-2", m.to(device), x, x, _hf_call, _hf_loss, torch.optim.AdamW, {"lr": 1e-4},
                       autocast=torch.bfloat16 if gpu else None)

    return {"cnn": cnn, "cnn_inference": cnn_inference, "resnet": resnet, "demo": demo, "gpt2": hf_gpt2,
            "lstm": lstm}


# ---------------------------------------------------------------- the changes, as a user would make them
def _sequentials(m: nn.Module) -> list[nn.Sequential]:
    return [s for s in m.modules() if isinstance(s, nn.Sequential)]


_MONOTONE = (nn.ReLU, nn.LeakyReLU, nn.ELU, nn.Hardtanh, nn.Sigmoid, nn.Tanh)


def pool_order(v: Variant, o: Any) -> str:
    n = 0
    for s in _sequentials(v.model):
        for i in range(len(s) - 1):
            if isinstance(s[i], _MONOTONE) and isinstance(s[i + 1], nn.MaxPool2d):
                s[i], s[i + 1] = s[i + 1], s[i]
                n += 1
    return f"activation moved after the max pooling ({n}x)"


def channels_last(v: Variant, o: Any) -> str:
    v.model = v.model.to(memory_format=torch.channels_last)
    v.x = v.x.contiguous(memory_format=torch.channels_last)
    v.rebuild_optimizer()
    return "`model.to(memory_format=torch.channels_last)`, input too"


class BNAct(nn.Module):
    def __init__(self, bn: nn.Module, act: nn.Module) -> None:
        super().__init__()
        self.bn, self.act = bn, act

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.bn(x))


def bn_fusion(v: Variant, o: Any) -> str:
    n = 0
    for s in _sequentials(v.model):
        for i in range(len(s) - 1):
            if isinstance(s[i], nn.BatchNorm2d) and isinstance(s[i + 1], (nn.ReLU, nn.SiLU, nn.GELU)):
                s[i] = torch.compile(BNAct(s[i], s[i + 1]))
                s[i + 1] = nn.Identity()
                n += 1
    v.rebuild_optimizer()
    return f"BatchNorm + activation compiled as one module ({n}x)"


def bn_fold(v: Variant, o: Any) -> str:
    from torch.nn.utils.fusion import fuse_conv_bn_eval

    n = 0
    for s in _sequentials(v.model):
        for i in range(len(s) - 1):
            if isinstance(s[i], nn.Conv2d) and isinstance(s[i + 1], nn.BatchNorm2d):
                s[i], s[i + 1] = fuse_conv_bn_eval(s[i], s[i + 1]), nn.Identity()
                n += 1
    return f"`fuse_conv_bn_eval(conv, bn)` ({n}x)"


def fused_optimizer(v: Variant, o: Any) -> str:
    v.opt_kwargs["fused"] = True
    v.rebuild_optimizer()
    return f"`{v.opt_cls.__name__}(..., fused=True)`"


def compiled_loss(v: Variant, o: Any) -> str:
    if v.call is _hf_call:  # the model's own loss -> its logits and the same loss, compiled
        v.call, v.loss = _hf_logits, _compiled(_shifted_ce)
    else:
        v.loss = _compiled(v.loss)
    return "the loss under `torch.compile` (logits -> cross-entropy)"


def gelu_tanh(v: Variant, o: Any) -> str:
    from transformers.activations import ACT2FN

    n = 0
    for mod in v.model.modules():
        if hasattr(mod, "act") and type(mod.act).__name__ == "NewGELUActivation":
            mod.act = ACT2FN["gelu_pytorch_tanh"]
            n += 1
    v.model.config.activation_function = "gelu_pytorch_tanh"
    return f"`activation_function=\"gelu_pytorch_tanh\"` ({n} MLPs)"


def compile_layers(v: Variant, o: Any) -> str:
    layers = (o.evidence or {}).get("layers") or [o.layer]
    for path in layers:
        parent, _, name = path.rpartition(".")
        owner = v.model.get_submodule(parent) if parent else v.model
        setattr(owner, name, torch.compile(getattr(owner, name)))
    return f"`torch.compile` on {len(layers)} layer(s) `{o.layer}`"


def sparse_embedding(v: Variant, o: Any) -> str:
    for mod in v.model.modules():
        if isinstance(mod, nn.Embedding):
            mod.sparse = True
    v.rebuild_optimizer()
    return "`nn.Embedding(..., sparse=True)`" + ("" if v.opt_cls is torch.optim.SGD else " + `SparseAdam` for it")


def pad_vocab(v: Variant, o: Any) -> str:
    padded = int(o.evidence["padded"])
    v.model.resize_token_embeddings(padded)
    v.rebuild_optimizer()
    return f"`resize_token_embeddings({padded})`"


def tf32(v: Variant, o: Any) -> str:
    v.settings["float32_matmul_precision"] = "high"
    return "`torch.set_float32_matmul_precision('high')`"


def cudnn_benchmark(v: Variant, o: Any) -> str:
    v.settings["cudnn_benchmark"] = True
    return "`torch.backends.cudnn.benchmark = True`"


def cuda_graphs(v: Variant, o: Any) -> str:
    v.model = torch.compile(v.model, mode="reduce-overhead")
    return "`torch.compile(model, mode=\"reduce-overhead\")`"


def compiled_pool(v: Variant, o: Any) -> str:
    for s in _sequentials(v.model):
        for i in range(len(s)):
            if isinstance(s[i], nn.MaxPool2d):
                s[i] = torch.compile(s[i])
    return "max pooling under `torch.compile`"


#: effect key (``analysis.finding.effect_key``) -> how to apply that finding's change to a Variant
CHANGES: dict[str, Callable[[Variant, Any], str]] = {
    "pool_order": pool_order, "channels_last": channels_last, "bn_fusion": bn_fusion, "bn_fold": bn_fold,
    "fusion:optimizer": fused_optimizer, "fusion:loss": compiled_loss, "fusion:gelu": gelu_tanh,
    "fusion:other": compile_layers, "embedding_sparse": sparse_embedding, "misaligned": pad_vocab,
    "fp32_matmul": tf32, "cudnn_benchmark": cudnn_benchmark, "launch": cuda_graphs, "pool_indices": compiled_pool,
}


#: changes that compile something: a first run pays Inductor's compile time (tens of seconds each on a GPU)
COMPILING = {"bn_fusion", "fusion:loss", "fusion:other", "launch", "pool_indices"}


# ---------------------------------------------------------------- measuring
def _timed(v: Variant, per: int, cuda: bool) -> float:
    if cuda:
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        a.record()
        for _ in range(per):
            v.step()
        b.record()
        b.synchronize()
        return a.elapsed_time(b) / 1e3 / per
    t0 = time.thread_time()  # the training thread's CPU time: what the machine's other processes do not add to
    for _ in range(per):
        v.step()
    return (time.thread_time() - t0) / per


@dataclass
class Paired:
    saving_s: float  #: median of the rounds' paired differences A - B
    low_s: float  #: distribution-free 95% interval of that median
    high_s: float
    a_s: float  #: median step of A, of B
    b_s: float
    rounds: int


def median_interval(x: list[float]) -> tuple[float, float]:
    """The distribution-free 95% interval of the median (order statistics, normal approximation of the binomial)."""
    s, n = sorted(x), len(x)
    k = max(0, int(math.floor((n - 1.96 * math.sqrt(n)) / 2)))
    return s[k], s[min(n - 1, n - 1 - k)]


def paired(a: Variant, b: Variant, rounds: int, per: int, cuda: bool) -> Paired:
    """A and B in interleaved rounds (A first in even rounds, B first in odd ones)."""
    for _ in range(2):
        a.step()
        b.step()
    ta, tb, d = [], [], []
    for i in range(rounds):
        if i % 2:
            t_b, t_a = _timed(b, per, cuda), _timed(a, per, cuda)
        else:
            t_a, t_b = _timed(a, per, cuda), _timed(b, per, cuda)
        ta.append(t_a)
        tb.append(t_b)
        d.append(t_a - t_b)
    lo, hi = median_interval(d)
    return Paired(statistics.median(d), lo, hi, statistics.median(ta), statistics.median(tb), rounds)


def report_of(v: Variant, steps: int, cuda: bool, gpu: str) -> Any:
    """The report a user gets: the unprofiled step's median as the basis, ``steps`` profiled steps merged."""
    for _ in range(2):
        v.step()
    plain = statistics.median(_timed(v, 1, cuda) for _ in range(max(5, steps)))
    profs = []
    for i in range(steps):
        # the variant's process-wide flags around the capture too: it reads them when it stops (the autotuner's flag
        # restored before that made cudnn_benchmark fire again after its change)
        with v.flags(), ts.profile(v.model, info=ts.CaptureInfo(step=i, step_time_s=plain,
                                                                step_time_basis="unprofiled-median")) as p:
            v.step()
        profs.append(p.result)
    return ts.roofline(merge_steps(profs), gpu)


def _findings(rep: Any, gpu: str) -> tuple[list[Any], list[Any]]:
    """(the report's findings, up to 20; every finding the rules make before the noise filter, up to 50): the
    report's step analysed again (its profile on the same roofs) to see past the report's top 10."""
    from tscope_callbacks.analysis.noise import find_noise
    from tscope_callbacks.analysis.roofline import build_roofline

    eng = build_roofline(rep.profile, ts.get_device_spec(gpu))
    held: list[Any] = []  # kernel-time findings held back on a launch-bound CUDA step: checked too
    every = advice.opportunities(eng, None, top=50, held_back=held)
    return advice.opportunities(eng, find_noise(eng), top=20), every + held


def _kind(o: Any) -> str:
    return effect_key(o.kind, str((o.evidence or {}).get("chain", "")))


@dataclass
class Case:
    model: str
    key: str
    layer: str
    predicted_s: float
    change: str
    noise: bool  #: the report left it out as within the noise
    result: Paired | None = None
    why_not: str = ""
    predicted_by: str = ""

    @property
    def ratio(self) -> float | None:
        r = self.result
        return r.saving_s / self.predicted_s if r is not None and self.predicted_s else None

    @property
    def sign_ok(self) -> bool | None:
        r = self.result
        return None if r is None else (r.saving_s > 0) == (self.predicted_s > 0)


def _line(o: Any) -> str:
    chain = (o.evidence or {}).get("chain")
    return f"{o.kind}{'/' + chain if chain else ''} `{o.layer or '(model)'}` {(o.saving_s or 0) * 1e3:.3g} ms"


def run_model(name: str, build: Callable[[], Variant], args: argparse.Namespace) -> tuple[list[Case], list[str],
                                                                                           list[str]]:
    """The closed loop on one model: profile, apply each finding's change (each measured against the model it was
    found on), then profile the model with every change applied and do the same with what is found there (a second
    pass: a finding that only appears once another change is made, e.g. pool order once the model is
    channels-last). Returns the cases, the first report's top 5 and the last report's top 5."""
    cuda = args.device == "cuda"
    base = build()
    if not cuda:
        FAULTS[base.name] = _page_faults_per_step(base)
        print(f"  minor page faults a step: {FAULTS[base.name]:.0f}", flush=True)
    cases: list[Case] = []
    before: list[str] = []
    applied: set[str] = set()
    for pass_ in (1, 2):
        rep = report_of(base, args.profile_steps, cuda, args.gpu)
        found, every = _findings(rep, args.gpu)
        shown = {(_kind(o), o.layer) for o in found}
        # every finding the rules make, also those the report holds back as noise (a busy machine's spread, an
        # outlier block, a kernel-time finding on a launch-bound CUDA step): their predictions are checked too, marked
        # "(noise)"
        held = [o for o in every if (_kind(o), o.layer) not in shown and _kind(o) in CHANGES]
        if pass_ == 1:
            before = [_line(o) for o in found[:5]] + [_line(o) + " (within the noise)" for o in held]
        print(f"  pass {pass_}: found {[_line(o) for o in found]}; within the noise {[_line(o) for o in held]}",
              flush=True)
        after = base.clone()
        todo = [(o, False) for o in found] + [(o, True) for o in held]
        todo = [(o, noisy) for o, noisy in todo if _kind(o) not in applied]
        for o, noisy in todo:
            key = _kind(o)
            apply = CHANGES.get(key)
            label = base.name + (" + " + ", ".join(sorted(applied)) if pass_ == 2 and applied else "")
            case = Case(label, key, o.layer or "(model)", o.saving_s or 0.0, "", noisy, predicted_by=o.predicted_by)
            cases.append(case)
            if apply is None:
                case.why_not = "no automatic change in this script"
                continue
            if args.skip_compiled and key in COMPILING:
                case.why_not = "needs torch.compile (skipped: --skip-compiled)"
                continue
            b = base.clone()
            try:
                case.change = apply(b, o)
                if key not in after.applied:
                    after.applied.append(key)
                    apply(after, o)
            except Exception as e:  # a change this model cannot take: say so
                case.why_not = f"{type(e).__name__}: {e}"
                continue
            print(f"  {label}: {key} on {case.layer}: {case.change}", flush=True)
            case.result = paired(base, b, args.rounds, args.per, cuda)
            print(f"    predicted {case.predicted_s * 1e3:.3g} ms, measured {case.result.saving_s * 1e3:.3g} ms "
                  f"[{case.result.low_s * 1e3:.3g}, {case.result.high_s * 1e3:.3g}] (A {case.result.a_s * 1e3:.4g} "
                  "ms)", flush=True)
        new = {c.key for c in cases if c.result is not None} - applied
        if not new:
            break
        applied |= new
        base = after
    rep = report_of(base, args.profile_steps, cuda, args.gpu)
    after_top = [_line(o) for o in rep.opportunities[:5]] + [_line(o) + " (within the noise)"
                                                             for o in rep.noise.suppressed if _kind(o) in CHANGES]
    for o in _findings(rep, args.gpu)[0]:
        if _kind(o) in applied:
            print(f"  !! {_kind(o)} fires again after its change was applied: {o.cause}", flush=True)
            after_top.append(f"(fired again after its change: {_kind(o)})")
    return cases, before, after_top


# ---------------------------------------------------------------- output
def _ms(x: float | None) -> str:
    return "–" if x is None else f"{x * 1e3:.3g}"


def table(cases: list[Case], device: str, args: argparse.Namespace, load: str, tops: dict[str, tuple]) -> str:
    tested = [c for c in cases if c.result is not None]
    ok = [c for c in tested if c.sign_ok and c.ratio is not None and 0.5 <= c.ratio <= 2.0]
    lines = [f"# Advice effect: predicted vs measured saving ({device})", "",
             f"{date.today().isoformat()}, torch {torch.__version__}, {platform.processor() or platform.machine()}, "
             + (f"{torch.cuda.get_device_name()}" if device == "cuda" else "1 CPU thread (`torch.set_num_threads(1)`)")
             + f"; load before the run: {load}.", "",
             f"Each change applied to the model it was found on; saving = median over {args.rounds} interleaved A/B "
             f"rounds ({args.per} steps each) of the paired difference, with its distribution-free 95% interval. "
             f"Predictions from {args.profile_steps} profiled steps merged (each op's median).", "",
             *([f"Allocator: {_allocator_text()}; minor page faults a step of each unchanged model: "
                + ", ".join(f"{k} {v:.0f}" for k, v in FAULTS.items()) + ".", ""] if device == "cpu" else []),
             f"**{len(ok)} of {len(tested)} changes** have the right sign and a prediction within 2x of the measured "
             f"saving; {sum(1 for c in tested if not c.sign_ok)} with the wrong sign.", "",
             "| model | finding | layer | change applied | predicted ms | measured ms [95%] | measured/predicted | "
             "A step ms | sign | within 2x |", "|---|---|---|---|---:|---:|---:|---:|---|---|"]
    for c in cases:
        r = c.result
        if r is None:
            lines.append(f"| {c.model} | {c.key}{' (noise)' if c.noise else ''} | `{c.layer}` | {c.why_not} | "
                         f"{_ms(c.predicted_s)} | – | – | – | – | – |")
            continue
        within = c.ratio is not None and 0.5 <= c.ratio <= 2.0
        lines.append(f"| {c.model} | {c.key}{' (noise)' if c.noise else ''} | `{c.layer}` | {c.change} | "
                     f"{_ms(c.predicted_s)} | {_ms(r.saving_s)} [{_ms(r.low_s)}, {_ms(r.high_s)}] | "
                     f"{c.ratio:.2f} | {_ms(r.a_s)} | {'right' if c.sign_ok else '**wrong**'} | "
                     f"{'yes' if within else '**no**'} |")
    lines += ["", "`(noise)`: the report held the finding back (within the measured noise of its rows, an outlier "
              "block, or on CUDA a kernel-time saving on a launch-bound step, named in its `launch` finding); applied "
              "anyway to check the prediction.", ""]
    for model, (before, after) in tops.items():
        lines += [f"## {model}: top opportunities", "", "before (as found):", ""]
        lines += [f"{i}. {t}" for i, t in enumerate(before, 1)] or ["(none)"]
        lines += ["", "after every applied change:", ""]
        lines += [f"{i}. {t}" for i, t in enumerate(after, 1)] or ["(none)"]
        lines.append("")
    return "\n".join(lines)


NOTES = """## How to read it

- **Measured** is the training thread's CPU time (`time.thread_time`), so other processes on a shared machine do not
  add to it (they still share its caches and memory bandwidth); **predicted** comes from the report a user gets:
  5 profiled steps merged. On a busy host the capture's op wall times hold the time the host gave to other processes:
  an op shorter than a scheduler slice (1 ms) is taken at its least preempted step's time, and the rest of the ops'
  excess over the unprofiled step is taken out of the longer ops (which are stretched in every step).
- A finding the report held back as noise is applied too (marked `(noise)`): on a busy machine most rows' times
  spread more than the savings, and the prediction is still checked.
- **The allocator.** With glibc's own settings (the default here, as users run) a fresh tensor above glibc's mmap
  threshold is page-faulted in at every allocation, and below it, whether the heap was trimmed decides; so which op
  pays depends on the process's history: the same change (pool order on the channels-last inference CNN) measured
  +2.8 and -2.3 ms in two processes (0.68 to 8.57 ms in four earlier runs), and 0.64 and 0.75 ms with glibc told to
  keep freed memory (`--allocator keep`: `MALLOC_MMAP_MAX_=0` and a 64 GiB trim threshold, as under jemalloc,
  tcmalloc or a caching allocator: 0 page faults a step), against 0.87-0.91 ms predicted.
  `advice_effect_keep.md` is the same loop with the memory kept.
- **The compiled loss on CPU** saves page faults, not bytes: against the eager cross-entropy (forward + backward, one
  thread, static shapes) it saved 12 and 49 ms (half the eager loss) over 700 x 10,000 and 256 x 50,257 fp32 logits
  in a process that page-faulted them in, 1.8 and 2.3 ms with the memory kept, and lost 0.3 ms over 2.1 and 8.4 MB.
  In the closed loop: GPT-2 (31,000 page faults a step) 50 ms for 52 predicted, the LSTM (0 page faults a step)
  -2.0 ms for 5.3 predicted, the demo -0.6 ms in two runs. So the loss finding is made on GPUs only.
- **A `torch.compile`d function** (the compiled loss) runs eagerly under the capture; its ops are marked
  (`info.compiled_functions_run_eagerly`) and get no fusion advice, so the report after the change no longer asks
  for it again.
- Effects the rules do not predict. On the channels-last CNN the classifier's gradient reaches the last max pooling's
  backward channels-first (`Linear` -> `flatten`) while its input is channels-last: that mixed-layout backward takes
  2.97 ms against 0.66 ms with a channels-last gradient; with the ReLU after the pooling the mismatch lands on a
  4x smaller ReLU backward. The fused optimizer also drops the optimizer's Python loop (a few us an op), which the
  prediction (the update's bytes) leaves out: on the CNN's SGD, 10 small parameters, measured 2.5x the prediction in
  one run.
"""


def effects(cases: list[Case], device: str) -> dict[str, Any]:
    """measured / predicted per kind of change (the median over the models it was applied to) for the report."""
    out: dict[str, Any] = {}
    for c in cases:
        if c.result is None or not c.ratio:
            continue
        r = c.result
        e = out.setdefault(c.key, {"cases": []})
        e["cases"].append({"model": c.model, "predicted_ms": round(c.predicted_s * 1e3, 4),
                           "measured_ms": round(r.saving_s * 1e3, 4), "low_ms": round(r.low_s * 1e3, 4),
                           "high_ms": round(r.high_s * 1e3, 4), "ratio": round(c.ratio, 3), "held_back": c.noise})
    for e in out.values():
        e["ratio"] = round(statistics.median(x["ratio"] for x in e["cases"]), 3)
        e["models"] = sorted({x["model"] for x in e["cases"]})
    return out


def write_effects(found: dict[str, Any], device: str) -> None:
    data = json.loads(EFFECT_TABLE.read_text()) if EFFECT_TABLE.exists() else {}
    data.setdefault("effects", {})[device] = found
    data["source"] = "benchmarks/advice_effect.py (measured / predicted saving per kind of change)"
    data.setdefault("measured", {})[device] = f"{date.today().isoformat()}, torch {torch.__version__}"
    EFFECT_TABLE.parent.mkdir(parents=True, exist_ok=True)
    EFFECT_TABLE.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    print(f"written {EFFECT_TABLE}")


#: glibc's malloc told to keep what the process frees: no mmap'd blocks (each a fresh mapping, page-faulted again at
#: every allocation) and no trimming of the heap's top. The steady state of a training loop under a caching allocator
#: (PyTorch's on CUDA; jemalloc or tcmalloc on CPU). On the CNN below: 0 minor page faults a step, 3,057 (12 MB of
#: fresh pages) with glibc's defaults, and the same change (pool order, channels-last CNN in inference) measured
#: +2.8 ms and -2.3 ms in two processes with the defaults, 0.64 and 0.75 ms with this
KEEP_ALLOCATOR = {"MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": str(64 << 30)}


FAULTS: dict[str, float] = {}  #: model -> minor page faults a step of its unchanged variant (CPU)


def _allocator_text() -> str:
    if os.environ.get("MALLOC_MMAP_MAX_") == KEEP_ALLOCATOR["MALLOC_MMAP_MAX_"]:
        return ("glibc told to keep freed memory (`MALLOC_MMAP_MAX_=0`, `MALLOC_TRIM_THRESHOLD_` 64 GiB; "
                "`--allocator default` for glibc's own settings)")
    return "glibc's own settings (`--allocator default`)"


def _page_faults_per_step(v: Variant, steps: int = 5) -> float:
    import resource

    for _ in range(3):  # warm: the heap grows to the step's size once
        v.step()
    r0 = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
    for _ in range(steps):
        v.step()
    return (resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - r0) / steps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--models", default="cnn,cnn_inference,resnet,demo,gpt2,lstm")
    ap.add_argument("--rounds", type=int, default=31)
    ap.add_argument("--per", type=int, default=2)
    ap.add_argument("--profile-steps", type=int, default=5)
    ap.add_argument("--write", action="store_true")
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--skip-compiled", action="store_true",
                    help="leave out the changes that compile (bn_fusion, the compiled loss or layer, CUDA graphs, "
                         "compiled pooling): a short GPU check without Inductor's compile times")
    ap.add_argument("--allocator", default="default", choices=["default", "keep"],
                    help="CPU: default: glibc's own settings, as users run (a fresh large tensor is page-faulted in, "
                         "and which op pays depends on the process's history); keep: glibc keeps freed memory "
                         "(MALLOC_MMAP_MAX_=0, a trim threshold of 64 GiB), as under jemalloc/tcmalloc or a caching "
                         "allocator: no page faults in the steady state (--write: advice_effect_keep.md, the shipped "
                         "ratios unchanged)")
    args = ap.parse_args()
    if args.device == "cpu" and args.allocator == "keep" and os.environ.get("MALLOC_MMAP_MAX_") is None:
        # glibc reads these at the process's first malloc: run this script again with them set
        env = {**os.environ, **KEEP_ALLOCATOR}
        os.execve(sys.executable, [sys.executable, *sys.argv], env)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("SKIP: --device cuda without a GPU")
        return
    if args.smoke:
        args.rounds, args.per, args.profile_steps = 3, 1, 2
    if args.device == "cpu":
        torch.set_num_threads(1)
    args.gpu = "auto" if args.device == "cuda" else "cpu"
    load = " ".join(f"{x:.2f}" for x in os.getloadavg()) + f" (1/5/15 min, {os.cpu_count()} CPUs)"
    print(f"load {load}", flush=True)
    builders = models(args.device, args.smoke)
    cases: list[Case] = []
    tops: dict[str, tuple] = {}
    for name in args.models.split(","):
        print(f"{name}:", flush=True)
        c, before, after = run_model(name, builders[name], args)
        cases += c
        tops[c[0].model if c else name] = (before, after)
    load_after = " ".join(f"{x:.2f}" for x in os.getloadavg())
    text = table(cases, args.device, args, f"{load}; after: {load_after}", tops)
    print(text)
    if args.write and not args.smoke:
        keep = args.device == "cpu" and args.allocator == "keep"
        name = ("advice_effect_keep.md" if keep else "advice_effect.md" if args.device == "cpu"
                else "advice_effect_cuda.md")
        (RESULTS / name).write_text(text + "\n" + NOTES + "\nReproduce: `python benchmarks/advice_effect.py --device "
                                    f"{args.device}{' --allocator keep' if keep else ''} --write`\n")
        if not keep:
            write_effects(effects(cases, args.device), args.device)


if __name__ == "__main__":
    main()
