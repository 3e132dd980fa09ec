"""Walking the tensors of a nested value and counting their non-finite elements: shared by the capture's replay of a
bad step (``capture.locate``, ``capture.op_origin``) and the NaN guard's analysis (``analysis.nonfinite``)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

__all__ = ["iter_tensors", "floating", "count_nonfinite"]


def iter_tensors(obj: Any, _depth: int = 0) -> Iterator[torch.Tensor]:
    """Tensors in a nested structure (tensor, list/tuple, dict, dataclass-like objects with ``__dict__``)."""
    if isinstance(obj, torch.Tensor):
        yield obj
    elif _depth > 8 or obj is None or isinstance(obj, (str, bytes, int, float, bool)):
        return
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from iter_tensors(v, _depth + 1)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from iter_tensors(v, _depth + 1)
    elif hasattr(obj, "__dataclass_fields__"):
        for k in obj.__dataclass_fields__:
            yield from iter_tensors(getattr(obj, k, None), _depth + 1)


def floating(t: torch.Tensor) -> bool:
    return t.is_floating_point() or t.is_complex()


def count_nonfinite(named: list[tuple[str, torch.Tensor | None]]) -> dict[str, int]:
    """{name: number of non-finite elements} for the tensors that have any (exact; syncs once per tensor)."""
    out = {}
    for name, t in named:
        if t is not None and floating(t):
            n = int((~torch.isfinite(t)).sum())
            if n:
                out[name] = n
    return out
