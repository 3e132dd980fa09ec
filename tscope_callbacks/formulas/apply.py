"""The one entry point the capture engine calls for every aten op: ``count_op``.

It runs inside a TorchDispatchMode for every op of a training step, so it does one cheap loop over the
arguments (no pytree), and everything that depends only on the op (schema alias/mutation info, the formula) is
cached per ``OpOverload``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import torch

from tscope_callbacks.formulas.bytes import generic_bytes, op_plan, split_io, unique_bytes
from tscope_callbacks.formulas.registry import DEFAULT_REGISTRY, FormulaRegistry

__all__ = ["OpCount", "count_op", "formula_errors", "clear_formula_errors"]

log = logging.getLogger(__name__)

_Tensor = torch.Tensor
_Size = torch.Size


@dataclass(slots=True)
class OpCount:
    """What one op call costs."""

    flops: int  #: a multiply-add counts 2
    bytes_read: int  #: ideal lower bound (see ``formulas.bytes``)
    bytes_written: int
    category: str  #: one of ``records.CATEGORIES``; "other" when the op has no formula
    counted: bool  #: False when no formula exists (or it failed: see ``formula_errors()``)
    dtype: str  #: first floating tensor input, else first tensor input, else output; "" when none
    input_shapes: list = field(default_factory=list)  #: shapes of the tensor inputs in order (lists flattened)
    output_shapes: list = field(default_factory=list)  #: shapes of the returned tensors (lists flattened)
    flops_model: int | None = None  #: MFU's convention where it differs from ``flops`` (attention backward)
    flops_dense: int | None = None  #: the full-square convention for causal attention (None: same as model)
    leading_dims: list | None = None  #: matmuls: each matrix operand's (inputs, then output) leading dimension


def _leading_dims(args: tuple, out: Any) -> list | None:
    """The leading dimension, in elements, of each matrix (>= 2-d tensor) a GEMM reads or writes, as BLAS sees its
    storage: the row stride of a row-major matrix, the column stride of a transposed one (autograd's weight gradient
    reads ``grad_output.t()``: its leading dimension is the layer's output width, whatever the logical shape says).
    None where a matrix is neither (BLAS copies it first) or has a size-1 side."""
    lds = []
    try:
        for t in (*args, out):
            if isinstance(t, _Tensor) and t.dim() >= 2:
                (r, c), (sr, sc) = t.shape[-2:], t.stride()[-2:]
                if r <= 1 or c <= 1:
                    continue
                if sc == 1:
                    lds.append(sr)
                elif sr == 1:
                    lds.append(sc)
                else:
                    return None
    except (RuntimeError, NotImplementedError, TypeError):  # no strides (sparse, nested): layout unknown
        return None
    return lds or None


_MAX_ERRORS = 256
_ERRORS: dict[tuple[str, str], int] = {}


def formula_errors() -> list[tuple[str, str]]:
    """Formula failures seen so far in this process: ``(op overload name, "ExcType: message")``, first seen first.

    A failing formula never propagates: the op is recorded with ``counted=False`` and zero FLOPs (its bytes fall
    back to the generic rule).
    """
    return list(_ERRORS)


def clear_formula_errors() -> None:
    _ERRORS.clear()


def _record_error(func: Any, kind: str, e: BaseException) -> None:
    key = (str(func), f"{kind} {type(e).__name__}: {e}")
    if key in _ERRORS:
        _ERRORS[key] += 1
        return
    if len(_ERRORS) < _MAX_ERRORS:
        _ERRORS[key] = 1
        log.warning("tscope: %s formula for %s failed (%s); recorded as uncounted", kind, key[0], key[1])


#: func -> (registry, registry version, formula, schema plan): one dict lookup per call on the hot path
_HOT: dict[Any, tuple] = {}
_DTYPE_STR: dict[Any, str] = {}


def _dtype_str(t: torch.Tensor | None) -> str:
    if t is None:
        return ""
    d = t.dtype
    s = _DTYPE_STR.get(d)
    if s is None:
        s = _DTYPE_STR[d] = str(d).removeprefix("torch.")
    return s


def _sizes_of_out(out: Any) -> Any:
    if isinstance(out, _Tensor):
        return out.shape
    if isinstance(out, tuple):
        return tuple(_sizes_of_out(o) for o in out)
    if isinstance(out, list):
        return [o.shape if isinstance(o, _Tensor) else o for o in out]
    return out


def _out_shapes(out: Any, acc: list) -> list:
    if isinstance(out, _Tensor):
        acc.append(list(out.shape))
    elif isinstance(out, (tuple, list)):
        for o in out:
            _out_shapes(o, acc)
    return acc


def count_op(
    func: Any,
    args: tuple,
    kwargs: dict | None,
    out: Any,
    registry: FormulaRegistry = DEFAULT_REGISTRY,
    *,
    want_shapes: bool = True,
) -> OpCount:
    """FLOPs, ideal bytes, category, dtype and shapes of one op call (``func(*args, **kwargs) -> out``)."""
    kwargs = kwargs or {}
    hot = _HOT.get(func)
    version = getattr(registry, "version", None)
    if hot is None or hot[0] is not registry or hot[1] != version:
        hot = _HOT[func] = (registry, version, registry.lookup(func), op_plan(func))
    formula = hot[2]
    plan = hot[3]
    flop_fn = formula.flops if formula is not None else None
    generic = not plan.view and (formula is None or (formula.bytes is None and not formula.zero_bytes))

    first = first_float = None
    in_shapes: list = []
    sargs: list | None = [] if flop_fn is not None else None
    for a in args:
        if isinstance(a, _Tensor):
            if first_float is None:
                if first is None:
                    first = a
                if a.is_floating_point():
                    first_float = a
            if want_shapes:
                in_shapes.append(list(a.shape))
            if sargs is not None:
                sargs.append(a.shape)
        elif isinstance(a, (list, tuple)) and a and isinstance(a[0], _Tensor | None):
            sl = []
            for t in a:
                if isinstance(t, _Tensor):
                    if first_float is None:
                        if first is None:
                            first = t
                        if t.is_floating_point():
                            first_float = t
                    if want_shapes:
                        in_shapes.append(list(t.shape))
                    sl.append(t.shape)
                else:
                    sl.append(t)
            if sargs is not None:
                sargs.append(sl)
        elif sargs is not None:
            sargs.append(a)

    skw: dict | None = {} if flop_fn is not None else None
    for k, a in kwargs.items():
        ts = None
        sk = skw is not None and k != "out"  # out= is passed to formulas as the returned value
        if isinstance(a, _Tensor):
            ts = (a,)
            if sk:
                skw[k] = a.shape
        elif isinstance(a, (list, tuple)) and a and isinstance(a[0], _Tensor):
            ts = [t for t in a if isinstance(t, _Tensor)]
            if sk:
                skw[k] = [t.shape if isinstance(t, _Tensor) else t for t in a]
        elif sk:
            skw[k] = a
        if ts is None or k in plan.kw_out:
            continue
        for t in ts:
            if first_float is None:
                if first is None:
                    first = t
                if t.is_floating_point():
                    first_float = t
            if want_shapes:
                in_shapes.append(list(t.shape))

    # ---- FLOPs ----
    fm = fd = None
    if formula is None:
        category = "other"
        counted = False
        flops = 0
    else:
        category = formula.category
        counted = True
        flops = 0
        if flop_fn is not None:
            try:
                raw = flop_fn(*sargs, out=_sizes_of_out(out), **skw)
                flops = int(raw)
                fm, fd = getattr(raw, "model", None), getattr(raw, "dense", None)
            except Exception as e:  # a formula bug must never break the user's step
                _record_error(func, "flop", e)
                counted = False
                flops = 0

    # ---- bytes ----
    if generic:  # the one byte rule (formulas.bytes.split_io)
        reads, writes = split_io(plan, args, kwargs, out)
        br = unique_bytes(reads)
        bw = unique_bytes(writes)
    elif formula is not None and formula.bytes is not None:
        try:
            br, bw = formula.bytes(args, kwargs, out)
        except Exception as e:
            _record_error(func, "bytes", e)
            br, bw = generic_bytes(func, args, kwargs, out)
    else:  # view / metadata / zero_bytes
        br = bw = 0

    if first_float is None and first is None:
        o = out[0] if isinstance(out, (tuple, list)) and out else out
        first = o if isinstance(o, _Tensor) else None
    return OpCount(
        flops,
        int(br),
        int(bw),
        category,
        counted,
        _dtype_str(first_float if first_float is not None else first),
        in_shapes,
        _out_shapes(out, []) if want_shapes else [],
        fm if counted and fm != flops else None,
        fd if counted and fd not in (None, fm if fm is not None else flops) else None,
        _leading_dims(args, out) if category == "matmul" else None,
    )
