"""Advice by layer type and device, only where a change in the user's code predicts a saving (``analysis.advice``
calls :func:`layer_findings` per layer and :func:`step_findings` once). Each rule names the change and the saving
computed from the step's own records, or says nothing:

- channels-last (the step; convolutions with 4-D activations, the model not channels-last):
  on CPU, PyTorch's NCHW max/avg pooling and BatchNorm kernels run far below the rate of its channels-last ones
  (which vectorize over channels): each such op is predicted at the rate this step's own element-wise ops reach
  (``layout_rate``), plus the NCHW <-> NHWC conversions oneDNN makes around each convolution; on CUDA (16-bit or
  TF32 convolutions: cuDNN's tensor-core kernels want NHWC) the conversion kernels' measured time, or their bytes
  at the bandwidth roof (``conversion``). fp32 convolutions on CUDA without TF32: nothing;
- ``cudnn_benchmark`` (CUDA convolutions above what their shapes take, with the autotuner off: measured -
  expected); channel counts (``conv_channels``: CUDA 16-bit convolutions off the tensor cores with channels not a
  multiple of 8: measured - the padded convolution at the tensor-core roof);
- BatchNorm: in training on CUDA, followed by an activation (``bn_fusion``): fused by ``torch.compile``, the
  activation's traffic folds into BatchNorm's kernel: the activation's forward time, and 2/3 of its backward's (it
  reads the gradient and the mask and writes the gradient; fused, only the gradient's read remains); on CPU a
  compiled BatchNorm + ReLU measured slower than eager: no such advice. In an inference step (no backward), right
  after a convolution (``bn_fold``): folded into the convolution, its op goes (its measured time);
- max pooling after a monotonic activation (``pool_order``): ``pool(relu(x)) == relu(pool(x))``, so the activation
  and its backward touch the pooled elements only: their bytes x out/in elements, at the rate they ran or the step's
  element-wise rate, the faster; not in an inference step of a channels-first CPU model, whose scalar max pooling
  measured slower fed the activation's input, by more than the activation's forward saved; on CUDA, the 8-byte indices
  kept for the backward become Inductor's 1-byte offsets under ``torch.compile`` (``pool_indices``: 7/8 of their
  bytes, written and read). On CPU a compiled max pooling measured slower than ATen's: no such advice there;
- LSTM/GRU on CUDA: cuDNN's fused RNN not used (``rnn_cudnn``: per-time-step cell ops: measured - the same work at
  its roofline bound); a hidden size off a multiple of 8 keeping 16-bit RNN GEMMs off the tensor cores
  (``rnn_hidden``);
- embeddings (``embedding_sparse``, CPU only): a dense gradient of a table much larger than the rows a step looks up,
  not tied to another weight (a tied table's gradient is dense anyway): ``sparse=True`` writes the looked-up rows
  only. Not on CUDA: the sparse gradient and ``SparseAdam`` measured slower than the dense path on an H200.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from tscope_callbacks.analysis.finding import Finding, ms, rows_of
from tscope_callbacks.analysis.fmt import bw_text, bytes_text, sig
from tscope_callbacks.analysis.rows import OpRoof

if TYPE_CHECKING:
    from tscope_callbacks.analysis.roofline import RooflineAnalysis

__all__ = ["layer_findings", "step_findings", "Context", "ACTIVATIONS", "ACTIVATION_BACKWARDS", "MONOTONE",
           "CHANNELS_LAST_CPU_OPS"]

_ITEM = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8}
#: element-wise activations (forward) and their backward ops
ACTIVATIONS = frozenset({"aten.relu", "aten.relu_", "aten.gelu", "aten.silu", "aten.silu_", "aten.hardtanh",
                         "aten.hardtanh_", "aten.leaky_relu", "aten.leaky_relu_", "aten.elu", "aten.elu_",
                         "aten.sigmoid", "aten.tanh", "aten.hardswish", "aten.mish"})
ACTIVATION_BACKWARDS = frozenset({"aten.threshold_backward", "aten.gelu_backward", "aten.silu_backward",
                                  "aten.hardtanh_backward", "aten.leaky_relu_backward", "aten.elu_backward",
                                  "aten.sigmoid_backward", "aten.tanh_backward", "aten.hardswish_backward",
                                  "aten.mish_backward"})
#: non-decreasing activations: max pooling commutes with them
MONOTONE = frozenset({"aten.relu", "aten.relu_", "aten.hardtanh", "aten.hardtanh_", "aten.leaky_relu",
                      "aten.leaky_relu_", "aten.elu", "aten.elu_", "aten.sigmoid", "aten.tanh"})
_BN = frozenset({"aten.native_batch_norm", "aten._native_batch_norm_legit", "aten._native_batch_norm_legit_functional",
                 "aten.cudnn_batch_norm", "aten._batch_norm_with_update", "aten.batch_norm",
                 "aten.miopen_batch_norm"})
_BN_BACKWARD = frozenset({"aten.native_batch_norm_backward", "aten.batch_norm_backward"})
_MAXPOOL = frozenset({"aten.max_pool2d_with_indices", "aten.max_pool3d_with_indices"})
#: ops whose CPU kernel in NCHW is much slower than its channels-last one (PyTorch's ``aten/native/cpu`` kernels:
#: the NCHW ones loop over each channel plane, the channels-last ones vectorize across channels)
CHANNELS_LAST_CPU_OPS = _BN | _BN_BACKWARD | _MAXPOOL | frozenset({
    "aten.avg_pool2d", "aten._adaptive_avg_pool2d", "aten.adaptive_max_pool2d"})
_RNN_CELLS = frozenset({"aten._thnn_fused_lstm_cell", "aten._thnn_fused_gru_cell", "aten.lstm_cell",
                        "aten.gru_cell"})
#: cuDNN's layout conversion kernels around an NCHW convolution that runs an NHWC (tensor-core) kernel
_CONVERSION_KERNELS = ("nchwtonhwc", "nhwctonchw")
SLOW_RATIO = 1.5
#: an NCHW op is called slow on CPU when it runs below this share of the step's element-wise rate
SLOW_LAYOUT_SHARE = 0.5
#: element-wise ops smaller than this do not set the step's element-wise rate (their time is mostly dispatch)
RATE_MIN_BYTES = 1 << 20


def _numel(shape: Any) -> int:
    return math.prod(shape) if isinstance(shape, (list, tuple)) and all(isinstance(d, int) for d in shape) else 0


def _pad8(c: int) -> int:
    return -(-c // 8) * 8


def compiled_function_ops(info: Any) -> dict[int, str]:
    """Op index -> the ``torch.compile``'d function (not module) that ran it eagerly under the capture
    (``CaptureInfo.compiled_functions_run_eagerly``): its ops are fused in the user's real run."""
    out: dict[int, str] = {}
    for name, runs in (getattr(info, "compiled_functions_run_eagerly", None) or {}).items():
        for first, last in runs:
            out.update(dict.fromkeys(range(int(first), int(last) + 1), str(name)))
    return out


def _four_d(shape: Any) -> bool:
    return isinstance(shape, (list, tuple)) and len(shape) == 4


class Context:
    """What the rules look at besides a layer's own ops: the step's ops in execution order, the capture's facts."""

    def __init__(self, report: RooflineAnalysis) -> None:
        info = report.info
        self.info = info
        self.seq = sorted((o for o in report.op_roofs if o.record.category != "view"), key=lambda o: o.record.index)
        self.pos = {o.record.index: i for i, o in enumerate(self.seq)}
        self.all_ops = list(report.op_roofs)
        self.cuda = str(info.device or "").startswith("cuda") or str(info.timing or "").startswith("cuda")
        self.cpu = info.device == "cpu" and not self.cuda
        self.compiled = bool(info.compiled_modules_run_eagerly or info.compiled_capture)
        #: op index -> the ``torch.compile``'d function that ran it eagerly under the capture (the real run fuses it)
        self.compiled_fn: dict[int, str] = compiled_function_ops(info)
        self.kernel_model = report.kernel_model  #: expectations beyond the roofline bound
        self.kernels = info.kernels or []  #: [name, start_ns, duration_ns, stream, op position]
        #: a forward-only step (inference, validation): no op ran in a backward
        self.inference = bool(self.seq) and not any(o.record.phase == "backward" for o in self.seq)
        #: the (layer, phase) rows marked as noise (``analysis.noise``): their time is no evidence for a finding, so
        #: the rules leave their ops out of a saving (set by ``analysis.advice.opportunities`` when it has the noise)
        self.noisy: frozenset[tuple[str, str]] = frozenset()

    def is_noisy(self, o: OpRoof) -> bool:
        return (o.record.layer, o.record.phase) in self.noisy

    def after(self, o: OpRoof) -> OpRoof | None:
        i = self.pos.get(o.record.index)
        return self.seq[i + 1] if i is not None and i + 1 < len(self.seq) else None

    def before(self, o: OpRoof) -> OpRoof | None:
        i = self.pos.get(o.record.index)
        return self.seq[i - 1] if i else None

    def backward_of(self, act: OpRoof) -> OpRoof | None:
        """The backward op of activation ``act``: same layer, an activation backward on the same shape."""
        shape = act.record.output_shapes[:1]
        return next((o for o in self.seq if o.record.layer == act.record.layer and o.record.phase == "backward"
                     and o.record.op in ACTIVATION_BACKWARDS and o.record.output_shapes[:1] == shape), None)

    def elementwise_rate(self) -> float | None:
        """Bytes/s this step's own element-wise ops reach: the upper quartile of their rates (bytes over measured
        time, ops of at least ``RATE_MIN_BYTES``), never above the bandwidth roof: what a healthy vectorized
        memory-bound kernel does on this device at these sizes (a few slow ones, e.g. on tensors of mixed layouts,
        do not set it); None when the step has none."""
        rates = sorted(o.bytes / o.measured_s for o in self.seq if o.record.category == "pointwise"
                       and o.measured_s and o.bytes >= RATE_MIN_BYTES)
        if not rates:
            return None
        return min(rates[math.ceil(0.75 * (len(rates) - 1))], self.seq[0].bandwidth)


def _t(o: OpRoof | None) -> float:
    return (o.measured_s or 0.0) if o is not None else 0.0


# ---------------- channels-last (the step) ----------------
def _act_bytes(o: OpRoof) -> int:
    """Bytes of a conv's 4-D activations (not its weights): forward input and output; backward grad_output, input
    and grad_input."""
    r, item = o.record, _ITEM.get(o.record.dtype, 4)
    ins = r.input_shapes[:2] if r.op == "aten.convolution_backward" else r.input_shapes[:1]
    return item * sum(_numel(s) for s in [*ins, *r.output_shapes[:1]] if _four_d(s))


def _cl_bytes(o: OpRoof, ctx: Context) -> int:
    """Bytes PyTorch's channels-last CPU kernel for ``o`` moves: BatchNorm in training passes over its input twice
    (the batch statistics, then the normalized output), and its backward over the gradient and the input twice (their
    reductions, then the input gradient); pooling and eval-mode BatchNorm once (the record's bytes)."""
    r = o.record
    if r.op in _BN and not ctx.inference:
        return r.bytes + _ITEM.get(r.dtype, 4) * _numel(r.input_shapes[0])
    if r.op in _BN_BACKWARD:
        return r.bytes + _ITEM.get(r.dtype, 4) * sum(_numel(x) for x in r.input_shapes[:2])
    return r.bytes


def _channels_last(ctx: Context) -> list[Finding]:
    if ctx.info.conv_channels_last is not False:
        return []  # channels-last already, or the layout is unknown
    # an op in a row marked noise is no evidence: its time counts toward no saving
    convs = [o for o in ctx.seq if o.record.category == "conv" and o.measured_s and _act_bytes(o)
             and not ctx.is_noisy(o)]
    if not convs:
        return []
    fix = ("convert the model and its inputs to channels-last: `model = model.to(memory_format=torch.channels_last)` "
           "and `x = x.to(memory_format=torch.channels_last)` in the step")
    if ctx.cuda:
        if not any(o.roof_precision in ("bf16", "fp16", "tf32") for o in convs):
            return []  # fp32 convolutions run NCHW kernels: no conversion to save
        pos = {o.record.index: i for i, o in enumerate(ctx.all_ops)}
        conv_pos = {pos[o.record.index] for o in convs}
        conv_k = [k for k in ctx.kernels if len(k) > 4 and k[4] in conv_pos
                  and any(c in str(k[0]).lower() for c in _CONVERSION_KERNELS)]
        if conv_k:
            saving = sum(float(k[2]) for k in conv_k) * 1e-9
            text = (f"{len(conv_k)} layout conversion kernels (cuDNN's nchwToNhwc / nhwcToNchw) around "
                    f"{len(convs)} convolutions took {ms(saving)}")
        else:
            moved = sum(2 * _act_bytes(o) for o in convs)
            saving = sum(min(o.measured_s or 0.0, 2 * _act_bytes(o) / o.bandwidth) for o in convs)
            text = (f"the activations of {len(convs)} convolutions, {bytes_text(moved)}, read and written once more "
                    f"to convert them, at {bw_text(convs[0].bandwidth)}: {ms(saving)}")
        return [Finding("channels_last", saving,
                        f"{len(convs)} convolutions take NCHW (channels-first) tensors, which cuDNN's tensor-core "
                        f"kernels convert to and from channels-last around each call", fix, "conversion", text,
                        rows_of(convs), {"convs": len(convs)})]
    if not ctx.cpu:
        return []
    rate = ctx.elementwise_rate() or convs[0].bandwidth
    slow = [o for o in ctx.seq if o.record.op in CHANNELS_LAST_CPU_OPS and o.measured_s and not ctx.is_noisy(o)
            and any(_four_d(s) for s in o.record.input_shapes[:1])
            and _cl_bytes(o, ctx) / rate < SLOW_LAYOUT_SHARE * (o.measured_s or 0.0)]
    if not slow:
        return []  # nothing runs slowly in NCHW: the conversions alone are not worth a finding
    ops_saving = sum((o.measured_s or 0.0) - _cl_bytes(o, ctx) / rate for o in slow)
    conv_saving = sum(min(o.measured_s or 0.0, 2 * _act_bytes(o) / rate) for o in convs)
    now = sum(o.measured_s or 0.0 for o in slow)
    kinds = sorted({"pooling" if "pool" in o.record.op else "BatchNorm" for o in slow})
    return [Finding("channels_last", ops_saving + conv_saving,
                    f"the model runs channels-first (NCHW): {len(slow)} {' and '.join(kinds)} ops take {ms(now)} at "
                    f"{bw_text(sum(o.bytes for o in slow) / now)}, where this step's element-wise ops reach "
                    f"{bw_text(rate)} (PyTorch's channels-last CPU kernels vectorize across channels; the NCHW "
                    f"ones loop over each channel plane), and oneDNN converts the activations of {len(convs)} "
                    "convolutions to and from its own layout", fix, "layout_rate",
                    f"{len(slow)} ops' channels-last kernels (BatchNorm's two passes) at {bw_text(rate)} "
                    f"instead of their measured time: {ms(ops_saving)}; "
                    f"the convolutions' activations once less read and written at that rate: {ms(conv_saving)}",
                    rows_of([*slow, *convs]), {"ops": len(slow), "convs": len(convs), "rate_gbps": rate / 1e9})]


# ---------------- convolution (the layer) ----------------
def _conv(ops: list[OpRoof], ctx: Context) -> list[Finding]:
    convs = [o for o in ops if o.record.category == "conv" and o.measured_s]
    if not convs or not ctx.cuda:
        return []
    out = []
    if ctx.info.cudnn_benchmark is False and ctx.kernel_model is not None:
        slow = [o for o in convs if (o.measured_s or 0.0) > SLOW_RATIO * o.expected_s]
        if slow:
            now, exp = sum(o.measured_s or 0.0 for o in slow), sum(o.expected_s for o in slow)
            out.append(Finding(
                "cudnn_benchmark", now - exp,
                f"{len(slow)} convolutions take {ms(now)} where these shapes take {ms(exp)} on this device "
                f"({sig(now / exp)}x) and cuDNN's autotuner is off (`torch.backends.cudnn.benchmark` is False): its "
                "default algorithm choice is slow for these shapes",
                "`torch.backends.cudnn.benchmark = True` (Lightning: `Trainer(benchmark=True)`) with fixed input "
                "shapes: cuDNN times its algorithms once per shape and keeps the fastest", "measured_excess",
                f"measured {ms(now)}, the kernel model expects {ms(exp)} for these shapes", rows_of(slow),
                {"convs": len(slow)}))
    fwd = next((o for o in convs if o.record.op == "aten.convolution"), None)
    shapes = fwd.record.input_shapes if fwd is not None else []
    if (fwd is not None and len(shapes) >= 2 and _four_d(shapes[0]) and _four_d(shapes[1])
            and fwd.roof_precision in ("bf16", "fp16")):
        cin, cout = shapes[0][1], shapes[1][0]
        bad = [c for c in (cin, cout) if c > 4 and c % 8]
        off = [o for o in convs if o.record.tensor_core is False]
        if bad and off:
            ratio = (_pad8(cin) / cin if cin in bad else 1.0) * (_pad8(cout) / cout if cout in bad else 1.0)
            now = sum(o.measured_s or 0.0 for o in off)
            after = sum(max(o.flops * ratio / o.peak, o.bytes * ratio / o.bandwidth) for o in off)
            chans = " and ".join(f"{c} -> {_pad8(c)}" for c in bad)
            out.append(Finding(
                "conv_channels", now - after,
                f"channels {', '.join(str(c) for c in bad)} are not a multiple of 8, so {len(off)} "
                f"{fwd.roof_precision} convolutions ran off the tensor cores (kernel names): {ms(now)}",
                f"choose channel counts that are multiples of 8 ({chans}) in this layer and its neighbours",
                "kernel_time", f"measured {ms(now)}; padded ({chans}), at the tensor-core roof: {ms(after)}",
                rows_of(off), {"channels": bad}))
    return out


# ---------------- BatchNorm ----------------
def _bn_fold(ops: list[OpRoof], ctx: Context) -> list[Finding]:
    """Inference (a step without a backward): a BatchNorm right after a convolution folds into the convolution's
    weights and bias, so its own op goes (``torch.nn.utils.fusion.fuse_conv_bn_eval``)."""
    bns = [o for o in ops if o.record.op in _BN and o.record.phase == "forward" and o.measured_s
           and (c := ctx.before(o)) is not None and c.record.category == "conv"
           and c.record.output_shapes[:1] == o.record.input_shapes[:1]]
    if not bns:
        return []
    now = sum(o.measured_s or 0.0 for o in bns)
    return [Finding("bn_fold", now,
                    f"an inference step runs {len(bns)} BatchNorm op(s) right after a convolution: in eval mode "
                    "BatchNorm is a fixed per-channel scale and shift that the convolution's weights can carry",
                    "fold BatchNorm into the convolution before it for inference: "
                    "`torch.nn.utils.fusion.fuse_conv_bn_eval(conv, bn)` (or `torch.ao.quantization.fuse_modules` on "
                    "the model in eval mode; `torch.compile` folds it too)", "removed",
                    f"the BatchNorm op(s) go: their measured {ms(now)}", rows_of(bns), {"bns": len(bns)})]


def _batchnorm(ops: list[OpRoof], ctx: Context) -> list[Finding]:
    """Training on CUDA: Inductor fuses BatchNorm with the activation after it. On CPU a compiled BatchNorm + ReLU
    measured 3.6x slower than eager (training mode, one thread): no such advice there."""
    if ctx.compiled or not ctx.cuda:
        return []
    saving, pairs, moved, acts = 0.0, 0, 0, []
    for bn in (o for o in ops if o.record.op in _BN and o.record.phase == "forward"
               and o.record.index not in ctx.compiled_fn):
        act = ctx.after(bn)
        if act is None or act.record.op not in ACTIVATIONS or act.record.input_shapes[:1] != bn.record.output_shapes[:1]:
            continue
        nxt = ctx.after(act)
        if act.record.op in MONOTONE and nxt is not None and nxt.record.op in _MAXPOOL:
            continue  # the pooling rule moves this activation after the pool
        b = _ITEM.get(bn.record.dtype, 4) * _numel(bn.record.output_shapes[0])
        bwd = ctx.backward_of(act)
        saving += _t(act) + _t(bwd) * 2 / 3
        moved += 2 * b + (2 * b if bwd is not None else 0)
        pairs += 1
        acts += [o for o in (act, bwd) if o is not None]
    if not pairs:
        return []
    return [Finding("bn_fusion", saving,
                    f"BatchNorm's output is written, then read back by the activation after it ({pairs} pair(s), "
                    f"forward and backward): {bytes_text(moved)} a fused kernel never moves",
                    "`torch.compile` the model, or the BatchNorm and its activation as one module (Inductor fuses "
                    "them, forward and backward); for inference, fold BatchNorm into the convolution before it",
                    "fused_bytes",
                    f"the activation's forward ({ms(sum(_t(o) for o in acts if o.record.phase == 'forward'))}) folds "
                    "into BatchNorm's kernel, and 2/3 of its backward's traffic goes: "
                    f"{ms(saving)}", rows_of(acts), {"pairs": pairs, "mb": moved / 2**20})]


# ---------------- pooling ----------------
def _pooling(ops: list[OpRoof], ctx: Context) -> list[Finding]:
    out = []
    for pool in (o for o in ops if o.record.op in _MAXPOOL and o.record.phase == "forward"):
        n_in, n_out = _numel(pool.record.input_shapes[0]), _numel(pool.record.output_shapes[0])
        if not n_in or not n_out or n_out >= n_in:
            continue
        act = ctx.before(pool)
        # PyTorch's NCHW max pooling on CPU is a scalar loop whose branches follow the data: fed the activation's
        # input instead of its output it measured slower, by more than an inference step's activation saved (in
        # training the activation's backward saves more: measured 1.0x the prediction)
        nchw_cpu_inference = ctx.cpu and ctx.inference and ctx.info.conv_channels_last is False
        if (not nchw_cpu_inference and act is not None and act.record.op in MONOTONE
                and act.record.output_shapes[:1] == pool.record.input_shapes[:1]):
            bwd = ctx.backward_of(act)
            both = [o for o in (act, bwd) if o is not None]
            now = _t(act) + _t(bwd)
            # on the pooled elements, at the rate they ran or this step's element-wise ops reach, the faster
            rate = max(ctx.elementwise_rate() or 0.0, sum(o.bytes for o in both) / now if now else 0.0)
            after = sum(o.bytes for o in both) * n_out / n_in / rate if rate else now * n_out / n_in
            saving = now - after
            name = act.record.op.removeprefix("aten.").rstrip("_")
            out.append(Finding(
                "pool_order", saving,
                f"`{act.record.layer or '(root)'}` applies {name} to the {n_in:,} elements max pooling then reduces "
                f"to {n_out:,}; {name} is monotonic, so after the pooling it and its backward touch "
                f"{sig(n_in / n_out)}x fewer elements",
                f"apply the {name} after the pooling: `pool(relu(x))` equals `relu(pool(x))` for max pooling",
                "elements", f"{name} forward and backward measured {ms(now)}; on {n_out:,} of {n_in:,} elements, "
                f"at {bw_text(rate)}: {ms(after)}", rows_of(both),
                {"elements_in": n_in, "elements_out": n_out}))
        idx = pool.record.output_shapes[1] if len(pool.record.output_shapes) > 1 else None
        if idx and ctx.cuda and not ctx.compiled:
            b = 8 * _numel(idx)
            bwd = next((o for o in ops if o.record.phase == "backward" and "max_pool" in o.record.op), None)
            saving = min(_t(pool) + _t(bwd), 2 * b * 7 / 8 / pool.bandwidth)
            out.append(Finding(
                "pool_indices", saving,
                f"max pooling keeps {_numel(idx):,} int64 indices for its backward ({bytes_text(b)} written, read "
                "again in backward)",
                "`torch.compile` the model: Inductor's max pooling stores int8 offsets within each window instead of "
                "int64 indices", "bytes",
                f"7/8 of {bytes_text(2 * b)} (written and read) at {bw_text(pool.bandwidth)}: {ms(saving)}",
                rows_of([o for o in (pool, bwd) if o is not None]), {"mb": b / 2**20}))
    return out


# ---------------- LSTM / GRU ----------------
def _rnn(ops: list[OpRoof], ctx: Context) -> list[Finding]:
    if not ctx.cuda:
        return []  # CPU: oneDNN runs LSTM fused; a GRU has no fused CPU kernel a change in the user's code selects
    out = []
    fused = [o for o in ops if o.record.op in ("aten._cudnn_rnn", "aten._cudnn_rnn_backward", "aten.miopen_rnn")]
    cells = [o for o in ops if o.record.op in _RNN_CELLS]
    if cells and not fused:
        now = sum(_t(o) for o in ops)
        after = sum(o.estimate_s for o in ops)
        out.append(Finding(
            "rnn_cudnn", now - after,
            f"the recurrent layer ran as {len(cells)} per-time-step cell ops ({len(ops)} ops), not cuDNN's fused RNN",
            "let cuDNN run it: `torch.backends.cudnn.enabled = True`, CUDA fp16/bf16/fp32 tensors, and "
            "`rnn.flatten_parameters()` after moving or wrapping the module", "measured_excess",
            f"measured {ms(now)}; the same work at its roofline bound: {ms(after)}", rows_of(ops),
            {"cells": len(cells)}))
    off = [o for o in fused if o.record.tensor_core is False and o.roof_precision in ("bf16", "fp16")]
    hidden = next((o.record.output_shapes[0][-1] for o in fused if o.record.output_shapes
                   and isinstance(o.record.output_shapes[0], (list, tuple)) and o.record.output_shapes[0]), None)
    if off and isinstance(hidden, int) and hidden % 8:
        ratio = _pad8(hidden) / hidden
        now = sum(_t(o) for o in off)
        after = sum(max(o.flops * ratio / o.peak, o.bytes * ratio / o.bandwidth) for o in off)
        out.append(Finding(
            "rnn_hidden", now - after,
            f"hidden size {hidden} is not a multiple of 8, so {len(off)} {off[0].roof_precision} RNN calls ran off "
            "the tensor cores", f"hidden_size={_pad8(hidden)} (a multiple of 8; the input size too)", "kernel_time",
            f"measured {ms(now)}; at hidden size {_pad8(hidden)} on the tensor-core roof: {ms(after)}", rows_of(off),
            {"hidden": hidden}))
    return out


# ---------------- embeddings ----------------
def _tied(o: OpRoof, ctx: Context) -> bool:
    """The table's gradient is summed with another gradient of its shape right after (a weight tied to another
    layer's, as GPT-2's embedding and LM head): it stays dense whatever the embedding does."""
    shape = o.record.output_shapes[:1]
    nxt = ctx.after(o)
    return nxt is not None and nxt.record.op in ("aten.add", "aten.add_") and nxt.record.phase == "backward" and \
        len([s for s in nxt.record.input_shapes if [s] == shape]) >= 2


def _embedding(ops: list[OpRoof], ctx: Context) -> list[Finding]:
    if ctx.cuda:
        # on a GPU the dense gradient is one fast kernel and the sparse path costs more than it writes: the demo
        # transformer's 50,304 x 768 table (8 x 1,024 rows looked up) measured 1.64 ms a step slower with
        # ``sparse=True`` + ``SparseAdam`` on an H200, for 0.19 ms predicted faster (``benchmarks/advice_effect.py``)
        return []
    out = []
    for o in ops:
        r = o.record
        if r.op != "aten.embedding_dense_backward" or not r.output_shapes or len(r.input_shapes) < 2:
            continue
        table = r.output_shapes[0]
        n = _numel(r.input_shapes[1])
        if len(table) != 2 or not n or table[0] < 4 * n or _tied(o, ctx):
            continue
        v, d = table
        zero = (v - n) * d * _ITEM.get(r.dtype, 4)
        saving = _t(o) * (1 - n / v)
        out.append(Finding(
            "embedding_sparse", saving,
            f"the embedding's gradient is a dense {v:,} x {d} table although the step looks up {n:,} rows: "
            f"{bytes_text(zero)} of zero rows written",
            "`nn.Embedding(..., sparse=True)` with `torch.optim.SparseAdam` (or SGD) for its weight: the gradient and "
            "the optimizer update then cover the looked-up rows only (the optimizer's saving comes on top)",
            "elements", f"the dense gradient measured {ms(_t(o))}; {n:,} of its {v:,} rows: {ms(_t(o) - saving)}",
            rows_of([o]), {"rows": v, "looked_up": n}))
    return out


def layer_findings(layer: str, ops: list[OpRoof], layer_type: str, ctx: Context) -> list[Finding]:
    """The layer-type rules' findings for one layer's ops (those with a positive saving)."""
    t = layer_type.lower()
    out: list[Finding] = []
    if any(o.record.category == "conv" for o in ops):
        out += _conv(ops, ctx)
    if "batchnorm" in t or any(o.record.op in _BN for o in ops):
        out += _bn_fold(ops, ctx) if ctx.inference else _batchnorm(ops, ctx)
    if any(o.record.op in _MAXPOOL for o in ops):
        out += _pooling(ops, ctx)
    if t in ("lstm", "gru", "rnn") or any(o.record.op in _RNN_CELLS for o in ops):
        out += _rnn(ops, ctx)
    if any(o.record.op == "aten.embedding_dense_backward" for o in ops):
        out += _embedding(ops, ctx)
    return [f for f in out if f.saving_s > 0]


def step_findings(ctx: Context) -> list[Finding]:
    """The rules whose change is model-wide (channels-last), with a positive saving."""
    return [f for f in _channels_last(ctx) if f.saving_s > 0]

