"""Communication on the roofline: collectives per kind against the interconnect, exposed time, overlap, rank skew.

Per collective kind and process group (:func:`comm_rows`): calls, bytes (nccl-tests' S), time, algorithm bandwidth
S / t, bus bandwidth algbw x factor (all-reduce 2(n-1)/n; all-gather, reduce-scatter, all-to-all (n-1)/n; broadcast,
send/recv 1) and the bus bandwidth's share of the link roof (one direction of the device's fastest link), and where
the calls were launched from (layers, phases). On a CPU host (gloo) a collective's time is its launch (the work
runs in gloo's threads), so bandwidths are left out there.

Exposed communication and overlap (:func:`overlap`) follow HTA: unions of kernel intervals per kind across streams,
never sums of self times -- exposed = communication time not covered by any compute kernel, overlap fraction = the
covered share, idle = the span minus the union of everything. Rank skew (:func:`skew`) follows TraceLens: for the
k-th collective on every rank, latency = the shortest duration across ranks (the transfer itself), wait = each
rank's duration minus it (time spent waiting for the slowest rank to arrive), spread = latest start minus earliest.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from tscope_callbacks.analysis.fmt import div as _div
from tscope_callbacks.analysis.rows import OpRoof
from tscope_callbacks.formulas.intervals import merge_intervals, union_length

if TYPE_CHECKING:
    from tscope_callbacks.analysis.roofline import RooflineAnalysis

__all__ = ["comm_rows", "overlap", "overlap_of", "skew"]


def _length(iv: list[tuple[int, int]]) -> int:
    return sum(e - s for s, e in iv)


def _intersection(a: list[tuple[int, int]], b: list[tuple[int, int]]) -> int:
    i = j = total = 0
    while i < len(a) and j < len(b):
        s, e = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if s < e:
            total += e - s
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def overlap(kernels: Sequence[tuple[int, int, bool]]) -> dict[str, float] | None:
    """From (start_ns, end_ns, is_comm) device intervals: ``compute_s``, ``comm_s`` (unions), ``exposed_comm_s``
    (comm not covered by compute), ``overlap_frac`` (covered share of comm; None without comm), ``idle_s`` (span
    minus the union of all), ``span_s``. None without kernels."""
    if not kernels:
        return None
    comp = merge_intervals((s, e) for s, e, c in kernels if not c)
    comm = merge_intervals((s, e) for s, e, c in kernels if c)
    both = _intersection(comp, comm)
    span = max(e for _, e, _ in kernels) - min(s for s, _, _ in kernels)
    busy = union_length((s, e) for s, e, _ in kernels)
    comm_len = _length(comm)
    return {"compute_s": _length(comp) * 1e-9, "comm_s": comm_len * 1e-9, "exposed_comm_s": (comm_len - both) * 1e-9,
            "overlap_frac": both / comm_len if comm_len else None, "idle_s": (span - busy) * 1e-9,
            "span_s": span * 1e-9}


def skew(per_rank: Sequence[Sequence[tuple[str, float, float]]]) -> dict[str, Any] | None:
    """TraceLens-style skew from each rank's collectives in launch order, ``(kind, start_s, duration_s)`` on a
    clock shared by the ranks (one host). Returns ``latency_s`` (sum over collectives of the shortest duration),
    ``wait_s`` per rank (its durations minus the latencies), ``max_wait_s``, ``spread_s`` (sum of start spreads),
    ``slowest_rank`` (the one the others waited for most often: the latest to start), ``collectives`` matched; None
    when ranks did not run the same sequence of collectives."""
    if len(per_rank) < 2 or not per_rank[0]:
        return None
    n = len(per_rank[0])
    if any(len(r) != n or [k for k, _, _ in r] != [k for k, _, _ in per_rank[0]] for r in per_rank):
        return None
    latency = spread = 0.0
    wait = [0.0] * len(per_rank)
    last = [0] * len(per_rank)
    for i in range(n):
        durs = [r[i][2] for r in per_rank]
        starts = [r[i][1] for r in per_rank]
        lat = min(durs)
        latency += lat
        spread += max(starts) - min(starts)
        for k, d in enumerate(durs):
            wait[k] += d - lat
        last[max(range(len(starts)), key=starts.__getitem__)] += 1
    return {"collectives": n, "latency_s": latency, "wait_s": wait, "max_wait_s": max(wait), "spread_s": spread,
            "slowest_rank": max(range(len(last)), key=last.__getitem__)}


def overlap_of(kernels: Sequence[Sequence[Any]] | None, ops: Sequence[OpRoof]) -> dict[str, float] | None:
    """HTA-style overlap of a step's recorded kernels (``CaptureInfo.kernels``; :func:`overlap`): a kernel is
    communication when the op that launched it is a collective, or its name is NCCL's/RCCL's."""
    if not kernels:
        return None
    comm_ops = {i for i, o in enumerate(ops) if o.record.category == "comm"}
    return overlap([(int(k[1]), int(k[1]) + int(k[2]), (k[4] in comm_ops) or "nccl" in str(k[0]).lower())
                    for k in kernels])


def comm_rows(report: RooflineAnalysis) -> list[dict[str, Any]]:
    """Per (collective, group): ``collective``, ``group``, ``group_size``, ``calls``, ``bytes`` (S summed),
    ``time_s`` (None untimed), ``algbw`` and ``busbw`` (bytes/s; None on a CPU host or untimed), ``pct_of_link``,
    ``roof_s`` (link bytes / link roof), ``layers`` (launched from), ``phases``; largest time (bytes) first."""
    link = getattr(report.spec, "link_bandwidth", None)
    cpu = report.info.device == "cpu"
    rows: dict[tuple[str, str], dict[str, Any]] = {}
    for o in report.op_roofs:
        c = o.record.comm
        if not c or c.get("collective") == "wait":
            continue
        row = rows.setdefault((c["collective"], c.get("group") or ""), {
            "collective": c["collective"], "group": c.get("group") or "", "group_size": c.get("group_size"),
            "calls": 0, "bytes": 0, "link_bytes": 0.0, "time_s": None, "roof_s": 0.0, "layers": {}, "phases": {}})
        row["calls"] += 1
        row["bytes"] += int(c.get("bytes") or 0)
        row["link_bytes"] += o.link_bytes
        row["roof_s"] += o.estimate_s
        if o.measured_s is not None:
            row["time_s"] = (row["time_s"] or 0.0) + o.measured_s
        lay = o.record.layer or "(root)"
        row["layers"][lay] = row["layers"].get(lay, 0) + 1
        row["phases"][o.record.phase] = row["phases"].get(o.record.phase, 0) + 1
    out = []
    for row in rows.values():
        t = row["time_s"]
        row["algbw"] = None if cpu else _div(row["bytes"], t)
        row["busbw"] = None if cpu else _div(row["link_bytes"], t)
        row["pct_of_link"] = _div(row["busbw"], link)
        out.append(row)
    return sorted(out, key=lambda r: (-(r["time_s"] or 0.0), -r["bytes"]))
