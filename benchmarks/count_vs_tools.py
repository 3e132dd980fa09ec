"""tscope's FLOP counts beside FlopCounterMode, DeepSpeed's flops profiler, calflops and fvcore, on HF models.

Each model is built from a tiny config (no weights, no download) and runs one step on this CPU: the forward, then
the backward from the sum of its first output. Every tool counts the same model on the same inputs:

- tscope: ``ts.profile`` (a dispatch mode: every aten op, forward and backward as they run);
- FlopCounterMode (``torch.utils.flop_counter``): a dispatch mode over its formula table, forward and backward;
- DeepSpeed's ``FlopsProfiler`` and calflops: patched ``torch.nn.functional`` and tensor methods, forward only (their
  training figure is forward x 3: backward assumed 2x the forward);
- fvcore ``FlopCountAnalysis``: a JIT trace of the forward, counting multiply-adds (shown x2: FLOPs).

FLOPs are a multiply-add = 2 everywhere. Per class: matmul (linear, mm, bmm, matmul, einsum, grouped GEMMs),
attention (fused SDPA), conv, norm, other (softmax, pointwise, embedding, loss, ...). A tool that is not installed is
reported as such; this script installs nothing.

    python benchmarks/count_vs_tools.py [--write] [--models gpt2,llama,...]
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import importlib.metadata as md
import io
import logging
import os
import platform
import sys
import time
import warnings
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

import tscope_callbacks as ts

sys.path.insert(0, str(Path(__file__).parent))
from common import publish

CLASSES = ("matmul", "attention", "conv", "norm", "other")
TOOLS = ("tscope", "FlopCounterMode", "DeepSpeed", "calflops", "fvcore")
B, L = 2, 32  #: batch and sequence length of every text model; ViT: 2 images of 3x32x32


# ---------------- models (tiny configs, random weights) ----------------
def _models() -> dict[str, Callable[[], tuple[nn.Module, dict[str, torch.Tensor]]]]:
    import transformers as tf

    ids = lambda: torch.randint(0, 1000, (B, L))  # noqa: E731
    common = dict(vocab_size=1000, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                  num_attention_heads=4)

    def gpt2():
        cfg = tf.GPT2Config(n_layer=2, n_embd=128, n_head=4, vocab_size=1000, n_positions=64, attn_pdrop=0.0,
                            resid_pdrop=0.0, embd_pdrop=0.0, bos_token_id=0, eos_token_id=0)
        return tf.GPT2LMHeadModel(cfg), {"input_ids": ids()}

    def llama():
        cfg = tf.LlamaConfig(**common, num_key_value_heads=2, max_position_embeddings=64)
        return tf.LlamaForCausalLM(cfg), {"input_ids": ids()}

    def bert():
        cfg = tf.BertConfig(**common, max_position_embeddings=64, hidden_dropout_prob=0.0,
                            attention_probs_dropout_prob=0.0)
        return tf.BertModel(cfg), {"input_ids": ids()}

    def t5():
        cfg = tf.T5Config(vocab_size=1000, d_model=128, d_kv=32, d_ff=256, num_layers=2, num_heads=4,
                          dropout_rate=0.0)
        return tf.T5ForConditionalGeneration(cfg), {"input_ids": ids(), "decoder_input_ids": ids()}

    def vit():
        cfg = tf.ViTConfig(image_size=32, patch_size=8, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                           num_attention_heads=4, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
        return tf.ViTModel(cfg, add_pooling_layer=False), {"pixel_values": torch.randn(B, 3, 32, 32)}

    def mixtral():
        cfg = tf.MixtralConfig(**common, num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2,
                               max_position_embeddings=64)
        return tf.MixtralForCausalLM(cfg), {"input_ids": ids()}

    return {"gpt2": gpt2, "llama": llama, "bert": bert, "t5": t5, "vit": vit, "mixtral": mixtral}


class Positional(nn.Module):
    """The model with positional tensor inputs and one tensor output (fvcore's JIT trace needs both)."""

    def __init__(self, model: nn.Module, names: list[str]) -> None:
        super().__init__()
        self.model = model
        self.names = names

    def forward(self, *xs: torch.Tensor) -> torch.Tensor:
        out = self.model(**dict(zip(self.names, xs)))
        return out[0]


# ---------------- op classes ----------------
_MATMUL = ("linear", "mm", "bmm", "matmul", "einsum", "addmm", "baddbmm", "addbmm", "grouped_mm", "__matmul__",
           "_grouped_mm", "mv", "dot")


def op_class(name: str) -> str:
    """The class of an op, from its name in any of the tools (``aten.addmm``, ``linear``, ``aten::bmm``)."""
    n = name.split("::")[-1].split(".")[-1] if name.startswith("aten") else name
    n = n.split(".")[0] if "." in n and not name.startswith("aten.") else n
    if "attention" in n or "scaled_dot_product" in n:
        return "attention"
    if "conv" in n:
        return "conv"
    if "norm" in n:
        return "norm"
    if n in _MATMUL or n.lstrip("_") in _MATMUL:
        return "matmul"
    return "other"


def _classes(counts: dict[str, int]) -> dict[str, int]:
    out = dict.fromkeys(CLASSES, 0)
    for name, f in counts.items():
        out[op_class(name)] += int(f)
    return out


_TS_CLASS = {"matmul": "matmul", "attention": "attention", "conv": "conv", "norm": "norm"}


# ---------------- the tools ----------------
def _fresh(build: Callable) -> tuple[nn.Module, list[str], tuple[torch.Tensor, ...]]:
    torch.manual_seed(0)
    model, kw = build()
    model.train()
    return Positional(model, list(kw)), list(kw), tuple(kw.values())


def run_tscope(build: Callable) -> dict[str, Any]:
    m, _, xs = _fresh(build)
    with ts.profile(m) as p:
        m(*xs).float().sum().backward()
    res: dict[str, Any] = {}
    for phase in ("forward", "backward"):
        c: Counter = Counter()
        uncounted = set()
        for r in p.ops:
            if r.phase == phase:
                c[_TS_CLASS.get(r.category, "other")] += r.flops
                if not r.counted:
                    uncounted.add(r.op)
        res[phase] = {k: c.get(k, 0) for k in CLASSES}
        res[phase + "_uncounted"] = sorted(uncounted)
    res["ops"] = sorted({r.op for r in p.ops if r.flops})
    return res


def run_flop_counter(build: Callable) -> dict[str, Any]:
    from torch.utils.flop_counter import FlopCounterMode

    m, _, xs = _fresh(build)
    with FlopCounterMode(display=False) as fwd:
        loss = m(*xs).float().sum()
    with FlopCounterMode(display=False) as bwd:
        loss.backward()
    op = lambda mode: {str(k): v for k, v in mode.get_flop_counts().get("Global", {}).items()}  # noqa: E731
    return {"forward": _classes(op(fwd)), "backward": _classes(op(bwd)), "ops": sorted(op(fwd) | op(bwd))}


class _Recording(list):
    """A module's list of (function name, flops) in DeepSpeed's / calflops' profiler that also tallies them."""

    tally: Counter

    def append(self, item: Any) -> None:
        super().append(item)
        try:
            self.tally[_fn_name(item[0])] += int(item[1])
        except (TypeError, ValueError, IndexError):
            pass


def _fn_name(key: Any) -> str:
    """The patched function's name: these profilers key by ``func.__str__`` (a method-wrapper) or a name."""
    owner = getattr(key, "__self__", None)
    return str(getattr(owner, "__name__", None) or getattr(key, "__name__", None) or key)


class _Stack(list):
    """The profiler's stack of per-module lists (``module_flop_count``): every list pushed records into ``tally``."""

    def __init__(self, tally: Counter) -> None:
        super().__init__()
        self.tally = tally

    def append(self, item: Any) -> None:
        rec = _Recording(item)
        rec.tally = self.tally
        super().append(rec)


def run_deepspeed(build: Callable) -> dict[str, Any]:
    from deepspeed.profiling.flops_profiler import profiler as dsp

    m, _, xs = _fresh(build)
    tally: Counter = Counter()
    dsp.module_flop_count = _Stack(tally)
    prof = dsp.FlopsProfiler(m)
    prof.start_profile()
    try:
        m(*xs)
        total = int(prof.get_total_flops())
    finally:
        prof.stop_profile()
        prof.end_profile()
    cls = _classes(tally)
    cls["other"] += total - sum(cls.values())  # modules DeepSpeed counts by a module hook (none here)
    return {"forward": cls, "backward": None, "ops": sorted(tally)}


def run_calflops(build: Callable) -> dict[str, Any]:
    from calflops import calculate_flops
    from calflops import calculate_pipline as cp

    m, _, xs = _fresh(build)
    tally: Counter = Counter()
    cp.module_flop_count = _Stack(tally)
    with contextlib.redirect_stdout(io.StringIO()):
        flops, _, _ = calculate_flops(m, args=list(xs), include_backPropagation=False, print_results=False,
                                      print_detailed=False, output_as_string=False)
    cls = _classes(tally)
    cls["other"] += int(flops) - sum(cls.values())
    return {"forward": cls, "backward": None, "ops": sorted(tally)}


def run_fvcore(build: Callable) -> dict[str, Any]:
    from fvcore.nn import FlopCountAnalysis

    m, _, xs = _fresh(build)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        a = FlopCountAnalysis(m, xs)
        a.unsupported_ops_warnings(False).uncalled_modules_warnings(False).tracer_warnings("none")
        by = {k: 2 * v for k, v in a.by_operator().items()}  # multiply-adds -> FLOPs
        unsupported = dict(a.unsupported_ops())
    return {"forward": _classes(by), "backward": None, "ops": sorted(by), "unsupported": unsupported}


RUNNERS = {"tscope": run_tscope, "FlopCounterMode": run_flop_counter, "DeepSpeed": run_deepspeed,
           "calflops": run_calflops, "fvcore": run_fvcore}
PACKAGES = {"tscope": "tscope-callbacks", "FlopCounterMode": "torch", "DeepSpeed": "deepspeed",
            "calflops": "calflops", "fvcore": "fvcore"}


def _installed(tool: str) -> str | None:
    """The tool's package version, or None when it is not installed (or does not import)."""
    try:
        v = md.version(PACKAGES[tool])
    except md.PackageNotFoundError:
        return None
    mod = {"DeepSpeed": "deepspeed.profiling.flops_profiler", "calflops": "calflops", "fvcore": "fvcore.nn"}.get(tool)
    if mod:
        try:
            with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                __import__(mod)
        except Exception as e:  # installed but unusable here
            return f"not usable ({type(e).__name__})"
    return v


# ---------------- reasons ----------------
def reasons(model: str, res: dict[str, dict[str, Any]]) -> list[str]:
    """Why each tool's forward/backward differs from tscope's, class by class, from what the tools counted."""
    out = []
    t = res["tscope"]
    tf, tb = t["forward"], t["backward"]
    for tool in TOOLS[1:]:
        r = res.get(tool)
        if not isinstance(r, dict):
            continue
        f = r["forward"]
        why = []
        for c in CLASSES:
            if f[c] == tf[c]:
                continue
            why.append(_why(tool, c, f[c], tf[c], r, t, model))
        if r.get("backward") is not None:
            for c in CLASSES:
                if r["backward"][c] != tb[c]:
                    why.append("backward " + _why(tool, c, r["backward"][c], tb[c], r, t, model))
        elif tool != "fvcore":
            why.append(f"backward not counted: assumed 2x the forward ({_fmt(2 * sum(f.values()))} against "
                       f"tscope's measured {_fmt(sum(tb.values()))})")
        else:
            why.append("forward only (a JIT trace of the forward)")
        out.append(f"- **{tool}**: " + ("; ".join(why) if why else "equal to tscope in every class") + ".")
    return out


def _why(tool: str, c: str, got: int, want: int, r: dict, t: dict, model: str) -> str:
    d = f"{c} {got:,} vs {want:,}"
    pruned = " (fvcore's JIT trace drops modules whose output the traced forward does not return: BERT's pooler" \
             ", 65,536 FLOPs, which runs)"
    if c == "attention" and got == 0 and want:
        return d + {
            "FlopCounterMode": " (no formula for `_scaled_dot_product_flash_attention_for_cpu` and its backward: "
                               "what SDPA runs on a CPU)",
            "calflops": " (`F.scaled_dot_product_attention` is not among its patched functions: not counted)",
            "fvcore": " (`aten::scaled_dot_product_attention` has no handle: skipped, listed as unsupported)",
        }.get(tool, "")
    if c == "attention" and got > want and model == "t5":
        return d + " (SDPA by its formula, 3 calls; T5's two self-attentions run SDPA's math path on a CPU (their " \
                   "position bias needs a gradient), which tscope counts as the bmm's that run, in the matmul class;" \
                   " the cross-attention, the CPU flash op, is equal)"
    if c == "attention" and got > want:
        return d + " (SDPA by its formula over the full square: a causal mask's masked half is counted too; tscope " \
                   "counts the attended pairs, (L+1)/2L of the square)"
    if c == "matmul" and model == "mixtral" and got < want:
        return d + " (the experts' grouped GEMMs, `aten._grouped_mm`: " + (
            "no formula)" if tool == "FlopCounterMode" else "no handle: skipped)" if tool == "fvcore"
            else "not a patched function: not counted)")
    if c == "matmul" and model == "t5" and got < want:
        return d + " (T5's self-attention runs SDPA's math path on a CPU, its position bias needing a gradient: " \
                   "tscope and FlopCounterMode count its bmm's; this tool sees SDPA calls, counted in its attention class or not)"
    if c == "matmul" and model == "bert" and tool == "fvcore" and got < want:
        return d + pruned
    if c in ("matmul", "conv") and got > want and tool in ("DeepSpeed", "calflops"):
        return d + " (the bias add counted" + (" once per bias element of `torch.addmm` (HF GPT-2's Conv1D)"
                                               if c == "matmul" else " per output element") + \
            "; tscope takes it as the GEMM's epilogue, as FlopCounterMode does)"
    if c == "conv" and tool == "FlopCounterMode" and got < want:
        return d + " (tscope also counts convolution_backward's bias gradient, a sum over the output)"
    if c == "norm":
        if tool == "FlopCounterMode":
            return d + " (counts matmul, conv and attention ops only)"
        per = "10 (5 multiply-adds)" if tool == "fvcore" else "5"
        return d + f" (layer_norm at {per} FLOPs per element; tscope 6: statistics 4, weight 1, bias 1)"
    if c == "other":
        if tool == "FlopCounterMode":
            return d + " (counts matmul, conv and attention ops only: softmax, pointwise, embedding, loss are 0)"
        if tool == "fvcore":
            unsup = {k: v for k, v in r.get("unsupported", {}).items() if "mm" not in k and "attention" not in k}
            return d + f" (no handle for elementwise ops: {len(unsup)} op kinds skipped, e.g. " \
                       f"{', '.join(sorted(unsup)[:4])})"
        return d + " (only patched functions count: F.* activations, softmax, torch.add/torch.mul; Tensor " \
                   "operators (x + y, x * y), in-place ops, reductions, rsqrt/pow (RMS norm), rotary sin/cos, casts, " \
                   "and functions a model bound before the patch (HF's GELUActivation keeps F.gelu) are not seen)"
    return d


# ---------------- table ----------------
def _fmt(n: int | None) -> str:
    return "—" if n is None else f"{n / 1e6:,.2f}M"


def _total(cls: dict[str, int] | None) -> int | None:
    return None if cls is None else sum(cls.values())


def _step(r: Any) -> int | None:
    """Forward + backward FLOPs a tool reports for the step (its assumed 2x backward where it measures none; the
    forward alone for fvcore)."""
    if not isinstance(r, dict):
        return None
    fwd = _total(r["forward"]) or 0
    bwd = _total(r["backward"])
    return fwd + (bwd if bwd is not None else 0 if r.get("unsupported") is not None else 2 * fwd)


def headline(results: dict[str, dict[str, Any]]) -> str:
    """Each tool's step count as a share of tscope's, over the models (Mixtral apart: its grouped experts)."""
    parts = []
    for tool in TOOLS[1:]:
        if tool == "fvcore":  # forward only: against tscope's forward
            shares = {m: _total(res[tool]["forward"]) / _total(res["tscope"]["forward"]) for m, res in results.items()
                      if isinstance(res.get(tool), dict) and _total(res["tscope"]["forward"])}
        else:
            shares = {m: _step(res.get(tool)) / _step(res["tscope"]) for m, res in results.items()
                      if _step(res.get(tool)) is not None and _step(res["tscope"])}
        if not shares:
            parts.append(f"{tool}: not run")
            continue
        dense = [v for m, v in shares.items() if m != "mixtral"]
        txt = f"{tool} {min(dense):.1%}–{max(dense):.1%}" if dense else tool
        if "mixtral" in shares:
            txt += f" (Mixtral {shares['mixtral']:.1%})"
        parts.append(txt)
    return ("**Headline.** The step (forward + backward) each tool counts, as a share of tscope's (fvcore: the "
            "forward, against tscope's forward): " + "; ".join(parts) + ". Every tool equals tscope on the linear "
            "layers' GEMMs, but for bias adds (DeepSpeed, calflops) and BERT's pooler (fvcore's trace drops it); the "
            "differences are attention on a CPU (FlopCounterMode, calflops and fvcore count "
            "0 for SDPA's CPU flash op; DeepSpeed counts the full square of a causal mask), MoE experts' grouped "
            "GEMMs (only tscope counts them), the non-GEMM ops, and the backward (measured by tscope and "
            "FlopCounterMode, assumed 2x by DeepSpeed and calflops).")


def table(results: dict[str, dict[str, Any]], versions: dict[str, str | None], secs: float) -> str:
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    cpu = platform.processor() or platform.machine()
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    lines = [
        "# FLOP counts: tscope beside FlopCounterMode, DeepSpeed, calflops and fvcore",
        "",
        f"Run {now} on {cpu} ({os.cpu_count()} cores, {platform.system()}), Python {platform.python_version()}, "
        f"torch {torch.__version__}, transformers {md.version('transformers')}; {secs:.0f} s.",
        "Tools: " + ", ".join(f"{t} {v}" if v and not v.startswith("not") else f"{t}: {v or 'not installed'}"
                               for t, v in versions.items()) + ".",
        "",
        f"HF models from tiny configs (2 layers, hidden 128, 4 heads, vocab 1,000; text batch {B} x {L} tokens, "
        f"ViT {B} images 3x32x32), SDPA attention (HF's default), train mode, one forward and one backward from "
        "the sum of the first output, on this CPU. FLOPs in millions (a multiply-add = 2; fvcore's multiply-adds "
        "x2). Backward: measured by tscope and FlopCounterMode; DeepSpeed and calflops assume 2x the forward "
        "(shown in italics); fvcore counts the forward only.",
        "",
        "| model | " + " | ".join(f"{t} fwd | {t} bwd" if t != "fvcore" else "fvcore fwd" for t in TOOLS) + " |",
        "|---|" + "---:|" * (2 * len(TOOLS) - 1),
    ]
    for model, res in results.items():
        row = [model]
        for t in TOOLS:
            r = res.get(t)
            if not isinstance(r, dict):
                row += [str(r)] if t == "fvcore" else [str(r), ""]
                continue
            fwd = _total(r["forward"])
            row.append(_fmt(fwd))
            if t != "fvcore":
                row.append(_fmt(_total(r["backward"])) if r["backward"] is not None else f"*{_fmt(2 * fwd)}*")
        lines.append("| " + " | ".join(row) + " |")
    lines += ["", headline(results), "", "## Per class (FLOPs; forward, and tscope's and FlopCounterMode's backward)",
              ""]
    for model, res in results.items():
        lines += [f"### {model}", "", "| class | " + " | ".join(
            [f"{t} fwd" for t in TOOLS] + ["tscope bwd", "FlopCounterMode bwd"]) + " |",
            "|---|" + "---:|" * (len(TOOLS) + 2)]
        for c in CLASSES:
            row = [c]
            for t in TOOLS:
                r = res.get(t)
                row.append(f"{r['forward'][c]:,}" if isinstance(r, dict) else "n/a")
            for t in ("tscope", "FlopCounterMode"):
                r = res.get(t)
                row.append(f"{r['backward'][c]:,}" if isinstance(r, dict) and r["backward"] else "n/a")
            lines.append("| " + " | ".join(row) + " |")
        unc = sorted(set(res["tscope"].get("forward_uncounted", [])) | set(res["tscope"].get("backward_uncounted",
                                                                                             [])))
        lines += ["", "Why they differ from tscope:", ""] + reasons(model, res)
        if unc:
            lines.append(f"- tscope: ops without a formula (counted=False, reported as coverage): {', '.join(unc)}.")
        lines.append("")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--write", action="store_true", help="write benchmarks/results/count_vs_tools.md")
    ap.add_argument("--models", default="gpt2,llama,bert,t5,vit,mixtral")
    args = ap.parse_args()
    logging.getLogger("DeepSpeed").setLevel(logging.ERROR)
    versions = {t: _installed(t) for t in TOOLS}
    builders = _models()
    t0 = time.perf_counter()
    results: dict[str, dict[str, Any]] = {}
    for name in args.models.split(","):
        build = builders[name]
        res: dict[str, Any] = {}
        for tool in TOOLS:
            v = versions[tool]
            if v is None or v.startswith("not"):
                res[tool] = v or "not installed"
                continue
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    res[tool] = RUNNERS[tool](build)
            except Exception as e:
                res[tool] = f"failed: {type(e).__name__}: {str(e).splitlines()[0][:80] if str(e) else ''}"
        results[name] = res
        print(name, {t: (_total(r["forward"]), _total(r["backward"])) if isinstance(r, dict) else r
                     for t, r in res.items()}, flush=True)
    text = table(results, versions, time.perf_counter() - t0)
    publish(text, args, "count_vs_tools")
    return 0


if __name__ == "__main__":
    sys.exit(main())
