"""The dashboard's report dict built from a step file of the version-1 layout (``{"profile", "device", "report"}``:
the callbacks' ``tscope/step_<N>.json`` before the typed ``StepReport``).

The page renders only the StepReport contract (``tscope_callbacks.dashboard.page``'s docstring); this module maps a
``RooflineReport`` and its ``StepProfile`` onto it, figure for figure, so the page reads the files the callbacks write
today. Nothing is recomputed that the report does not already hold except per-op roofs (``analysis.rows.OpRoof``,
the same objects the report's rows sum).
"""

from __future__ import annotations

import datetime as _dt
import json
import math
from typing import Any

__all__ = ["report_dict", "report_dict_from_file", "StepFileError"]

SCHEMA = "tscope.step_report"
VERSION = 2


class StepFileError(ValueError):
    """A step file that cannot be shown (corrupt, half-written, or of an unknown schema); the message says why."""


def _fin(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


def _safe(o: Any) -> Any:
    if isinstance(o, dict):
        return {str(k): _safe(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [_safe(v) for v in o]
    if isinstance(o, float):
        return _fin(o)
    if isinstance(o, (str, int, bool)) or o is None:
        return o
    return str(o)


def _fig(value: Any, unit: str, basis: str) -> dict[str, Any]:
    return {"value": _fin(float(value)) if isinstance(value, (int, float)) else None, "unit": unit, "basis": basis}


def _row(r: dict[str, Any]) -> dict[str, Any]:
    out = dict(r)
    out["pct_of_roof"] = r.get("attained")
    out["calls"] = r.get("n_ops")
    return out


def report_dict(report: Any, profile: Any, *, step: int | None = None, stage: str = "train", run: str | None = None,
                spec: Any = None) -> dict[str, Any]:
    """The contract dict of one profiled step (``report``: a ``RooflineReport`` of ``profile``)."""
    d = report.to_dict()
    s = d["summary"]
    meta = profile.meta or {}
    spec = spec if spec is not None else report.spec
    step = step if step is not None else meta.get("step", s.get("step"))
    timing = s.get("timing") or "untimed"
    basis = s.get("step_time_basis_text") or ("expected kernel time (untimed)" if not s.get("timed") else
                                               "op time")
    step_s = s.get("measured_step_s")
    mc = meta.get("memory_categories") or {}
    peak = mc.get("step_peak") if isinstance(mc, dict) else None
    dev_mem = getattr(spec, "memory_bytes", None)
    from tscope_callbacks.analysis.model_summary import model_summary

    ms = model_summary(report)
    mfu_basis = f"model FLOPs / ({basis} x {s.get('mfu_precision') or 'fp32'} peak)"
    header = {
        "step_ms": _fig(step_s * 1e3 if step_s else None, "ms", basis),
        "estimated_step_ms": _fig((s.get("estimated_step_s") or 0) * 1e3, "ms", "sum of per-op roofline times"),
        "mfu": _fig(s.get("mfu"), "fraction", mfu_basis),
        "mbu": _fig(s.get("mbu"), "fraction", f"bytes moved / ({basis} x bandwidth)"),
        "hfu": _fig(s.get("hfu"), "fraction", f"hardware FLOPs (recompute included) / ({basis} x peak)"),
        "achieved_tflops": _fig(s.get("achieved_tflops"), "TFLOP/s", f"model FLOPs / {basis}"),
        "tokens_per_s": _fig(ms.get("tokens_per_s"), "tokens/s", f"tokens per step / {basis}"),
        "samples_per_s": _fig(ms.get("samples_per_s"), "samples/s", f"samples per step / {basis}"),
        "memory_peak_bytes": _fig(peak, "bytes", (mc.get("step_peak_basis") if isinstance(mc, dict) else None)
                                  or "not measured"),
        "flop_coverage": _fig(s.get("flop_coverage"), "fraction", "share of ops with a FLOP formula, by time"),
    }
    cats = {}
    if isinstance(mc, dict):
        for src, dst in (("params", "weights"), ("buffers", "buffers"), ("grads", "grads"),
                         ("optimizer_state", "optimizer_state"), ("activations_saved", "activations_saved")):
            if isinstance(mc.get(src), (int, float)):
                cats[dst] = mc[src]
        tracked = mc.get("step_tracked_peak")
        if isinstance(tracked, (int, float)) and isinstance(mc.get("activations_saved"), (int, float)):
            cats["temporaries"] = max(0, tracked - mc["activations_saved"])
    fits = None if not (peak and dev_mem) else bool(peak <= dev_mem)
    verdict = ("not measured" if not peak else f"{peak / 2**20:.4g} MiB peak" +
               (f" of {dev_mem / 2**30:.4g} GiB: {'fits' if fits else 'does not fit'}" if dev_mem else
                " (device memory unknown)"))
    op_s = s.get("op_time_s") or 0.0
    total_s = step_s or op_s or s.get("estimated_step_s") or 0.0
    t_basis = (f"fractions of measured op time, scaled to the step ({basis})" if s.get("timed")
               else "expected kernel time")
    frac = lambda k: (s.get(k) or 0.0) * (op_s if s.get("timed") else total_s)  # noqa: E731
    split = {"compute_bound_s": frac("compute_bound_time_frac"), "memory_bound_s": frac("memory_bound_time_frac"),
             "communication_s": frac("comm_time_frac"), "overhead_s": frac("overhead_time_frac")
             + frac("uncounted_time_frac"), "idle_s": max(0.0, total_s - op_s) if s.get("timed") and step_s else 0.0,
             "input_s": None, "basis": t_basis}
    ops = []
    for i, o in enumerate(report.op_roofs):
        r = o.record
        ops.append({"i": i, "op": r.op, "layer": r.layer, "phase": r.phase, "category": r.category,
                    "flops": r.flops, "bytes": r.bytes, "time_s": _fin(r.time_s), "estimate_s": _fin(o.estimate_s),
                    "expected_s": _fin(o.expected_s), "pct_of_roof": _fin(o.attained), "bound": o.bound,
                    "precision": o.precision, "dtype": r.dtype, "input_shapes": r.input_shapes,
                    "output_shapes": r.output_shapes, "counted": r.counted})
    layers = []
    for rec in (profile.layers or {}).values():
        layers.append(rec.to_dict() if hasattr(rec, "to_dict") else dict(getattr(rec, "__dict__", rec)))
    step_ref = step_s or s.get("estimated_step_s")
    opps = []
    for o in d.get("opportunities") or []:
        sv = o.get("saving_s")
        opps.append({"title": (o.get("fix") or o.get("reason") or "").split(";")[0][:120],
                     "layer": o.get("layer"), "phase": o.get("phase"), "type": o.get("type"), "op": None,
                     "cause": o.get("reason"), "change": o.get("fix") or "", "saving_s": sv,
                     "saving_frac": (sv / step_ref) if sv and step_ref else None, "kind": o.get("kind")})
    nonfinite = []
    for rec in layers:
        for k in ("nonfinite_output", "nonfinite_grad_input", "nonfinite_grad_output"):
            if rec.get(k):
                nonfinite.append({"step": step, "layer": rec.get("path"), "op": None,
                                  "phase": "forward" if k == "nonfinite_output" else "backward", "line": None,
                                  "kind": k.replace("nonfinite_", "")})
    device = {"name": getattr(spec, "name", s.get("device")), "source": getattr(spec, "source", s.get("device_source")),
              "measured": bool(getattr(spec, "measured", False)), "bandwidth": getattr(spec, "bandwidth", None),
              "peaks": dict(getattr(spec, "flops", {}) or {}), "achievable": None, "memory_bytes": dev_mem}
    out = {
        "schema": SCHEMA, "version": VERSION, "step": step, "stage": stage, "run": run,
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "device": device, "header": header,
        "memory": {"peak_bytes": peak, "device_bytes": dev_mem, "fits": fits, "verdict": verdict, "categories": cats},
        "time_split": split,
        "rows": {"layer_phase": [_row(r) for r in d["layers"]], "layer": [_row(r) for r in d["layer_totals"]],
                 "inclusive": [_row(r) for r in d["inclusive"]], "category": [_row(r) for r in d["by_category"]],
                 "op_name": [_row(r) for r in d["by_op"]]},
        "ops": ops, "layers": layers,
        "model": {"name": s.get("model"), **{k: v for k, v in ms.items() if isinstance(v, (int, float, str))}},
        "communication": None, "fsdp_whatif": None, "compiled_vs_eager": None, "what_if": None,
        "opportunities": opps, "nonfinite": nonfinite, "noise": d.get("noise") or {},
        "scalars": d.get("scalars") or {}, "user": {},
        "totals": _row(d["totals"]), "roofs": d.get("roofs") or [], "summary": {"timing": timing, **s},
    }
    return _safe(out)


def report_dict_from_file(path: str, *, run: str | None = None) -> dict[str, Any]:
    """The contract dict of a saved step file; :class:`StepFileError` with a one-line reason when unusable."""
    import os
    import re

    try:
        with open(path) as fh:
            data = json.load(fh)
    except OSError as e:
        raise StepFileError(f"cannot read {path}: {e.strerror or e}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise StepFileError(f"{os.path.basename(path)} is not valid JSON (corrupt or still being written: {e})") from None
    if isinstance(data, dict) and data.get("schema") == SCHEMA:
        if data.get("version") != VERSION:
            raise StepFileError(f"{os.path.basename(path)}: schema {SCHEMA} version {data.get('version')}; this "
                                f"dashboard reads version {VERSION}")
        return data
    if isinstance(data, dict) and isinstance(data.get("report"), dict) and data["report"].get("schema") == SCHEMA:
        return data["report"]
    from tscope_callbacks.api import roofline
    from tscope_callbacks.cli.report import load

    try:
        prof, dev = load(path)
        rep = roofline(prof, dev or None)
    except (LookupError, ValueError, OSError) as e:
        raise StepFileError(str(e)) from None
    m = re.search(r"(?:(\w+)_)?step_(\d+)\.json$", os.path.basename(path))
    stage = (m.group(1) or "train") if m else "train"
    return report_dict(rep, prof, step=int(m.group(2)) if m else None, stage=stage, run=run, spec=rep.spec)
