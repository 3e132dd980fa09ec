"""Rendering of a report (:class:`~tscope_callbacks.analysis.report.ReportData`): markdown and the rich console (CSV:
``render.csv_table``). Pure functions of the report.

"Roof" always means the datasheet roof of the spec (or the measured roof when the spec itself is measured, e.g. on
CPU); "achievable" is the calibrated roof shown beside it when known.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from tscope_callbacks.analysis.fmt import (
    bw_text,
    bytes_text,
    count_text,
    flops_text,
    ms_text,
    pct_text,
    rate_text,
    ratio_text,
    sig,
    time_text,
)
from tscope_callbacks.analysis.report import (
    NoiseSection,
    Opportunity,
    ReportData,
    RoofUsed,
    Row,
    Summary,
)
from tscope_callbacks.analysis.roofs import roof_bandwidth
from tscope_callbacks.records import StepProfile
from tscope_callbacks.render.fsdp import fsdp_lines
from tscope_callbacks.render.notes import basis_extra, environment_lines, noise_lines

if TYPE_CHECKING:
    from rich.console import Console

__all__ = ["header_lines", "to_markdown", "to_console", "op_table", "COLUMNS", "columns", "compare_table",
           "opportunity_line"]

def _p(x: float | None) -> str:
    """A fraction as a percentage (``analysis.fmt.pct_text``); "" when there is none (a table's empty cell)."""
    return "" if x is None else pct_text(x)


def _num(x: float | None) -> str:
    """A bare number, 3 significant figures (``analysis.fmt.sig``); "" when there is none."""
    return "" if x is None else sig(x)


def _time_basis(s: Summary) -> str:
    return "estimated" if not s.timed else f"measured op time {time_text(s.op_time_s)}" \
        if s.op_time_s else "measured"


def _step_split(report: ReportData) -> str:
    """The measured step split as the dashboard's "Where the step goes" splits it (``report.time_split``: the op time
    by bound plus the rest of the unprofiled step, adding up to it), so both say the same shares; "" without a
    measured step (then the op time's own split)."""
    t = report.time_split
    if not t.step_s or not report.timed:
        return ""
    cuda = str(report.summary.timing).startswith("cuda")
    rest = ("no kernel running (gaps between kernels, waits for the host)" if cuda
            else "outside ops (host: Python, hooks, data)")
    parts = [("compute-bound", t.compute_bound_s), ("memory-bound", t.memory_bound_s),
             ("communication", t.communication_s), ("uncounted ops", t.uncounted_s),
             ("overhead (views, zero-work ops)", t.overhead_s), (rest, t.idle_s)]
    shown = " · ".join(f"{pct_text(v / t.step_s)} {name} ({time_text(v)})" for name, v in parts if v)
    rest_of_step = " + the rest of the step" if t.idle_s else ""  # none: the ops fill (or were scaled to) the step
    return f"- **Time** (the {time_text(t.step_s)} step: {t.basis}{rest_of_step}): {shown}"


def _widened(report: ReportData) -> str:
    """Where the roofs drawn use a wider bandwidth than the device's (an op beat a measured roof): which, and that
    MBU stays on the device's."""
    used = roof_bandwidth(report.roofs, report.summary.bandwidth)
    if not report.summary.bandwidth or used <= report.summary.bandwidth * (1 + 1e-9):
        return ""
    return f" (MBU's basis; the roofs and their ridges below use {bw_text(used)}: widened, see the roof note)"


def _roof_line(r: RoofUsed) -> str:
    kind = "matrix" if r.matrix else "vector"
    s = f"{r.precision} {kind} {rate_text(r.peak_flops)} (ridge {_num(r.ridge)} FLOP/B)"
    if r.achievable_peak_flops and r.achievable_bandwidth:
        s += f" / achievable {rate_text(r.achievable_peak_flops)}"
    return s


def step_lines(report: ReportData) -> list[str]:
    """The step time and its basis, the expected time, MFU/MBU (and HFU where recompute makes it differ)."""
    s, lines = report.summary, []
    if s.kernel_model:
        est = (f"expected {time_text(s.estimated_step_s)} (sum of shape-aware kernel estimates from "
               f"{s.kernel_model}; roofline bound {time_text(s.roof_step_s)})")
    else:
        est = f"estimated {time_text(s.estimated_step_s)} (sum of per-op roofs)"
    if s.measured_step_s is not None:
        ops = f"op time {time_text(s.op_time_s)}" if s.timed else "ops not timed"
        extra = ""
        if s.device_idle_s is not None:
            extra += f"; GPU idle {time_text(s.device_idle_s)} during the capture"
        if s.wall_time_s:
            extra += f"; captured region {time_text(s.wall_time_s)} wall (slowed by the capture; not used)"
        extra += _cost_text(s.capture_cost)
        lines += [f"- **Step**: measured {time_text(s.measured_step_s)} ({s.step_time_basis_text}"
                  f"{basis_extra(report.context, s.step)}) -- "
                  f"the basis of MFU/MBU; {ops}; {est}{extra}",
                  f"- **MFU** {_p(s.mfu)} · **MBU** {_p(s.mbu)} · "
                  f"{rate_text(None if s.achieved_tflops is None else s.achieved_tflops * 1e12)} · "
                  f"{bw_text(None if s.achieved_gbps is None else s.achieved_gbps * 1e9)} achieved"]
        if s.hardware_flops != s.model_flops:
            lines += [hfu_line(report)]
    else:
        lines += [f"- **Step**: not timed; {est}"
                  + (f"; MFU at the estimate {_p(s.estimated_mfu)}" if s.estimated_mfu is not None else "")
                  + (f", MBU {_p(s.estimated_mbu)}" if s.estimated_mfu is not None and s.estimated_mbu is not None
                     else "")]
    return lines + input_lines(report)


def input_lines(report: ReportData) -> list[str]:
    """The step's time fetching its batch (the DataLoader's next and the transfer to the device: the step monitor's
    mean over its recent clean steps), and when it is input-bound, what to change in the DataLoader; [] without a
    monitor's figures."""
    ts = report.time_split
    if ts.input_s is None:
        return []
    # the share is of those steps' own mean (the monitor's basis, which includes the fetch), said so: beside the
    # header's median step it read as a share of that ("369 µs (0.658% of the step)" of a 53.5 ms step)
    how = [f"mean of the last {ts.input_steps} steps" if ts.input_steps else "mean of the recent steps"]
    if ts.input_share is not None:
        how.append(f"{pct_text(ts.input_share)} of their mean {time_text(ts.input_step_s)} step" if ts.input_step_s
                   else f"{pct_text(ts.input_share)} of the step")
    line = f"- **Input**: each step spends {time_text(ts.input_s)} fetching its batch ({', '.join(how)})"
    if ts.input_bound:
        line += " -- **input-bound**: the device waits for data" + (
            ": " + "; ".join(ts.input_fixes) if ts.input_fixes else "")
    return [line]


def hfu_line(report: ReportData) -> str:
    """HFU vs MFU, naming only what this step's hardware FLOPs hold beyond its model FLOPs: activation-checkpointing
    recompute, the optimizer's update, a fused attention backward's recomputed scores (each only when present)."""
    s = report.summary
    opt = sum(o.flops for o in report.ops if o.phase == "optimizer")
    attn = any(o.category == "attention" and o.phase == "backward" and o.flops != o.model_flops for o in report.ops)
    extra = ([f"{flops_text(s.recompute_flops)} of activation-checkpointing recompute"] if s.recompute_flops
             else []) + ([f"the optimizer's {flops_text(opt)}"] if opt else []) \
        + (["attention backward's recomputed scores"] if attn else [])
    without = [w for w, on in (("recompute", s.recompute_flops), ("the optimizer", opt)) if on]
    model = (["without " + " or ".join(without)] if without else []) \
        + (["attention backward as 2x its forward"] if attn else [])
    return (f"- **HFU** {_p(s.hfu)} (hardware FLOPs: everything that ran"
            + (f", incl. {', '.join(extra)}" if extra else "") + f") vs **MFU** {_p(s.mfu)} (model FLOPs"
            + (f": {', '.join(model)}" if model else "") + ")")


def header_lines(report: ReportData) -> list[str]:
    """The figures above the table: device, roofs, precision, step times, MFU/MBU, bound fractions, coverage."""
    s = report.summary
    device = (f"what-if on {s.device}, measured on {report.what_if.measured_on}" if report.what_if is not None
              else s.device)
    title = " · ".join(str(x) for x in (device, s.model, f"step {s.step}" if s.step is not None
                                        else None) if x)
    roof = s.roof + (f"; achievable roof: {s.achievable_roof} (\"% of achievable\")" if s.achievable_roof
                     else "")
    lines = [f"## Roofline — {title}", "", model_line(report),
             f"- **Roofs**: {roof}; " + (f"\"% of roof\" = estimate / measured on the {s.roof} roof; " if report.timed
                                         else "untimed: every time is an estimate (roof ms: the roofline bound"
                                         + ("; expected ms: the shape-aware kernel time" if s.has_kernel_model
                                            else "") + "); ")
             + f"bandwidth {bw_text(s.bandwidth)}" + _widened(report),
             "- **Roofs used**: " + ("; ".join(_roof_line(r) for r in report.roofs[:4]) or "none (no ops)"),
             f"- **Precision**: {s.dominant_precision} dominant; MFU per device (this rank's model FLOPs over its "
             f"step time and one device's peak: under TP/FSDP the local shards' FLOPs) against the {s.mfu_precision} "
             "matrix roof "
             f"({rate_text(s.mfu_peak_flops)}); float32 matmul precision "
             f"{s.float32_matmul_precision or 'highest'}"]
    lines += step_lines(report)
    lines += environment_lines(report)
    split = _step_split(report)
    if split:
        lines += [split]
    elif s.compute_bound_time_frac is not None:
        lines += [f"- **Time** ({_time_basis(s)}): {_p(s.compute_bound_time_frac)} compute-bound · "
                  f"{_p(s.memory_bound_time_frac)} memory-bound · {_p(s.uncounted_time_frac)} uncounted · "
                  f"{_p(s.overhead_time_frac)} overhead (views, zero-work ops)"
                  + (f" · {_p(s.comm_time_frac)} communication" if s.comm_time_frac else "")]
    if report.what_if is not None:
        lines += [f"- **What-if**: times were measured on {report.what_if.measured_on}, roofs are {s.device}'s: "
                  "% of roof, MFU and recoverable time compare two devices (an estimate, not a measurement)"]
    for note in report.context.roof_notes:
        lines += [f"- **Roof note**: {note}"]
    lines += compiled_lines(report)
    lines += memory_lines(report)
    lines += [f"- **Totals**: {flops_text(s.total_flops)}, {bytes_text(s.total_bytes)}, {s.n_ops} ops; "
              f"FLOP coverage {_p(s.flop_coverage)}"
              + (" (no formula: " + ", ".join(f"{k} ×{v}" for k, v in list(s.uncounted_ops.items())[:5]) + ")"
                 if s.uncounted_ops else "")]
    return lines


def compiled_lines(report: ReportData) -> list[str]:
    """How a compiled model was captured: its Inductor kernels, or its compiled modules run eagerly."""
    cc = report.context.compiled_capture
    if cc:
        return [f"- **Compiled**: the compiled execution was recorded ({cc.get('kernel_records', 0)} Inductor kernel "
                f"calls; extern kernels counted exactly, fused kernels from their names; provenance: "
                f"{cc.get('provenance', '')})" + ("; CUDA graphs (mode='reduce-overhead'): kernels replayed inside a "
                                                  "graph count in device-busy time but have no per-kernel record"
                                                  if cc.get("cudagraphs") else "")]
    if report.context.compiled_modules_run_eagerly:
        return ["- **Compiled**: " + ", ".join(f"`{m or '(root)'}`" for m in report.context.
                                               compiled_modules_run_eagerly)
                + " ran eagerly under this profile (times are eager times)"]
    return []


def _cost_text(cost: dict[str, float | int] | None) -> str:
    """tscope's own host time around the region (``info.capture_cost``), so a slow profiled step is explained."""
    if not cost:
        return ""
    t = lambda k: time_text(cost.get(k) or 0.0)  # noqa: E731
    dev = f", device read-out {t('kineto_s')} + {t('assign_s')}" if "kineto_s" in cost else ""
    return f"; tscope's own host time outside it: start {t('start_s')}{dev}, records {t('build_s')}"


def memory_lines(report: ReportData) -> list[str]:
    """The step's memory by category, its peak against the device's memory, and under sharding FSDPMemTracker's
    split (``capture.step_memory``, ``analysis.memory_fit``)."""
    m = report.memory
    if m is None:
        return []
    mc = m.categories
    mib = lambda k: sig((mc.get(k) or 0) / 2**20)  # noqa: E731
    lines = []
    if mc.get("step_peak"):
        opt = mib("optimizer_state") if mc.get("optimizer_state") is not None else "n/a (no optimizer step captured)"
        saved = mib("activations_saved") if mc.get("activations_saved") else "n/a"
        line = (f"- **Memory** (this rank, MiB): weights {mib('weights')} · gradients {mib('grads')} · optimizer "
                f"state {opt} · saved activations {saved}; step peak about **{mib('step_peak')}** "
                f"({m.basis or None})")
        if m.verdict:
            cap = f"{bytes_text(m.device_bytes or 0)} of {report.summary.device}"
            line += f": {_p(m.share)} of the {cap}"
            if m.verdict != "fits":
                shard = (f"shard weights, gradients and optimizer state ({bytes_text(m.states_bytes or 0)}: "
                         f"FSDP / ZeRO-3 over {m.shard_over} or more GPUs; `fsdp={m.shard_over}` shows that step "
                         "per GPU), " if m.shard_over else "")
                line += (f" -- **{m.verdict}**" + (" (the allocator needs headroom)" if m.verdict == "tight"
                                                   else "")
                         + f". Fix: {shard}checkpoint activations (the step's own allocations peak at "
                           f"{bytes_text(m.rest_bytes or 0)}: activations, temporaries, new gradients), or a "
                           "smaller micro-batch")
        lines.append(line)
    elif mc.get("weights") is not None:  # a profile without layer details: the states, and where the peak is
        opt = mib("optimizer_state") if mc.get("optimizer_state") is not None else "n/a (no optimizer step captured)"
        lines.append(f"- **Memory** (this rank, MiB): weights {mib('weights')} · gradients {mib('grads')} · optimizer "
                     f"state {opt}; the step peak and saved activations need layer details (a step "
                     "LayerProfilerCallback profiled, or `ts.profile(model, layer_details=True)`)")
    if "sharded_params" in mc:
        lines.append(f"- **Memory by category** (this rank, MiB): params {mib('sharded_params')} sharded / "
                     f"{mib('unsharded_params')} unsharded; grads {mib('sharded_grads')} sharded / "
                     f"{mib('unsharded_grads')} unsharded; all-gather buffer {mib('all_gather_buffer_max')} (largest); "
                     f"reduce-scatter buffer {mib('reduce_scatter_buffer_max')}; saved activations "
                     + (mib("activations_saved") if mc.get("activations_saved") else "n/a (layer details off)"))
    return lines


def model_line(report: ReportData) -> str:
    """The model level in one line (``analysis.model_summary``)."""
    m = report.model or {}
    parts = []
    if m["params"] is not None:
        tr = "" if m["params_trainable"] == m["params"] else f", {sig(m['params_trainable'] / 1e6)} M trainable"
        parts.append(f"{sig(m['params'] / 1e6)} M parameters{tr}, {bytes_text(m['size_mb'] * 2**20)}")
    parts.append(f"forward {flops_text(m['flops_forward'])} ({sig(m['macs_forward'] / 1e9)} GMAC in matrix ops), "
                 f"step {flops_text(m['flops_step'])}")
    if m["activations_mb"] is not None:
        parts.append(f"activations {bytes_text(m['activations_mb'] * 2**20)} ({m['activations_source']})")
    step, s = report.step_s, report.summary
    if step:
        fwd = f", forward {time_text(m['forward_ms'] / 1e3)}" if m["forward_ms"] else ""
        per = "per batch" if m["micro_batches"] == 1 else f"per step of {m['micro_batches']} micro-batches"
        source = s.step_time_source or ("estimated" if not s.timed else None)
        parts.append(f"{time_text(step)} {per} ({source}{fwd})")
    if m["samples_per_s"] is not None:
        parts.append(count_text(m["samples_per_s"], "samples/s") + (f", {count_text(m['tokens_per_s'], 'tokens/s')}"
                                                                    if m["tokens_per_s"] else ""))
    return "- **Model**: " + "; ".join(parts)


def _ms(s: float | None) -> str:
    """A time in a column headed "ms": the one formatter's (``analysis.fmt.ms_text``); "" when there is none."""
    return "" if s is None else ms_text(s)


def _mib(b: float | None) -> str:
    """Bytes in a column headed "MiB" (the one convention for bytes: binary units, as the page shows them)."""
    return "" if b is None else sig(b / 2**20)


def _cells(r: Row, ach: bool, expected: bool = False, noise: NoiseSection | None = None,
           timed: bool = True) -> list[str]:
    """A table row's cells, in :func:`columns`' order (untimed: no measured time, no % of roof)."""
    c = [r.name if r.kind != "layer" and r.kind != "layer_total" else f"`{r.name}`", r.type, r.phase,
         sig(r.flops / 1e9), _mib(r.bytes), _num(r.intensity), r.bound, _ms(r.estimate_s)]
    c += [_ms(r.expected_s)] if expected else []
    if not timed:
        return c
    noisy = noise is not None and r.kind == "layer" and noise.is_marked(r.layer, r.phase)
    c += [_ms(r.measured_s) + " (noise)" * noisy, _p(r.attained) if r.bound != "uncounted" else ""]
    return c + [_p(r.attained_achievable) if r.bound != "uncounted" else ""] if ach else c


def comm_lines(report: ReportData) -> list[str]:
    """The communication section: collectives per kind on the link roof, overlap, rank skew (empty without any)."""
    c = report.communication
    if not c:
        return []
    rows, ov, sk = c["rows"], c.get("overlap"), c.get("skew")
    link = report.device.link_bandwidth
    roof = (f"link roof {bw_text(link)} per direction ({report.device.link_name}, half the datasheet's "
            "bidirectional figure)" if link else "no interconnect listed for this device: no link roof")
    out = ["", "### Communication", "", f"nccl-tests conventions: bytes = S (all-gather: the gathered output; "
           f"reduce-scatter: the full input); busbw = algbw x factor; {roof}."
           + (" CPU host (gloo): times are launches, no bandwidths." if report.context.device_kind == "cpu" else ""),
           ""]
    out += _md_table(["collective", "group (n)", "calls", "MiB", "ms", "algbw GB/s", "busbw GB/s", "% of link",
                      "launched from"],
                     [[r["collective"], f"{r['group'] or '-'} ({r['group_size'] or '?'})", str(r["calls"]),
                       _mib(r["bytes"]), _ms(r["time_s"]), _num(r["algbw"] and r["algbw"] / 1e9),
                       _num(r["busbw"] and r["busbw"] / 1e9), _p(r["pct_of_link"]),
                       ", ".join(f"`{k}` ×{v}" for k, v in sorted(r["layers"].items(), key=lambda kv: -kv[1])[:3])
                       + " · " + "/".join(sorted(r["phases"]))] for r in rows])
    if ov and ov.get("comm_s"):
        out += ["", f"- **Overlap** (kernel timeline, unions across streams): communication {time_text(ov['comm_s'])}"
                f", exposed {time_text(ov['exposed_comm_s'])}, {_p(ov['overlap_frac'])} overlapped with "
                f"compute; GPU idle {time_text(ov['idle_s'])} of a {time_text(ov['span_s'])} span"]
    if sk:
        out += [f"- **Rank skew** ({sk['collectives']} collectives matched across ranks): transfer latency "
                f"{time_text(sk['latency_s'])}; waiting for other ranks up to {time_text(sk['max_wait_s'])}"
                f" (per rank: {', '.join(time_text(w) for w in sk['wait_s'])}); start spread "
                f"{time_text(sk['spread_s'])}; latest to arrive most often: rank {sk['slowest_rank']}"]
    return out


_STEP_KINDS = {"input": "the input pipeline", "loop": "the training loop", "launch": "the step",
               "channels_last": "the model"}


def opportunity_line(o: Opportunity, step: float | None) -> str:
    """One opportunity as a line: where, what, the cause, the change and the saving; then how the saving was predicted
    and, where tscope's closed loop applied that kind of change, how the measured saving compared."""
    where = f"`{o.layer}`" if o.layer else _STEP_KINDS.get(o.kind, "`(root)`")
    line = f"{where} — **{o.title}**: {o.cause}"
    if o.predicted_text:
        line += f" Prediction: {o.predicted_text}."
    if o.measured_ratio is not None and o.measured_on:
        line += f" Checked: {o.measured_on}."
    return line


def below_roof_lines(report: ReportData, top: int = 5) -> list[str]:
    """Rows below their roof for which no change is known: what the numbers say (not opportunities)."""
    rows = report.below_roof[:top]
    if not rows:
        return []
    step = report.summary.measured_step_s
    out = ["", "### Below their roof, no known change", ""]
    for b in rows:
        rec = (f"{time_text(b.recoverable_s)} above expected" + (f" ({pct_text(b.recoverable_s / step)} of the step)"
                                                                  if step else "")) if b.recoverable_s else ""
        out.append(f"- `{b.layer or '(root)'}` {b.phase} — {rec}: {b.cause}")
    more = len(report.below_roof) - len(rows)
    if more > 0:
        out.append(f"- ... and {more} more (the JSON report holds them all)")
    return out


def advice_marks(report: ReportData) -> dict[tuple[str, str], str]:
    """(layer, phase) -> the table's advice cell: the numbers of the opportunities whose saving comes from the row
    ("#1, #3"), or "no known change" for a row below its roof that no opportunity covers."""
    marks: dict[tuple[str, str], list[str]] = {}
    for i, o in enumerate(report.opportunities[:5], 1):
        for r in o.rows:
            marks.setdefault((r[0], r[1]), []).append(f"#{i}")
    out = {k: ", ".join(v) for k, v in marks.items()}
    for b in report.below_roof:
        out.setdefault((b.layer, b.phase), "no known change")
    return out


def _md_table(head: list[str], rows: list[list[str]]) -> list[str]:
    out = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    return out + ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in rows]


COLUMNS = ["layer", "type", "phase", "GFLOPs", "MiB", "FLOP/B", "bound", "roof ms", "expected ms", "measured ms",
           "% of roof"]


def columns(report: ReportData) -> list[str]:
    """The table's columns: "expected ms" (shape-aware kernel estimate) only when a kernel model applies (GPU specs);
    "% of achievable" only with an achievable roof; "advice" (timed): the opportunities the row's time would be saved
    by ("#1"), or "no known change" for a row below its roof that no opportunity covers."""
    cols = [c for c in COLUMNS if c != "expected ms" or report.summary.has_kernel_model]
    if not report.timed:  # an estimate: nothing measured, so no measured time and no % of roof to show
        return [c for c in cols if c not in ("measured ms", "% of roof")]
    return cols + (["% of achievable"] if report.summary.has_achievable else []) + ["advice"]


def to_markdown(report: ReportData, top: int = 20) -> str:
    """Header figures, the layer x phase table (top rows + grouped rest + total), the op-class comparison and the
    opportunities list."""
    ach, exp, timed = report.summary.has_achievable, report.summary.has_kernel_model, report.timed
    head = columns(report)
    marks = advice_marks(report)
    table = report.table("layer", top=top)
    rows = [_cells(r, ach, exp, report.noise, timed) + ([marks.get((r.layer, r.phase), "")] if timed else [])
            for r in table]
    tot = _cells(report.totals, ach, exp, timed=timed) + ([""] if timed else [])
    tot[0], tot[2] = "**total**", ""
    lines = header_lines(report) + ["", "### Layers (self time, forward and backward apart)", ""]
    lines += _md_table(head, rows + [tot])
    measured = lambda r: ([_ms(r.measured_s), _num(r.ratio)]  # noqa: E731
                          + ([_num(r.expected_ratio)] if exp else []) + [_p(r.attained)]) if timed else []
    cat_rows = [[r.name, str(r.n_ops), sig(r.flops / 1e9), _mib(r.bytes), _ms(r.estimate_s)]
                + ([_ms(r.expected_s)] if exp else []) + measured(r) for r in report.table("category")]
    lines += ["", "### By op class (" + (("measured vs roof" + (" and expected)" if exp else ")")) if timed
                                         else "roof" + (" and expected, untimed)" if exp else ", untimed)")), ""]
    lines += _md_table(["class", "ops", "GFLOPs", "MiB", "roof ms"] + (["expected ms"] if exp else [])
                       + ((["measured ms", "measured/roof"] + (["measured/expected"] if exp else []) + ["% of roof"])
                          if timed else []), cat_rows)
    lines += comm_lines(report) + fsdp_lines(report)
    opps = report.opportunities[:5]
    lines += ["", "### Opportunities" + (" (by predicted saving)" if report.timed or exp else " (by expected time)"),
              ""]
    lines += [f"{i}. {opportunity_line(o, report.summary.measured_step_s)}" for i, o in enumerate(opps, 1)]
    held = noise_lines(report, top)  # the noise marks and the findings within the noise
    if not opps:
        floor = report.noise.floor_s
        lines.append("(none above the measured noise: see below)" if held else
                     "(no change known to save time: see the rows below their roof)" if report.below_roof else
                     f"(none above the steps' typical deviation on this busy machine, {time_text(floor)})"
                     if floor > 0 else "(none: every layer is at its roof)")
    lines += below_roof_lines(report) + held
    return "\n".join(lines) + "\n"


def to_console(report: ReportData, top: int = 20, console: Console | None = None) -> None:
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
    ach, exp = report.summary.has_achievable, report.summary.has_kernel_model
    t = Table(title="Layers (self time)", show_lines=False)
    for i, h in enumerate(c for c in columns(report) if c != "advice"):  # a terminal is narrow: the lists below say it
        t.add_column(h, justify="left" if i < 3 or h == "bound" else "right")
    style = {"compute": "green", "memory": "yellow", "uncounted": "red", "overhead": "dim"}
    for r in report.table("layer", top=top):
        cells = _cells(r, ach, exp, timed=report.timed)
        cells[0] = r.name
        cells[6] = f"[{style.get(r.bound, '')}]{r.bound}[/]" if r.bound in style else r.bound
        t.add_row(*cells)
    tot = _cells(report.totals, ach, exp, timed=report.timed)
    tot[0], tot[2] = "total", ""
    t.add_row(*tot, style="bold")
    con.print(t)
    for i, o in enumerate(report.opportunities[:5], 1):
        con.print(f"{i}. " + opportunity_line(o, report.summary.measured_step_s).replace("`", ""), markup=False)
    for line in below_roof_lines(report):
        con.print(line.replace("`", "").removeprefix("### "), markup=False)


def compare_table(rows: Sequence[dict[str, Any]], top: int = 20) -> str:
    """``analysis.compare.compiled_vs_eager`` rows as a markdown table (top layers by eager time + the total)."""
    body = list(rows[:-1][:top]) + list(rows[-1:])
    return "\n".join(_md_table(
        ["layer", "compiled ms", "eager ms", "speedup", "compiled % of roof", "kernels/ops compiled", "ops eager"],
        [[f"`{r['layer']}`" if r["layer"] != "(total)" else "**total**", _num(r["compiled_ms"]),
          _num(r["eager_ms"]), "" if r["speedup"] is None else ratio_text(r["speedup"]),
          _p(r["compiled_pct_of_roof"]), str(r["compiled_ops"]), str(r["eager_ops"])] for r in body]))


def op_table(profile: StepProfile, top: int = 20) -> str:
    """Top ops by time (or FLOPs when untimed), for profiles without a device roof (counts and times only)."""
    agg: dict[str, list[float]] = {}
    for r in profile.ops:
        a = agg.setdefault(r.op, [0, 0.0, 0.0, 0.0])
        a[0] += 1
        a[1] += r.flops
        a[2] += r.bytes
        a[3] += r.time_s or 0.0
    items = sorted(agg.items(), key=lambda kv: (kv[1][3], kv[1][1]), reverse=True)[:top]
    return "\n".join(_md_table(["op", "calls", "GFLOPs", "MiB", "time ms"],
                               [[k, str(int(v[0])), sig(v[1] / 1e9), _mib(v[2]), _ms(v[3])] for k, v in items]))
