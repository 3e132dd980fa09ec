"""The generic ideal-bytes rule: the lower bound of memory traffic an op needs.

- every tensor input is read once and every fresh output written once, each at its own dtype;
- a tensor's bytes are the storage elements it actually references: ``min(prod(sizes of dims with non-zero
  stride), span)`` where ``span = 1 + sum((size - 1) * stride)`` — so a stride-0 broadcast bias counts its real
  storage and an overlapping ``as_strided`` view counts no more than the memory it covers;
- tensors on the same storage (the same tensor twice, ``x`` and ``x.t()``) are counted once: per storage, the
  smaller of the summed tensor bytes and the union of their byte extents;
- an argument the schema marks as written (``Tensor(a!)``) is read *and* written, except ``out=`` arguments
  (keyword-only written arguments), which are only written; a returned alias of an input (in-place result,
  ``out=`` result, view) is not counted again;
- Python scalars and None move 0 bytes; tensor lists (foreach, cat) count element-wise.

Family modules reuse ``tensor_bytes``/``unique_bytes`` for their byte overrides (gathers, write-only fills).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from tscope_callbacks.formulas.intervals import union_length

__all__ = [
    "OpPlan",
    "op_plan",
    "tensor_bytes",
    "unique_bytes",
    "split_io",
    "fresh_outputs",
    "generic_bytes",
    "tensors_in",
    "copy_bytes",
    "write_only_bytes",
    "storage_id",
]

_Tensor = torch.Tensor


def tensor_bytes(t: torch.Tensor) -> int:
    """Ideal bytes of one tensor: storage elements it references times its element size."""
    try:
        if t.is_contiguous():
            return t.nbytes
        if t.numel() == 0:
            return 0
        distinct = 1
        span = 1
        for s, st in zip(t.shape, t.stride()):
            if st:
                distinct *= s
                span += (s - 1) * abs(st)
        return min(distinct, span) * t.element_size()
    except (RuntimeError, NotImplementedError):  # sparse / nested / opaque layouts: dense size
        return t.numel() * t.element_size()


def _extent(t: torch.Tensor) -> tuple[int, int]:
    """Byte range [start, end) of the storage a tensor can touch."""
    item = t.element_size()
    start = t.storage_offset() * item
    span = 1
    for s, st in zip(t.shape, t.stride()):
        span += (s - 1) * abs(st)
    return start, start + span * item


def _storage_id_fn() -> Any:
    """The fastest storage identity this torch offers: ``torch._C._storage_id(t)`` (the storage's address, as
    ``t.untyped_storage()._cdata`` but without building a storage object), else the latter."""
    sid = getattr(torch._C, "_storage_id", None)
    try:
        t = torch.empty(2)
        if sid is not None and sid(t) == t.untyped_storage()._cdata == sid(t[1:]):
            return sid
    except Exception:
        pass
    return lambda t: t.untyped_storage()._cdata


storage_id = _storage_id_fn()  #: the storage's identity (its address) of a tensor


def _storage_key(t: torch.Tensor) -> Any:
    try:
        return storage_id(t)
    except (RuntimeError, NotImplementedError, AttributeError, TypeError):
        return id(t)


def unique_bytes(ts: list) -> int:
    """Summed ideal bytes of tensors, counting memory shared between them once."""
    n = len(ts)
    if n == 0:
        return 0
    if n == 1:
        return tensor_bytes(ts[0])
    try:
        keys = [storage_id(t) for t in ts]
    except (RuntimeError, NotImplementedError, AttributeError, TypeError):
        keys = [_storage_key(t) for t in ts]
    if len(set(keys)) == n:  # the common case: all distinct storages
        return sum([tensor_bytes(t) for t in ts])
    groups: dict[Any, list] = {}
    for k, t in zip(keys, ts):
        g = groups.get(k)
        if g is None:
            groups[k] = [t]
        else:
            g.append(t)
    total = 0
    for g in groups.values():
        if len(g) == 1:
            total += tensor_bytes(g[0])
            continue
        seen: dict[int, torch.Tensor] = {}
        for t in g:  # the very same tensor object twice: once
            seen.setdefault(id(t), t)
        g = list(seen.values())
        summed = sum(tensor_bytes(t) for t in g)
        if len(g) == 1:
            total += summed
            continue
        try:
            spans = [_extent(t) for t in g if t.numel()]
        except (RuntimeError, NotImplementedError):
            total += summed
            continue
        union = union_length(spans)
        total += min(summed, union)
    return total


def tensors_in(x: Any) -> list:
    """Tensors in an argument: itself, the tensors of a list/tuple, or none."""
    if isinstance(x, _Tensor):
        return [x]
    if isinstance(x, (list, tuple)):
        return [t for t in x if isinstance(t, _Tensor)]
    return []


@dataclass(frozen=True, slots=True)
class OpPlan:
    """What an op's schema says about its memory traffic (computed once per OpOverload)."""

    pos_write: tuple  #: per positional argument: True when the op mutates it (read and written)
    kw_write: frozenset  #: keyword-only mutated arguments that are not out= (read and written)
    kw_out: frozenset  #: out= arguments (written only)
    n_returns: int
    fresh_returns: tuple  #: per return: True when it is a new tensor (not an alias of an input)
    view: bool  #: every return is a non-writing alias of an input (a view op)
    has_schema: bool


_NO_SCHEMA = OpPlan((), frozenset(), frozenset(), 1, (True,), False, False)
_PLANS: dict[int, tuple[Any, OpPlan]] = {}  #: id(op) -> (op, plan)


def _make_plan(func: Any) -> OpPlan:
    schema = getattr(func, "_schema", None)
    if schema is None:
        return _NO_SCHEMA
    pos_write = []
    kw_write = set()
    kw_out = set()
    for a in schema.arguments:
        ai = a.alias_info
        w = bool(ai is not None and ai.is_write)
        if a.kwarg_only:
            if w:
                (kw_out if a.is_out else kw_write).add(a.name)
        else:
            pos_write.append(w)
    rets = schema.returns
    fresh = tuple(r.alias_info is None for r in rets)
    view = bool(rets) and all(r.alias_info is not None and not r.alias_info.is_write for r in rets)
    return OpPlan(tuple(pos_write), frozenset(kw_write), frozenset(kw_out), len(rets), fresh, view, True)


def op_plan(func: Any) -> OpPlan:
    """The cached schema plan of an op (keyed by id: ``OpOverload.__hash__`` is a Python method, and this runs per
    op; the entry holds the op, and a hit must be that very object)."""
    hit = _PLANS.get(id(func))
    if hit is not None and hit[0] is func:
        return hit[1]
    plan = _make_plan(func)
    _PLANS[id(func)] = (func, plan)
    return plan


def fresh_outputs(plan: OpPlan, out: Any) -> list:
    """Tensors among an op's results that are new memory (not aliases of inputs)."""
    if plan.n_returns == 1 or not plan.has_schema:
        return tensors_in(out) if plan.fresh_returns and plan.fresh_returns[0] else []
    if not isinstance(out, (tuple, list)):
        return []
    res: list = []
    for o, fresh in zip(out, plan.fresh_returns):
        if fresh:
            res.extend(tensors_in(o))
    return res


def split_io(plan: OpPlan, args: tuple, kwargs: dict, out: Any) -> tuple[list, list]:
    """(tensors read, tensors written) under the generic rule (the one place it is written: ``count_op`` runs it
    for every op, so the common argument, a tensor, takes no call)."""
    reads: list = []
    writes: list = []
    pw = plan.pos_write
    npw = len(pw)
    for i, a in enumerate(args):
        if isinstance(a, _Tensor):
            reads.append(a)
            if i < npw and pw[i]:
                writes.append(a)
        elif isinstance(a, (list, tuple)):
            ts = [t for t in a if isinstance(t, _Tensor)]
            reads.extend(ts)
            if ts and i < npw and pw[i]:
                writes.extend(ts)
    for k, a in kwargs.items():
        ts = tensors_in(a)
        if not ts:
            continue
        if k in plan.kw_out:
            writes.extend(ts)
            continue
        reads.extend(ts)
        if k in plan.kw_write:
            writes.extend(ts)
    writes.extend(fresh_outputs(plan, out))
    return reads, writes


def generic_bytes(func: Any, args: tuple, kwargs: dict, out: Any) -> tuple[int, int]:
    """(bytes_read, bytes_written) of an op under the generic ideal-bytes rule (0, 0 for view ops)."""
    plan = op_plan(func)
    if plan.view:
        return 0, 0
    reads, writes = split_io(plan, args, kwargs or {}, out)
    return unique_bytes(reads), unique_bytes(writes)


# ---- byte overrides shared by several families ----
def copy_bytes(args: tuple, kwargs: dict, out: Any) -> tuple[int, int]:
    """``copy_(self, src)`` / ``_foreach_copy_(self, src)``: read src, write self (its old values are not read)."""
    return unique_bytes(tensors_in(args[1])), unique_bytes(tensors_in(args[0]))


def write_only_bytes(args: tuple, kwargs: dict, out: Any) -> tuple[int, int]:
    """Fills and factories (``fill_``, ``zero_``, ``uniform_``, ``zeros_like``...): ``self`` is written (in place)
    or only lends its shape (``*_like``); its values are not read. Other tensor arguments are read."""
    others = [t for a in args[1:] for t in tensors_in(a)]
    others += [t for k, a in kwargs.items() if k != "out" for t in tensors_in(a)]
    res = tensors_in(out)
    if not res and args:
        res = tensors_in(args[0])  # in-place foreach fills return nothing
    return unique_bytes(others), unique_bytes(res)
