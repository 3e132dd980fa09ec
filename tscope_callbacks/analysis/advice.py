"""Opportunities: what to change in the model or the training code, and the time it is predicted to save.

Each finding names the cause (from the numbers), the fix (what to change in the user's code) and the predicted saving
per step, computed by re-estimating the same ops after the fix with the device's kernel model (a what-if: the
padded GEMM shape, the TF32 roof, the fused byte count). Findings, by layer:

- ``misaligned``: a GEMM dimension that is not a multiple of 8 (16-bit) / 4 (32-bit) elements sends cuBLAS down a
  slow path; padded to the next multiple of 64 (N=50257 -> 50304) the same GEMMs are re-estimated;
- ``small_m``: GEMMs with few rows (batch x sequence) cannot fill the GPU; re-estimated at M=1024 rows per the
  same work;
- ``fp32_matmul``: fp32 GEMMs on a chip with TF32 (or bf16) tensor cores, TF32 disabled; re-estimated at TF32;
- ``cuda_cores``: a 16-bit GEMM whose kernels did not run on tensor cores (kernel names);
- ``fusion``: runs of memory-bound ops (pointwise, norms, softmax) writing intermediates the next op reads back;
  re-estimated as one kernel moving the run's first input and last output (skipped for compiled modules: Inductor
  fuses them already);
- ``launch``: many kernels shorter than ``LAUNCH_BOUND_S``: launch overhead, CUDA graphs help;
- ``slow_kernel``: measured well above what this shape reaches on the device (layout, dtype, a bad heuristic);
- ``uncounted``: time in ops without a FLOP formula (the roofline cannot place it);
- by layer type (``analysis.layer_advice``): ``channels_last``, ``cudnn_benchmark``, ``conv_channels`` (convolution),
  ``bn_fusion`` (BatchNorm + activation), ``pool_order``, ``pool_indices`` (max pooling), ``rnn_cudnn``,
  ``rnn_hidden`` (LSTM/GRU), ``embedding_sparse``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from tscope_callbacks.analysis.estimate import MEMORY_BOUND, gemm_dims
from tscope_callbacks.analysis.fmt import div as _div
from tscope_callbacks.analysis.fmt import n as _n
from tscope_callbacks.analysis.layer_advice import Context, layer_findings
from tscope_callbacks.analysis.rows import Opportunity, OpRoof
from tscope_callbacks.analysis.view import RooflineView
from tscope_callbacks.devices.efficiency import ITEMSIZE

__all__ = ["opportunities", "LAUNCH_BOUND_S", "MIN_SAVING_SHARE", "pad_to"]

LAUNCH_BOUND_S = 10e-6  #: kernels shorter than this are dominated by launch/dispatch
MIN_SAVING_SHARE = 0.005  #: findings saving less than this share of the step are not reported
SMALL_M = 128
SLOW_RATIO = 1.5  #: measured / expected above which a matrix op is called slow


def pad_to(x: int, multiple: int = 64) -> int:
    return -(-x // multiple) * multiple


def _time(o: OpRoof) -> float:
    return o.measured_s if o.measured_s is not None else o.expected_s


def _gemm_s(model: Any, dims: tuple[int, int, int], precision: str) -> float:
    return model.gemm_s(*dims, precision) if model is not None else 0.0


def _ms(s: float) -> str:
    return f"{s * 1e3:.3g} ms"


def _misaligned(layer: str, ops: list[OpRoof], model: Any) -> list[tuple]:
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
        rate = f" at {tf / 1e12:.0f} TFLOP/s" if tf else ""
        out.append(("misaligned", now - after,
                    f"dimension {v} (in its {o0.record.phase} GEMM {m}x{k} @ {k}x{n}) is not a multiple of 8, so "
                    f"the GEMM library takes a slow path{rate}; padded to {padded} (a multiple of 64) its "
                    f"{len(affected)} GEMMs are expected to take {_ms(after)} instead of {_ms(now)}",
                    f"pad {v} to {padded}: for a vocabulary, the model's `vocab_size` (Hugging Face: "
                    f"`model.resize_token_embeddings({padded})`); for hidden sizes, choose a multiple of 64",
                    {"dim": v, "padded": padded, "n_gemms": len(affected)}))
    return out


def _small_m(ops: list[OpRoof], model: Any) -> list[tuple]:
    out = []
    small = [(o, d) for o in ops if o.record.category == "matmul" and (d := gemm_dims(o.record)) is not None
             and d[0] < SMALL_M and d[1] >= SMALL_M and d[2] >= SMALL_M]
    if small and model is not None:
        now = sum(_time(o) for o, _ in small)
        after = sum(_gemm_s(model, (1024, n, k), o.roof_precision) * m / 1024 for o, (m, n, k) in small)
        m = min(d[0] for _, d in small)
        out.append(("small_m", now - after,
                    f"{len(small)} GEMMs have only {m} rows (batch x sequence): too few to fill the GPU; the same work "
                    f"in GEMMs of 1024 rows is expected to take {_ms(after)} instead of {_ms(now)}",
                    "raise the batch (or micro-batch) size, or concatenate requests, so each GEMM has >= 1024 rows",
                    {"m": m}))
    return out


def _fp32(ops: list[OpRoof], model: Any, tf32_available: bool) -> list[tuple]:
    mm = [(o, d) for o in ops if o.record.category in ("matmul", "conv") and o.roof_precision == "fp32"
          and (d := gemm_dims(o.record)) is not None]
    if not mm or not tf32_available:
        return []
    now = sum(_time(o) for o, _ in mm)
    after = sum(_gemm_s(model, d, "tf32") if model is not None else o.flops / (o.peak * 7.4) for o, d in mm)
    return [("fp32_matmul", now - after,
             f"{len(mm)} fp32 GEMMs run on CUDA cores although the GPU has TF32 tensor cores: expected "
             f"{_ms(after)} at TF32 instead of {_ms(now)}",
             "`torch.set_float32_matmul_precision('high')` (TF32), or train under bf16 autocast "
             "(Lightning: `precision='bf16-mixed'`)", {"n_gemms": len(mm)})]


def _cuda_cores(ops: list[OpRoof]) -> list[tuple]:
    simt = [o for o in ops if o.record.category == "matmul" and o.record.tensor_core is False
            and o.roof_precision in ("bf16", "fp16", "tf32")]
    if not simt:
        return []
    now = sum(_time(o) for o in simt)
    after = sum(o.expected_s for o in simt)
    return [("cuda_cores", now - after,
             f"{len(simt)} {simt[0].roof_precision} GEMMs ran on CUDA cores, not tensor cores (kernel names), "
             f"{_ms(now)} where the shapes take {_ms(after)} on tensor cores",
             "check their operands: 16-byte aligned sizes and strides, contiguous inputs, a supported dtype",
             {"n": len(simt)})]


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
    "optimizer": ("a fused optimizer, e.g. `torch.optim.AdamW(params, fused=True)` (or `foreach=True`): one kernel "
                  "per step for all parameters instead of one per operation per tensor"),
    "loss": ("a fused cross-entropy that never materializes the fp32 logits (e.g. Liger Kernel's "
             "`LigerFusedLinearCrossEntropyLoss`, or a chunked loss), or `torch.compile` the loss"),
    "gelu": ("the tanh-approximate GELU written out as pow/tanh/mul/add runs as separate kernels: use "
             "`torch.nn.functional.gelu(x, approximate=\"tanh\")` (one kernel each way), or `torch.compile`"),
    "rmsnorm": ("the RMSNorm written out as pow/mean/rsqrt/mul runs as separate kernels, forward and backward: use a "
                "fused RMSNorm (Liger Kernel's `LigerRMSNorm`; for Hugging Face Llama, Mistral, Qwen, ...: "
                "`liger_kernel.transformers.apply_liger_kernel_to_llama()` and its siblings), or `torch.compile`"),
    "rope": ("the rotary embedding written out as rotate_half (neg/cat/mul/add) runs as separate kernels: use a fused "
             "RoPE (Liger Kernel's `liger_rotary_pos_emb`; Hugging Face models: "
             "`apply_liger_kernel_to_<model>(rope=True)`), or `torch.compile`"),
    "swiglu": ("the SwiGLU MLP's SiLU and gating product run as separate kernels: use a fused SwiGLU (Liger Kernel's "
               "`LigerSwiGLUMLP`; Hugging Face models: `apply_liger_kernel_to_<model>(swiglu=True)`), or "
               "`torch.compile`"),
    "other": ("`torch.compile` the model (Inductor fuses element-wise chains), or use fused kernels "
              "(fused LayerNorm, fused bias + activation, fused dropout + residual add)"),
}


def _is_rnn(layer_type: str) -> bool:
    return layer_type.lower() in ("lstm", "gru", "rnn", "lstmcell", "grucell", "rnncell")


def _chain_kind(run: list[OpRoof], layer_type: str = "") -> str:
    names = {o.record.op.split(".")[1] if "." in o.record.op else o.record.op for o in run}
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


def _fused_optimizer_bytes(runs: list[list[OpRoof]], param_bytes: int) -> int:
    """What a fused optimizer moves per step: each state tensor once. Adam-family (``addcdiv``): params, grads,
    both moments read, params and moments written = 7 x the parameter bytes; SGD with momentum: 5x; plain SGD 3x."""
    names = {o.record.op.rsplit(".", 1)[-1].rstrip("_") for run in runs for o in run}
    per = 7 if "addcdiv" in names else 5 if "lerp" in names or len(names) > 2 else 3
    return per * param_bytes


def _fusion(ops: list[OpRoof], model: Any, compiled: bool, param_bytes: int = 0, layer_type: str = "") -> list[tuple]:
    """One finding per kind of chain (optimizer update, loss, written-out GELU, RMSNorm, rotary embedding, SwiGLU,
    other), each with its own fix."""
    if compiled:
        return []
    kinds: dict[str, list[list[OpRoof]]] = {}
    for run in _runs(ops):
        kinds.setdefault(_chain_kind(run, layer_type), []).append(run)
    out = []
    for kind, runs in kinds.items():
        now = sum(_time(o) for run in runs for o in run)
        before_b = sum(o.bytes for run in runs for o in run)
        ends = [run[0].record.bytes_read + run[-1].record.bytes_written for run in runs]
        if kind == "optimizer" and param_bytes:
            ends = [min(before_b, _fused_optimizer_bytes(runs, param_bytes))]
        fused_b = sum(ends)
        bw = runs[0][0].bandwidth
        after = sum(model.memory_s("pointwise", b) if model is not None else b / bw for b in ends)
        n = sum(len(run) for run in runs)
        what = {"optimizer": " of the optimizer update", "loss": " of the loss", "gelu": " of the GELU",
                "rmsnorm": " of the RMSNorm", "rope": " of the rotary embedding", "swiglu": " of the SwiGLU"}.get(kind, "")
        out.append(("fusion", now - after,
                    f"{n} memory-bound ops{what} in {len(runs)} chain(s) move "
                    f"{_n(before_b / 1e6)} MB, each writing what the next reads back; fused, about "
                    f"{_n(fused_b / 1e6)} MB: expected {_ms(after)} instead of {_ms(now)}",
                    _FIXES[kind], {"ops": n, "mb_before": before_b / 1e6, "mb_after": fused_b / 1e6,
                                   "chain": kind, "phases": sorted({run[0].record.phase for run in runs})}))
    return out


def _swiglu(by_layer: dict[str, list[OpRoof]], model: Any, compiled: bool) -> tuple[dict[str, list[tuple]], set[int]]:
    """SwiGLU MLPs written out (``down(silu(gate(x)) * up(x))``, HF's ``act_fn`` a child module): the SiLU, the gating
    product and their backward are memory-bound kernels separated by the GEMMs, so no chain of consecutive ops shows
    them. Per MLP layer (the gating product's): forward silu + mul move 5 activations (fused: gate and up read, the
    product written: 3); backward silu_backward + two muls move 9 (fused: the product's gradient, gate and up read,
    their gradients written: 5). Returns the findings per layer and the op indices they claim (kept out of the
    chain findings, which would count them again)."""
    if compiled:
        return {}, set()
    out: dict[str, list[tuple]] = {}
    claimed: set[int] = set()
    children: dict[str, list[str]] = {}  #: layer -> its direct children (the root's are not looked at)
    for k in by_layer:
        if "." in k:
            children.setdefault(k.rpartition(".")[0], []).append(k)
    for layer, ops in by_layer.items():
        kids = ops + [o for k in children.get(layer, ()) for o in by_layer[k]]
        found, now, after, before_b, after_b = [], 0.0, 0.0, 0, 0
        for phase, act, muls_n, before_n, after_n in (("forward", "silu", 1, 5, 3), ("backward", "silu_backward", 2,
                                                                                     9, 5)):
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
            now += sum(_time(o) for o in group)
            after += model.memory_s("pointwise", after_n * n) if model is not None else after_n * n / a.bandwidth
            before_b, after_b = before_b + before_n * n, after_b + after_n * n
        if not found:
            continue
        claimed.update(o.record.index for o in found)
        out[layer] = [("fusion", now - after,
                       f"{len(found)} memory-bound ops of the SwiGLU (SiLU, gating product and their backward) move "
                       f"{_n(before_b / 1e6)} MB between the GEMMs; fused, about {_n(after_b / 1e6)} MB: expected "
                       f"{_ms(after)} instead of {_ms(now)}", _FIXES["swiglu"],
                       {"ops": len(found), "mb_before": before_b / 1e6, "mb_after": after_b / 1e6,
                        "chain": "swiglu"})]
    return out, claimed


def _launch(ops: list[OpRoof]) -> list[tuple]:
    timed = [o for o in ops if o.measured_s is not None and o.record.category != "view" and o.measured_s > 0]
    tiny = [o for o in timed if o.measured_s < LAUNCH_BOUND_S]
    if len(tiny) < 8 or len(tiny) < len(timed) / 2:
        return []
    now = sum(o.measured_s for o in tiny)
    return [("launch", now * 0.5,
             f"{len(tiny)} kernels of {now / len(tiny) * 1e6:.1f} µs on average: launch overhead dominates (about half "
             "of it is recoverable)",
             "capture the step with CUDA graphs (`torch.compile(model, mode='reduce-overhead')`), or fuse and batch "
             "the small ops", {"kernels": len(tiny)})]


def _slow(ops: list[OpRoof], skip: frozenset[str] = frozenset()) -> list[tuple]:
    out = []
    for cat in ("matmul", "attention", "conv"):
        if cat in skip:
            continue
        mo = [o for o in ops if o.record.category == cat and o.measured_s is not None and o.expected is not None
              and o.measured_s > SLOW_RATIO * o.expected_s]
        if mo:
            now, exp = sum(o.measured_s for o in mo), sum(o.expected_s for o in mo)
            out.append(("slow_kernel", now - exp,
                        f"{len(mo)} {cat} ops take {_ms(now)} where these shapes take {_ms(exp)} on this device "
                        f"({now / exp:.1f}x)", "check operand layouts (non-contiguous or transposed inputs force "
                        "copies or slower kernels), dtypes and the attention backend", {"n": len(mo)}))
    return out


def _uncounted(ops: list[OpRoof]) -> list[tuple]:
    un = [o for o in ops if not o.record.counted and o.record.category != "view"]
    if not un:
        return []
    names: dict[str, int] = {}
    for o in un:
        names[o.record.op] = names.get(o.record.op, 0) + 1
    top = max(names, key=names.__getitem__)
    now = sum(_time(o) for o in un)
    return [("uncounted", 0.0,
             f"{len(un)} ops without a FLOP formula ({top} x{names[top]}) take {_ms(now)}: the roofline cannot place "
             "them", f"give {top} a formula: `ts.profile(model, formulas={{\"{top}\": fn}})`, or for the callbacks "
             f"`@tscope_callbacks.formulas.register_flops(\"{top}\", \"other\")` on `fn(*input_sizes, out=...)` "
             "returning FLOPs", {"ops": names, "time_s": now})]


def _pattern(layer: str) -> str:
    """Layer path with its repeated-block indices as ``*`` (``transformer.h.3.mlp`` -> ``transformer.h.*.mlp``)."""
    return re.sub(r"(?<=\.)\d+(?=\.|$)", "*", layer) if layer else layer


def opportunities(report: RooflineView, top: int = 5) -> list[Opportunity]:
    """Findings, largest predicted saving first (uncounted time last), each with cause, fix and saving. The same
    finding in repeated blocks (``h.0.mlp`` ... ``h.11.mlp``) is one opportunity: savings summed, layers listed."""
    model = getattr(report, "kernel_model", None)
    step = report.measured_step_s or report.estimated_step_s or 0.0
    tf32 = bool(report.spec.flops.get("tf32"))
    # compiled models: Inductor fuses elementwise chains already (kernels mode records the fused kernels; an eager
    # capture of a compiled model shows ops the real run fuses): no fusion advice
    compiled = bool(report.meta.get("compiled_modules_run_eagerly") or report.meta.get("compiled_capture"))
    by_layer: dict[str, list[OpRoof]] = {}
    for o in report.op_roofs:
        by_layer.setdefault(o.record.layer, []).append(o)
    typ = {k: getattr(v, "type", "") for k, v in report.layer_records.items()}
    root = report.layer_records.get("") if report.layer_records else None
    param_bytes = int(getattr(root, "param_bytes", 0) or 0)
    groups: dict[tuple[str, str, str], list[tuple[str, tuple, float | None, float]]] = {}
    swiglu, claimed = _swiglu(by_layer, model, compiled)
    ctx = Context(report)
    for layer, ops in by_layer.items():
        free = [o for o in ops if o.record.index not in claimed]
        typed = layer_findings(layer, ops, typ.get(layer, ""), ctx)
        slow_skip = frozenset({"conv"}) if any(f[0] == "cudnn_benchmark" for f in typed) else frozenset()
        # BatchNorm's own ops are one kernel each way (``bn_fusion`` fuses it with its activation); kernel launches
        # are a GPU's cost (on CPU an op's time is its own work)
        chains = [] if "batchnorm" in typ.get(layer, "").lower() else _fusion(free, model, compiled, param_bytes,
                                                                             typ.get(layer, ""))
        launch = [] if report.meta.get("device") == "cpu" else _launch(ops)
        findings = (_misaligned(layer, ops, model) + _small_m(ops, model) + _fp32(ops, model, tf32) + _cuda_cores(ops)
                    + swiglu.get(layer, []) + chains + typed + launch + _slow(ops, slow_skip) + _uncounted(ops))
        measured = sum(o.measured_s for o in ops if o.measured_s is not None) if report.timed else None
        expected = sum(o.expected_s for o in ops)
        for f in findings:
            groups.setdefault((f[0], f[4].get("chain", ""), _pattern(layer)), []).append((layer, f, measured,
                                                                                          expected))
    found: list[Opportunity] = []
    noise = getattr(report, "noise", None)
    suppress = getattr(report, "_suppress", lambda o: None)
    for (kind, _chain, pattern), all_members in groups.items():
        # an outlier among identical blocks gets no advice (its excess is noise); a finding must exceed the spread of
        # its layers' times over the steps (below), which a noisy row of the layer raises
        members = [m for m in all_members if noise is None or kind == "uncounted" or not noise.layer_outlier(m[0])]
        if not members:
            continue
        saving = sum(f[1] for _, f, _, _ in members)
        time_s = sum(f[4].get("time_s", 0.0) for _, f, _, _ in members) if kind == "uncounted" else 0.0
        if kind != "uncounted" and (saving <= 0 or (step and saving < MIN_SAVING_SHARE * step)):
            continue
        if kind == "uncounted" and (not step or time_s < MIN_SAVING_SHARE * step):
            continue
        layer, (_, _, cause, fix, evidence), _, _ = members[0]
        n = len(members)
        if n > 1:
            cause = f"in each of {n} layers `{pattern}`: {cause}"
            evidence = {**evidence, "layers": [m[0] for m in members]}
        share = f" ({saving / step:.0%} of the step)" if step and saving else ""
        save = f" Saves about {_ms(saving)}/step{share}." if saving else ""
        measured = [m[2] for m in members if m[2] is not None]
        found.append(Opportunity(
            layer=pattern if n > 1 else layer, phase="all", type=typ.get(layer, ""), recoverable_s=saving or None,
            measured_s=sum(measured) if measured else None, estimate_s=sum(m[3] for m in members), bound="",
            intensity=None, ridge=None, attained=None, reason=f"{cause}. Fix: {fix}.{save}", kind=kind,
            saving_s=saving, fix=fix, evidence=evidence))
        phases = evidence.get("phases")  # the phases its ops ran in, where a finding knows them (a chain's)
        spread = max(sum(noise.layer_spread(m[0], phases) for m in members), noise.floor_s) if noise else 0.0
        if kind != "uncounted" and spread and saving <= spread:  # within the measured noise: not a finding
            found[-1].evidence = {**found[-1].evidence, "noise_s": spread}
            suppress(found.pop())
    found.sort(key=lambda o: (o.kind == "uncounted", -(o.saving_s or 0.0)))
    return found[:top]
