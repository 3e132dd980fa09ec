"""One registry of FLOP (and byte-override) formulas, keyed by aten op.

A FLOP formula is a small pure function of shapes, as in torch's ``flop_counter.py``: it is called as
``fn(*args, out=out, **kwargs)`` where every tensor in args/kwargs/out has been replaced by its ``torch.Size``
(lists of tensors become lists of sizes). It returns an int; a multiply-add counts 2.

A byte formula (optional; most ops use the generic ideal-bytes rule in ``formulas.bytes``) is called with the
*real* tensors as ``fn(args, kwargs, out) -> (bytes_read, bytes_written)``.

Lookup order for an ``OpOverload``: exact overload → its packet → tag/shape fallbacks (pointwise-tagged ops) →
view/metadata ops (known zero) → ``None`` (uncounted). Registering the same key twice raises, so formulas never
silently shadow each other; users add their own on a copy (``DEFAULT_REGISTRY.copy()``) or per profile via
``ts.profile(model, formulas={aten.my_op: fn})``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["Formula", "FormulaRegistry", "DEFAULT_REGISTRY", "register_flops", "op_key"]

FlopFn = Callable[..., int]
BytesFn = Callable[[tuple, dict, Any], "tuple[int, int]"]
OpLike = Any  # torch._ops.OpOverload | torch._ops.OpOverloadPacket | str


@dataclass(frozen=True, slots=True)
class Formula:
    """What the registry knows about one op."""

    category: str  #: one of records.CATEGORIES
    flops: FlopFn | None = None  #: None means "known zero FLOPs" (views, copies)
    bytes: BytesFn | None = None  #: None means the generic ideal-bytes rule
    zero_bytes: bool = False  #: views/metadata: no bytes moved at all


def op_key(op: OpLike) -> str:
    """Normalise an op to its registry key: ``"aten.mm"`` for a packet, ``"aten.mm.out"`` for an overload."""
    if isinstance(op, str):
        return op
    if isinstance(op, torch._ops.OpOverload):
        return f"{op.namespace}.{op._opname}.{op._overloadname}"
    if isinstance(op, torch._ops.OpOverloadPacket):
        return f"{op._qualified_op_name.replace('::', '.')}"
    raise TypeError(f"expected an aten op (OpOverload/OpOverloadPacket) or its name, got {type(op).__name__}")


class FormulaRegistry:
    """Formulas by op key. Fallbacks (e.g. pointwise-by-tag) are functions ``(func) -> Formula | None``."""

    def __init__(self) -> None:
        self._table: dict[str, Formula] = {}
        self._fallbacks: list[Callable[[Any], Formula | None]] = []
        self._cache: dict[Any, Formula | None] = {}
        self._version = 0  #: bumped on every change, so callers may cache lookups (see ``formulas.apply``)

    def register(
        self,
        ops: OpLike | Iterable[OpLike],
        formula: Formula,
        *,
        override: bool = False,
    ) -> None:
        if isinstance(ops, (str, torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
            ops = [ops]
        for op in ops:
            key = op_key(op)
            if key in self._table and not override:
                raise ValueError(
                    f"a formula for {key} is already registered; pass override=True to replace it "
                    f"(on your own registry copy, not the default)"
                )
            self._table[key] = formula
        self._cache.clear()
        self._version += 1

    @property
    def version(self) -> int:
        """Bumped on every change (a formula or fallback added or replaced), so callers may cache lookups."""
        return self._version

    def add_fallback(self, fn: Callable[[Any], Formula | None]) -> None:
        self._fallbacks.append(fn)
        self._cache.clear()
        self._version += 1

    def lookup(self, func: Any) -> Formula | None:
        """Formula for an ``OpOverload`` (cached), or None when the op has no formula."""
        try:
            return self._cache[func]
        except (KeyError, TypeError):
            pass
        found = self._lookup_uncached(func)
        try:
            self._cache[func] = found
        except TypeError:
            pass
        return found

    def _lookup_uncached(self, func: Any) -> Formula | None:
        if isinstance(func, torch._ops.OpOverload):
            f = self._table.get(op_key(func)) or self._table.get(op_key(func.overloadpacket))
            if f is not None:
                return f
        elif (f := self._table.get(op_key(func))) is not None:
            return f
        for fb in self._fallbacks:
            f = fb(func)
            if f is not None:
                return f
        return None

    def keys(self) -> list[str]:
        return sorted(self._table)

    def copy(self) -> FormulaRegistry:
        new = FormulaRegistry()
        new._table = dict(self._table)
        new._fallbacks = list(self._fallbacks)
        return new

    def with_overrides(self, formulas: dict[OpLike, Formula | FlopFn] | None) -> FormulaRegistry:
        """A copy with user formulas added (a bare function is taken as a FLOP formula, category 'other')."""
        if not formulas:
            return self
        new = self.copy()
        for op, f in formulas.items():
            if not isinstance(f, Formula):
                if not callable(f):
                    raise TypeError(f"formula for {op_key(op)} must be a Formula or a callable, got {f!r}")
                prev = new._lookup_uncached(op) if not isinstance(op, str) else new._table.get(op)
                f = Formula(category=prev.category if prev else "other", flops=f)
            new.register(op, f, override=True)
        return new


DEFAULT_REGISTRY = FormulaRegistry()


def register_flops(ops: OpLike | Iterable[OpLike], category: str, *, bytes: BytesFn | None = None):
    """Decorator: register a FLOP formula in the default registry."""

    def deco(fn: FlopFn) -> FlopFn:
        DEFAULT_REGISTRY.register(ops, Formula(category=category, flops=fn, bytes=bytes))
        return fn

    return deco
