"""fvcore-compatible element counting: Tensorscope's ``ElemCountAnalysis``, with real dtypes for bytes.

``ElemCountAnalysis(model, inputs)`` traces ``model(*inputs)`` once with ``torch.jit`` (through fvcore's
``JitModelAnalysis``) and counts, per traced op, the **elements read plus elements written**: the numel of every
tensor input plus every tensor output (Tensorscope's definition). Departures, each one towards what the op really
moves:

- views, reshapes that are views, and metadata ops (``view``, ``transpose``, ``flatten`` of a contiguous tensor,
  ``size``...) move **0 elements**; ``reshape``/``flatten``/``contiguous``/``to`` count a copy only when the trace
  shows one (strides not viewable, or dtype/device changed);
- ``embedding``/``index_select``/``gather`` read the gathered rows (output numel), not the whole table;
- ``copy_``/``fill_``/``zero_`` do not read the tensor they overwrite; ``*_like`` factories read nothing;
- eval-mode ``dropout`` is the identity (0); wrapped Python scalars (0-dim constants) and shape arithmetic
  (``x.size(0) * x.size(1)``) are not tensors of the model and count 0.

Ops without a handle are reported by ``unsupported_ops()`` (fvcore semantics), never silently dropped: unlike
fvcore, relu/dropout/cat/copy_... are counted, only the zero-movement ops in :data:`ZERO_OPS` are ignored. Bytes
use each traced value's own scalar type; ``dtype`` is the fallback for values of unknown type (and your own
``set_op_handle`` handles), or, with ``cast=True``, the size of every floating-point tensor (bf16 from an fp32 trace).
"""

from __future__ import annotations

import contextvars
from collections import Counter
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

try:  # fvcore is an optional extra: importing this module works without it, constructing the analysis does not
    from fvcore.nn.jit_analysis import JitModelAnalysis as _Base

    _FVCORE_ERROR: ImportError | None = None
except ImportError as _e:  # pragma: no cover - exercised in a subprocess test
    _Base = object  # type: ignore[assignment,misc]
    _FVCORE_ERROR = _e

__all__ = ["ElemCountAnalysis", "ZERO_OPS", "SUPPORTED_OPS", "elem_count_handle"]

Value = Any  # torch._C.Value (not annotated by torch)
Flow = tuple[str, int, torch.dtype | None]  # ("r" | "w", numel, dtype or None when unknown)
Rule = Callable[[list, list, "_Recorder"], list[Flow]]

#: Ops that move no data (views, metadata, shape queries, uninitialised allocation): ignored like fvcore ignores.
ZERO_OPS: frozenset[str] = frozenset(
    "aten::" + n
    for n in (
        "view view_as transpose t permute squeeze unsqueeze squeeze_ unsqueeze_ expand expand_as select slice "
        "narrow split split_with_sizes chunk unbind unsafe_chunk unsafe_split alias detach detach_ movedim "
        "swapaxes swapdims diagonal as_strided unfold view_as_real view_as_complex real imag numpy_T mT "
        "size numel dim stride Int Float Bool IntImplicit FloatImplicit ScalarImplicit is_floating_point "
        "empty empty_like new_empty empty_strided requires_grad_ lift_fresh"
    ).split()
)

_CONV = ("_convolution", "convolution", "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d",
         "conv_transpose3d")
_GENERIC = (
    # matmul family and convolution (fvcore's default FLOP handles cover these)
    "addmm addmm_ bmm baddbmm mm mv dot matmul linear einsum addmv addbmm "
    # norms, pooling, resampling
    "batch_norm group_norm layer_norm instance_norm rms_norm max_pool1d max_pool2d max_pool3d "
    "max_pool2d_with_indices avg_pool1d avg_pool2d avg_pool3d adaptive_avg_pool1d adaptive_avg_pool2d "
    "adaptive_avg_pool3d adaptive_max_pool1d adaptive_max_pool2d upsample_nearest1d upsample_nearest2d "
    "upsample_nearest3d upsample_bilinear2d upsample_bicubic2d upsample_trilinear3d grid_sampler pixel_shuffle "
    # pointwise (+ in-place: the argument is read and written)
    "add add_ sub sub_ rsub mul mul_ div div_ neg neg_ pow pow_ sqrt rsqrt exp exp_ log log1p tanh tanh_ sigmoid "
    "sigmoid_ relu relu_ relu6 gelu silu silu_ mish hardtanh hardtanh_ hardswish hardswish_ hardsigmoid "
    "leaky_relu leaky_relu_ elu elu_ softplus clamp clamp_ clamp_min clamp_min_ clamp_max abs erf sin cos "
    "reciprocal floor ceil round trunc floor_divide remainder fmod where masked_fill masked_fill_ lerp "
    "eq ne lt le gt ge logical_not logical_and logical_or __and__ __or__ bitwise_not minimum maximum "
    "softmax log_softmax _softmax "
    # reductions
    "sum mean amax amin max min argmax argmin var std norm linalg_vector_norm cumsum prod logsumexp "
    "topk sort any all "
    # memory: copies, concatenation, indexing, padding
    "cat stack clone repeat tile constant_pad_nd pad reflection_pad2d replication_pad2d roll flip tril triu "
    "index index_put_ scatter scatter_ scatter_add masked_select "
    # attention, losses, factories (write their output)
    "scaled_dot_product_attention cross_entropy_loss nll_loss mse_loss l1_loss smooth_l1_loss "
    "binary_cross_entropy binary_cross_entropy_with_logits zeros ones full arange linspace rand randn randint "
    "bernoulli bernoulli_"
).split()


def _is_tensor(v: Value) -> bool:
    return isinstance(v.type(), torch.TensorType)


class _Recorder:
    """Per-analysis scratch: the per-node flows (for bytes) and a memo of shape-arithmetic values."""

    def __init__(self) -> None:
        self.records: list[tuple[str, str, list[Flow]]] = []  # (scopeName, op name, flows)
        self.shape_memo: dict[int, bool] = {}

    def is_shape_value(self, v: Value) -> bool:
        """True for 0-dim tensors that are trace artefacts: wrapped Python scalars and ``x.size(0) * 2``."""
        key = v.unique()
        hit = self.shape_memo.get(key)
        if hit is None:
            hit = False
            node = v.node()
            kind = node.kind()
            if v.type().dim() == 0:
                if kind in ("prim::NumToTensor", "prim::Constant"):
                    hit = True
                elif kind.startswith("aten::"):
                    ts = [i for i in node.inputs() if _is_tensor(i)]
                    hit = bool(ts) and all(self.is_shape_value(i) for i in ts)
            self.shape_memo[key] = hit
        return hit

    def tensors(self, values: list[Value]) -> list[Value]:
        """Tensor values among ``values`` (lists built by ``prim::ListConstruct`` expanded), trace artefacts dropped."""
        out: list[Value] = []
        for v in values:
            if _is_tensor(v):
                if not self.is_shape_value(v):
                    out.append(v)
            elif isinstance(v.type(), torch.ListType) and v.node().kind() == "prim::ListConstruct":
                out.extend(self.tensors(list(v.node().inputs())))
        return out


_RECORDER: contextvars.ContextVar[_Recorder | None] = contextvars.ContextVar("tscope_elemcount", default=None)


def _flow(direction: str, v: Value, numel: int | None = None) -> Flow:
    ty = v.type()
    if numel is None:
        sizes = ty.sizes()
        numel = 0 if sizes is None else int(torch.Size(sizes).numel())
    return (direction, numel, ty.dtype())


def _same_layout(a: Value, b: Value) -> bool:
    ta, tb = a.type(), b.type()
    return (ta.sizes(), ta.strides(), ta.dtype(), ta.device()) == (tb.sizes(), tb.strides(), tb.dtype(), tb.device())


def _viewable(src: Value, out: Value) -> bool:
    """Whether ``reshape(src) -> out`` can be a view (eager reshape copies exactly when ``view`` would fail)."""
    ti, to = src.type(), out.type()
    if ti.sizes() is None or ti.strides() is None or to.sizes() is None:
        return True
    try:
        torch.empty_strided(ti.sizes(), ti.strides(), device="meta").view(to.sizes())
    except RuntimeError:
        return False
    return True


def _generic(ins: list, outs: list, r: _Recorder) -> list[Flow]:
    return [_flow("r", v) for v in r.tensors(ins)] + [_flow("w", v) for v in r.tensors(outs)]


def _write_only(ins: list, outs: list, r: _Recorder) -> list[Flow]:
    return [_flow("w", v) for v in r.tensors(outs)]


def _overwrite(ins: list, outs: list, r: _Recorder) -> list[Flow]:
    """``copy_(self, src)``/``fill_``/``zero_``: ``self`` is written, not read."""
    return [_flow("r", v) for v in r.tensors(ins[1:])] + _write_only(ins, outs, r)


def _copy_if_changed(ins: list, outs: list, r: _Recorder) -> list[Flow]:
    """``to``/``type_as``/``contiguous``: a copy only when dtype, device or layout changed (else returns self)."""
    src = r.tensors(ins[:1])
    if not src or not outs or _same_layout(src[0], outs[0]):
        return []
    return [_flow("r", src[0]), _flow("w", outs[0])]


def _reshape(ins: list, outs: list, r: _Recorder) -> list[Flow]:
    """``reshape``/``flatten``/``unflatten``: 0 when a view, else one copy."""
    src = r.tensors(ins[:1])
    if not src or not outs or _viewable(src[0], outs[0]):
        return []
    return [_flow("r", src[0]), _flow("w", outs[0])]


def _gather(src_i: int, idx_i: int) -> Rule:
    """Reads the index and the gathered rows (output numel at the source's dtype), writes the output."""

    def rule(ins: list, outs: list, r: _Recorder) -> list[Flow]:
        src, out = ins[src_i], outs[0]
        n = _flow("w", out)[1]
        return [_flow("r", ins[idx_i]), ("r", n, src.type().dtype()), _flow("w", out)]

    return rule


def _dropout(ins: list, outs: list, r: _Recorder) -> list[Flow]:
    """``dropout(x, p, train)``: the identity when ``train`` is False or ``p == 0`` (traced as constants)."""
    p, train = (v.toIValue() if v.node().kind() == "prim::Constant" else None for v in ins[1:3])
    if train is False or p == 0:
        return []
    return _generic(ins, outs, r)


def _op_name(kind: str) -> str:
    """The key used in ``by_operator()``: fvcore's (``conv`` for convolutions, else the name without ``aten::``)."""
    name = kind.split("::", 1)[-1]
    return "conv" if name in _CONV else name


class _Handle:
    """An fvcore handle: ``(inputs, outputs) -> Counter({op: elements})``; records the flows for bytes."""

    def __init__(self, rule: Rule) -> None:
        self.rule = rule

    def __call__(self, inputs: list, outputs: list) -> Counter[str]:
        rec = _RECORDER.get() or _Recorder()
        node = outputs[0].node() if outputs else None
        kind = node.kind() if node is not None else "unknown"
        flows = self.rule(inputs, outputs, rec)
        name = _op_name(kind)
        rec.records.append((node.scopeName() if node is not None else "", name, flows))
        return Counter({name: sum(f[1] for f in flows)})


def elem_count_handle(rule: Rule = _generic) -> _Handle:
    """A handle for ``set_op_handle``; the default rule reads every tensor input and writes every tensor output."""
    return _Handle(rule)


_RULES: dict[str, Rule] = {n: _generic for n in (*_GENERIC, *_CONV)}
_RULES.update(
    {n: _write_only for n in "zeros_like ones_like full_like rand_like randn_like new_zeros new_ones new_full".split()}
)
_RULES.update({n: _overwrite for n in ("copy_", "fill_", "zero_")})
_RULES.update(
    {
        n: _copy_if_changed
        for n in ("to", "type_as", "contiguous", "_autocast_to_reduced_precision", "_autocast_to_full_precision")
    }
)
_RULES.update({n: _reshape for n in ("reshape", "reshape_as", "flatten", "unflatten")})
_RULES.update(embedding=_gather(0, 1), index_select=_gather(0, 2), gather=_gather(0, 2), dropout=_dropout)
_RULES.update(feature_dropout=_dropout, alpha_dropout=_dropout)

#: ``"aten::op" -> handle`` for every op with a built-in rule.
SUPPORTED_OPS: dict[str, _Handle] = {f"aten::{n}": _Handle(rule) for n, rule in _RULES.items()}

_PRECISION_BYTES = {
    **dict.fromkeys(("fp64", "float64", "double", "64", "64-true"), 8),
    **dict.fromkeys(("fp32", "float32", "float", "tf32", "32", "32-true", "int32"), 4),
    **dict.fromkeys(
        ("fp16", "float16", "half", "16", "16-mixed", "16-true", "bf16", "bfloat16", "bf16-mixed", "bf16-true"), 2
    ),
    **dict.fromkeys(("fp8", "int8", "uint8", "8"), 1),
    "int64": 8,
}


def _itemsize(precision_or_dtype: str | torch.dtype | None) -> int | None:
    """Bytes per element of a torch dtype or a precision name (``"fp32"``, ``"bf16"``, ``"16-mixed"``...)."""
    if precision_or_dtype is None or isinstance(precision_or_dtype, torch.dtype):
        return None if precision_or_dtype is None else precision_or_dtype.itemsize
    key = str(precision_or_dtype).lower().removeprefix("torch.")
    if key not in _PRECISION_BYTES:
        raise ValueError(
            f"unknown precision {precision_or_dtype!r}; use a torch.dtype or one of {sorted(_PRECISION_BYTES)}"
        )
    return _PRECISION_BYTES[key]


class ElemCountAnalysis(_Base):  # type: ignore[misc,valid-type]
    """Elements read + written per op, per module, per operator (fvcore API), and the bytes they make.

    >>> elems = ElemCountAnalysis(model, (torch.randn(32, 3, 224, 224),))
    >>> elems.total(); elems.by_module(); elems.by_operator(); elems.unsupported_ops()
    >>> elems.total_bytes()              # each traced value at its own dtype
    >>> elems.total_bytes("bf16", cast=True)   # every floating tensor taken as bf16

    The trace runs ``model`` forward once (train-mode BatchNorm updates its running stats, as with fvcore).
    Add or replace handles with ``set_op_handle(name, handle)``; ``elem_count_handle()`` builds one.
    """

    def __init__(self, model: nn.Module, inputs: torch.Tensor | tuple[Any, ...]) -> None:
        if _FVCORE_ERROR is not None:
            raise ImportError(
                "ElemCountAnalysis needs fvcore: pip install 'tscope-callbacks[fvcore]'"
            ) from _FVCORE_ERROR
        super().__init__(model=model, inputs=inputs)
        self._records: list[tuple[str, str, list[Flow]]] = []
        self.clear_op_handles()

    # ---------------- fvcore surface ----------------
    def clear_op_handles(self) -> ElemCountAnalysis:
        """Back to the built-in handles, with only the zero-movement :data:`ZERO_OPS` ignored."""
        super().clear_op_handles()
        self._ignored_ops = set(ZERO_OPS)
        self._op_handles = dict(SUPPORTED_OPS)
        return self

    def unsupported_ops(self, module_name: str = "") -> Counter[str]:
        """Ops seen in the trace that have no handle (runs the analysis first if needed)."""
        self._analyze()
        return super().unsupported_ops(module_name)

    def copy(self, new_model: nn.Module | None = None, new_inputs: Any = None) -> ElemCountAnalysis:
        """A copy with the same handles and settings, on a new model or new inputs."""
        new = ElemCountAnalysis(
            self._model if new_model is None else new_model, self._inputs if new_inputs is None else new_inputs
        )
        new._op_handles, new._ignored_ops = dict(self._op_handles), set(self._ignored_ops)
        new.unsupported_ops_warnings(self._enable_warn_unsupported_ops)
        new.uncalled_modules_warnings(self._enable_warn_uncalled_mods)
        return new.tracer_warnings(self._warn_trace).ancestor_mode(self._ancestor_mode)

    def _analyze(self) -> Any:
        if self._stats is not None:
            return self._stats
        rec = _Recorder()
        token = _RECORDER.set(rec)
        try:
            stats = super()._analyze()
        finally:
            _RECORDER.reset(token)
        self._records = rec.records
        return stats

    # ---------------- bytes ----------------
    def bytes_by_module_and_operator(
        self, dtype: str | torch.dtype | None = None, *, cast: bool = False, direction: str = "rw"
    ) -> dict[str, Counter[str]]:
        """Bytes per module and operator. ``dtype``: fallback size (or, with ``cast``, every float tensor's size).

        ``direction``: ``"rw"`` (read + written), ``"r"`` or ``"w"``. Raises ValueError when some elements have
        no known dtype and no ``dtype`` was given.
        """
        stats = self._analyze()
        size = _itemsize(dtype)
        if cast and size is None:
            raise ValueError("cast=True needs a dtype or precision")
        out: dict[str, Counter[str]] = {name: Counter() for name in stats.counts}
        seen: dict[str, Counter[str]] = {name: Counter() for name in stats.counts}
        for scope, op, flows in self._records:
            nbytes = 0
            for d, n, dt in flows:
                if d in direction and n:
                    s = size if dt is None or (cast and dt.is_floating_point) else dt.itemsize
                    if s is None:
                        raise ValueError(f"{n} elements of {op} have no traced dtype; pass dtype=...")
                    nbytes += n * s
            elems = sum(f[1] for f in flows)
            for name in self._ancestors(scope):
                out[name][op] += nbytes
                seen[name][op] += elems
        if direction == "rw":  # elements from handles that record no flows (your own set_op_handle ones)
            for name, ctr in stats.counts.items():
                for op, n in ctr.items():
                    extra = n - seen[name][op]
                    if extra > 0:
                        if size is None:
                            raise ValueError(f"{extra} elements of {op} come from a custom handle; pass dtype=...")
                        out[name][op] += extra * size
        return {name: +ctr for name, ctr in out.items()}

    def bytes_by_operator(
        self, module_name: str = "", dtype: str | torch.dtype | None = None, *, cast: bool = False
    ) -> Counter[str]:
        """Bytes of one module (default the whole model), by operator."""
        return self.bytes_by_module_and_operator(dtype, cast=cast)[self.canonical_module_name(module_name)]

    def bytes_by_module(self, dtype: str | torch.dtype | None = None, *, cast: bool = False) -> Counter[str]:
        """Bytes per module path (``""`` is the whole model)."""
        return Counter({m: sum(c.values()) for m, c in self.bytes_by_module_and_operator(dtype, cast=cast).items()})

    def total_bytes(self, dtype: str | torch.dtype | None = None, module_name: str = "", *, cast: bool = False) -> int:
        """Bytes read + written by one module (default the whole model), each value at its traced dtype."""
        return sum(self.bytes_by_operator(module_name, dtype, cast=cast).values())

    def bytes(self, precision_or_dtype: str | torch.dtype | None = None, *, cast: bool = False) -> int:
        """Model total bytes (Tensorscope's elements x precision when ``cast=True``)."""
        return self.total_bytes(precision_or_dtype, cast=cast)

    def bytes_read_written(
        self, dtype: str | torch.dtype | None = None, module_name: str = "", *, cast: bool = False
    ) -> tuple[int, int]:
        """``(bytes_read, bytes_written)`` of one module, for comparison with the dispatch engine's records."""
        name = self.canonical_module_name(module_name)
        return tuple(  # type: ignore[return-value]
            sum(self.bytes_by_module_and_operator(dtype, cast=cast, direction=d)[name].values()) for d in "rw"
        )

    def _ancestors(self, scope: str) -> set[str]:
        names = scope.split("/")
        return set(names) if self._ancestor_mode == "caller" else self._get_all_ancestors(names[-1])
