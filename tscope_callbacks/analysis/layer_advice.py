"""Advice by layer type, where a change in the user's code predicts a saving (``analysis.advice`` calls
:func:`layer_findings` per layer). Each rule names the change and the saving computed from the step's own records,
or says nothing:

- convolution: ``channels_last`` (the NCHW <-> NHWC conversions around each conv: its activations read and written
  once more, at the bandwidth), ``cudnn.benchmark`` (CUDA convs above what their shapes take, with the autotuner
  off: measured - expected), channel counts (CUDA 16-bit convs off the tensor cores with channels not a multiple of
  8: measured - the padded conv at the tensor-core roof);
- BatchNorm followed by an activation: fused (``torch.compile``), the normalised tensor is neither written nor read
  back, forward and backward (2 x its bytes each way, at most the activation's time);
- max pooling: an activation before it runs on the pooled tensor instead (``pool(relu(x)) == relu(pool(x))``: its
  forward and backward time x (1 - out/in elements)); the 8-byte indices kept for the backward become Inductor's
  1-byte offsets under ``torch.compile`` (7/8 of their bytes, written and read);
- LSTM/GRU on CUDA: cuDNN's fused RNN not used (per-time-step cell ops: measured - the same work at its roofline
  bound); a hidden size off a multiple of 8 keeping 16-bit RNN GEMMs off the tensor cores (measured - padded at the
  tensor-core roof);
- embeddings: a dense gradient of a table much larger than the rows a step looks up (``sparse=True``: the
  gradient covers the looked-up rows: (V - n) x D x itemsize bytes not written).
"""

from __future__ import annotations

import math
from typing import Any

from tscope_callbacks.analysis.fmt import n as _n
from tscope_callbacks.analysis.rows import OpRoof
from tscope_callbacks.analysis.view import RooflineView

__all__ = ["layer_findings", "ACTIVATIONS", "ACTIVATION_BACKWARDS", "MONOTONE"]

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
_MAXPOOL = frozenset({"aten.max_pool2d_with_indices", "aten.max_pool3d_with_indices"})
_RNN_CELLS = frozenset({"aten._thnn_fused_lstm_cell", "aten._thnn_fused_gru_cell", "aten.lstm_cell",
                        "aten.gru_cell"})
SLOW_RATIO = 1.5


def _numel(shape: Any) -> int:
    return math.prod(shape) if isinstance(shape, (list, tuple)) and all(isinstance(d, int) for d in shape) else 0


def _ms(s: float) -> str:
    return f"{s * 1e3:.3g} ms"


def _pad8(c: int) -> int:
    return -(-c // 8) * 8


class Context:
    """What the rules look at besides a layer's own ops: the step's ops in execution order, the profile's labels."""

    def __init__(self, report: RooflineView) -> None:
        self.meta = report.meta
        self.seq = sorted((o for o in report.op_roofs if o.record.category != "view"), key=lambda o: o.record.index)
        self.pos = {o.record.index: i for i, o in enumerate(self.seq)}
        self.cuda = str(self.meta.get("device", "")).startswith("cuda") or str(
            self.meta.get("timing", "")).startswith("cuda")
        self.compiled = bool(self.meta.get("compiled_modules_run_eagerly") or self.meta.get("compiled_capture"))
        self.kernel_model = getattr(report, "kernel_model", None)  #: expectations beyond the roofline bound

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


def _t(o: OpRoof | None) -> float:
    return (o.measured_s or 0.0) if o is not None else 0.0


# ---------------- convolution ----------------
def _act_bytes(o: OpRoof) -> int:
    """Bytes of a conv's activations (not its weights): forward input and output; backward grad_output, input and
    grad_input."""
    r, item = o.record, _ITEM.get(o.record.dtype, 4)
    ins = r.input_shapes[:2] if r.op == "aten.convolution_backward" else r.input_shapes[:1]
    shapes = [s for s in [*ins, *r.output_shapes[:1]] if isinstance(s, (list, tuple)) and len(s) == 4]
    return item * sum(_numel(s) for s in shapes)


def _conv(ops: list[OpRoof], ctx: Context) -> list[tuple]:
    convs = [o for o in ops if o.record.category == "conv" and o.measured_s]
    if not convs:
        return []
    out = []
    four = [o for o in convs if _act_bytes(o)]
    tensor_cores = any(o.roof_precision in ("bf16", "fp16", "tf32") for o in four)
    if four and ctx.meta.get("conv_channels_last") is False and (tensor_cores or not ctx.cuda):
        moved = sum(2 * _act_bytes(o) for o in four)
        saving = sum(min(o.measured_s, 2 * _act_bytes(o) / o.bandwidth) for o in four)
        lib = "cuDNN's tensor-core kernels" if ctx.cuda else "oneDNN"
        out.append(("channels_last", saving,
                    f"{len(four)} convolutions take NCHW (channels-first) tensors, which {lib} convert to and from "
                    f"channels-last around each call: {_n(moved / 1e6)} MB read and written again, {_ms(saving)} at "
                    f"{four[0].bandwidth / 1e9:.4g} GB/s",
                    "convert the model and its inputs to channels-last: `model = model.to(memory_format="
                    "torch.channels_last)` and `x = x.to(memory_format=torch.channels_last)` in the step",
                    {"convs": len(four), "mb": moved / 1e6}))
    if ctx.cuda and ctx.meta.get("cudnn_benchmark") is False and ctx.kernel_model is not None:
        slow = [o for o in convs if o.measured_s > SLOW_RATIO * o.expected_s]
        if slow:
            now, exp = sum(o.measured_s for o in slow), sum(o.expected_s for o in slow)
            out.append(("cudnn_benchmark", now - exp,
                        f"{len(slow)} convolutions take {_ms(now)} where these shapes take {_ms(exp)} on this device "
                        f"({now / exp:.1f}x) and cuDNN's autotuner is off (`torch.backends.cudnn.benchmark` is "
                        "False): its default algorithm choice is slow for these shapes",
                        "`torch.backends.cudnn.benchmark = True` (Lightning: `Trainer(benchmark=True)`) with fixed "
                        "input shapes: cuDNN times its algorithms once per shape and keeps the fastest",
                        {"convs": len(slow)}))
    if ctx.cuda:
        fwd = next((o for o in convs if o.record.op == "aten.convolution"), None)
        shapes = fwd.record.input_shapes if fwd is not None else []
        if (fwd is not None and len(shapes) >= 2 and len(shapes[0]) == 4 and len(shapes[1]) == 4
                and fwd.roof_precision in ("bf16", "fp16")):
            cin, cout = shapes[0][1], shapes[1][0]
            bad = [c for c in (cin, cout) if c > 4 and c % 8]
            off = [o for o in convs if o.record.tensor_core is False]
            if bad and off:
                ratio = (_pad8(cin) / cin if cin in bad else 1.0) * (_pad8(cout) / cout if cout in bad else 1.0)
                now = sum(o.measured_s for o in off)
                after = sum(max(o.flops * ratio / o.peak, o.bytes * ratio / o.bandwidth) for o in off)
                chans = " and ".join(f"{c} -> {_pad8(c)}" for c in bad)
                out.append(("conv_channels", now - after,
                            f"channels {', '.join(str(c) for c in bad)} are not a multiple of 8, so {len(off)} "
                            f"{fwd.roof_precision} convolutions ran off the tensor cores (kernel names): {_ms(now)}; "
                            f"padded ({chans}) at the tensor-core roof about {_ms(after)}",
                            f"choose channel counts that are multiples of 8 ({chans}) in this layer and its "
                            "neighbours", {"channels": bad}))
    return out


# ---------------- BatchNorm ----------------
def _batchnorm(ops: list[OpRoof], ctx: Context) -> list[tuple]:
    if ctx.compiled:
        return []
    saving, pairs, moved = 0.0, 0, 0
    for bn in (o for o in ops if o.record.op in _BN and o.record.phase == "forward"):
        act = ctx.after(bn)
        if act is None or act.record.op not in ACTIVATIONS or act.record.input_shapes[:1] != bn.record.output_shapes[:1]:
            continue
        nxt = ctx.after(act)
        if act.record.op in MONOTONE and nxt is not None and nxt.record.op in _MAXPOOL:
            continue  # the pooling rule moves this activation after the pool
        b = _ITEM.get(bn.record.dtype, 4) * _numel(bn.record.output_shapes[0])
        bwd = ctx.backward_of(act)
        saving += min(_t(act), 2 * b / act.bandwidth) + min(_t(bwd), 2 * b / act.bandwidth)
        moved += 2 * b * (2 if bwd is not None else 1)
        pairs += 1
    if not pairs:
        return []
    return [("bn_fusion", saving,
             f"BatchNorm's output is written and read back by the activation after it ({pairs} pair(s), forward and "
             f"backward): {_n(moved / 1e6)} MB that a fused kernel never moves, {_ms(saving)}",
             "`torch.compile` the model (Inductor fuses BatchNorm with the activation after it, forward and backward); "
             "for inference, fold BatchNorm into the preceding convolution", {"pairs": pairs, "mb": moved / 1e6})]


# ---------------- pooling ----------------
def _pooling(ops: list[OpRoof], ctx: Context) -> list[tuple]:
    out = []
    for pool in (o for o in ops if o.record.op in _MAXPOOL and o.record.phase == "forward"):
        n_in, n_out = _numel(pool.record.input_shapes[0]), _numel(pool.record.output_shapes[0])
        if not n_in or not n_out:
            continue
        act = ctx.before(pool)
        if act is not None and act.record.op in MONOTONE and act.record.output_shapes[:1] == pool.record.input_shapes[:1]:
            bwd = ctx.backward_of(act)
            now = _t(act) + _t(bwd)
            saving = now * (1 - n_out / n_in)
            name = act.record.op.removeprefix("aten.").rstrip("_")
            out.append(("pool_order", saving,
                        f"`{act.record.layer or '(root)'}` applies {name} to the {n_in:,} elements max pooling "
                        f"then reduces to {n_out:,}; {name} is monotonic, so applied after the pooling it and its "
                        f"backward touch {n_in / n_out:.3g}x fewer elements: {_ms(now)} -> {_ms(now - saving)}",
                        f"apply the {name} after the pooling: `pool(relu(x))` equals `relu(pool(x))` for max pooling",
                        {"elements_in": n_in, "elements_out": n_out}))
        idx = pool.record.output_shapes[1] if len(pool.record.output_shapes) > 1 else None
        if idx and not ctx.compiled:
            b = 8 * _numel(idx)
            bwd = next((o for o in ops if o.record.phase == "backward" and "max_pool" in o.record.op), None)
            saving = min(_t(pool) + _t(bwd), 2 * b * 7 / 8 / pool.bandwidth)
            out.append(("pool_indices", saving,
                        f"max pooling keeps {_numel(idx):,} int64 indices for its backward ({_n(b / 1e6)} MB written, "
                        f"read again in backward); 1-byte window offsets move 1/8 of that: {_ms(saving)} less",
                        "`torch.compile` the model: Inductor's max pooling stores int8 offsets within each window "
                        "instead of int64 indices", {"mb": b / 1e6}))
    return out


# ---------------- LSTM / GRU ----------------
def _rnn(ops: list[OpRoof], ctx: Context) -> list[tuple]:
    if not ctx.cuda:
        return []  # CPU: oneDNN runs LSTM fused; a GRU has no fused CPU kernel a change in the user's code selects
    out = []
    fused = [o for o in ops if o.record.op in ("aten._cudnn_rnn", "aten._cudnn_rnn_backward", "aten.miopen_rnn")]
    cells = [o for o in ops if o.record.op in _RNN_CELLS]
    if cells and not fused:
        now = sum(_t(o) for o in ops)
        after = sum(o.estimate_s for o in ops)
        out.append(("rnn_cudnn", now - after,
                    f"the recurrent layer ran as {len(cells)} per-time-step cell ops ({len(ops)} ops, {_ms(now)}), "
                    f"not cuDNN's fused RNN; the same work at its roofline bound takes {_ms(after)}",
                    "let cuDNN run it: `torch.backends.cudnn.enabled = True`, CUDA fp16/bf16/fp32 tensors, and "
                    "`rnn.flatten_parameters()` after moving or wrapping the module", {"cells": len(cells)}))
    off = [o for o in fused if o.record.tensor_core is False and o.roof_precision in ("bf16", "fp16")]
    hidden = next((o.record.output_shapes[0][-1] for o in fused if o.record.output_shapes
                   and isinstance(o.record.output_shapes[0], (list, tuple)) and o.record.output_shapes[0]), None)
    if off and isinstance(hidden, int) and hidden % 8:
        ratio = _pad8(hidden) / hidden
        now = sum(_t(o) for o in off)
        after = sum(max(o.flops * ratio / o.peak, o.bytes * ratio / o.bandwidth) for o in off)
        out.append(("rnn_hidden", now - after,
                    f"hidden size {hidden} is not a multiple of 8, so {len(off)} {off[0].roof_precision} RNN calls ran "
                    f"off the tensor cores: {_ms(now)}; at hidden size {_pad8(hidden)} on the tensor-core roof about "
                    f"{_ms(after)}", f"hidden_size={_pad8(hidden)} (a multiple of 8; the input size too)",
                    {"hidden": hidden}))
    return out


# ---------------- embeddings ----------------
def _embedding(ops: list[OpRoof], ctx: Context) -> list[tuple]:
    out = []
    for o in ops:
        r = o.record
        if r.op != "aten.embedding_dense_backward" or not r.output_shapes or len(r.input_shapes) < 2:
            continue
        table = r.output_shapes[0]
        n = _numel(r.input_shapes[1])
        if len(table) != 2 or not n or table[0] < 4 * n:
            continue
        v, d = table
        saving = min(_t(o), (v - n) * d * _ITEM.get(r.dtype, 4) / o.bandwidth)
        out.append(("embedding_sparse", saving,
                    f"the embedding's gradient is a dense {v:,} x {d} table although the step looks up {n:,} rows: "
                    f"{_n((v - n) * d * _ITEM.get(r.dtype, 4) / 1e6)} MB of zero rows written, {_ms(saving)}",
                    "`nn.Embedding(..., sparse=True)` with `torch.optim.SparseAdam` (or SGD) for its weight: the "
                    "gradient and the optimizer update then cover the looked-up rows only (the optimizer's saving "
                    "comes on top)", {"rows": v, "looked_up": n}))
    return out


def layer_findings(layer: str, ops: list[OpRoof], layer_type: str, ctx: Context) -> list[tuple]:
    """Findings ``(kind, saving_s, cause, fix, evidence)`` of the layer-type rules for one layer's ops."""
    t = layer_type.lower()
    out: list[tuple] = []
    if any(o.record.category == "conv" for o in ops):
        out += _conv(ops, ctx)
    if "batchnorm" in t or any(o.record.op in _BN for o in ops):
        out += _batchnorm(ops, ctx)
    if any(o.record.op in _MAXPOOL for o in ops):
        out += _pooling(ops, ctx)
    if t in ("lstm", "gru", "rnn") or any(o.record.op in _RNN_CELLS for o in ops):
        out += _rnn(ops, ctx)
    if any(o.record.op == "aten.embedding_dense_backward" for o in ops):
        out += _embedding(ops, ctx)
    return [f for f in out if f[1] > 0]
