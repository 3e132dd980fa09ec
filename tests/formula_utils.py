"""Test helper: run a callable under a minimal TorchDispatchMode that calls ``count_op`` for every aten op."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch.utils._python_dispatch import TorchDispatchMode

from tscope_callbacks.formulas import DEFAULT_REGISTRY, OpCount, count_op


def op_name(func: Any) -> str:
    """``aten.mm`` for ``aten.mm.default``."""
    return f"{func.namespace}.{func._opname}" if hasattr(func, "_opname") else str(func)


class CountMode(TorchDispatchMode):
    def __init__(self, registry=DEFAULT_REGISTRY) -> None:
        super().__init__()
        self.registry = registry
        self.records: list[tuple[str, OpCount]] = []
        self.overloads: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        self.records.append((op_name(func), count_op(func, args, kwargs, out, self.registry)))
        self.overloads.append(str(func))
        return out


def count(fn: Callable[[], Any], registry=DEFAULT_REGISTRY) -> list[tuple[str, OpCount]]:
    """Run ``fn()`` and return ``[(op_name, OpCount), ...]`` in dispatch order."""
    with CountMode(registry) as mode:
        fn()
    return mode.records


def only(records: list[tuple[str, OpCount]], name: str) -> list[OpCount]:
    """The counts of one op (``"aten.mm"``), in order."""
    return [c for n, c in records if n == name]


def one(records: list[tuple[str, OpCount]], name: str) -> OpCount:
    """The single count of an op that must appear exactly once."""
    found = only(records, name)
    assert len(found) == 1, f"{name}: expected one call, got {len(found)} in {[n for n, _ in records]}"
    return found[0]


def total_flops(records, category: str | None = None) -> int:
    return sum(c.flops for _, c in records if category is None or c.category == category)
