"""Rendering of a roofline analysis: markdown, CSV, JSON-safe dict, rich console.

"Roof" always means the datasheet roof of the spec (or the measured roof when the spec itself is measured, e.g. on
CPU); "achievable" is the calibrated roof shown beside it when known.
"""

from __future__ import annotations

import csv
import math
from typing import Any

from tscope_callbacks.analysis.comm import comm_rows
from tscope_callbacks.analysis.fmt import fig as _f
from tscope_callbacks.analysis.fmt import g as _g
from tscope_callbacks.analysis.fmt import n as _n
from tscope_callbacks.analysis.fmt import pct as _pct
from tscope_callbacks.analysis.memory_fit import report_memory_fit
from tscope_callbacks.analysis.model_summary import model_summary
from tscope_callbacks.analysis.rows import Row
from tscope_callbacks.analysis.summary import roofs_used
from tscope_callbacks.render.fsdp import fsdp_lines
from tscope_callbacks.render.notes import basis_extra, environment_lines, noise_dict, noise_lines

__all__ = ["header_lines", "to_markdown", "to_csv", "to_dict", "to_console", "json_safe", "op_table", "COLUMNS",
           "columns", "compare_table", "opportunity_line"]

def _p(x: float | None) -> str:
    return "" if x is None else _pct(x)


def _time_basis(s: dict[str, Any]) -> str:
    return "estimated" if not s["timed"] else f"measured op time {_f(s['op_time_s'], '.4g', 1e3)} ms" \
        if s["op_time_s"] else "measured"


def _outside_ops(s: dict[str, Any]) -> str:
    """The part of the (unprofiled) step the ops do not account for, when the step basis is not the op time itself:
    host time between ops on CPU (Python, hooks, data loading), the device waiting for work on CUDA."""
    step, ops = s["measured_step_s"], s["op_time_s"] if s["timed"] else None
    if not step or not ops or s["step_time_source"] == "op-time" or step - ops < 0.01 * step:
        return ""
    where = ("the device did no op work (launch- or host-bound)" if str(s["timing"]).startswith("cuda")
             else "host time between ops: Python, hooks, data loading")
    return f"; outside ops: {_f(step - ops, '.4g', 1e3)} ms of the {_f(step, '.4g', 1e3)} ms step " \
           f"({_pct((step - ops) / step)}): {where}"


def _roof_line(r: dict[str, Any]) -> str:
    kind = "matrix" if r["matrix"] else "vector"
    s = f"{r['precision']} {kind} {r['peak_flops'] / 1e12:.4g} TFLOP/s (ridge {_g(r['ridge'])} FLOP/B)"
    if r["achievable_peak_flops"] and r["achievable_bandwidth"]:
        s += f" / achievable {r['achievable_peak_flops'] / 1e12:.4g} TFLOP/s"
    return s


def header_lines(report: Any) -> list[str]:
    """The figures above the table: device, roofs, precision, step times, MFU/MBU, bound fractions, coverage."""
    s = report.summary
    title = " · ".join(str(x) for x in (s["device"], s["model"], f"step {s['step']}" if s["step"] is not None
                                        else None) if x)
    roof = s["roof"] + (f"; achievable roof: {s['achievable_roof']} (\"% of achievable\")" if s["achievable_roof"]
                        else "")
    lines = [f"## Roofline — {title}", "", model_line(report),
             f"- **Roofs**: {roof}; \"% of roof\" = estimate / measured on the {s['roof']} roof; "
             f"bandwidth {s['bandwidth'] / 1e9:.4g} GB/s",
             "- **Roofs used**: " + ("; ".join(_roof_line(r) for r in roofs_used(report)[:4]) or "none (no ops)"),
             f"- **Precision**: {s['dominant_precision']} dominant; MFU per device (this rank's model FLOPs over its "
             f"step time and one device's peak: under TP/FSDP the local shards' FLOPs) against the {s['mfu_precision']} "
             "matrix roof "
             f"({s['mfu_peak_flops'] / 1e12:.4g} TFLOP/s); float32 matmul precision "
             f"{s['float32_matmul_precision'] or 'highest'}"]
    if s.get("kernel_model"):
        est = (f"expected {_f(s['estimated_step_s'], '.4g', 1e3)} ms (sum of shape-aware kernel estimates from "
               f"{s['kernel_model']}; roofline bound {_f(s['roof_step_s'], '.4g', 1e3)} ms)")
    else:
        est = f"estimated {_f(s['estimated_step_s'], '.4g', 1e3)} ms (sum of per-op roofs)"
    if s["measured_step_s"] is not None:
        ops = f"op time {_f(s['op_time_s'], '.4g', 1e3)} ms" if s["timed"] else "ops not timed"
        extra = ""
        if s["device_idle_s"] is not None:
            extra += f"; GPU idle {_f(s['device_idle_s'], '.4g', 1e3)} ms during the capture"
        if s["wall_time_s"]:
            extra += f"; captured region {_f(s['wall_time_s'], '.4g', 1e3)} ms wall (slowed by the capture; not used)"
        extra += _cost_text(s.get("capture_cost"))
        lines += [f"- **Step**: measured {_f(s['measured_step_s'], '.4g', 1e3)} ms ({s['step_time_basis_text']}"
                  f"{basis_extra(report.meta)}) -- "
                  f"the basis of MFU/MBU; {ops}; {est}{extra}",
                  f"- **MFU** {_p(s['mfu'])} · **MBU** {_p(s['mbu'])} · {_f(s['achieved_tflops'], '.4g')} TFLOP/s · "
                  f"{_f(s['achieved_gbps'], '.4g')} GB/s achieved"]
        if s["hardware_flops"] != s["model_flops"]:
            rec = (f"{_n(s['recompute_flops'] / 1e9)} GFLOP of activation-checkpointing recompute, "
                   if s["recompute_flops"] else "")
            lines += [f"- **HFU** {_p(s['hfu'])} (hardware FLOPs: everything that ran, incl. {rec}attention "
                      f"backward's recomputed scores) vs **MFU** {_p(s['mfu'])} (model FLOPs: without recompute, "
                      "attention backward as 2x its forward)"]
    else:
        lines += [f"- **Step**: not timed; {est}"
                  + (f"; MFU at the estimate {_p(s['estimated_mfu'])}" if s["estimated_mfu"] is not None else "")]
    lines += environment_lines(report)
    if s["compute_bound_time_frac"] is not None:
        lines += [f"- **Time** ({_time_basis(s)}): {_p(s['compute_bound_time_frac'])} compute-bound · "
                  f"{_p(s['memory_bound_time_frac'])} memory-bound · {_p(s['uncounted_time_frac'])} uncounted · "
                  f"{_p(s['overhead_time_frac'])} overhead (views, zero-work ops)"
                  + (f" · {_p(s['comm_time_frac'])} communication" if s.get("comm_time_frac") else "")
                  + _outside_ops(s)]
    if report.meta.get("what_if"):
        lines += [f"- **What-if**: times were measured on {report.meta['what_if']}, roofs are {s['device']}'s: "
                  "% of roof, MFU and recoverable time compare two devices (an estimate, not a measurement)"]
    for note in report.meta.get("roof_notes") or []:
        lines += [f"- **Roof note**: {note}"]
    cc = report.meta.get("compiled_capture")
    if cc:
        lines += [f"- **Compiled**: the compiled execution was recorded ({cc.get('kernel_records', 0)} Inductor kernel "
                  f"calls; extern kernels counted exactly, fused kernels from their names; provenance: "
                  f"{cc.get('provenance', '')})" + ("; CUDA graphs (mode='reduce-overhead'): kernels replayed inside a "
                                                    "graph count in device-busy time but have no per-kernel record"
                                                    if cc.get("cudagraphs") else "")]
    elif report.meta.get("compiled_modules_run_eagerly"):
        lines += ["- **Compiled**: " + ", ".join(f"`{m or '(root)'}`" for m in report.meta[
            "compiled_modules_run_eagerly"]) + " ran eagerly under this profile (times are eager times)"]
    lines += memory_lines(report)
    lines += [f"- **Totals**: {_n(s['total_flops'] / 1e9)} GFLOP, {_n(s['total_bytes'] / 1e6)} MB, {s['n_ops']} ops; "
              f"FLOP coverage {_p(s['flop_coverage'])}"
              + (" (no formula: " + ", ".join(f"{k} ×{v}" for k, v in list(s["uncounted_ops"].items())[:5]) + ")"
                 if s["uncounted_ops"] else "")]
    return lines


def _cost_text(cost: dict[str, Any] | None) -> str:
    """tscope's own host time around the region (``meta["capture_cost"]``), so a slow profiled step is explained."""
    if not cost:
        return ""
    ms = lambda k: _f(cost.get(k) or 0.0, ".3g", 1e3)  # noqa: E731
    dev = f", device read-out {ms('kineto_s')} + {ms('assign_s')} ms" if "kineto_s" in cost else ""
    return f"; tscope's own host time outside it: start {ms('start_s')} ms{dev}, records {ms('build_s')} ms"


def memory_lines(report: Any) -> list[str]:
    """The step's memory by category, its peak against the device's memory, and under sharding FSDPMemTracker's
    split (``capture.step_memory``, ``analysis.memory_fit``)."""
    mc = report.meta.get("memory_categories")
    if not mc:
        return []
    mib = lambda k: _n((mc.get(k) or 0) / 2**20)  # noqa: E731
    lines = []
    if mc.get("step_peak"):
        opt = mib("optimizer_state") if mc.get("optimizer_state") is not None else "n/a (no optimizer step captured)"
        saved = mib("activations_saved") if mc.get("activations_saved") else "n/a"
        line = (f"- **Memory** (this rank, MiB): weights {mib('params')} · gradients {mib('grads')} · optimizer state "
                f"{opt} · saved activations {saved}; step peak about **{mib('step_peak')}** "
                f"({mc.get('step_peak_basis')})")
        fit = report_memory_fit(report)
        if fit and fit["verdict"]:
            cap = f"{_n(fit['capacity'] / 2**20)} MiB of {report.summary['device']}"
            line += f": {_p(fit['share'])} of the {cap}"
            if fit["verdict"] != "fits":
                shard = (f"shard weights, gradients and optimizer state ({_n(fit['states'] / 2**20)} MiB: FSDP / "
                         f"ZeRO-3 over {fit['shard_over']} or more GPUs; `fsdp={fit['shard_over']}` shows that step "
                         "per GPU), " if fit["shard_over"] else "")
                line += (f" -- **{fit['verdict']}**" + (" (the allocator needs headroom)" if fit["verdict"] == "tight"
                                                        else "")
                         + f". Fix: {shard}checkpoint activations (the step's own allocations peak at "
                           f"{_n(fit['rest'] / 2**20)} MiB: activations, temporaries, new gradients), or a smaller "
                           "micro-batch")
        lines.append(line)
    if "sharded_params" in mc:
        lines.append(f"- **Memory by category** (this rank, MiB): params {mib('sharded_params')} sharded / "
                     f"{mib('unsharded_params')} unsharded; grads {mib('sharded_grads')} sharded / "
                     f"{mib('unsharded_grads')} unsharded; all-gather buffer {mib('all_gather_buffer_max')} (largest); "
                     f"reduce-scatter buffer {mib('reduce_scatter_buffer_max')}; saved activations "
                     + (mib("activations_saved") if mc.get("activations_saved") else "n/a (layer details off)"))
    return lines


def model_line(report: Any) -> str:
    """The model level in one line (``analysis.model_summary``)."""
    m = model_summary(report)
    parts = []
    if m["params"] is not None:
        tr = "" if m["params_trainable"] == m["params"] else f", {m['params_trainable'] / 1e6:.4g} M trainable"
        parts.append(f"{m['params'] / 1e6:.4g} M parameters{tr}, {_n(m['size_mb'])} MiB")
    parts.append(f"forward {_n(m['flops_forward'] / 1e9)} GFLOP ({_n(m['macs_forward'] / 1e9)} GMAC in matrix ops), "
                 f"step {_n(m['flops_step'] / 1e9)} GFLOP")
    if m["activations_mb"] is not None:
        parts.append(f"activations {_n(m['activations_mb'])} MiB ({m['activations_source']})")
    if m["latency_ms"] is not None:
        fwd = f", forward {_f(m['forward_ms'], '.4g')} ms" if m["forward_ms"] else ""
        per = "per batch" if m["micro_batches"] == 1 else f"per step of {m['micro_batches']} micro-batches"
        parts.append(f"{_f(m['latency_ms'], '.4g')} ms {per} ({m['latency_source']}{fwd})")
    if m["samples_per_s"] is not None:
        parts.append(f"{_n(m['samples_per_s'])} samples/s" + (f", {_n(m['tokens_per_s'])} tokens/s"
                                                               if m["tokens_per_s"] else ""))
    return "- **Model**: " + "; ".join(parts)


def _cells(r: Row, ach: bool, expected: bool = False, noise: Any = None) -> list[str]:
    c = [r.name if r.kind != "layer" and r.kind != "layer_total" else f"`{r.name}`", r.type, r.phase,
         _n(r.flops / 1e9), _n(r.bytes / 1e6), _g(r.intensity), r.bound, _f(r.estimate_s, ".4g", 1e3)]
    c += [_f(r.expected_s, ".4g", 1e3)] if expected else []
    noisy = noise is not None and r.kind == "layer" and (r.layer, r.phase) in noise.marks
    c += [_f(r.measured_s, ".4g", 1e3) + " (noise)" * noisy, _p(r.attained) if r.bound != "uncounted" else ""]
    return c + [_p(r.attained_achievable) if r.bound != "uncounted" else ""] if ach else c


def comm_lines(report: Any) -> list[str]:
    """The communication section: collectives per kind on the link roof, overlap, rank skew (empty without any)."""
    rows = comm_rows(report)
    ov, sk = getattr(report, "overlap", None), report.meta.get("skew")
    if not rows and not (ov and ov.get("comm_s")):
        return []
    link = getattr(report.spec, "link_bandwidth", None)
    roof = (f"link roof {link / 1e9:.4g} GB/s per direction ({report.spec.link_name}, half the datasheet's "
            "bidirectional figure)" if link else "no interconnect listed for this device: no link roof")
    out = ["", "### Communication", "", f"nccl-tests conventions: bytes = S (all-gather: the gathered output; "
           f"reduce-scatter: the full input); busbw = algbw x factor; {roof}."
           + (" CPU host (gloo): times are launches, no bandwidths." if report.meta.get("device") == "cpu" else ""),
           ""]
    out += _md_table(["collective", "group (n)", "calls", "MB", "ms", "algbw GB/s", "busbw GB/s", "% of link",
                      "launched from"],
                     [[r["collective"], f"{r['group'] or '-'} ({r['group_size'] or '?'})", str(r["calls"]),
                       _n(r["bytes"] / 1e6), _f(r["time_s"], ".4g", 1e3), _f(r["algbw"], ".4g", 1e-9),
                       _f(r["busbw"], ".4g", 1e-9), _p(r["pct_of_link"]),
                       ", ".join(f"`{k}` ×{v}" for k, v in sorted(r["layers"].items(), key=lambda kv: -kv[1])[:3])
                       + " · " + "/".join(sorted(r["phases"]))] for r in rows])
    if ov and ov.get("comm_s"):
        out += ["", f"- **Overlap** (kernel timeline, unions across streams): communication {_f(ov['comm_s'], '.4g', 1e3)}"
                f" ms, exposed {_f(ov['exposed_comm_s'], '.4g', 1e3)} ms, {_p(ov['overlap_frac'])} overlapped with "
                f"compute; GPU idle {_f(ov['idle_s'], '.4g', 1e3)} ms of a {_f(ov['span_s'], '.4g', 1e3)} ms span"]
    if sk:
        out += [f"- **Rank skew** ({sk['collectives']} collectives matched across ranks): transfer latency "
                f"{_f(sk['latency_s'], '.4g', 1e3)} ms; waiting for other ranks up to {_f(sk['max_wait_s'], '.4g', 1e3)}"
                f" ms (per rank: {', '.join(_f(w, '.3g', 1e3) for w in sk['wait_s'])} ms); start spread "
                f"{_f(sk['spread_s'], '.4g', 1e3)} ms; latest to arrive most often: rank {sk['slowest_rank']}"]
    return out


def opportunity_line(o: Any, step: float | None) -> str:
    """One opportunity as a line: a finding with its cause, fix and saving, or a row below its expectation."""
    where = f"`{o.layer or '(root)'}`"
    if o.kind != "below_expected":
        return f"{where} — **{o.kind.replace('_', ' ')}**: {o.reason}"
    t = (f"{o.recoverable_s * 1e3:.3g} ms recoverable" + (f" ({_pct(o.recoverable_s / step)} of step)" if step
         else "")) if o.recoverable_s is not None else f"{o.estimate_s * 1e3:.3g} ms expected"
    return f"{where} {o.phase} — {t}: {o.reason}"


def _md_table(head: list[str], rows: list[list[str]]) -> list[str]:
    out = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    return out + ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in rows]


COLUMNS = ["layer", "type", "phase", "GFLOPs", "MB", "FLOP/B", "bound", "roof ms", "expected ms", "measured ms",
           "% of roof"]


def columns(report: Any) -> list[str]:
    """The table's columns: "expected ms" (shape-aware kernel estimate) only when a kernel model applies (GPU specs);
    "% of achievable" only with an achievable roof."""
    cols = [c for c in COLUMNS if c != "expected ms" or getattr(report, "kernel_model", None) is not None]
    return cols + (["% of achievable"] if report.achievable is not None else [])


def to_markdown(report: Any, top: int = 20) -> str:
    """Header figures, the layer x phase table (top rows + grouped rest + total), the op-class comparison and the
    opportunities list."""
    ach, exp = report.achievable is not None, report.kernel_model is not None
    head = columns(report)
    rows = [_cells(r, ach, exp, getattr(report, "noise", None)) for r in report.table("layer", top=top)]
    tot = _cells(report.totals, ach, exp)
    tot[0], tot[2] = "**total**", ""
    lines = header_lines(report) + ["", "### Layers (self time, forward and backward apart)", ""]
    lines += _md_table(head, rows + [tot])
    cat_rows = [[r.name, str(r.n_ops), _n(r.flops / 1e9), _n(r.bytes / 1e6), _f(r.estimate_s, ".4g", 1e3)]
                + ([_f(r.expected_s, ".4g", 1e3)] if exp else [])
                + [_f(r.measured_s, ".4g", 1e3), _f(r.ratio, ".3g")] + ([_f(r.expected_ratio, ".3g")] if exp else [])
                + [_p(r.attained)] for r in report.table("category")]
    lines += ["", "### By op class (measured vs roof" + (" and expected)" if exp else ")"), ""]
    lines += _md_table(["class", "ops", "GFLOPs", "MB", "roof ms"] + (["expected ms"] if exp else [])
                       + ["measured ms", "measured/roof"] + (["measured/expected"] if exp else []) + ["% of roof"],
                       cat_rows)
    lines += comm_lines(report) + fsdp_lines(report)
    opps = report.opportunities(top=5)
    lines += ["", "### Opportunities" + (" (by predicted saving)" if report.timed or exp else " (by expected time)"),
              ""]
    lines += [f"{i}. {opportunity_line(o, report.measured_step_s)}" for i, o in enumerate(opps, 1)]
    held = noise_lines(report)  # the noise marks and the findings within the noise
    if not opps:
        lines.append("(none above the measured noise: see below)" if held else "(none: every layer is at its roof)")
    lines += held
    return "\n".join(lines) + "\n"


CSV_FIELDS = ["table", "name", "layer", "type", "phase", "category", "precision", "n_ops", "flops", "bytes",
              "intensity", "ridge", "bound", "estimate_ms", "expected_ms", "achievable_estimate_ms", "measured_ms", "pct_of_roof",
              "pct_of_achievable", "recoverable_ms"]


def to_csv(report: Any, path: Any) -> None:
    """Every row of every table (layer x phase, layer totals, inclusive, op class, op name), ungrouped."""
    ms = lambda s: "" if s is None else s * 1e3  # noqa: E731
    pct = lambda x: "" if x is None else 100.0 * x  # noqa: E731
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(CSV_FIELDS)
        for table, rows in (("layer", report.layer_rows), ("layer_total", report.layer_totals),
                            ("inclusive", report.inclusive), ("category", report.category_rows),
                            ("op", report.op_rows), ("total", [report.totals])):
            for r in rows:
                w.writerow([table, r.name, r.layer, r.type, r.phase, r.category, r.precision, r.n_ops, r.flops,
                            r.bytes, "" if r.intensity is None else r.intensity, "" if r.ridge is None else r.ridge,
                            r.bound, ms(r.estimate_s), ms(r.expected_s), ms(r.achievable_estimate_s), ms(r.measured_s),
                            pct(r.attained), pct(r.attained_achievable), ms(r.recoverable_s)])


def json_safe(x: Any) -> Any:
    """Recursively replace inf/nan by None and tuples by lists, so ``json.dumps`` works."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {str(k): json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [json_safe(v) for v in x]
    return x


def to_dict(report: Any) -> dict[str, Any]:
    """JSON-safe dict: ``summary``, ``scalars``, ``roofs``, ``layers`` (layer x phase), ``layer_totals``,
    ``inclusive``, ``by_category``, ``by_op``, ``category_comparison``, ``opportunities``, ``noise`` (rows marked
    noise, findings within the noise: ``analysis.noise``), ``totals``."""
    return json_safe({
        "version": 1,
        "summary": report.summary,
        "scalars": report.scalars(),
        "roofs": roofs_used(report),
        "layers": [r.to_dict() for r in report.layer_rows],
        "layer_totals": [r.to_dict() for r in report.layer_totals],
        "inclusive": [r.to_dict() for r in report.inclusive],
        "by_category": [r.to_dict() for r in report.category_rows],
        "by_op": [r.to_dict() for r in report.op_rows],
        "category_comparison": report.category_comparison(),
        "opportunities": [o.to_dict() for o in report.opportunities(top=10)],
        "noise": noise_dict(report),
        "totals": report.totals.to_dict(),
    })


def to_console(report: Any, top: int = 20, console: Any = None) -> None:
    """Print the table with rich when installed (plain markdown otherwise)."""
    try:
        from rich.console import Console
        from rich.markdown import Markdown
        from rich.table import Table
    except ImportError:
        print(to_markdown(report, top=top))
        return
    con = console or Console()
    con.print(Markdown("\n".join(header_lines(report))))
    ach, exp = report.achievable is not None, report.kernel_model is not None
    t = Table(title="Layers (self time)", show_lines=False)
    for i, h in enumerate(columns(report)):
        t.add_column(h, justify="left" if i < 3 or h == "bound" else "right")
    style = {"compute": "green", "memory": "yellow", "uncounted": "red", "overhead": "dim"}
    for r in report.table("layer", top=top):
        cells = _cells(r, ach, exp)
        cells[0] = r.name
        cells[6] = f"[{style.get(r.bound, '')}]{r.bound}[/]" if r.bound in style else r.bound
        t.add_row(*cells)
    tot = _cells(report.totals, ach, exp)
    tot[0], tot[2] = "total", ""
    t.add_row(*tot, style="bold")
    con.print(t)
    for i, o in enumerate(report.opportunities(top=5), 1):
        con.print(f"{i}. " + opportunity_line(o, report.measured_step_s).replace("`", ""), markup=False)


def compare_table(rows: list[dict[str, Any]], top: int = 20) -> str:
    """``analysis.compare.compiled_vs_eager`` rows as a markdown table (top layers by eager time + the total)."""
    body = rows[:-1][:top] + rows[-1:]
    return "\n".join(_md_table(
        ["layer", "compiled ms", "eager ms", "speedup", "compiled % of roof", "kernels/ops compiled", "ops eager"],
        [[f"`{r['layer']}`" if r["layer"] != "(total)" else "**total**", _f(r["compiled_ms"], ".4g"),
          _f(r["eager_ms"], ".4g"), _f(r["speedup"], ".3g") + ("x" if r["speedup"] is not None else ""),
          _p(r["compiled_pct_of_roof"]), str(r["compiled_ops"]), str(r["eager_ops"])] for r in body]))


def op_table(profile: Any, top: int = 20) -> str:
    """Top ops by time (or FLOPs when untimed), for profiles without a device roof (counts and times only)."""
    agg: dict[str, list[float]] = {}
    for r in profile.ops:
        a = agg.setdefault(r.op, [0, 0.0, 0.0, 0.0])
        a[0] += 1
        a[1] += r.flops
        a[2] += r.bytes
        a[3] += r.time_s or 0.0
    items = sorted(agg.items(), key=lambda kv: (kv[1][3], kv[1][1]), reverse=True)[:top]
    return "\n".join(_md_table(["op", "calls", "GFLOPs", "MB", "time ms"],
                               [[k, str(int(v[0])), f"{v[1] / 1e9:.4f}", f"{v[2] / 1e6:.3f}", f"{v[3] * 1e3:.3f}"]
                                for k, v in items]))
