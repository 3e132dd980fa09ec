"""Small shared helpers for the formula families: numel of a shape, op-name resolution, registration.

Formulas receive shapes (``torch.Size``), never tensors; these helpers keep them one-liners.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from math import prod
from typing import Any

import torch

from tscope_callbacks.formulas.registry import DEFAULT_REGISTRY, BytesFn, Formula

__all__ = ["numel", "first_numel", "out_numel", "resolve", "reg", "aten"]

aten = torch.ops.aten


def numel(shape: Any) -> int:
    """Elements of a shape (``torch.Size``/list of ints); 0 for None."""
    if shape is None:
        return 0
    return int(prod(shape))


def out_numel(out: Any) -> int:
    """Elements of an op's output: a shape, a list of shapes (summed: foreach), or a tuple (its first entry)."""
    if isinstance(out, torch.Size):
        return numel(out)
    if isinstance(out, list):
        return sum(numel(o) for o in out if isinstance(o, torch.Size))
    if isinstance(out, tuple) and out:
        return out_numel(out[0])
    return 0


def first_numel(x: Any) -> int:
    """Elements of a shape, or the summed elements of a list of shapes (foreach lists)."""
    if isinstance(x, torch.Size):
        return numel(x)
    if isinstance(x, (list, tuple)) and x and isinstance(x[0], torch.Size):
        return sum(numel(s) for s in x)
    return 0


def resolve(names: Iterable[str] | str) -> list[Any]:
    """``"mm"`` → ``torch.ops.aten.mm`` (packet); ``"max.other"`` → that overload. Missing ops are skipped,
    so a formula table can name ops that only exist in some torch versions."""
    if isinstance(names, str):
        names = [names]
    ops = []
    for n in names:
        base, _, overload = n.partition(".")
        packet = getattr(aten, base, None)
        if packet is None:
            continue
        if overload:
            op = getattr(packet, overload, None) if overload in packet.overloads() else None
            if op is None:
                continue
            ops.append(op)
        else:
            ops.append(packet)
    return ops


def reg(
    names: Iterable[str] | str,
    category: str,
    flops: Callable[..., int] | None = None,
    *,
    bytes: BytesFn | None = None,
    zero_bytes: bool = False,
) -> None:
    """Register one formula for every existing op among ``names`` in the default registry."""
    ops = resolve(names)
    if ops:
        DEFAULT_REGISTRY.register(ops, Formula(category=category, flops=flops, bytes=bytes, zero_bytes=zero_bytes))
