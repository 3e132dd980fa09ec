"""The RooflineCallback's outputs of one profiled step. :func:`emit` writes them -- scalars, the markdown table, the
layer table and scatter, the plot, the step JSON, the Chrome trace and the compiled-vs-eager comparison -- and each
is a pure function of the step's :class:`AnalysedStep` and its :class:`ProfileContext`: nothing here reads or writes
the callback. The namespaced keys (``tscope/<area>/[<stage>/]<name>``) are made here, from the analysis' bare keys."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tscope_callbacks.callbacks.session import ProfileContext
from tscope_callbacks.callbacks.sinks import Sink, metric_key
from tscope_callbacks.capture.faults import Faults
from tscope_callbacks.devices.spec import DeviceSpec
from tscope_callbacks.records import StepProfile

if TYPE_CHECKING:
    from tscope_callbacks.render.report import RooflineReport

__all__ = ["AnalysedStep", "Comparison", "EmitOptions", "emit", "emit_comparison", "step_scalars", "table_text",
           "memory_scalars", "fsdp_scalars", "step_file", "step_file_name", "gather_traces", "fsdp_whatif_of"]


@dataclass(frozen=True)
class Comparison:
    """A compiled step against its eager reference (``compare_eager``): per-layer rows and the step's speedup."""

    compiled_step: Any
    eager_step: Any
    rows: tuple[dict[str, Any], ...]
    speedup: float | None

    @classmethod
    def of(cls, compiled: RooflineReport, eager: RooflineReport) -> Comparison:
        from tscope_callbacks.analysis.compare import compile_speedup, compiled_vs_eager

        return cls(compiled.meta.get("step"), eager.meta.get("step"), tuple(compiled_vs_eager(compiled, eager)),
                   compile_speedup(compiled, eager))


@dataclass(frozen=True)
class AnalysedStep:
    """One profiled step, analysed once: the records, the roofline report (None without a device roof or off rank
    zero), the device, the FSDP what-if, the compiled-vs-eager comparison, every rank's records for the trace."""

    profile: StepProfile
    report: RooflineReport | None
    device: DeviceSpec | None = None
    fsdp_whatif: Mapping[str, Any] | None = None
    comparison: Comparison | None = None
    traces: tuple[StepProfile, ...] | None = None


@dataclass(frozen=True)
class EmitOptions:
    """What to write besides the scalars and the table (the callback's arguments)."""

    top: int = 20
    plot: bool = True
    save_json: bool = True
    model: bool = True  #: the ``tscope/model/*`` scalars (once per fit: the callback says when)


def gather_traces(trainer: Any, result: StepProfile, ctx: ProfileContext) -> tuple[StepProfile, ...]:
    """Every rank's records of this step, for the trace (all ranks call this; a collective under several ranks, on
    scheduled steps only: a recount may happen on one rank)."""
    if trainer.world_size <= 1 or ctx.reason == "recount":
        return (result,)
    from tscope_callbacks.callbacks.session import gather_objects

    return tuple(StepProfile.from_dict(d) for d in gather_objects(trainer, result.to_dict()))


def fsdp_whatif_of(report: RooflineReport, model: Any, n: int, trainer_precision: str) -> dict[str, Any]:
    """``fsdp_whatif=N``: the step predicted under FSDP2 over N GPUs (``analysis.fsdp``). Under "-mixed" precision
    parameters are gathered at the low dtype and gradients reduced in fp32 (as ``analyze_model``)."""
    from tscope_callbacks.analysis.fsdp import fsdp_whatif, mixed_policy

    low, reduce = mixed_policy(trainer_precision)
    return fsdp_whatif(report, model, n, param_dtype=low, reduce_dtype=reduce)


def step_scalars(step: AnalysedStep, ctx: ProfileContext) -> dict[str, float]:
    """The profiled step's bare ``tscope/roofline`` scalars (the report's, or counts and times without a device roof);
    with several ranks also the step time's min and max across them."""
    result, report = step.profile, step.report
    if report is not None:
        out = dict(report.scalars())
    else:
        out = {"flop_coverage": float(result.coverage())}
        t = result.meta.get("step_time_s")
        if t:
            out["measured_step_ms"] = t * 1e3
            out["achieved_tflops"] = result.total_flops / t / 1e12
    if ctx.world_size > 1 and ctx.step_times_s:
        out["step_ms_min"] = min(ctx.step_times_s) * 1e3
        out["step_ms_max"] = max(ctx.step_times_s) * 1e3
    return out


def fsdp_scalars(w: Mapping[str, Any]) -> dict[str, float]:
    """``tscope/fsdp_whatif/*`` of a what-if (``analysis.fsdp.fsdp_whatif``): per-GPU peak, device share, step time,
    exposed communication, MFU."""
    mem, sim = w["memory"], w.get("time") or {}
    vals = {"peak_mb": mem["peak"] / 2**20 if mem.get("peak") else None, "device_share": mem.get("share"),
            "step_ms": sim["step_s"] * 1e3 if sim.get("step_s") else None,
            "exposed_comm_ms": sim["exposed_s"] * 1e3 if sim.get("exposed_s") is not None else None,
            "mfu": sim.get("mfu")}
    return {k: v for k, v in vals.items() if v is not None}


def memory_scalars(report: RooflineReport) -> dict[str, float]:
    """The step's memory by category in MiB (``capture.step_memory``; layer details) and, where the device's memory is
    known, the peak's share of it."""
    from tscope_callbacks.analysis.memory_fit import report_memory_fit

    mc = report.meta.get("memory_categories") or {}
    if not mc.get("step_peak"):
        return {}
    keys = {"step_peak": "step_peak_mb", "params": "weights_mb", "grads": "grads_mb",
            "optimizer_state": "optimizer_state_mb", "activations_saved": "activations_saved_mb"}
    out = {name: mc[k] / 2**20 for k, name in keys.items() if mc.get(k) is not None}
    fit = report_memory_fit(report)
    if fit and fit["share"] is not None:
        out["device_share"] = fit["share"]
    return out


def table_text(step: AnalysedStep, ctx: ProfileContext, top: int) -> str:
    """The markdown of ``tscope/roofline/table``: a head naming the step (micro-batches, the step time across ranks)
    and the report (op totals only without a device roof)."""
    head = f"**{ctx.stage} step {ctx.step}**" + (f" ({ctx.micro_batches} micro-batches)"
                                                  if ctx.micro_batches > 1 else "")
    if ctx.world_size > 1:
        t = ctx.step_times_s
        head += (f" -- step time across {len(t)} ranks: min {min(t) * 1e3:.2f} ms, max {max(t) * 1e3:.2f} ms "
                 f"(slowest: rank {max(range(len(t)), key=t.__getitem__)})")
    if step.report is None:
        from tscope_callbacks.render.markdown import op_table

        return head + " -- no device roof; op totals only\n\n" + op_table(step.profile, top)
    return head + "\n\n" + step.report.to_markdown(top=top)


def comparison_text(c: Comparison, top: int) -> str:
    from tscope_callbacks.render.markdown import compare_table

    speed = c.speedup
    head = (f"**compiled step {c.compiled_step} vs eager step {c.eager_step}** (op time, both slowed alike by the "
            f"capture): {'' if speed is None else f'{speed:.2f}x '}faster compiled\n\n")
    return head + compare_table(list(c.rows), top)


def step_file_name(ctx: ProfileContext, kind: str = "step") -> str:
    """``step_<N>.json`` (train) or ``<stage>_step_<N>.json``; ``kind="trace"``: ``trace_step_<N>.json``."""
    name = f"{kind}_step_{ctx.step}.json" if kind != "step" else f"step_{ctx.step}.json"
    return name if ctx.stage == "train" else f"{ctx.stage}_{name}"


def step_file(step: AnalysedStep) -> dict[str, Any]:
    """The step JSON: ``{"profile", "device", "report"}`` (``tscope report PATH`` renders it again)."""
    return {"profile": step.profile.to_dict(), "device": step.device.to_dict() if step.device is not None else None,
            "report": step.report.to_dict() if step.report is not None else None}


def emit_comparison(c: Comparison, sinks: Sink, ctx: ProfileContext, top: int) -> None:
    """``tscope/roofline/compiled_vs_eager`` (text) and ``tscope/roofline/compile_speedup``."""
    sinks.log_text(metric_key("roofline", "compiled_vs_eager"), comparison_text(c, top), ctx.log_step)
    if c.speedup is not None:
        sinks.log_scalars({metric_key("roofline", "compile_speedup"): c.speedup}, ctx.log_step)


def emit(step: AnalysedStep, sinks: Sink, ctx: ProfileContext, opts: EmitOptions, faults: Faults) -> None:
    """Every output of one profiled step (rank zero): the FSDP what-if's scalars, the step's scalars, the markdown
    table, communication, model and memory scalars, the layer table and scatter, the plot, the step JSON, the trace
    and the compiled-vs-eager comparison. A failing plot is reported to ``faults``; the rest is still written."""
    report, at = step.report, ctx.log_step
    key = lambda area, name: metric_key(area, name, ctx.stage)  # noqa: E731
    if step.fsdp_whatif is not None:
        sinks.log_scalars({key("fsdp_whatif", k): v for k, v in fsdp_scalars(step.fsdp_whatif).items()}, at)
    sinks.log_scalars({key("roofline", k): v for k, v in step_scalars(step, ctx).items()}, at)
    sinks.log_text(key("roofline", "table"), table_text(step, ctx, opts.top), at)
    if report is not None:
        from tscope_callbacks.analysis.comm import comm_summary
        from tscope_callbacks.analysis.roofline import layer_points
        from tscope_callbacks.render.markdown import comm_lines

        comm = comm_summary(report)
        if comm:
            sinks.log_scalars({key("comm", k): v for k, v in comm.items()}, at)
            sinks.log_text(key("comm", "table"), "\n".join(comm_lines(report)).strip(), at)
        if opts.model and ctx.stage == "train":
            from tscope_callbacks.analysis.model_summary import model_summary, summary_scalars

            sinks.log_scalars({metric_key("model", k): v for k, v in summary_scalars(model_summary(report)).items()},
                              at)
        mem = memory_scalars(report)
        if mem:
            sinks.log_scalars({key("memory", k): v for k, v in mem.items()}, at)
        rows = layer_points(report)
        sinks.log_table(key("roofline", "layers"), rows, at)
        sinks.log_scatter(key("roofline", "scatter"), rows, "intensity", "achieved_gflops_per_s", at,
                          title="layer roofline: intensity (FLOP/byte) vs achieved GFLOP/s")
        if opts.plot:
            try:
                sinks.log_figure(key("roofline", "plot"), report.figure(), at)
            except Exception as e:
                faults.report("drawing the roofline plot", e)
    if opts.save_json:
        sinks.write_json(step_file_name(ctx), step_file(step))
    if step.traces:
        from tscope_callbacks.render.trace import chrome_trace

        sinks.write_json(step_file_name(ctx, "trace"),
                         chrome_trace(list(step.traces), [report] + [None] * (len(step.traces) - 1)))
    if step.comparison is not None:
        emit_comparison(step.comparison, sinks, ctx, opts.top)
