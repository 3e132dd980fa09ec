"""Histograms of many tensors (gradients, parameters) computed on their device: no host sync, one read for all.

``wandb.watch`` builds each histogram with host reads (the min, the max, then the counts: several ``.item()`` per
tensor) and drops non-finite values without saying so: on the step a NaN reaches the gradients, the tensors that
hold it are not logged at all. Here, per tensor, everything stays on the device until one copy of the whole batch:

1. **stats** (:func:`device_stats`): finite min and max, finite count, NaN count, +-Inf count, sum and sum of
   squares of the finite values (float64 accumulators);
2. **counts** (:func:`device_counts`): ``bins`` equal bins over [min, max] of the finite values, with ``histc`` on
   values mapped to [0, bins] by device-side scalars (``histc``'s own range arguments are host numbers: a sync).

Between the two steps a sharded tensor's stats can be reduced across ranks (min/max/sum) so every rank bins over the
same range and the counts add up (:func:`reduce_stats`). On CPU, where a host read costs no sync, a chunk whose min
and max are finite skips the masking passes (same results). Large tensors are processed in chunks of ``CHUNK`` elements:
temporaries stay small (a few MB whatever the tensor) and each chunk's float32 counts are exact (< 2**24).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

__all__ = ["Histogram", "CHUNK", "NSTAT", "device_stats", "device_counts", "reduce_stats", "read_histograms",
           "histograms"]

CHUNK = 1 << 22  #: elements per pass: fp32 temporaries of 16 MiB, exact fp32 counts
NSTAT = 7  #: stats per tensor: lo, hi, finite, nan, inf, sum, sum of squares


@dataclass
class Histogram:
    """One tensor's histogram: ``counts[i]`` finite values in [``edges[i]``, ``edges[i+1]``) (the last bin closed).

    ``num`` counts the finite values (the sum of ``counts``); ``nan`` and ``inf`` the non-finite ones, which no bin
    holds. A constant tensor gets one unit-wide range centred on its value; a tensor with no finite value gets
    ``num == 0`` and ``min``/``max`` None."""

    name: str
    edges: list[float]
    counts: list[int]
    num: int
    nan: int
    inf: int
    min: float | None
    max: float | None
    sum: float
    sum_squares: float
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def mean(self) -> float | None:
        return self.sum / self.num if self.num else None

    @property
    def std(self) -> float | None:
        if not self.num:
            return None
        m = self.sum / self.num
        return math.sqrt(max(0.0, self.sum_squares / self.num - m * m))

    @property
    def nonfinite(self) -> int:
        return self.nan + self.inf

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "num": self.num, "nan": self.nan, "inf": self.inf, "min": self.min,
                "max": self.max, "mean": self.mean, "std": self.std, "edges": self.edges, "counts": self.counts}


def _flat(t: torch.Tensor) -> torch.Tensor:
    t = t.detach()
    if t.is_complex():
        t = torch.view_as_real(t)
    return t.reshape(-1)


def _work(c: torch.Tensor) -> torch.Tensor:
    """The dtype values are compared and binned in: float64 stays float64 (its min and max exact), the rest fp32."""
    return c if c.dtype == torch.float64 else c.float()


def _chunks(x: torch.Tensor) -> list[torch.Tensor]:
    n = x.numel()
    return [x] if n <= CHUNK else [x[i:i + CHUNK] for i in range(0, n, CHUNK)]


def _reads_are_free(device: torch.device) -> bool:
    """Whether reading a value on the host costs no device sync (CPU): then clean chunks take a shorter path."""
    return device.type == "cpu"


def device_stats(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """float64 [len(tensors), 7] on the first tensor's device: finite min, finite max, #finite, #NaN, #Inf, sum and
    sum of squares of the finite values. An empty or all-non-finite tensor has min +inf and max -inf."""
    dev = tensors[0].device
    rows = []
    for t in tensors:
        x = _flat(t)
        lo = torch.full((), math.inf, dtype=torch.float64, device=x.device)
        hi = torch.full((), -math.inf, dtype=torch.float64, device=x.device)
        acc = torch.zeros(5, dtype=torch.float64, device=x.device)  # finite, nan, inf, sum, sum of squares
        for c in _chunks(x):
            c = _work(c)
            if c.numel() and _reads_are_free(c.device):  # CPU: a clean chunk takes 4 passes, not 11
                cl, ch = torch.aminmax(c)
                if math.isfinite(cl) and math.isfinite(ch):
                    lo, hi = torch.minimum(lo, cl.double()), torch.maximum(hi, ch.double())
                    acc += torch.stack([torch.tensor(float(c.numel()), dtype=torch.float64), acc.new_zeros(()),
                                        acc.new_zeros(()), c.sum(dtype=torch.float64),
                                        torch.linalg.vector_norm(c, dtype=torch.float64).square()])
                    continue
            fin = torch.isfinite(c)
            nan = torch.isnan(c)
            cz = torch.where(fin, c, 0.0)
            if c.numel():
                lo = torch.minimum(lo, torch.where(fin, c, math.inf).amin().double())
                hi = torch.maximum(hi, torch.where(fin, c, -math.inf).amax().double())
            nf = fin.sum(dtype=torch.float64)
            nn = nan.sum(dtype=torch.float64)
            acc += torch.stack([nf, nn, c.numel() - nf - nn, cz.sum(dtype=torch.float64),
                                torch.linalg.vector_norm(cz, dtype=torch.float64).square()])
        rows.append(torch.cat([lo.reshape(1), hi.reshape(1), acc]).to(dev))
    return torch.stack(rows)


def _range(stats: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(left edge, width of the whole range) per row of ``stats``, on its device: [min, max] of the finite values; a
    constant tensor gets [v - 0.5, v + 0.5], one without finite values [-0.5, 0.5]."""
    lo, hi = stats[:, 0], stats[:, 1]
    ok = torch.isfinite(lo) & torch.isfinite(hi)
    wide = ok & (hi > lo)
    base = torch.where(wide, lo, torch.where(ok, lo - 0.5, torch.full_like(lo, -0.5)))
    span = torch.where(wide, hi - lo, torch.ones_like(lo))
    return base, span


def device_counts(tensors: Sequence[torch.Tensor], stats: torch.Tensor, bins: int) -> torch.Tensor:
    """float64 [len(tensors), bins] on ``stats``' device: finite values per bin over each row's range."""
    base, span = _range(stats)
    rows = []
    for i, t in enumerate(tensors):
        x = _flat(t)
        b = base[i].to(x.device)
        scale = (bins / span[i]).to(x.device)
        h = torch.zeros(bins, dtype=torch.float64, device=x.device)
        if _reads_are_free(x.device) and x.numel() and not stats[i, 3:5].any():  # CPU, all finite: histc alone
            lo, w = float(base[i]), float(span[i])
            for c in _chunks(x):
                h += torch.histc(_work(c), bins=bins, min=lo, max=lo + w).double()
            rows.append(h.to(stats.device))
            continue
        for c in _chunks(x):
            # finite values map into [0, bins] (the min to exactly 0; the max to `bins`, clamped where rounding
            # overshoots: histc puts it in the last bin); NaN and Inf to -1, outside the range: histc skips them
            u = ((_work(c) - b) * scale).nan_to_num_(nan=-1.0, posinf=-1.0, neginf=-1.0).clamp_(max=bins)
            h += torch.histc(u, bins=bins, min=0, max=bins).double()
        rows.append(h.to(stats.device))
    return torch.stack(rows) if rows else torch.zeros(0, bins, dtype=torch.float64, device=stats.device)


def reduce_stats(stats: torch.Tensor, all_reduce: Any) -> torch.Tensor:
    """Combine ranks' stats of shards of the same tensors (``all_reduce(tensor, op)`` with op "min"/"max"/"sum",
    in place): min of the minima, max of the maxima, sums of the rest."""
    lo, hi, rest = stats[:, 0].contiguous(), stats[:, 1].contiguous(), stats[:, 2:].contiguous()
    all_reduce(lo, "min")
    all_reduce(hi, "max")
    all_reduce(rest, "sum")
    return torch.cat([lo[:, None], hi[:, None], rest], dim=1)


def read_histograms(names: Sequence[str], stats: Any, counts: Any, bins: int) -> list[Histogram]:
    """Histograms from host copies (tensors or nested lists) of :func:`device_stats` and :func:`device_counts`."""
    st = torch.as_tensor(stats, dtype=torch.float64).reshape(len(names), NSTAT)
    ct = torch.as_tensor(counts, dtype=torch.float64).reshape(len(names), bins)
    base, span = _range(st)
    out = []
    for i, name in enumerate(names):
        lo, hi, nf, nn, ni, s, ss = st[i].tolist()
        b, w = float(base[i]), float(span[i])
        edges = [b + w * k / bins for k in range(bins + 1)]
        out.append(Histogram(name, edges, [int(round(v)) for v in ct[i].tolist()], int(round(nf)), int(round(nn)),
                             int(round(ni)), lo if math.isfinite(lo) else None, hi if math.isfinite(hi) else None,
                             s, ss))
    return out


def histograms(named: Sequence[tuple[str, torch.Tensor]], bins: int = 64) -> list[Histogram]:
    """Histograms of ``(name, tensor)`` pairs on one process (reads the device once; tests and offline use)."""
    if not named:
        return []
    ts = [t for _, t in named]
    stats = device_stats(ts)
    counts = device_counts(ts, stats, bins)
    return read_histograms([n for n, _ in named], stats.cpu(), counts.cpu(), bins)
