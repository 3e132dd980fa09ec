"""The union of half-open intervals ``[start, end)``: written once, used by the byte rule (a storage's byte extents,
``formulas.bytes``), device-busy time (kernel intervals, ``capture.cuda_timing``) and communication overlap
(``analysis.comm``). Touching intervals (one ends where the next starts) merge."""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["merge_intervals", "union_length"]


def merge_intervals(intervals: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """The union as merged, sorted, disjoint ``(start, end)`` intervals."""
    out: list[list[int]] = []
    for s, e in sorted(intervals):
        if out and s <= out[-1][1]:
            if e > out[-1][1]:
                out[-1][1] = e
        else:
            out.append([s, e])
    return [(s, e) for s, e in out]


def union_length(intervals: Iterable[tuple[int, int]]) -> int:
    """Total length of the union (overlaps counted once)."""
    return sum(e - s for s, e in merge_intervals(intervals))
