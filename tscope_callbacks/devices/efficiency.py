"""What a device's libraries achieve for a given shape: per-kernel time models calibrated from measured tables.

The roofline bound ``max(FLOPs / peak, bytes / bandwidth)`` is what the silicon allows; a GEMM library reaches a
different fraction of it for every shape (GPT-2's LM head, 8192x768 @ 768x50257, runs at 95-125 TFLOP/s on an H100,
at 50304 columns at ~680). A :class:`KernelModel` predicts the kernel time a shape really takes:

- **GEMM** (``gemm_s``): an analytic part -- tile quantization (64x128 tiles) and wave quantization over the SMs,
  a reachable fraction of the matrix peak, the memory bound, a ramp time, and a slow-path factor for operands whose
  rows are not 16-byte aligned (N or K not a multiple of 8 in bf16: no TMA/vectorized loads) -- times a correction
  learnt from the measured table: the inverse-distance average, over the 6 nearest measured shapes of the same
  alignment class (in log2 M, N, K), of measured / analytic. Leave-one-out on the H100 table: median error 9%, 87%
  of kernels over 20 µs within 1.3x.
- **Attention** (``attention_s``): the measured efficiency of the backend (flash / cuDNN / mem-efficient), causal or
  not, per computed 128x128 block, nearest in (batch x heads, length) among rows of the same head dim, times the
  op's FLOPs; the backward is the forward's time times the backend's measured backward / forward ratio. The
  packaged sweeps time one call between CUDA events, which at GPT-2's size is mostly host time: rows within 3x of
  the backend's fastest call are dropped (H100 GPT-2 step, cuDNN: the event-timed row predicts 0.29 ms a layer,
  the rows kept 0.18 ms, the kernels took 0.21 ms). ``tscope calibrate --gemm`` measures the rows as kernel time
  (``devices.sdpa_table``), and those replace the packaged rows for that device.
- **Memory-bound** ops (``memory_s``): a kernel's launch and ramp (:data:`MIN_KERNEL_S`) plus its bytes at the
  bandwidth share the closest op kind (add, gelu, copy, sum, softmax, layer_norm) streams at for that size. Sweep
  rows within 3x of the kind's fastest call time its host dispatch (add: 22 µs from 8 KB to 32 MB on the H100) and
  are not used, nor are rows faster than DRAM (L2 hits between the sweep's repeated calls); the kind's fastest call
  is its host time. The bytes are those the kernels move (``formulas.kernel_bytes``: softmax over long rows and
  layer_norm's backward pass over their operands more than once). ``tscope calibrate --gemm`` measures per-op curves
  as kernel time (``devices.memory_table``); an op follows its own, else its class's, else the packaged kind's.

Measured GEMM tables time one call between CUDA events, which adds the host's dispatch time (~15-20 µs) to every
kernel; the model subtracts it (``delta_s``: the table's fastest call minus :data:`MIN_KERNEL_S`), as kernels in a
training step run back to back. Tables ship for the devices measured (``devices/data/<device>.json``: H100, H200); ``tscope
calibrate --gemm`` measures one for the current GPU. Other GPUs use the H100 model's efficiencies against their own
datasheet roofs (``scaled=True``, said in the report).
"""

from __future__ import annotations

import functools
import json
import math
import re
from pathlib import Path
from typing import Any

import numpy as np

from tscope_callbacks.devices.cache import cached_gemm_table
from tscope_callbacks.devices.gemm import gemm_flops

__all__ = ["KernelModel", "model_for", "build_model", "forget", "fit_gemm", "MIN_KERNEL_S", "TABLE_DIR", "aligned"]

TABLE_DIR = Path(__file__).with_name("data")
MIN_KERNEL_S = 2.5e-6  #: the shortest kernel in a training step: launch and ramp of a back-to-back kernel
HOST_BOUND = 3.0  #: an event-timed sweep row under this multiple of its kind's fastest call is host time
ITEMSIZE = {"bf16": 2, "fp16": 2, "tf32": 4, "fp32": 4, "fp64": 8, "fp8": 1, "int8": 1}
_SMS = 132  #: SMs of the table devices (H100 SXM, H200); other devices' counts are not in the spec rows
#: memory-bound op kind -> bytes moved per element in the measured sweep (reads + writes), to turn times into GB/s
_SWEEP_BYTES_PER_ELEM = {"add": 3, "gelu": 2, "copy": 2, "sum": 1, "softmax": 2, "layer_norm": 2}
#: op class (records.CATEGORIES) -> the measured op kind whose bandwidth curve it follows
KIND_OF_CATEGORY = {"pointwise": "add", "norm": "layer_norm", "softmax": "softmax", "loss": "softmax",
                    "reduction": "sum", "memory": "copy", "embedding": "copy", "optimizer": "add"}
#: analytic GEMM parameters (eta, eta_mem, ramp_s, tile_m, tile_n, misaligned factor) when a table has none
DEFAULT_PARAMS = {"bf16": [0.9, 0.9, 6e-6, 64, 128, 0.3], "fp16": [0.8, 0.9, 6e-6, 64, 128, 0.3],
                  "tf32": [0.7, 0.6, 4e-6, 64, 128, 1.0], "fp32": [0.9, 0.6, 2e-6, 64, 128, 1.0]}


def aligned(n: int, k: int, itemsize: int) -> bool:
    """Operand rows start on 16-byte boundaries (what cuBLAS's fast tensor-core paths need)."""
    return (n * itemsize) % 16 == 0 and (k * itemsize) % 16 == 0


def _tile_waste(length: int, causal: bool, tile: int = 128) -> float:
    """Pairs a fused attention kernel computes (whole ``tile`` x ``tile`` blocks) per pair it attends."""
    n = math.ceil(length / tile)
    if causal:
        return n * (n + 1) // 2 * tile * tile / (length * (length + 1) // 2)
    return (n * tile) ** 2 / length ** 2


def _analytic(m: int, n: int, k: int, peak: float, bw: float, item: int, p: list, sms: int = _SMS,
              ok: bool | None = None) -> float:
    eta, eta_mem, ramp, tm, tn, mis = p
    ok = aligned(n, k, item) if ok is None else ok
    flops, nbytes = gemm_flops(m, k, n), item * (m * k + k * n + m * n)
    tiles_m, tiles_n = math.ceil(m / tm), math.ceil(n / tn)
    tiles = tiles_m * tiles_n
    waves = math.ceil(tiles / sms)
    q = tiles / (waves * sms) * (m * n) / (tiles_m * tm * tiles_n * tn)
    e = eta * q * (1.0 if ok else mis)
    return ramp + max(flops / (peak * e), nbytes / (bw * eta_mem))


def fit_gemm(points: list[tuple[int, int, int, float]], precision: str, peak: float, bw: float,
             sms: int = _SMS) -> list:
    """Least log-error analytic parameters for measured kernel times (a coarse grid: robust, ~1 s)."""
    item = ITEMSIZE.get(precision, 2)
    t = np.array([p[3] for p in points])
    best: tuple[float, list] | None = None
    for eta in (0.7, 0.75, 0.8, 0.85, 0.9):
        for eta_mem in (0.6, 0.75, 0.9):
            for ramp in (1e-6, 2e-6, 4e-6, 6e-6):
                for tm, tn in ((64, 128), (128, 128), (128, 256), (256, 128)):
                    for mis in (0.1, 0.15, 0.2, 0.3, 1.0):
                        p = [eta, eta_mem, ramp, tm, tn, mis]
                        pred = np.array([_analytic(m, n, k, peak, bw, item, p, sms) for m, n, k, _ in points])
                        err = float(np.sqrt(np.mean(np.log(pred / t) ** 2)))
                        if best is None or err < best[0]:
                            best = (err, p)
    return best[1] if best is not None else DEFAULT_PARAMS.get(precision, DEFAULT_PARAMS["bf16"])


class KernelModel:
    """Kernel-time predictions for one device (see the module docstring).

    ``peak``: matrix FLOP/s per precision, ``bandwidth``: bytes/s, of the device predicted for; ``table``: a measured
    table (this device's, or another's when ``scaled``)."""

    def __init__(self, table: dict[str, Any], peak: dict[str, float], bandwidth: float, *, scaled: bool = False,
                 table_peak: dict[str, float] | None = None, table_bandwidth: float | None = None,
                 gemm_table: dict[str, Any] | None = None) -> None:
        self.device = table.get("device", "?")
        self.scaled = scaled
        self.source = (f"{'scaled from ' if scaled else ''}{self.device} table: {table.get('source', '')}").strip()
        if gemm_table is not None:
            self.source = f"GEMMs: {gemm_table.get('source', 'calibrated')}; other ops: {self.source}"
        self.peak, self.bandwidth = peak, bandwidth
        tpeak, tbw = table_peak or peak, table_bandwidth or bandwidth
        floor = min((r[3] for rows in table.get("gemm", {}).values() for r in rows), default=MIN_KERNEL_S)
        self.delta_s = float(table.get("delta_s", max(0.0, floor - MIN_KERNEL_S)))
        # GEMM points as efficiencies relative to the analytic model (device-independent: transfer by roofs); a
        # calibrated table of this very device (``gemm_table``) replaces the packaged/scaled one
        g = gemm_table if gemm_table is not None else table
        gpeak, gbw = (peak, bandwidth) if gemm_table is not None else (tpeak, tbw)
        self.gemm_delta_s = float(g.get("gemm_delta_s", self.delta_s))
        self.sms = int(g.get("sms") or _SMS)
        self.params: dict[str, list] = {**DEFAULT_PARAMS, **g.get("gemm_params", {})}
        self._gemm: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        self._rows: dict[str, list] = {p: list(rows) for p, rows in g.get("gemm", {}).items()}
        for prec, rows in g.get("gemm", {}).items():
            item, p = ITEMSIZE.get(prec, 2), self.params.get(prec, DEFAULT_PARAMS["bf16"])
            pk = gpeak.get(prec) or gpeak.get("bf16", 1e15)
            feats, resid, cls = [], [], []
            for m, n, k, t in rows:
                kt = max(MIN_KERNEL_S, t - self.gemm_delta_s)
                feats.append((math.log2(m), math.log2(n), math.log2(k)))
                resid.append(math.log(kt / _analytic(m, n, k, pk, gbw, item, p, self.sms)))
                cls.append(aligned(n, k, item))
            self._gemm[prec] = (np.array(feats), np.array(resid), np.array(cls))
        # attention: a calibrated table of this device with kernel-timed SDPA rows (``devices.sdpa_table``) replaces
        # the packaged one, whose rows time one call between CUDA events (host work included: ``delta_s`` is taken
        # off, a lower bound of that host time)
        src = gemm_table if gemm_table is not None and gemm_table.get("sdpa") else table
        kernels = src.get("sdpa_timing") == "kernels"
        sdpa_rows = src.get("sdpa", [])
        sdpa_delta, sdpa_peak = (0.0, peak if src is gemm_table else tpeak) if kernels else (self.delta_s, tpeak)
        self.sdpa_source = "kernel-timed (tscope calibrate --gemm)" if kernels else "one call between CUDA events"
        if kernels:
            self.source += "; SDPA: kernel-timed"
        # an event-timed row measures the call's host work plus the part of the kernel that outlasts it: the smallest
        # configurations take the same time as each other (the host floor), so a row within HOST_BOUND x its
        # backend's fastest call in that direction says nothing about the kernel and is not used (H100 cuDNN, GPT-2's
        # 8x12x1024x64 causal: forward 84 µs and backward 235 µs between events, against a 35 µs / 178 µs floor, while
        # the training step's kernels take 206 µs for both); kernel-timed rows are all used
        fast_f: dict[str, float] = {}
        fast_b: dict[str, float] = {}
        for b, _bk, _h, _t, _d, _c, fs, bs in sdpa_rows:
            fast_f[b], fast_b[b] = min(fs, fast_f.get(b, math.inf)), min(bs, fast_b.get(b, math.inf))
        bound = 0.0 if kernels else HOST_BOUND
        self._sdpa = []
        ratios: dict[str, list[float]] = {}  # backward / forward kernel time where both rows say something
        for b, bk, h, t, d, c, fs, bs in sdpa_rows:
            use_f, use_b = fs >= bound * fast_f[b], bs >= bound * fast_b[b]
            self._sdpa.append((b, bk, h, t, d, c,
                               self._eff_sdpa(bk, h, t, d, c, fs, False, sdpa_peak, sdpa_delta) if use_f else None,
                               self._eff_sdpa(bk, h, t, d, c, bs, True, sdpa_peak, sdpa_delta) if use_b else None))
            if use_f and use_b:
                ratios.setdefault(b, []).append(bs / fs)
        self._bwd_ratio = {b: float(np.median(r)) for b, r in ratios.items()}
        # memory-bound sweeps: an event-timed call is the op's host dispatch (the kind's fastest call, less the
        # shortest kernel) plus its kernel, so rows within HOST_BOUND x that floor are host time (H100: add 22 µs and
        # layer_norm 42 µs from 8 KB to 32 MB) and only the rest say what bandwidth the kernel streams at
        self._mem: dict[str, dict[str, list[tuple[float, float]]]] = {}  #: kind -> dtype -> (log2 bytes, bw share)
        for name, per in table.get("memory", {}).items():
            kind = re.sub(r"_\d+$", "", name)  # "softmax_1024": the sweep's row length, not another op
            for dt, rows in per.items():
                if not rows:
                    continue
                fastest = min(t for _, t in rows)
                per_elem = ITEMSIZE.get(dt, 4) * _SWEEP_BYTES_PER_ELEM.get(kind, 2)
                pts = [(math.log2(n * per_elem), n * per_elem / max(t - fastest, MIN_KERNEL_S) / tbw)
                       for n, t in rows if t >= HOST_BOUND * fastest]
                # a row faster than DRAM streams found its operands in L2 from the call before (H100 add fp32, 16M
                # elements: 201 MB in 53.9 µs = 3.73 TB/s against 3.35); a training step's op does not
                pts = [pt for pt in pts if pt[1] <= 1.0] or [min(pts or [(0.0, 0.8)], key=lambda pt: pt[1])]
                self._mem.setdefault(kind, {})[dt] = sorted(pts)
        # kernel-timed per-op curves of this very device (``devices.memory_table``): an op with rows follows its own
        # and every other op of a measured class follows that class's rows (all its ops merged)
        self._op_mem: dict[str, dict[str, list[tuple[float, float]]]] = {}
        self._cls_mem: dict[str, dict[str, list[tuple[float, float]]]] = {}
        if gemm_table is not None and gemm_table.get("memory_timing") == "kernels":
            classes = gemm_table.get("memory_op_class", {})
            merged: dict[str, dict[str, list[tuple[float, float]]]] = {}
            for op, per in gemm_table.get("memory_ops", {}).items():
                for dt, rows in per.items():
                    pts = [(math.log2(b), b / max(t - MIN_KERNEL_S, 0.1 * MIN_KERNEL_S) / bandwidth)
                           for b, t in rows if b > 0 and t > 0]
                    if pts:
                        self._op_mem.setdefault(op, {})[dt] = _curve(pts)
                        if op in classes:
                            merged.setdefault(classes[op], {}).setdefault(dt, []).extend(pts)
            self._cls_mem = {c: {dt: _curve(p) for dt, p in per.items()} for c, per in merged.items()}
            if self._op_mem:
                self.source += f"; memory-bound: {len(self._op_mem)} ops kernel-timed"

    @staticmethod
    def _eff_sdpa(b: int, h: int, t: int, d: int, causal: bool, seconds: float, backward: bool,
                  peak: dict[str, float], delta_s: float) -> float:
        pairs = t * (t + 1) // 2 if causal else t * t
        flops = b * h * pairs * 4 * d * (2.5 if backward else 1.0)  # the sweep's convention (hardware, 5 GEMMs)
        # per computed tile: a kernel computes whole 128x128 blocks, so its efficiency over attended pairs falls with
        # the masked share of the diagonal blocks (causal 1024: 11% of computed pairs, 2048: 6%)
        return flops / max(MIN_KERNEL_S, seconds - delta_s) / peak.get("bf16", 1e15) * _tile_waste(t, causal)

    # ---------------- predictions ----------------
    @functools.lru_cache(maxsize=8192)  # noqa: B019  (models live as long as the process; shapes repeat)
    def gemm_s(self, m: int, n: int, k: int, precision: str = "bf16", ok: bool | None = None) -> float:
        """Kernel seconds of an (M x K) @ (K x N) GEMM at ``precision``. ``ok``: whether every operand's leading
        dimension is 16-byte aligned, where the caller knows the storage (None: row-major operands, as measured:
        N and K)."""
        if min(m, n, k) <= 0:
            return 0.0
        prec = precision if precision in self._gemm or precision in DEFAULT_PARAMS else "bf16"
        item = ITEMSIZE.get(prec, 2)
        ok = aligned(n, k, item) if ok is None else ok
        peak = self.peak.get(prec) or self.peak.get("bf16", 1e15)
        base = _analytic(m, n, k, peak, self.bandwidth, item, self.params.get(prec, DEFAULT_PARAMS["bf16"]), self.sms,
                         ok)
        data = self._gemm.get(prec) or self._gemm.get("bf16")
        if data is None or not len(data[0]):
            return max(MIN_KERNEL_S, base)
        feats, resid, cls = data
        same = cls == ok
        if not same.any():
            return max(MIN_KERNEL_S, base)
        f, r = feats[same], resid[same]
        dist = np.abs(f - np.array([math.log2(m), math.log2(n), math.log2(k)])).sum(axis=1)
        idx = np.argsort(dist)[:6]
        w = 1.0 / (dist[idx] + 0.05) ** 2
        return max(MIN_KERNEL_S, base * math.exp(float((w * r[idx]).sum() / w.sum())))

    def gemm_loo(self, precision: str = "bf16") -> list[tuple[int, int, int, float, float]]:
        """Leave-one-out check of the GEMM model on its own table: per measured shape (M, N, K, measured kernel
        seconds, predicted without that point). ``tscope calibrate --gemm`` prints its summary; the tests hold it."""
        data, rows = self._gemm.get(precision), self._rows.get(precision, [])
        if data is None:
            return []
        feats, resid, cls = data
        item = ITEMSIZE.get(precision, 2)
        peak = self.peak.get(precision) or self.peak.get("bf16", 1e15)
        out = []
        for i, (m, n, k, t) in enumerate(rows):
            same = cls == cls[i]
            same[i] = False
            if not same.any():
                continue
            f, r = feats[same], resid[same]
            dist = np.abs(f - feats[i]).sum(axis=1)
            idx = np.argsort(dist)[:6]
            w = 1.0 / (dist[idx] + 0.05) ** 2
            base = _analytic(m, n, k, peak, self.bandwidth, item, self.params.get(precision, DEFAULT_PARAMS["bf16"]),
                             self.sms)
            pred = max(MIN_KERNEL_S, base * math.exp(float((w * r[idx]).sum() / w.sum())))
            out.append((m, n, k, max(MIN_KERNEL_S, t - self.gemm_delta_s), pred))
        return out

    def attention_s(self, backend: str, batch_heads: int, length: int, head_dim: int, causal: bool,
                    backward: bool, flops: float, precision: str = "bf16") -> float:
        """Kernel seconds of a fused attention op doing ``flops`` (hardware FLOPs), from the nearest measured
        configuration of its backend ("FLASH_ATTENTION", "CUDNN_ATTENTION", "EFFICIENT_ATTENTION")."""
        peak = self.peak.get(precision) or self.peak.get("bf16", 1e15)
        q = (math.log2(max(batch_heads, 1)), math.log2(max(length, 1)), math.log2(max(head_dim, 1)))

        def dist(s: tuple) -> float:
            return abs(math.log2(s[1] * s[2]) - q[0]) + abs(math.log2(s[3]) - q[1]) + 2 * abs(math.log2(s[4]) - q[2])

        def predict(bwd: bool, work: float) -> float | None:
            col = 7 if bwd else 6
            rows = [s for s in self._sdpa if s[col] is not None]
            cands = [s for s in rows if s[0] == backend and s[5] == causal] or \
                [s for s in rows if s[5] == causal] or rows
            if not cands:
                return None
            # another head dim is another kernel (its tile shapes): rows of this one, where the backend has some
            cands = [s for s in cands if s[4] == head_dim] or cands
            best = sorted(cands, key=dist)[:2]
            w = [1.0 / (dist(s) + 0.05) ** 2 for s in best]
            eff = math.exp(sum(wi * math.log(s[col]) for wi, s in zip(w, best)) / sum(w))
            return max(MIN_KERNEL_S, work * _tile_waste(length, causal) / (peak * eff))

        fwd = predict(False, flops / 2.5 if backward else flops)
        if fwd is None:
            return max(MIN_KERNEL_S, flops / (0.3 * peak))
        if not backward:
            return fwd
        # the backward follows the forward's shape efficiency, times the backend's measured backward / forward ratio
        ratio = self._bwd_ratio.get(backend)
        return ratio * fwd if ratio else (predict(True, flops) or 2.5 * fwd)

    def memory_s(self, category: str, nbytes: float, dtype: str = "bf16", op: str | None = None,
                 launches: int = 1) -> float:
        """Kernel seconds of a memory-bound op of class ``category`` whose ``launches`` kernels move ``nbytes``:
        each kernel's launch and ramp plus the bytes at the bandwidth share its curve gives (log-bytes
        interpolation, the end values beyond the ends). The curve: op ``op``'s own where this device was calibrated
        for it (its launches are in the measurement), else the calibrated ops of its class, else its class's
        packaged op kind."""
        if nbytes <= 0:
            return 0.0
        own = self._op_mem.get(op) if op else None
        extra = 0.0 if own else max(launches - 1, 0) * MIN_KERNEL_S
        per = own or self._cls_mem.get(category) \
            or self._mem.get(KIND_OF_CATEGORY.get(category, "copy")) or self._mem.get("copy")
        if not per:
            return extra + MIN_KERNEL_S + nbytes / (0.8 * self.bandwidth)
        pts = per.get(dtype) or per.get("bf16") or next(iter(per.values()))
        x = math.log2(nbytes)
        share = pts[0][1] if x <= pts[0][0] else pts[-1][1]
        for (x0, s0), (x1, s1) in zip(pts, pts[1:]):
            if x0 <= x <= x1:
                share = math.exp(math.log(s0) + (math.log(s1) - math.log(s0)) * (x - x0) / (x1 - x0))
                break
        return extra + MIN_KERNEL_S + nbytes / (self.bandwidth * min(share, 1.0))


def _curve(pts: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """(log2 bytes, share) points sorted, those at one size merged (geometric mean): an interpolable curve."""
    by: dict[float, list[float]] = {}
    for x, sh in pts:
        by.setdefault(round(x, 6), []).append(math.log(sh))
    return [(x, math.exp(sum(v) / len(v))) for x, v in sorted(by.items())]


@functools.lru_cache(maxsize=8)
def _load(path: str) -> dict[str, Any]:
    return json.loads(Path(path).read_text())


def _tables() -> dict[str, Path]:
    out: dict[str, Path] = {}
    for p in sorted(TABLE_DIR.glob("*.json")):
        try:
            out[_load(str(p))["device"]] = p
        except (OSError, ValueError, KeyError):
            continue
    return out


_MODELS: dict[tuple, KernelModel | None] = {}


def model_for(spec: Any, table: dict[str, Any] | None = None) -> KernelModel | None:
    """Cached :func:`build_model` per device roofs (and table)."""
    key = (spec.name, float(spec.bandwidth), tuple(sorted(spec.flops.items())), id(table) if table else None)
    if key not in _MODELS:
        _MODELS[key] = build_model(spec, table)
    return _MODELS[key]


def build_model(spec: Any, table: dict[str, Any] | None = None) -> KernelModel | None:
    """The kernel model for a device spec: its own measured table (``table``, a calibration, or a packaged one), else
    the H100 table's efficiencies scaled to its datasheet roofs; None for measured CPU roofs (no GPU library)."""
    if getattr(spec, "measured", False) and getattr(spec, "vendor", "") == "cpu":
        return None
    peak = {p: float(v) for p, v in spec.flops.items()}
    if "fp32" not in peak and "fp32" in spec.vector_flops:
        peak["fp32"] = float(spec.vector_flops["fp32"])
    if table is not None:
        return KernelModel(table, peak, float(spec.bandwidth))
    calibrated = cached_gemm_table(spec.name)
    tables = _tables()
    own = tables.get(spec.name)
    if own is not None:
        return KernelModel(_load(str(own)), peak, float(spec.bandwidth), gemm_table=calibrated)
    ref = tables.get("NVIDIA H100 SXM")
    if ref is None:
        return KernelModel(calibrated, peak, float(spec.bandwidth)) if calibrated is not None else None
    ref_peak = {"bf16": 989.4e12, "fp16": 989.4e12, "tf32": 494.7e12, "fp32": 66.9e12}
    return KernelModel(_load(str(ref)), peak, float(spec.bandwidth), scaled=True, table_peak=ref_peak,
                       table_bandwidth=3.35e12, gemm_table=calibrated)


def forget(name: str) -> None:
    """Drop the cached models of device ``name`` (after ``calibrate --gemm`` stored a new table for it)."""
    for key in [k for k in _MODELS if k[0] == name]:
        del _MODELS[key]
