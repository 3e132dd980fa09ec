"""Reductions, scans and softmax: FLOPs per *input* element (plus a per-output term where the op finalises).

    op                                                   per input   per output
    sum nansum prod amax amin max min argmax argmin          1           0
    any all count_nonzero cumsum cumprod cummax cummin
    mean nanmean                                             1           1   (the divide)
    aminmax                                                  2           0
    var var_mean                                             3           0   (accumulate, centre, square-acc.)
    std std_mean                                             3           1   (+ sqrt)
    norm linalg_vector_norm (any p)                          2           1   (|x|^p or x*x, accumulate; root)
    logsumexp                                                4           2   (max, sub, exp, add; log, add)
    logcumsumexp                                             3           0
    _softmax _log_softmax _safe_softmax                      5           0   (max, sub, exp, sum, div|log-sub)
    _softmax_backward_data                                   4           0   (g*y, row-sum, sub, mul)
    _log_softmax_backward_data                               4           0   (row-sum g, exp y, mul, sub)
    sort argsort msort                                       ceil(log2 s)   (comparisons; s = size along dim)
    topk                                                     ceil(log2(k + 1))   (a k-heap per slice)
    median nanmedian kthvalue mode                           1           0   (selection)
    histc histogram (bin count)                              2           0   (the bin: subtract, scale; +2 for the
                                                                              data range when min = max = 0)
    histogram (bin edges)                                    ceil(log2 e)   (binary search; e = number of edges)
    bincount                                                 1           0   (the increment or weight add)

Histograms are counted as reductions: each reads its input once and writes only the bins (MoE routers count tokens
per expert with ``histc``).

The binary ``max.other``/``min.other`` overloads are pointwise (pointwise.py).
"""

from __future__ import annotations

from math import ceil, log2

from tscope_callbacks.formulas.common import first_numel, out_numel, reg
from tscope_callbacks.formulas.costs import REDUCTION_COSTS

__all__ = ["reduction_flops"]


def reduction_flops(per_in: int, per_out: int = 0):
    def flops(x, *args, out=None, **kwargs) -> int:
        return per_in * first_numel(x) + (per_out * out_numel(out) if per_out else 0)

    flops.__name__ = f"reduction_{per_in}_{per_out}_flops"
    return flops


for _name, (_in, _out) in REDUCTION_COSTS.items():  # one table with compiled kernels' members (formulas.costs)
    reg([_name], "softmax" if "softmax" in _name else "reduction", reduction_flops(_in, _out))


def _sort(x, dim=-1, *args, out=None, **kwargs) -> int:
    dim = kwargs.get("dim", dim if isinstance(dim, int) and not isinstance(dim, bool) else -1)
    size = x[dim] if len(x) else 1
    return first_numel(x) * (ceil(log2(size)) if size > 1 else 0)


def _msort(x, *args, out=None, **kwargs) -> int:
    return _sort(x, 0)


def _topk(x, k=1, *args, out=None, **kwargs) -> int:
    return first_numel(x) * max(1, ceil(log2(k + 1)))


reg(["sort.default", "sort.stable", "sort.values", "sort.values_stable", "argsort.default", "argsort.stable"],
    "reduction", _sort)
reg(["msort"], "reduction", _msort)
reg(["topk"], "reduction", _topk)
reg(["median", "nanmedian", "kthvalue", "mode"], "reduction", reduction_flops(1))


def _histc(x, bins=100, lo=0, hi=0, *args, out=None, **kwargs) -> int:
    lo, hi = kwargs.get("min", lo), kwargs.get("max", hi)
    auto = not lo and not hi  # min = max = 0: the range is the data's (one more pass: a min and a max per element)
    return first_numel(x) * (4 if auto else 2)


def _histogram_edges(x, edges, *args, out=None, **kwargs) -> int:
    e = first_numel(edges)
    return first_numel(x) * (ceil(log2(e)) if e > 1 else 1)


def _histogram_bins(x, bins=100, *args, out=None, **kwargs) -> int:
    return first_numel(x) * (2 if kwargs.get("range") else 4)  # range is keyword-only


reg(["histc"], "reduction", _histc)
reg(["histogram.bin_ct", "histogram.bin_ct_out"], "reduction", _histogram_bins)
reg(["histogram.bins_tensor", "histogram.bins_tensor_out"], "reduction", _histogram_edges)
reg(["bincount"], "reduction", reduction_flops(1))
