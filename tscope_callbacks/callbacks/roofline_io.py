"""The RooflineCallback's outputs: a profiled step's scalars, table, plot and JSON; the compiled-vs-eager comparison, the communication section, and the
Chrome trace of a profiled step (all ranks' profiles gathered to rank zero)."""

from __future__ import annotations

from typing import Any

from lightning.pytorch.utilities import rank_zero_warn

from tscope_callbacks.analysis.throughput import Window
from tscope_callbacks.callbacks import session
from tscope_callbacks.callbacks.sinks import metric_key

__all__ = ["write_step", "step_scalars", "mfu_boundary", "count_step", "compare", "on_eager_reference", "write_comm", "gather_trace", "write_trace", "write_model",
           "write_memory", "memory_scalars"]


def compare(cb: Any, trainer: Any, ctx: Any, compiled: Any) -> None:
    """Log the compiled-vs-eager table of ``compiled`` against the eager reference."""
    from tscope_callbacks.analysis.compare import compile_speedup, compiled_vs_eager
    from tscope_callbacks.render.markdown import compare_table

    eager = cb.eager_report
    if compiled is None or eager is None or not ctx.is_global_zero:
        return
    speed = compile_speedup(compiled, eager)
    head = (f"**compiled step {compiled.meta.get('step')} vs eager step {eager.meta.get('step')}** (op time, "
            f"both slowed alike by the capture): {'' if speed is None else f'{speed:.2f}x '}faster compiled\n\n")
    sinks = cb.sinks(trainer)
    sinks.log_text(metric_key("roofline", "compiled_vs_eager"), head + compare_table(compiled_vs_eager(
        compiled, eager), cb.top), ctx.log_step)
    if speed is not None:
        sinks.log_scalars({metric_key("roofline", "compile_speedup"): speed}, ctx.log_step)


def on_eager_reference(cb: Any, trainer: Any, result: Any, ctx: Any) -> None:
    """The eager reference step of a compiled model: keep its report, log the comparison."""
    if cb.spec is None or not ctx.is_global_zero:
        return
    from tscope_callbacks.api import roofline

    cb.eager_report = roofline(result, cb.spec, precision=cb.precision)
    compare(cb, trainer, ctx, cb.last_report)


def write_comm(sinks: Any, report: Any, ctx: Any) -> None:
    """``tscope/comm/*`` scalars and the communication table, when the step ran collectives."""
    from tscope_callbacks.analysis.comm import comm_summary
    from tscope_callbacks.render.markdown import comm_lines

    vals = comm_summary(report)
    if not vals:
        return
    sinks.log_scalars({metric_key("comm", k, ctx.stage): v for k, v in vals.items()}, ctx.log_step)
    sinks.log_text(metric_key("comm", "table", ctx.stage), "\n".join(comm_lines(report)).strip(), ctx.log_step)


def memory_scalars(report: Any) -> dict[str, float]:
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


def write_memory(sinks: Any, report: Any, ctx: Any) -> None:
    """``tscope/memory/*`` scalars at each profiled step with layer details."""
    vals = memory_scalars(report)
    if vals:
        sinks.log_scalars({metric_key("memory", k, ctx.stage): v for k, v in vals.items()}, ctx.log_step)


def write_fsdp_whatif(cb: Any, trainer: Any, pl_module: Any, result: Any, report: Any, ctx: Any) -> None:
    """``fsdp_whatif=N``: the profiled step predicted under FSDP2 over N GPUs (``analysis.fsdp``), into the report
    (its markdown section; the profile carries it into the step JSON) and as ``tscope/fsdp_whatif/*`` scalars. Under
    "-mixed" precision parameters are gathered at the low dtype and gradients reduced in fp32 (as ``analyze_model``)."""
    from tscope_callbacks.analysis.fsdp import fsdp_whatif, mixed_policy

    try:
        low, reduce = mixed_policy(str(getattr(trainer, "precision", "")))
        w = fsdp_whatif(report, pl_module, cb.fsdp_whatif, param_dtype=low, reduce_dtype=reduce)
    except Exception as e:  # e.g. an already sharded model: said once, the rest of the report stands
        cb._warn_once(f"the FSDP what-if over {cb.fsdp_whatif} GPUs", e)
        return
    report.meta["fsdp_whatif"] = result.meta["fsdp_whatif"] = w
    mem, sim = w["memory"], w.get("time") or {}
    vals = {"peak_mb": mem["peak"] / 2**20 if mem.get("peak") else None, "device_share": mem.get("share"),
            "step_ms": sim["step_s"] * 1e3 if sim.get("step_s") else None,
            "exposed_comm_ms": sim["exposed_s"] * 1e3 if sim.get("exposed_s") is not None else None,
            "mfu": sim.get("mfu")}
    cb.sinks(trainer).log_scalars({metric_key("fsdp_whatif", k, ctx.stage): v for k, v in vals.items()
                                   if v is not None}, ctx.log_step)


def gather_trace(cb: Any, trainer: Any, result: Any, ctx: Any) -> list[Any] | None:
    """Every rank's profile of this step (all ranks call this; scheduled steps only under several ranks)."""
    if trainer.world_size <= 1 or ctx.reason == "recount":
        return [result]
    try:
        from tscope_callbacks.records import StepProfile

        return [StepProfile.from_dict(d) for d in session.gather_objects(trainer, result.to_dict())]
    except Exception as e:
        cb._warn_once("gathering the ranks' profiles for the trace", e)
        return [result]


def write_trace(sinks: Any, profiles: list[Any], report: Any, ctx: Any) -> None:
    """``<log_dir>/tscope/trace_step_<N>.json``: one process per rank (open it in ui.perfetto.dev)."""
    from tscope_callbacks.render.trace import chrome_trace

    name = f"trace_step_{ctx.step}.json" if ctx.stage == "train" else f"{ctx.stage}_trace_step_{ctx.step}.json"
    sinks.write_json(name, chrome_trace(profiles, [report] + [None] * (len(profiles) - 1)))


def write_model(cb: Any, sinks: Any, report: Any, ctx: Any) -> None:
    """``tscope/model/*`` scalars (parameters, size, FLOPs, MACs, activations, latency, throughput), once per fit."""
    if getattr(cb, "_model_logged", False) or ctx.stage != "train":
        return
    from tscope_callbacks.analysis.model_summary import model_summary, summary_scalars

    sinks.log_scalars({metric_key("model", k): v for k, v in summary_scalars(model_summary(report)).items()},
                      ctx.log_step)
    cb._model_logged = True


def write_step(cb: Any, trainer: Any, result: Any, report: Any, ctx: Any, scalars: dict[str, float]) -> None:
    """A profiled step's outputs on rank zero: scalars, the markdown table, layer table and scatter, plot, JSON."""
    from tscope_callbacks.analysis.roofline import layer_points
    from tscope_callbacks.render.markdown import op_table

    sinks, step = cb.sinks(trainer), ctx.log_step
    key = lambda name: metric_key("roofline", name, ctx.stage)  # noqa: E731
    sinks.log_scalars(scalars, step)
    head = f"**{ctx.stage} step {ctx.step}**" + (f" ({ctx.micro_batches} micro-batches)"
                                                  if ctx.micro_batches > 1 else "")
    if ctx.world_size > 1:
        t = ctx.step_times_s
        head += (f" -- step time across {len(t)} ranks: min {min(t) * 1e3:.2f} ms, max {max(t) * 1e3:.2f} ms "
                 f"(slowest: rank {max(range(len(t)), key=t.__getitem__)})")
    body = report.to_markdown(top=cb.top) if report is not None else (
        " -- no device roof; op totals only\n\n" + op_table(result, cb.top))
    sinks.log_text(key("table"), head + ("\n\n" if report is not None else "") + body, step)
    if report is not None:
        write_comm(sinks, report, ctx)
        write_model(cb, sinks, report, ctx)
        write_memory(sinks, report, ctx)
        rows = layer_points(report)
        sinks.log_table(key("layers"), rows, step)
        sinks.log_scatter(key("scatter"), rows, "intensity", "achieved_gflops_per_s", step,
                          title="layer roofline: intensity (FLOP/byte) vs achieved GFLOP/s")
        if cb.plot:
            try:
                sinks.log_figure(key("plot"), report.figure(), step)
            except Exception as e:
                cb.faults.report("drawing the roofline plot", e)
    if cb.save_json:
        name = f"step_{ctx.step}.json" if ctx.stage == "train" else f"{ctx.stage}_step_{ctx.step}.json"
        sinks.write_json(name, {"profile": result.to_dict(),
                                "device": cb.spec.to_dict() if cb.spec is not None else None,
                                "report": report.to_dict() if report is not None else None})

def step_scalars(result: Any, report: Any, ctx: Any) -> dict[str, float]:
    """A profiled step's bare scalars (the report's, or counts and times without a device roof)."""
    if report is not None:
        out = dict(report.scalars())
    else:
        out = {"flop_coverage": float(result.coverage())}
        step = result.meta.get("step_time_s")
        if step:
            out["measured_step_ms"] = step * 1e3
            out["achieved_tflops"] = result.total_flops / step / 1e12
    if ctx.world_size > 1 and ctx.step_times_s:
        out["step_ms_min"] = min(ctx.step_times_s) * 1e3
        out["step_ms_max"] = max(ctx.step_times_s) * 1e3
    return out


def mfu_boundary(cb: Any, trainer: Any, gs: int, *, final: bool = False) -> None:
    """The automatic MFU at a logging step: close the running window, log the windows the device has finished."""
    try:
        if not final or cb._timer.current is not None and cb._timer.current.steps:  # type: ignore[union-attr]
            cb._timer.boundary(gs)  # type: ignore[union-attr]  # (at the end: closes the last window)
        for w, seconds in cb._timer.ready(wait=final):  # type: ignore[union-attr]
            cb.throughput.update(Window(w.end_step - 1, seconds, w.steps, w.flops, w.samples, w.tokens))
            vals = cb.throughput.compute()
            out = {k: vals[k] for k in ("achieved_tflops", "mfu", "step_ms", "samples_per_s", "tokens_per_s")
                   if k in vals}
            cb.last_mfu = vals.get("mfu", cb.last_mfu)
            cb.sinks(trainer).log_scalars({metric_key("roofline", k): v for k, v in out.items()}, w.end_step - 1)
    except Exception as e:
        cb.auto_mfu = False
        cb.faults.report("the automatic MFU", e)


def count_step(cb: Any, trainer: Any, sig: tuple, max_signatures: int) -> None:
    """One optimizer step in the running automatic-MFU window: its model FLOPs by batch signature; an unknown
    signature makes the window unusable and asks for a recount (at most ``max_signatures`` shapes)."""
    flops = cb._flops.get(sig)
    if flops is not None:
        cb._timer.add(flops)
        return
    cb._timer.mark_dirty()  # a step whose FLOPs are unknown: window unusable
    if len(cb._flops) < max_signatures:
        cb._recount_at = trainer.global_step
        cb._next_train = min(cb._next_train, trainer.global_step)
    elif not cb._shape_warned:
        cb._shape_warned = True
        rank_zero_warn(f"tscope RooflineCallback: more than {max_signatures} batch shapes; the automatic MFU "
                       "skips windows with a shape that was never profiled")
