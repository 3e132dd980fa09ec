"""The capture's memo of op counts: ``count_op`` keyed by call signature (``CountCache``), and the per-op facts the
hot path asks for (``value_dependent``). Everything here runs for every op of a profiled step."""

from __future__ import annotations

from typing import Any

import torch

from tscope_callbacks.formulas.apply import OpCount, count_op
from tscope_callbacks.formulas.bytes import op_plan
from tscope_callbacks.formulas.bytes import storage_id as _sid
from tscope_callbacks.formulas.registry import DEFAULT_REGISTRY, FormulaRegistry

__all__ = ["CountCache", "value_dependent", "VALUE_DEPENDENT"]

_Tensor = torch.Tensor
_HASHABLE = (int, bool, str, type(None), torch.dtype, torch.device, torch.layout, torch.memory_format)
_UNCACHEABLE = object()
_SHAPES = object()
_INPUTS = object()
#: float arguments enter the key only as zero / non-zero: formulas depend on no more (a weight decay, momentum or
#: dropout probability that is 0 changes the count), while learning rates and bias corrections change every step
_ZERO, _NONZERO = ("float", 0), ("float", 1)


#: ops whose count depends on tensor values, not only shapes (an embedding reads its unique rows): never memoized
VALUE_DEPENDENT = frozenset({"aten.embedding"})
#: id(op) -> (op, flag). Ops are keyed by id on the hot path: ``OpOverload.__hash__`` is a Python method (~0.25 µs
#: a lookup, several lookups an op); the op is kept in the value, and a hit must be that very object
_VALUE_DEP: dict[int, tuple[Any, bool]] = {}


#: ops whose output shape depends on tensor values (besides those tagged so: torch.Tag.dynamic_output_shape,
#: data_dependent_output): their memo key includes the outputs
_DYNAMIC_NAMES = ("nonzero", "unique", "masked_select", "repeat_interleave", "bincount", "item", "_local_scalar")
_DYNAMIC_TAGS = tuple(getattr(torch.Tag, t) for t in ("dynamic_output_shape", "data_dependent_output")
                      if hasattr(torch.Tag, t))


def dynamic_output(func: Any) -> bool:
    """Whether ``func``'s output shape can depend on tensor values (``nonzero``, ``unique``, boolean indexing)."""
    name = getattr(func, "_opname", "") or str(func)
    return any(t in getattr(func, "tags", ()) for t in _DYNAMIC_TAGS) or any(n in name for n in _DYNAMIC_NAMES)


def value_dependent(func: Any) -> bool:
    """Whether ``func``'s count depends on tensor values (:data:`VALUE_DEPENDENT`), not only on shapes."""
    hit = _VALUE_DEP.get(id(func))
    if hit is None or hit[0] is not func:
        name = f"{getattr(func, 'namespace', '')}.{getattr(func, '_opname', '')}"
        hit = _VALUE_DEP[id(func)] = (func, name in VALUE_DEPENDENT)
    return hit[1]


class CountCache:
    """``count_op`` memoized by op signature, for the capture hot path (a training step repeats the same ops with the
    same shapes block after block and step after step).

    The signature is everything ``count_op`` depends on: the op; per tensor argument its shape, strides, dtype,
    storage offset and which other arguments share its storage; non-tensor arguments by value; per output its shape,
    strides, dtype and whether it aliases an argument. Where the outputs follow from the inputs (most ops) the key
    is the inputs' part alone (:func:`_input_key`). Arguments that are not plainly hashable (generators, opaque
    objects) bypass the memo. The cached ``OpCount`` (and its shape lists) is shared between the records of
    identical calls: treat records as read-only.
    """

    __slots__ = ("registry", "memo", "max_entries", "hits", "misses", "_kinds", "_version", "_dtype")

    def __init__(self, registry: FormulaRegistry = DEFAULT_REGISTRY, *, max_entries: int = 100_000) -> None:
        self.registry = registry
        self.memo: dict[Any, tuple[Any, OpCount]] = {}  #: signature -> (op, count)
        self.max_entries = max_entries
        self.hits = self.misses = 0
        #: id(op) -> (op, key function or None when value-dependent), for the registry at version ``_version``
        self._kinds: dict[int, tuple[Any, Any]] = {}
        self._version = registry.version
        self._dtype = torch.get_default_dtype()

    def _kind(self, func: Any) -> tuple[Any, Any]:
        """How ``func``'s calls are keyed: not at all (value-dependent), by shapes and dtypes alone (a formula with
        no FLOPs and zero bytes: views, metadata, uninitialised allocations; their count is shapes, dtype and
        category), by its inputs alone (its outputs' shapes, strides and dtypes follow from them), or by the full
        signature (ops whose output shape depends on values, ops without a schema)."""
        if value_dependent(func):
            keyer = None
        else:
            f = self.registry.lookup(func)
            plan = op_plan(func)
            shapes_only = (f is not None and f.flops is None and f.bytes is None and f.category != "matmul"
                           and (f.zero_bytes or plan.view))
            if not plan.has_schema or dynamic_output(func):
                keyer = _signature
            else:
                keyer = _shape_key if shapes_only else _input_key
        k = self._kinds[id(func)] = (func, keyer)
        return k

    def refresh(self) -> CountCache:
        """Forget memoized counts made under another default dtype (a call's key leaves out its outputs, and an
        integer tensor times a Python float is of the default dtype). Profiles call it when they start."""
        d = torch.get_default_dtype()
        if d is not self._dtype:
            self.memo.clear()
            self._dtype = d
        return self

    def count(self, func: Any, args: tuple, kwargs: dict | None, out: Any) -> OpCount:
        if self._version != self.registry.version:  # a formula was added or replaced: memoized counts may be stale
            self.memo.clear()
            self._kinds.clear()
            self._version = self.registry.version
        k = self._kinds.get(id(func))
        if k is None or k[0] is not func:
            k = self._kind(func)
        keyer = k[1]
        if keyer is None:
            key = _UNCACHEABLE
        else:
            key = keyer(func, args, kwargs, out)
            hit = self.memo.get(key)  # (_UNCACHEABLE is never stored)
            if hit is not None and hit[0] is func:
                self.hits += 1
                return hit[1]
        self.misses += 1
        c = count_op(func, args, kwargs, out, self.registry)
        if key is not _UNCACHEABLE and len(self.memo) < self.max_entries:
            self.memo[key] = (func, c)
        return c


_INTS = frozenset({int})
#: int and bool lists: an op's argument at one position has one of the two types, so ``True`` equal to ``1`` in a
#: key never merges two calls of different meaning
_INT_BOOL = frozenset({int, bool})


def _signature(func: Any, args: tuple, kwargs: dict | None, out: Any) -> Any:
    """The memo key of one call (see :class:`CountCache`); ``_UNCACHEABLE`` when an argument is not plainly hashable.
    Written as flat loops: it runs for every op of a profiled step."""
    groups: dict[int, int] = {}
    parts: list = [id(func)]  # by id: the memo's value holds the op, and a hit must be that object
    add = parts.append
    sid = _sid
    T = _Tensor
    try:
        for a in args:
            if isinstance(a, T):
                st = sid(a)
                g = groups.get(st)
                if g is None:
                    g = groups[st] = len(groups)
                add((a.shape, a.stride(), a.dtype, a.storage_offset(), g))
            elif isinstance(a, float):
                add(_ZERO if a == 0.0 else _NONZERO)
            elif isinstance(a, (list, tuple)):
                add(_seq_key(a, groups))
            elif isinstance(a, _HASHABLE):
                add(a)
            else:
                return _UNCACHEABLE
        if kwargs:
            for k, a in kwargs.items():
                if isinstance(a, T):
                    st = sid(a)
                    g = groups.get(st)
                    if g is None:
                        g = groups[st] = len(groups)
                    add((k, a.shape, a.stride(), a.dtype, a.storage_offset(), g))
                elif isinstance(a, float):
                    add((k, _ZERO if a == 0.0 else _NONZERO))
                elif isinstance(a, (list, tuple)):
                    add((k, _seq_key(a, groups)))
                elif isinstance(a, _HASHABLE):
                    add((k, a))
                else:
                    return _UNCACHEABLE
        if isinstance(out, T):
            add((out.shape, out.stride(), out.dtype, groups.get(sid(out), -1)))
        elif isinstance(out, (tuple, list)):
            add(_seq_key(out, groups, outputs=True))
        else:
            add(type(out))
        return tuple(parts)
    except (TypeError, RuntimeError, NotImplementedError, AttributeError):
        return _UNCACHEABLE


def _input_key(func: Any, args: tuple, kwargs: dict | None, out: Any) -> Any:
    """The memo key of a call whose outputs follow from its inputs (see ``CountCache._kind``): the op, then per
    tensor argument its shape, strides and dtype; other arguments as in :func:`_signature`. The outputs and storage
    offsets are left out: an op with a schema and a fixed output shape makes the same outputs (shapes, strides,
    dtypes, aliasing) from the same input metadata, and offsets matter only between arguments that share a storage.
    Such calls (``x * x``, overlapping views), tensor lists and calls without a tensor argument (a factory's dtype
    may be the default dtype) take the full :func:`_signature`. Three fifths of an HF GPT-2 training step's ops
    take this path: four reads per argument instead of five, none for the outputs."""
    storages: set[int] = set()
    parts: list = [id(func), _INPUTS]  # the marker: never equal to a full signature or shape key of the same op
    add = parts.append
    sid = _sid
    T = _Tensor
    try:
        for a in args:
            if isinstance(a, T):
                st = sid(a)
                if st in storages:
                    return _signature(func, args, kwargs, out)
                storages.add(st)
                add((a.shape, a.stride(), a.dtype))
            elif isinstance(a, float):
                add(_ZERO if a == 0.0 else _NONZERO)
            elif isinstance(a, (list, tuple)):
                if not _INT_BOOL.issuperset(map(type, a)):  # sizes, dims, output masks; tensor lists: full key
                    return _signature(func, args, kwargs, out)
                add(tuple(a))
            elif isinstance(a, _HASHABLE):
                add(a)
            else:
                return _UNCACHEABLE
        if kwargs:
            for k, a in kwargs.items():
                if isinstance(a, T):
                    st = sid(a)
                    if st in storages:
                        return _signature(func, args, kwargs, out)
                    storages.add(st)
                    add((k, a.shape, a.stride(), a.dtype))
                elif isinstance(a, float):
                    add((k, _ZERO if a == 0.0 else _NONZERO))
                elif isinstance(a, (list, tuple)):
                    return _signature(func, args, kwargs, out)
                elif isinstance(a, _HASHABLE):
                    add((k, a))
                else:
                    return _UNCACHEABLE
        if not storages:
            return _signature(func, args, kwargs, out)
        return tuple(parts)
    except (TypeError, RuntimeError, NotImplementedError, AttributeError):
        return _UNCACHEABLE


def _shape_key(func: Any, args: tuple, kwargs: dict | None, out: Any) -> Any:
    """The memo key of a call whose count is its shapes, dtypes and category alone (see ``CountCache._kind``): the
    op, then every tensor's shape and dtype in argument order, then the outputs'. A third of a transformer step's
    ops (views, detach, transposes) take this path: two attribute reads per tensor instead of five."""
    parts: list = [id(func), _SHAPES]  # the marker: never equal to a full signature of the same op
    add = parts.append
    T = _Tensor
    try:
        for a in args:
            if isinstance(a, T):
                add(a.shape)
                add(a.dtype)
            elif isinstance(a, (list, tuple)):
                if _INTS.issuperset(map(type, a)):  # sizes, dims: the output's shape says what they did
                    continue
                for t in a:
                    if isinstance(t, T):
                        add(t.shape)
                        add(t.dtype)
                    elif isinstance(t, (list, tuple)):
                        return _signature(func, args, kwargs, out)
                add(None)  # a list's end (its tensors are not the next arguments)
        if kwargs:
            for k, a in kwargs.items():
                if isinstance(a, T):
                    add(k)
                    add(a.shape)
                    add(a.dtype)
                elif isinstance(a, (list, tuple)):
                    return _signature(func, args, kwargs, out)
        if isinstance(out, T):
            add(out.shape)
            add(out.dtype)
        elif isinstance(out, (tuple, list)):
            add(len(out))
            for o in out:
                if isinstance(o, T):
                    add(o.shape)
                    add(o.dtype)
                elif isinstance(o, (list, tuple)):
                    return _signature(func, args, kwargs, out)
                else:
                    add(None)
        else:
            add(type(out))
        return tuple(parts)
    except (TypeError, RuntimeError, NotImplementedError, AttributeError):
        return _UNCACHEABLE


def _seq_key(seq: Any, groups: dict[int, int], outputs: bool = False) -> tuple:
    """Key of a list/tuple argument (tensor lists of foreach/cat ops, int lists, scalar lists) or of a tuple output."""
    if _INTS.issuperset(map(type, seq)):  # sizes, strides, dims: the common case, one C-level pass
        return tuple(seq)
    sub: list = []
    for x in seq:
        if isinstance(x, _Tensor):
            st = _sid(x)
            g = groups.get(st)
            if g is None:
                if outputs:
                    g = -1
                else:
                    g = groups[st] = len(groups)
            sub.append((x.shape, x.stride(), x.dtype, x.storage_offset(), g))
        elif isinstance(x, float):
            sub.append(_ZERO if x == 0.0 else _NONZERO)
        elif isinstance(x, _HASHABLE):
            sub.append(x)
        elif outputs:
            sub.append(type(x))
        elif isinstance(x, (list, tuple)):
            sub.append(_seq_key(x, groups))
        else:
            raise TypeError
    return tuple(sub)
