"""Opportunities: what to change in the model, the training code or its settings, and the time it is predicted to
save. Every opportunity names a change and a predicted saving; a row below its roof for which no change is known is
not one (:func:`below_roof` lists those, with what the numbers say about them).

Each finding names the cause (from the numbers), the fix (what to change in the user's code) and the predicted
saving per step, and says how it was predicted (``analysis.finding.PREDICTED_BY``): by re-estimating the changed ops
with the device's kernel model (the padded GEMM shape, the TF32 roof), by the bytes a fused kernel no longer moves,
by the elements a change skips. Where ``benchmarks/advice_effect.py`` applied that kind of change on the same kind
of device, the opportunity carries the measured / predicted ratio. Findings:

- ``misaligned`` (GPU kernel model): a GEMM operand's leading dimension is not 16-byte aligned (a multiple of 8
  elements in 16-bit types, 4 in fp32), which sends cuBLAS down a slow path; the same GEMMs re-estimated with it
  padded to the next multiple of 64 (N=50257 -> 50304);
- ``small_m`` (GPU kernel model): GEMMs with few rows (batch x sequence) cannot fill the GPU; re-estimated at
  M=1024 rows per the same work;
- ``fp32_matmul``: fp32 GEMMs on a device with TF32 tensor cores, TF32 off; re-estimated at TF32;
- ``fusion``: runs of memory-bound ops (pointwise, norms, softmax, the optimizer's per-tensor update) writing
  intermediates the next op reads back; one kernel moving the run's first input and last output (skipped for
  compiled modules and for the ops of a `torch.compile`d function, which the capture runs eagerly: Inductor fuses
  them already); by chain: optimizer, loss (not on CPU: see below), GELU, RMSNorm, rotary embedding, SwiGLU, other;
- ``launch`` (CUDA, step): the device idles between short kernels in the unprofiled step: launch overhead; CUDA
  graphs (``torch.compile(mode="reduce-overhead")``);
- ``input``, ``loop`` (step): the step monitor's findings (``callbacks.monitor``): the wait for each batch with the
  DataLoader settings that would help, and the loop's own work;
- by layer type and device (``analysis.layer_advice``): ``channels_last``, ``cudnn_benchmark``,
  ``conv_channels``, ``bn_fusion``, ``bn_fold``, ``pool_order``, ``pool_indices``, ``rnn_cudnn``, ``rnn_hidden``,
  ``embedding_sparse``.

Not on CPU: the loss chain. A compiled cross-entropy against the eager one (forward + backward, one thread, static
shapes; ``benchmarks/advice_effect.py``) saves the page faults of the eager loss's fresh logit-sized tensors where the
process takes them (glibc returns large blocks to the system: 12 and 49 ms, half the eager loss, over 700 x 10,000 and
256 x 50,257 fp32 logits) and about nothing or less where it does not (glibc keeping freed memory, as jemalloc or
tcmalloc do: +1.8 and +2.3 ms of 14 and 25 ms; -0.3 ms over 2.1 and 8.4 MB; the LSTM's 28 MB loss -2.0 ms and the
demo's 2 MB loss -0.6 ms in the closed loop, with no page faults in those processes). The bytes fusion saves predict
neither.

Time that no rule explains (a slow kernel for its shape, a 16-bit GEMM on CUDA cores, ops without a FLOP formula)
is what :func:`below_roof` says about the rows, not an opportunity.
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from tscope_callbacks.analysis.basis import step_time_of, time_of
from tscope_callbacks.analysis.diagnose import explain
from tscope_callbacks.analysis.estimate import MEMORY_BOUND, gemm_dims
from tscope_callbacks.analysis.finding import Finding, measured_effect, ms, rows_of
from tscope_callbacks.analysis.fmt import bytes_text, pct_text, rate_text, sig, time_text
from tscope_callbacks.analysis.fmt import div as _div
from tscope_callbacks.analysis.layer_advice import Context, compiled_function_ops, layer_findings, step_findings
from tscope_callbacks.analysis.noise import Noise
from tscope_callbacks.analysis.report import Opportunity, Row
from tscope_callbacks.analysis.rows import OpRoof
from tscope_callbacks.devices.efficiency import ITEMSIZE

if TYPE_CHECKING:
    from tscope_callbacks.analysis.roofline import RooflineAnalysis

__all__ = ["opportunities", "below_roof", "KINDS", "BELOW_RATIO", "LAUNCH_BOUND_S", "LAUNCH_IDLE_SHARE", "GRAPH_GAP_S",
           "MIN_SAVING_SHARE", "PREEMPT_S", "COMPILED_LAYER_S", "LAUNCH_BOUND_SHARE", "KERNEL_TIME_KINDS", "pad_to"]

#: every kind of opportunity (each names a change)
KINDS = ("misaligned", "small_m", "fp32_matmul", "fusion", "launch", "input", "loop", "channels_last",
         "cudnn_benchmark", "conv_channels", "bn_fusion", "bn_fold", "pool_order", "pool_indices", "rnn_cudnn", "rnn_hidden",
         "embedding_sparse")
LAUNCH_BOUND_S = 10e-6  #: kernels shorter than this are dominated by launch/dispatch
LAUNCH_IDLE_SHARE = 0.1  #: the launch finding needs the device idle at least this share of the unprofiled step
GRAPH_GAP_S = 1e-6  #: the gap a CUDA graph still leaves between two of its kernels (assumed, not yet measured)
MIN_SAVING_SHARE = 0.005  #: findings saving less than this share of the step are not reported
BELOW_RATIO = 1.5  #: a row taking at least this x its expected time is below its roof (``below_roof``)
#: CPU ops at least this long are stretched by a busy host in every profiled step (about one scheduler time slice)
PREEMPT_S = 1e-3
SMALL_M = 128
#: what a layer compiled on its own costs a training step on a GPU (forward + backward: its guards, the graph
#: boundaries around it, its own launches): ``torch.compile`` on each of 12 small layers one by one (the LayerNorms,
#: the QKV and first MLP Linear of a 12-layer d=768 transformer, GPT-2-124M's MLP output projection) measured 2.4 to
#: 9.2 ms a step slower on an H200 where the fusion saving predicted 0.39-1.6 ms faster (``benchmarks/advice_effect.py
#: --device cuda``): 0.33-0.80 ms a layer. The per-layer advice of the "other" chains on CUDA is net of the largest,
#: and only where that leaves a saving
COMPILED_LAYER_S = 0.8e-3
#: a CUDA step whose device idles at least this share of it (the ``launch`` finding's idle) waits for the host: a
#: kernel-time saving does not shorten it. On an H200 the three CNNs of the closed loop (device idle about 43-85% of
#: steps of 1.1-4.6 ms) measured channels-last -0.30 to +0.02 ms for 0.01-0.17 ms predicted, cuDNN autotuning on the
#: inference CNN 0.005 and 0.012 ms for 0.07 ms; the device-bound transformers' kernel savings (GELU, vocabulary
#: padding) measured 1.0x
LAUNCH_BOUND_SHARE = 0.3
#: findings whose saving is kernel time only (no kernel launch goes): held back on a launch-bound CUDA step, named in
#: the ``launch`` finding instead. Not BatchNorm folding, pool order, fusion, the fused optimizer or cuDNN's RNN, which
#: also take launches away (BatchNorm folding measured 7.5x its kernel-time prediction on the launch-bound CNN)
KERNEL_TIME_KINDS = frozenset({"cudnn_benchmark", "channels_last", "conv_channels", "fp32_matmul", "misaligned",
                               "small_m", "pool_indices", "bn_fusion", "rnn_hidden"})


def pad_to(x: int, multiple: int = 64) -> int:
    return -(-x // multiple) * multiple


def _time(o: OpRoof) -> float:
    """An op's time (``analysis.basis.time_of``), the op's own basis: measured where it was timed."""
    return time_of(o, o.measured_s is not None)


def _took(ops: Iterable[OpRoof]) -> str:
    """"took" when every op was timed, else "take (expected)": an estimate's times are the expected ones."""
    return "took" if all(o.measured_s is not None for o in ops) else "take (expected)"


def _gemm_s(model: Any, dims: tuple[int, int, int], precision: str) -> float:
    return model.gemm_s(*dims, precision) if model is not None else 0.0


def _misaligned(layer: str, ops: list[OpRoof], model: Any) -> list[Finding]:
    gemms = [(o, d) for o in ops if (d := gemm_dims(o.record)) is not None and o.record.category == "matmul"]
    if not gemms or model is None:
        return []
    bad: dict[int, list] = {}
    for o, (m, n, k) in gemms:
        item = ITEMSIZE.get(o.roof_precision, 2)
        lds = o.record.leading_dims  # as stored (a transposed operand's is its logical M); else row-major: N, K
        for v in dict.fromkeys(lds if lds else (n, k)):
            if (v * item) % 16 and v in (m, n, k):
                bad.setdefault(v, []).append((o, (m, n, k)))
    out = []
    for v, hits in bad.items():
        padded = pad_to(v)
        affected = [(o, d) for o, d in gemms if v in d]  # forward and backward GEMMs sharing the dimension
        now = sum(_time(o) for o, _ in affected)
        after = sum(_gemm_s(model, tuple(padded if x == v else x for x in d), o.roof_precision) for o, d in affected)
        o0, (m, n, k) = next(((o, d) for o, d in hits if o.record.phase == "forward"), hits[0])
        tf = _div(o0.record.flops, _time(o0))
        rate = f" at {rate_text(tf)}" if tf else ""
        item = ITEMSIZE.get(o0.roof_precision, 2)
        out.append(Finding(
            "misaligned", now - after,
            f"dimension {v} (in its {o0.record.phase} GEMM {m}x{k} @ {k}x{n}) is not a multiple of {16 // item} "
            f"({o0.roof_precision}: 16-byte rows), so the GEMM library takes a slow path{rate}",
            f"pad {v} to {padded}: for a vocabulary, the model's `vocab_size` (Hugging Face: "
            f"`model.resize_token_embeddings({padded})`); for hidden sizes, choose a multiple of 64",
            "kernel_time", f"its {len(affected)} GEMMs {_took(o for o, _ in affected)} {ms(now)}; at {padded} the "
            "device's GEMM tables expect "
            f"{ms(after)}", rows_of(o for o, _ in affected), {"dim": v, "padded": padded, "n_gemms": len(affected)}))
    return out


def _small_m(ops: list[OpRoof], model: Any) -> list[Finding]:
    small = [(o, d) for o in ops if o.record.category == "matmul" and (d := gemm_dims(o.record)) is not None
             and d[0] < SMALL_M and d[1] >= SMALL_M and d[2] >= SMALL_M]
    if not small or model is None:
        return []
    now = sum(_time(o) for o, _ in small)
    after = sum(_gemm_s(model, (1024, n, k), o.roof_precision) * m / 1024 for o, (m, n, k) in small)
    m = min(d[0] for _, d in small)
    return [Finding("small_m", now - after,
                    f"{len(small)} GEMMs have only {m} rows (batch x sequence): too few to fill the GPU",
                    "raise the batch (or micro-batch) size, or concatenate requests, so each GEMM has >= 1024 rows",
                    "kernel_time", f"they {_took(o for o, _ in small)} {ms(now)}; the same work in GEMMs of 1024 rows, "
                    "from the device's GEMM "
                    f"tables: {ms(after)}", rows_of(o for o, _ in small), {"m": m})]


def _fp32(ops: list[OpRoof], model: Any, tf32_peak: float) -> list[Finding]:
    mm = [(o, d) for o in ops if o.record.category == "matmul" and o.roof_precision == "fp32"
          and (d := gemm_dims(o.record)) is not None]
    if not mm or not tf32_peak:
        return []
    now = sum(_time(o) for o, _ in mm)
    after = sum(_gemm_s(model, d, "tf32") if model is not None else max(o.flops / tf32_peak, o.bytes / o.bandwidth)
                for o, d in mm)
    return [Finding("fp32_matmul", now - after,
                    f"{len(mm)} fp32 GEMMs run on CUDA cores although the GPU has TF32 tensor cores (TF32 is off)",
                    "`torch.set_float32_matmul_precision('high')` (TF32), or train under bf16 autocast "
                    "(Lightning: `precision='bf16-mixed'`)", "kernel_time",
                    f"they {_took(o for o, _ in mm)} {ms(now)}; at TF32 "
                    f"{'from the GEMM tables' if model is not None else 'on its roof'}: "
                    f"{ms(after)}", rows_of(o for o, _ in mm), {"n_gemms": len(mm)})]


def _runs(ops: Iterable[OpRoof]) -> list[list[OpRoof]]:
    """Maximal runs of consecutive (by op index) memory-bound ops of one phase."""
    runs: list[list[OpRoof]] = []
    for o in sorted(ops, key=lambda o: o.record.index):
        r = o.record
        if r.category not in MEMORY_BOUND or r.category in ("optimizer", "embedding") or not r.bytes:
            continue
        if runs and runs[-1][-1].record.phase == r.phase and r.index - runs[-1][-1].record.index <= 2:
            runs[-1].append(o)
        else:
            runs.append([o])
    return [run for run in runs if len(run) >= 2]


_FIXES = {
    "optimizer": ("the optimizer's fused implementation: `{opt}(params, ..., fused=True)` (one kernel per parameter "
                  "group instead of one per operation per tensor{foreach})"),
    "loss": ("a fused cross-entropy that never materializes the fp32 logits (e.g. Liger Kernel's "
             "`LigerFusedLinearCrossEntropyLoss`, or a chunked loss), or `torch.compile` the loss"),
    "gelu": ("the tanh-approximate GELU written out as pow/tanh/mul/add runs as separate kernels: use "
             "`torch.nn.functional.gelu(x, approximate=\"tanh\")` (one kernel each way; Hugging Face: "
             "`activation_function=\"gelu_pytorch_tanh\"` in the config), or `torch.compile`"),
    "rmsnorm": ("the RMSNorm written out as pow/mean/rsqrt/mul runs as separate kernels, forward and backward: use a "
                "fused RMSNorm (`torch.nn.RMSNorm`, Liger Kernel's `LigerRMSNorm`; for Hugging Face Llama, Mistral, "
                "Qwen, ...: `liger_kernel.transformers.apply_liger_kernel_to_llama()` and its siblings), or "
                "`torch.compile`"),
    "rope": ("the rotary embedding written out as rotate_half (neg/cat/mul/add) runs as separate kernels: use a fused "
             "RoPE (Liger Kernel's `liger_rotary_pos_emb`; Hugging Face models: "
             "`apply_liger_kernel_to_<model>(rope=True)`), or `torch.compile`"),
    "swiglu": ("the SwiGLU MLP's SiLU and gating product run as separate kernels: use a fused SwiGLU (Liger Kernel's "
               "`LigerSwiGLUMLP`; Hugging Face models: `apply_liger_kernel_to_<model>(swiglu=True)`), or "
               "`torch.compile`"),
    "other": ("`torch.compile` this layer (Inductor fuses element-wise chains into one kernel), or use fused kernels "
              "(fused LayerNorm, fused bias + activation, fused dropout + residual add)"),
}
_WHAT = {"optimizer": " of the optimizer update", "loss": " of the loss", "gelu": " of the GELU",
         "rmsnorm": " of the RMSNorm", "rope": " of the rotary embedding", "swiglu": " of the SwiGLU"}


def _is_rnn(layer_type: str) -> bool:
    return layer_type.lower() in ("lstm", "gru", "rnn", "lstmcell", "grucell", "rnncell")


def _names(ops: Iterable[OpRoof]) -> set[str]:
    return {o.record.op.split(".")[1] if "." in o.record.op else o.record.op for o in ops}


def _chain_kind(run: list[OpRoof], layer_type: str = "") -> str:
    names = _names(run)
    if run[0].record.phase == "optimizer":
        return "optimizer"
    if names & {"_log_softmax", "log_softmax", "nll_loss_forward", "_log_softmax_backward_data"} or any(
            o.record.category == "loss" for o in run):
        return "loss"
    if {"tanh", "pow"} <= names or {"tanh_backward", "pow"} <= names:
        return "gelu"
    if "rmsnorm" in layer_type.lower() or {"rsqrt", "mean", "pow"} <= names:
        return "rmsnorm"
    if "neg" in names and names & {"cat", "slice_backward"} and not _is_rnn(layer_type):
        return "rope"
    if names & {"silu", "silu_backward"}:
        return "swiglu"
    return "other"


def _optimizer(runs: list[list[OpRoof]]) -> tuple[str, int]:
    """(the optimizer family, the bytes per parameter byte its fused kernel moves) from the update's ops: Adam-family
    (``addcdiv``, ``lerp``): params, grads and both moments read, params and moments written = 7x the parameter
    bytes; SGD with momentum (``mul_``/``add_`` on a buffer): 5x; plain SGD: 3x."""
    names = {n.rstrip("_") for n in _names(o for run in runs for o in run)}
    if names & {"addcdiv", "lerp", "sqrt", "addcmul"}:
        return "torch.optim.AdamW", 7
    return "torch.optim.SGD", 5 if "mul" in names else 3


def _fused_after(now: float, before_b: int, fused_b: int, roof_s: float) -> float:
    """A fused kernel's time: its bytes at the rate the unfused ops ran (they reached ``before_b / now``), and never
    under its roof (``roof_s``: the kernel model's, or the bandwidth's)."""
    return max(roof_s, now * fused_b / before_b if before_b else 0.0)


def _fusion(ops: list[OpRoof], model: Any, compiled: bool, param_bytes: int = 0, layer_type: str = "",
            cuda: bool = False, cpu: bool = False) -> list[Finding]:
    """One finding per kind of chain (optimizer update, loss, written-out GELU, RMSNorm, rotary embedding, SwiGLU,
    other), each with its own fix."""
    if compiled:
        return []
    kinds: dict[str, list[list[OpRoof]]] = {}
    for run in _runs(ops):
        kinds.setdefault(_chain_kind(run, layer_type), []).append(run)
    out = []
    for kind, runs in kinds.items():
        flat = [o for run in runs for o in run]
        now = sum(_time(o) for o in flat)
        before_b = sum(o.bytes for o in flat)
        ends = [run[0].record.bytes_read + run[-1].record.bytes_written for run in runs]
        fix = _FIXES[kind]
        fwd = [run for run in runs if run[0].record.phase == "forward"]
        if kind == "loss" and cpu:
            # on CPU a compiled loss saves the eager loss's page faults when the process has them, and about nothing
            # or less otherwise (module docstring): the bytes it no longer moves do not predict it
            continue
        if kind == "loss" and fwd and len(fwd) < len(runs):
            # a fused loss keeps no probabilities: its backward reads the logits again to recompute them
            ends.append(fwd[0][0].record.bytes_read)
        if kind == "optimizer":
            opt, per = _optimizer(runs)
            if param_bytes:
                ends = [min(before_b, per * param_bytes)]
            fix = fix.format(opt=opt, foreach="; on a GPU `foreach=True` also batches the tensors" if cuda else "")
        fused_b = sum(ends)
        bw = runs[0][0].bandwidth
        roof = sum(model.memory_s("pointwise", b) if model is not None else b / bw for b in ends)
        after = _fused_after(now, before_b, fused_b, roof)
        n = len(flat)
        out.append(Finding(
            "fusion", now - after,
            f"{n} memory-bound ops{_WHAT.get(kind, '')} in {len(runs)} chain(s) move {bytes_text(before_b)}, each "
            f"writing what the next reads back; fused, about {bytes_text(fused_b)}", fix, "fused_bytes",
            f"the {n} ops {_took(flat)} {ms(now)} for {bytes_text(before_b)}; {bytes_text(fused_b)} at their rate: "
            f"{ms(after)}", rows_of(flat),
            {"ops": n, "mb_before": before_b / 1e6, "mb_after": fused_b / 1e6, "chain": kind,
             "phases": sorted({run[0].record.phase for run in runs})}))
    return out


def _swiglu(by_layer: dict[str, list[OpRoof]], model: Any, compiled: bool) -> tuple[dict[str, list[Finding]],
                                                                                  set[int]]:
    """SwiGLU MLPs written out (``down(silu(gate(x)) * up(x))``, HF's ``act_fn`` a child module): the SiLU, the gating
    product and their backward are memory-bound kernels separated by the GEMMs, so no chain of consecutive ops shows
    them. Per MLP layer (the gating product's): forward silu + mul move 5 activations (fused: gate and up read, the
    product written: 3); backward silu_backward + two muls move 9 (fused: the product's gradient, gate and up read,
    their gradients written: 5). Returns the findings per layer and the op indices they claim (kept out of the
    chain findings, which would count them again)."""
    if compiled:
        return {}, set()
    out: dict[str, list[Finding]] = {}
    claimed: set[int] = set()
    children: dict[str, list[str]] = {}  #: layer -> its direct children (the root's are not looked at)
    for k in by_layer:
        if "." in k:
            children.setdefault(k.rpartition(".")[0], []).append(k)
    for layer, ops in by_layer.items():
        kids = ops + [o for k in children.get(layer, ()) for o in by_layer[k]]
        found: list[OpRoof] = []
        now, after, before_b, after_b = 0.0, 0.0, 0, 0
        for phase, act, muls_n, before_n, after_n in (("forward", "silu", 1, 5, 3),
                                                      ("backward", "silu_backward", 2, 9, 5)):
            acts = [o for o in kids if o.record.phase == phase and o.record.op == f"aten.{act}"]
            if len(acts) != 1:
                continue
            a = acts[0]
            shape = a.record.output_shapes[:1]
            muls = [o for o in ops if o.record.phase == phase and o.record.op == "aten.mul"
                    and o.record.output_shapes[:1] == shape]
            if len(muls) < muls_n:
                continue
            group = [a, *muls[:muls_n]]
            n = a.record.bytes_written  # one activation
            found += group
            t = sum(_time(o) for o in group)
            roof = model.memory_s("pointwise", after_n * n) if model is not None else after_n * n / a.bandwidth
            now += t
            after += _fused_after(t, before_n * n, after_n * n, roof)
            before_b, after_b = before_b + before_n * n, after_b + after_n * n
        if not found:
            continue
        claimed.update(o.record.index for o in found)
        out[layer] = [Finding(
            "fusion", now - after,
            f"{len(found)} memory-bound ops of the SwiGLU (SiLU, gating product and their backward) move "
            f"{bytes_text(before_b)} between the GEMMs; fused, about {bytes_text(after_b)}", _FIXES["swiglu"],
            "fused_bytes", f"the {len(found)} ops {_took(found)} {ms(now)}; {bytes_text(after_b)} at their rate: "
            f"{ms(after)}",
            rows_of(found), {"ops": len(found), "mb_before": before_b / 1e6, "mb_after": after_b / 1e6,
                             "chain": "swiglu"})]
    return out, claimed


# ---------------- the step ----------------
def _launch(report: RooflineAnalysis, ctx: Context, input_s: float) -> list[Finding]:
    """CUDA: the device idles between short kernels in the unprofiled step (the host cannot launch them as fast as
    they run). CUDA graphs replay the step's kernels with one launch: the idle goes, but for a small gap per kernel.
    Needs the step time of unprofiled steps (a capture's own time is slowed by the capture)."""
    info = report.info
    step, busy = report.measured_step_s, info.device_busy_s
    if not ctx.cuda or not step or not busy or report.step_time_source in (None, "device-busy", "op-time"):
        return []
    cc = info.compiled_capture or {}
    if cc.get("cudagraphs"):
        return []  # already replayed as CUDA graphs
    durations = [float(k[2]) * 1e-9 for k in ctx.kernels if len(k) > 2] or [
        o.measured_s for o in report.op_roofs if o.measured_s and o.record.category != "view"]
    if not durations:
        return []
    idle = step - float(busy) - input_s
    typical = statistics.median(durations)
    if idle < LAUNCH_IDLE_SHARE * step or typical >= LAUNCH_BOUND_S:
        return []
    saving = idle - len(durations) * GRAPH_GAP_S
    return [Finding(
        "launch", saving,
        f"the device is idle {ms(idle)} of the {ms(step)} step ({pct_text(idle / step)}) between {len(durations):,} kernels "
        f"of typically {time_text(typical)}: the host launches them slower than they run",
        "capture the step as a CUDA graph: `torch.compile(model, mode=\"reduce-overhead\")` (or "
        "`torch.cuda.graphs` by hand); fewer, larger ops help too", "idle",
        f"step {ms(step)} - device busy {ms(float(busy))}" + (f" - data wait {ms(input_s)}" if input_s else "")
        + f" = {ms(idle)} idle; a graph keeps about {time_text(GRAPH_GAP_S)} per kernel: {ms(saving)}", (),
        {"kernels": len(durations), "idle_s": idle})]


def _breakdown(report: RooflineAnalysis) -> dict[str, Any]:
    bd = report.info.step_breakdown
    return bd if isinstance(bd, dict) else {}


def _wait_ms(bd: dict[str, Any]) -> float | None:
    """The step monitor's wait for each batch (ms): fetching it and moving it to the device (``parts_ms``), or
    its ``data_wait_ms`` where a breakdown has no parts."""
    parts = bd.get("parts_ms")
    if isinstance(parts, dict):
        got = [parts.get(k) for k in ("fetch", "transfer") if isinstance(parts.get(k), (int, float))]
        return float(sum(got)) if got else None
    wait = bd.get("data_wait_ms")
    return float(wait) if isinstance(wait, (int, float)) else None


def _input(bd: dict[str, Any]) -> list[Finding]:
    """The step monitor's input-bound verdict, with the DataLoader changes it read from the loader."""
    wait = _wait_ms(bd)
    if not bd.get("input_bound") or wait is None or wait <= 0:
        return []
    fixes = [str(f) for f in bd.get("input_fixes") or ()]
    fix = "; ".join(fixes) or ("make the DataLoader keep up: more `num_workers`, a larger `prefetch_factor`, or a "
                               "cheaper `__getitem__`")
    share = bd.get("fetch_share", bd.get("data_wait_share"))
    return [Finding(
        "input", wait / 1e3,
        f"each step waits {time_text(wait / 1e3)} for its batch" + (f" ({pct_text(share)} of the step)" if isinstance(
            share, (int, float)) else "") + ": the step monitor finds the run input-bound", fix, "data_wait",
        f"the wait, {time_text(wait / 1e3)} a step (median over the step monitor's clean steps), goes once loading overlaps "
        "with the step", (), {"data_wait_ms": wait})]


def _loop(bd: dict[str, Any]) -> list[Finding]:
    """The step monitor's loop findings (its measured cost of loggers, callbacks, checkpoints), as it gives them."""
    out = []
    for f in bd.get("loop_findings") or ():
        if not isinstance(f, dict) or not isinstance(f.get("saving_s"), (int, float)) or not f.get("change"):
            continue
        out.append(Finding("loop", float(f["saving_s"]), str(f.get("cause") or "the training loop's own work"),
                           str(f["change"]), "loop", str(f.get("basis") or f"measured by the step monitor: "
                                                                       f"{ms(float(f['saving_s']))} a step"),
                           (), {k: v for k, v in f.items() if k not in ("cause", "change")}))
    return out


def _pattern(layer: str) -> str:
    """Layer path with its repeated-block indices as ``*`` (``transformer.h.3.mlp`` -> ``transformer.h.*.mlp``)."""
    return re.sub(r"(?<=\.)\d+(?=\.|$)", "*", layer) if layer else layer


class _Stretch:
    """How much a busy host stretched the profiled ops' wall times, to scale savings found in op times to the
    unprofiled step they are a share of (a CPU capture: each op's wall time holds the time the host gave to other
    processes; GPU kernel times are not slowed by the host, and a calm host's ops add up to less than the step: no
    scale).

    The scheduler preempts a running thread at the end of its time slice (Linux's EEVDF base slice: 0.75 ms x
    (1 + log2 CPUs, at most 8), 1.5 ms on 2 CPUs). An op shorter than ``PREEMPT_S`` runs whole in some of the
    profiled steps: its time in the least disturbed one is taken (its samples' minimum; the median step's time can
    be a preempted one on a host that busy). An op longer than that is stretched in every step: the ops' remaining
    excess over the unprofiled step is taken out of those, ``k_long = (step - short ops) / long ops``. A finding's
    saving is scaled by its rows' ops' times so corrected over their times (on the CNN of
    ``benchmarks/advice_effect.py`` at load 4-5 on 2 CPUs: max pooling 22-29 ms under the capture, 10.7 ms of thread
    time, in every step; BatchNorm 0.6 ms in most steps, 4.8 ms in a preempted one; the former uniform step / ops
    scale, x0.44, halved BatchNorm folding's prediction). When the short ops alone exceed the step, every op takes the
    uniform step / ops scale."""

    def __init__(self, report: RooflineAnalysis) -> None:
        step, ops = report.measured_step_s, report.op_time_s
        self.step_s, self.ops_s = step or 0.0, ops or 0.0
        self.k = self.k_long = 1.0
        self.split = False
        if (report.info.device != "cpu" or not report.timed or not step or not ops or ops <= step
                or report.step_time_source in (None, "op-time", "device-busy")):
            return
        self.k = self.k_long = step / ops
        short = long_ = 0.0
        for o in report.op_roofs:
            t = o.measured_s
            if t:
                lo = _least(o)
                if lo < PREEMPT_S:
                    short += lo
                else:
                    long_ += t
        if short > 0 and long_ > 0 and step > short:
            self.split, self.k_long = True, min(1.0, (step - short) / long_)

    def scale(self, ops: Iterable[OpRoof]) -> float:
        """The scale of a saving found in ``ops``' times: their corrected times over their times."""
        if self.k >= 1.0:
            return 1.0
        if not self.split:
            return self.k
        tot = fixed = 0.0
        for o in ops:
            t = o.measured_s or 0.0
            if t:
                lo = _least(o)
                tot += t
                fixed += lo if lo < PREEMPT_S else t * self.k_long
        return fixed / tot if tot else self.k

    def text(self, k: float, saving: float) -> str:
        basis = f"the unprofiled step ({ms(self.step_s)}) over the profiled ops' time ({ms(self.ops_s)})"
        if self.split:
            basis = (f"the ops under {ms(PREEMPT_S)} at their least preempted step's time, the excess of the profiled "
                     f"ops ({ms(self.ops_s)}) over the unprofiled step ({ms(self.step_s)}) taken out of the longer ones")
        return f"; x{sig(k)}, {basis}: {ms(saving)}"


def _least(o: OpRoof) -> float:
    """An op's time in its least disturbed profiled step (its samples' minimum; its time when it has none)."""
    t = o.measured_s or 0.0
    samples = o.record.time_samples
    return min(t, min(samples)) if samples else t


def _step_s(report: RooflineAnalysis) -> float:
    return step_time_of(report.measured_step_s, report.estimated_step_s) or 0.0


Group = dict[tuple[str, str, str], list[tuple[str, Finding]]]  #: (kind, chain, layer pattern) -> (layer, finding)


def _grouped_findings(report: RooflineAnalysis, ctx: Context) -> Group:
    """Every layer's and the step's findings, grouped by kind, chain and layer pattern (the same finding in repeated
    blocks, ``h.0.mlp`` ... ``h.11.mlp``, is one group); step findings have the pattern ""."""
    model = report.kernel_model
    spec = report.spec
    tf32_peak = float(spec.flops.get("tf32") or 0.0) if getattr(spec, "vendor", "") != "cpu" else 0.0
    by_layer: dict[str, list[OpRoof]] = {}
    for o in report.op_roofs:
        by_layer.setdefault(o.record.layer, []).append(o)
    typ = {k: getattr(v, "type", "") for k, v in report.layer_records.items()}
    root = report.layer_records.get("") if report.layer_records else None
    param_bytes = int(getattr(root, "param_bytes", 0) or 0)
    groups: Group = {}
    # ops a ``torch.compile``'d function ran (eagerly under the capture): compiled in the real run, never fusion advice
    eager = ctx.compiled_fn
    uncompiled = {k: [o for o in v if o.record.index not in eager] for k, v in by_layer.items()} if eager else by_layer
    swiglu, claimed = _swiglu(uncompiled, model, ctx.compiled)
    for layer, ops in by_layer.items():
        free = [o for o in uncompiled[layer] if o.record.index not in claimed]
        # BatchNorm's own ops are one kernel each way (``bn_fusion`` fuses it with its activation)
        chains = [] if "batchnorm" in typ.get(layer, "").lower() else _fusion(
            free, model, ctx.compiled, param_bytes, typ.get(layer, ""), ctx.cuda, ctx.cpu)
        findings = (_misaligned(layer, ops, model) + _small_m(ops, model) + _fp32(ops, model, tf32_peak)
                    + swiglu.get(layer, []) + chains + layer_findings(layer, ops, typ.get(layer, ""), ctx))
        for f in findings:
            groups.setdefault((f.kind, f.chain, _pattern(layer)), []).append((layer, f))
    bd = _breakdown(report)
    for f in step_findings(ctx) + _input(bd) + _loop(bd) + _launch(report, ctx, (_wait_ms(bd) or 0.0) / 1e3):
        groups.setdefault((f.kind, f.chain, ""), []).append(("", f))
    return groups


def _opportunity(report: RooflineAnalysis, stretch: _Stretch, key: tuple[str, str, str],
                 members: list[tuple[str, Finding]], noise: Noise | None, cuda: bool = False,
                 held: list[tuple[str, str, float]] | None = None) -> tuple[Opportunity, bool, bool] | None:
    """One group's findings as one opportunity (savings summed, layers listed, scaled to the unprofiled step where a
    busy host stretched the profiled ops: ``_Stretch``) and whether its saving is within the measured noise of its
    rows; None when it saves nothing worth saying (under ``MIN_SAVING_SHARE`` of the step). On CUDA a per-layer
    ``torch.compile`` (the "other" chains) is net of ``COMPILED_LAYER_S`` a layer. ``held``: given on a launch-bound
    step, where a ``KERNEL_TIME_KINDS`` finding is appended to it (kind, layer, saving) instead of made, and the
    ``launch`` finding names those appended before it. Returns (the opportunity, within the noise, held back)."""
    kind, chain, pattern = key
    step = _step_s(report)
    rows = tuple(dict.fromkeys(r for _, f in members for r in f.rows))
    in_rows = [o for o in report.op_roofs if (o.record.layer, o.record.phase) in set(rows)]
    # step findings are measured on unprofiled steps: not scaled
    k = stretch.scale(in_rows) if all(f.rows for _, f in members) else 1.0
    saving = sum(f.saving_s for _, f in members) * k
    layer, f0 = members[0]
    n = len(members)
    cause, evidence, text = f0.cause, dict(f0.evidence), f0.predicted_text
    if n > 1:
        cause = f"in each of {n} layers `{pattern}`: {cause}"
        evidence["layers"] = [m[0] for m in members]
        text = f"per layer, as in `{layer}`: {text}; {n} layers: {ms(saving / k)}"
    if kind == "fusion" and chain == "other" and cuda:
        # each layer compiled on its own costs the step its guards, graph boundaries and launches (measured)
        cost = n * COMPILED_LAYER_S
        text += (f"; less {ms(COMPILED_LAYER_S)} a compiled layer a step (guards, graph boundaries, launches: "
                 f"measured up to that on an H200) x {n}: {ms(saving - cost)}")
        saving -= cost
    if saving <= 0 or (step and saving < MIN_SAVING_SHARE * step):
        return None
    is_held = held is not None and kind in KERNEL_TIME_KINDS  # a launch-bound step: named in the launch finding
    if is_held:
        held.append((kind, pattern if n > 1 else layer, saving))
    if kind == "launch" and held:
        names = ", ".join(f"{k_} `{x or '(model)'}` {ms(s_)}" for k_, x, s_ in held)
        cause += (f"; held back until the step is device-bound (a kernel-time saving does not shorten a step whose "
                  f"device waits for the host): {names}")
        evidence["held_back"] = [[k_, x, s_] for k_, x, s_ in held]
    if k != 1.0:
        text += stretch.text(k, saving)
    share = f" ({pct_text(saving / step)} of the step)" if step else ""
    ops_s = [o.measured_s for o in in_rows if o.measured_s is not None]
    effect = measured_effect(kind, chain, report.info.device)
    phases = evidence.get("phases")  # the phases its ops ran in, where a finding knows them (a chain's)
    layers = [m[0] for m in members]
    # the spread of the rows it comes from: its layers' (the phases it ran in) and every row its saving names (a step
    # finding's rows lie in many layers)
    spread_rows = {k for k in (noise.spread if noise else {}) if k in set(rows)
                   or (k[0] in layers and (phases is None or k[1] in phases))}
    spread = max(sum(noise.spread[k] for k in spread_rows), noise.floor_s) if noise else 0.0
    # a row marked noise is no evidence: a finding that rests on one (its own layer's, or a neighbour a rule looks
    # at, e.g. the activation before a pooling) is held back as noise; the step's channels-last finding, which spans
    # every conv, BatchNorm and pooling row, leaves such rows' ops out of its saving instead (``layer_advice``)
    noisy = [r for r in rows if noise is not None and r in noise.marks]
    if noisy:
        evidence["noise_rows"] = [list(r) for r in noisy]
    within = bool(noisy) or (bool(spread) and saving <= spread)  # within the measured noise: not a finding
    typ = getattr(report.layer_records.get(layer), "type", "") if report.layer_records else ""
    return Opportunity(
        layer=pattern if n > 1 else layer, phase="all", type=typ, kind=kind,
        cause=f"{cause}. Fix: {f0.fix}. Saves about {ms(saving)}/step{share}.", change=f0.fix, saving_s=saving,
        recoverable_s=saving, measured_s=sum(ops_s) if ops_s else None,
        estimate_s=sum(o.expected_s for o in in_rows),
        evidence={**evidence, "noise_s": spread} if within and spread else evidence, rows=rows,
        predicted_by=f0.predicted_by, predicted_text=text, measured_ratio=effect.ratio if effect else None,
        measured_on=effect.text if effect else "", op=str(evidence.get("op") or "")), within, is_held


def opportunities(report: RooflineAnalysis, noise: Noise | None = None, top: int = 5,
                  suppressed: list[Opportunity] | None = None,
                  held_back: list[Opportunity] | None = None) -> list[Opportunity]:
    """Findings, largest predicted saving first, each with cause, change, predicted saving and how it was predicted.
    The same finding in repeated blocks (``h.0.mlp`` ... ``h.11.mlp``) is one opportunity: savings summed, layers
    listed. ``noise``: the step's (``analysis.noise.find_noise``); a row marked noise is no evidence: a finding whose
    saving is within the measured noise of its rows, or that rests on a row marked noise, is left out (appended to
    ``suppressed``; ``evidence["noise_rows"]`` names such rows), a repeated block resting on one leaves its group, and
    the step's channels-last finding leaves such rows' ops out of its saving (then made only when what is left is
    at least ``MIN_SAVING_SHARE`` of the step and above the noise). On a launch-bound CUDA step (the device idle at least
    ``LAUNCH_BOUND_SHARE`` of it) the ``KERNEL_TIME_KINDS`` findings are left out (appended to ``held_back``) and
    named in the ``launch`` finding."""
    found: list[Opportunity] = []
    stretch = _Stretch(report)
    ctx = Context(report)
    if noise is not None:
        ctx.noisy = frozenset(noise.marks)
    groups = _grouped_findings(report, ctx)
    step = _step_s(report)
    # the device waits for the host most of the step: a saving of kernel time alone does not shorten it (the launch
    # group comes last: it names the findings held back)
    launch_bound = bool(step) and any(float(f.evidence.get("idle_s") or 0.0) >= LAUNCH_BOUND_SHARE * step
                                      for (kind, _, _), fs in groups.items() if kind == "launch" for _, f in fs)
    held: list[tuple[str, str, float]] | None = [] if launch_bound else None
    for key, all_members in groups.items():
        # an outlier among identical blocks gets no advice (its excess is noise); a finding must exceed the spread of
        # its rows' times over the steps (``_opportunity``), which a noisy row raises
        members = [m for m in all_members if noise is None or not noise.layer_outlier(m[0])]
        # a repeated block whose finding rests on a row marked noise leaves the group (the other blocks are the
        # evidence); a group of only such blocks is held back as noise (``_opportunity``)
        clean = [m for m in members if not any(r in ctx.noisy for r in m[1].rows)]
        if clean and len(clean) < len(members):
            members = clean
        made = _opportunity(report, stretch, key, members, noise, ctx.cuda, held) if members else None
        if made is None:
            continue
        o, within, is_held = made
        if is_held:
            if held_back is not None:
                held_back.append(o)
        elif not within:
            found.append(o)
        elif suppressed is not None and all((x.layer, x.phase, x.kind) != (o.layer, o.phase, o.kind)
                                            for x in suppressed):
            suppressed.append(o)
    found.sort(key=lambda o: -(o.saving_s or 0.0))
    return found[:top]


def below_roof(report: RooflineAnalysis, found: Iterable[Opportunity], noise: Noise | None = None,
               top: int = 10) -> list[tuple[Row, str]]:
    """Layer x phase rows below their roof for which no change is known: (row, what the numbers say about it), by
    recoverable time. A row counts when it is timed, takes at least ``BELOW_RATIO`` x its expected time (its roof
    where no kernel model applies), its recoverable time (measured - expected) is at least ``MIN_SAVING_SHARE`` of
    the step and above its measured spread, it is not marked as noise, and no opportunity's saving comes from it."""
    if not report.timed:
        return []
    step = _step_s(report)
    covered = {tuple(r) for o in found for r in (o.rows or ())}
    out = []
    for r in report.layer_rows:
        rec = r.recoverable_s or 0.0
        if (r.bound == "overhead" or (r.layer, r.phase) in covered or not r.measured_s
                or r.measured_s < BELOW_RATIO * r.expected_s or rec <= 0 or (step and rec < MIN_SAVING_SHARE * step)):
            continue
        if noise is not None and ((r.layer, r.phase) in noise.marks
                                  or rec <= max(noise.spread.get((r.layer, r.phase), 0.0), noise.floor_s)):
            continue
        out.append((r, _cause(r, report)))
    out.sort(key=lambda x: -(x[0].recoverable_s or 0.0))
    return out[:top]


def _cause(r: Row, report: RooflineAnalysis) -> str:
    """What the numbers say about a row no rule has a change for: its place on the roofline, and the facts the
    records show (16-bit GEMMs on CUDA cores, a kernel slower than its shape takes on the device, no FLOP formula)."""
    ops = report.row_ops.get((r.layer, r.phase), [])
    parts = [explain(r)]
    fns = compiled_function_ops(report.info)
    ran = sorted({fns[o.record.index] for o in ops if o.record.index in fns})
    compiled = ""
    if ran:  # the user compiled it: the capture's eager time is not what their run takes
        n = sum(1 for o in ops if o.record.index in fns)
        compiled = (f"; {n} of its {len(ops)} ops ran in `torch.compile`d {', '.join(f'`{x}`' for x in ran)}, run "
                    "eagerly under the capture: already compiled in the real run (fused there; this eager time "
                    "overstates it)")
    simt = [o for o in ops if o.record.category == "matmul" and o.record.tensor_core is False
            and o.roof_precision in ("bf16", "fp16", "tf32")]
    if simt:
        parts.append(f"{len(simt)} {simt[0].roof_precision} GEMMs ran on CUDA cores, not tensor cores (kernel names)")
    if report.kernel_model is not None and r.measured_s and r.expected_s:
        parts.append(f"{sig(r.measured_s / r.expected_s)}x what the device's libraries take for these shapes")
    return "; ".join(p for p in parts if p) + (compiled or "; no change known to tscope")
