"""The RooflineCallback's outputs of one profiled step. :func:`emit` writes them -- scalars, the markdown table, the
layer table and scatter, the plot, the step JSON, the Chrome trace and the compiled-vs-eager comparison -- and each
is a pure function of the step's report (:class:`~tscope_callbacks.analysis.report.ReportData`, with the step's
:class:`ProfileContext` for where it goes): nothing here reads or writes the callback. The analysis hands out bare
keys; the namespaced ones (``tscope/<area>/[<stage>/]<name>``) are made here.

The step file ``<log_dir>/tscope/step_<N>.json`` is ``{"profile", "device", "report"}``: the raw records and the
DeviceSpec (for re-analysis) and, under ``"report"``, the report's JSON (``report.to_dict()``, schema
``tscope.step_report``; ``ts.load_step_file`` reads it back)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tscope_callbacks.analysis.fmt import ratio_text, time_text
from tscope_callbacks.analysis.report import ReportData, layer_point_rows, step_file_name
from tscope_callbacks.analysis.report import step_file as step_file_of
from tscope_callbacks.callbacks.context import ProfileContext
from tscope_callbacks.callbacks.sinks import Sink, metric_key
from tscope_callbacks.capture.faults import Faults
from tscope_callbacks.devices.spec import DeviceSpec
from tscope_callbacks.records import ProfileReason, StepProfile

if TYPE_CHECKING:
    import lightning.pytorch as pl
    import torch

__all__ = ["AnalysedStep", "Comparison", "EmitOptions", "emit", "emit_comparison", "step_scalars", "table_text",
           "layer_points", "step_file", "gather_traces", "fsdp_whatif_of"]

#: areas of ``ReportData.area_scalars`` logged before the step's own scalars
_BEFORE = ("fsdp_whatif",)


@dataclass(frozen=True)
class Comparison:
    """A compiled step against its eager reference (``CaptureOptions.compare_eager``): per-layer rows (the last is the
    total) and the whole step's speedup (eager op time / compiled op time)."""

    compiled_step: int | None
    eager_step: int | None
    rows: tuple[dict[str, Any], ...]  #: ``ReportData.compiled_vs_eager``

    @property
    def speedup(self) -> float | None:
        return self.rows[-1].get("speedup") if self.rows else None


@dataclass(frozen=True)
class AnalysedStep:
    """One profiled step, analysed once: the records, the ReportData (None without a device roof or off rank zero),
    the device, every rank's records for the trace, and the eager reference's step (``compiled_vs_eager``)."""

    profile: StepProfile
    report: ReportData | None
    device: DeviceSpec | None = None
    traces: tuple[StepProfile, ...] | None = None
    eager_step: int | None = None

    @property
    def comparison(self) -> Comparison | None:
        r = self.report
        if r is None or not r.compiled_vs_eager:
            return None
        return Comparison(r.step, self.eager_step, tuple(r.compiled_vs_eager))


@dataclass(frozen=True)
class EmitOptions:
    """What to write besides the scalars and the table (the callback's arguments)."""

    top: int = 20
    plot: bool = True
    save_json: bool = True
    model: bool = True  #: the ``tscope/model/*`` hyperparameters (once per fit: the callback says when)


def gather_traces(trainer: pl.Trainer, result: StepProfile, ctx: ProfileContext) -> tuple[StepProfile, ...]:
    """Every rank's records of this step, for the trace (all ranks call this; a collective under several ranks, on
    scheduled steps only: a recount may happen on one rank)."""
    if trainer.world_size <= 1 or ctx.reason == ProfileReason.RECOUNT:
        return (result,)
    from tscope_callbacks.callbacks.context import gather_objects

    return tuple(StepProfile.from_dict(d) for d in gather_objects(trainer, result.to_dict()))


def fsdp_whatif_of(report: ReportData, model: torch.nn.Module, n: int, trainer_precision: str) -> dict[str, Any]:
    """``WhatIf(fsdp_gpus=N)``: the step predicted under FSDP2 over N GPUs (``analysis.fsdp``). Under "-mixed" precision
    parameters are gathered at the low dtype and gradients reduced in fp32 (as ``analyze_model``)."""
    from tscope_callbacks.analysis.fsdp import fsdp_whatif, mixed_policy

    low, reduce = mixed_policy(trainer_precision)
    return fsdp_whatif(report, model, n, param_dtype=low, reduce_dtype=reduce)


def step_scalars(step: AnalysedStep, ctx: ProfileContext) -> dict[str, float]:
    """The profiled step's bare ``tscope/roofline`` scalars (the report's, or counts and times without a device roof);
    with several ranks also the step time's min and max across them."""
    result, report = step.profile, step.report
    if report is not None:
        out = dict(report.scalars)
    else:
        out = {"flop_coverage": float(result.coverage())}
        t = result.info.step_time_s
        if t:
            out["measured_step_ms"] = t * 1e3
            out["achieved_tflops"] = result.total_flops / t / 1e12
    if ctx.world_size > 1 and ctx.step_times_s:
        out["step_ms_min"] = min(ctx.step_times_s) * 1e3
        out["step_ms_max"] = max(ctx.step_times_s) * 1e3
    return out


def layer_points(report: ReportData) -> list[dict[str, Any]]:
    """Per layer (all phases, self attribution): where it sits on the roofline, as table rows (JSON-safe): the
    ``tscope/roofline/layers`` table and the W&B scatter."""
    return layer_point_rows(report.rows["layer"])


def table_text(step: AnalysedStep, ctx: ProfileContext, top: int) -> str:
    """The markdown of ``tscope/roofline/table``: a head naming the step (micro-batches, the step time across ranks)
    and the report (op totals only without a device roof)."""
    from tscope_callbacks.render.markdown import op_table, to_markdown

    head = f"**{ctx.stage} step {ctx.step}**" + (f" ({ctx.micro_batches} micro-batches)"
                                                  if ctx.micro_batches > 1 else "")
    if ctx.world_size > 1:
        t = ctx.step_times_s
        head += (f" -- step time across {len(t)} ranks: min {time_text(min(t))}, max {time_text(max(t))} "
                 f"(slowest: rank {max(range(len(t)), key=t.__getitem__)})")
    if step.report is None:
        return head + " -- no device roof; op totals only\n\n" + op_table(step.profile, top)
    return head + "\n\n" + to_markdown(step.report, top=top)


def comparison_text(c: Comparison, top: int) -> str:
    from tscope_callbacks.render.markdown import compare_table

    speed = c.speedup
    head = (f"**compiled step {c.compiled_step} vs eager step {c.eager_step}** (op time, both slowed alike by the "
            f"capture): {'' if speed is None else ratio_text(speed) + ' '}faster compiled\n\n")
    return head + compare_table(list(c.rows), top)


def step_file(step: AnalysedStep) -> dict[str, Any]:
    """The step file's content: ``{"profile", "device", "report"}`` (``analysis.report.step_file``)."""
    return step_file_of(step.profile, step.device.to_dict() if step.device is not None else None, step.report)


def emit_comparison(c: Comparison, sinks: Sink, ctx: ProfileContext, top: int) -> None:
    """``tscope/roofline/compiled_vs_eager`` (text) and ``tscope/roofline/compile_speedup``."""
    sinks.log_text(metric_key("roofline", "compiled_vs_eager"), comparison_text(c, top), ctx.log_step)
    if c.speedup is not None:
        sinks.log_scalars({metric_key("roofline", "compile_speedup"): c.speedup}, ctx.log_step)


def _areas(report: ReportData, areas: Sequence[str], ctx: ProfileContext, sinks: Sink) -> None:
    for area in areas:
        vals = report.area_scalars.get(area)
        if vals:
            sinks.log_scalars({metric_key(area, k, ctx.stage): v for k, v in vals.items()}, ctx.log_step)


def emit(step: AnalysedStep, sinks: Sink, ctx: ProfileContext, opts: EmitOptions, faults: Faults) -> None:
    """Every output of one profiled step (rank zero), each a function of its ReportData: the FSDP what-if's scalars,
    the step's scalars, the markdown table, communication (scalars and table), model (once per fit) and memory
    scalars, the layer table and scatter, the plot, the step JSON, the trace and the compiled-vs-eager comparison.
    A failing plot is reported to ``faults``; the rest is still written."""
    report, at = step.report, ctx.log_step
    key = lambda area, name: metric_key(area, name, ctx.stage)  # noqa: E731
    if report is not None:
        _areas(report, _BEFORE, ctx, sinks)
    sinks.log_scalars({key("roofline", k): v for k, v in step_scalars(step, ctx).items()}, at)
    sinks.log_text(key("roofline", "table"), table_text(step, ctx, opts.top), at)
    if report is not None:
        from tscope_callbacks.render.markdown import comm_lines

        if report.area_scalars.get("comm"):
            _areas(report, ("comm",), ctx, sinks)
            sinks.log_text(key("comm", "table"), "\n".join(comm_lines(report)).strip(), at)
        if opts.model and ctx.stage == "train" and report.area_scalars.get("model"):
            sinks.log_scalars({metric_key("model", k): v for k, v in report.area_scalars["model"].items()}, at)
        _areas(report, ("memory",), ctx, sinks)
        rows = layer_points(report)
        sinks.log_table(key("roofline", "layers"), rows, at)
        sinks.log_scatter(key("roofline", "scatter"), rows, "intensity", "achieved_gflops_per_s", at,
                          title="layer roofline: intensity (FLOP/byte) vs achieved GFLOP/s")
        if opts.plot:
            from tscope_callbacks.render.plot import card_figure

            try:  # sized for the logger's image card (TensorBoard shows it 350 px wide); report.plot() is full size
                sinks.log_figure(key("roofline", "plot"), card_figure(report), at)
            except Exception as e:
                faults.report("drawing the roofline plot", e)

        def dashboard() -> str:
            from tscope_callbacks.render.dashboard import report_html

            return report_html(report)

        sinks.log_html(key("roofline", "dashboard"), dashboard, at)  # W&B: wandb.Html of the step's page
    if opts.save_json:
        sinks.write_json(step_file_name(ctx.step, ctx.stage), step_file(step))
    if step.traces:
        from tscope_callbacks.render.trace import chrome_trace

        sinks.write_json(step_file_name(ctx.step, ctx.stage, "trace"),
                         chrome_trace(list(step.traces), [report] + [None] * (len(step.traces) - 1)))
    if step.comparison is not None:
        emit_comparison(step.comparison, sinks, ctx, opts.top)
