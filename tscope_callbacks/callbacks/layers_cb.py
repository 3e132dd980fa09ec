"""``LayerProfilerCallback``: per-layer latency, memory, shapes and gradient shapes of scheduled steps."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import lightning.pytorch as pl
from typing_extensions import override

from tscope_callbacks.analysis.fmt import time_text
from tscope_callbacks.analysis.layers import inspector_gadgets_json, layer_rows, select_layers, top_layers
from tscope_callbacks.analysis.report import step_file_name
from tscope_callbacks.callbacks.base import ProfileContext, ProfilingCallback
from tscope_callbacks.callbacks.options import LayerOutputs, check_bool, check_option
from tscope_callbacks.callbacks.sinks import metric_key
from tscope_callbacks.capture.paths import Selection
from tscope_callbacks.records import LayerRecord, StepProfile
from tscope_callbacks.render.layer_table import ROOT_NAME, render_tree_markdown, render_tree_table

__all__ = ["LayerProfilerCallback"]

log = logging.getLogger("tscope_callbacks")


class LayerProfilerCallback(ProfilingCallback):
    """What each layer does in a profiled step (InspectorGadgets/torchprof, forward *and* backward, no host timers
    around asynchronous work): input/output and gradient shapes, parameter/gradient counts and bytes, output memory,
    allocator growth forward/backward, latency forward/backward (inclusive and self), FLOPs, calls and non-finite
    flags.

    Args:
        paths: module paths or fnmatch globs to report (others are aggregated into their nearest reported
            ancestor); None: all modules (up to ``depth``).
        depth: report modules at most this many path segments deep (``model.blocks.0`` is depth 3); None: all.
        check_finite: flag non-finite outputs and gradients per layer.
        outputs: what each profiled step writes (:class:`~tscope_callbacks.LayerOutputs`: scalars for the
            ``top_k`` layers by FLOPs (5), ``save_json``, the bars ``plot``, ``verbose`` printing). None: its
            defaults. ``top_k=``, ``save_json=``, ``verbose=``, ``plot=`` given here raise one line saying so.
        every_n_steps, start_step, max_profiles, profile_first, stages, raise_errors: see
            :class:`~tscope_callbacks.callbacks.base.ProfilingCallback`.

    Keys written (stage ``train``; other stages use ``tscope/layers/<stage>/...``):

    - text ``tscope/layers/table``: the torchprof-style tree table (Module | Self fwd | fwd total | Self bwd |
      bwd total | GFLOPs fwd | GFLOPs bwd | output MiB | mem fwd MiB | mem bwd MiB | calls);
    - scalars ``tscope/layers/<path>/forward_ms``, ``tscope/layers/<path>/backward_ms`` (inclusive op time) for the
      ``top_k`` layers by FLOPs (or the ``paths`` selected);
    - table ``tscope/layers/rows`` (one row per layer; a ``wandb.Table`` on W&B, a CSV file with CSVLogger);
    - image ``tscope/layers/bars`` (``plot``): self time forward/backward and memory per layer, largest first;
    - file ``<log_dir>/tscope/layers_step_<N>.json`` (other stages: ``layers_<stage>_step_<N>.json``) in the
      InspectorGadgets nested format ``{<model class>: {"info": {...}, "children": {...}}}`` (MB, ms).

    Attributes: ``last_layers`` (the reported ``dict[str, LayerRecord]`` of the last profiled step),
    ``last_table`` (its rendered table).
    """

    _moved = {k: f"outputs=ts.LayerOutputs({k}=...)" for k in ("top_k", "save_json", "verbose", "plot")}

    def __init__(self, paths: str | Sequence[str] | None = None, depth: int | None = None, *,
                 check_finite: bool = True, outputs: LayerOutputs | None = None, every_n_steps: int | None = 500,
                 start_step: int = 10, max_profiles: int | None = None, profile_first: bool = True,
                 stages: str | list[str] | tuple[str, ...] = ("train",), raise_errors: bool = False) -> None:
        super().__init__(every_n_steps=every_n_steps, start_step=start_step, max_profiles=max_profiles,
                         profile_first=profile_first, stages=stages, raise_errors=raise_errors)
        sel = Selection(paths, depth)  # validates both (the same rule as ts.profile(paths=, depth=))
        check_bool("LayerProfilerCallback", "check_finite", check_finite)
        self.paths, self.depth, self.check_finite = sel.paths, depth, check_finite
        self.outputs: LayerOutputs = check_option("LayerProfilerCallback", "outputs", outputs, LayerOutputs)
        self.last_layers: dict[str, LayerRecord] | None = None
        self.last_table: str | None = None

    @override
    def _capture_options(self) -> dict[str, Any]:
        # Captured at full module detail; ``paths``/``depth`` are applied afterwards by ``select_layers`` (the same
        # rule as ``ts.profile(paths=, depth=)``, identical totals), so ``calls`` stays each module's own count and
        # a RooflineCallback due at the same step shares the capture.
        return {"layer_details": True, "check_finite": self.check_finite, "paths": None, "depth": None}

    @override
    def _on_profile(self, trainer: pl.Trainer, pl_module: pl.LightningModule, result: StepProfile,
                    ctx: ProfileContext) -> None:
        layers = select_layers(result.layers, self.paths, self.depth)
        model_name = type(pl_module).__name__
        # the basis in the title: one step's op times (a RooflineCallback's report and the TSCOPE tab's tree show
        # the median over its merged steps, so their times of the same layer may differ)
        title = (f"tscope layers -- {model_name}, {ctx.stage} step {ctx.step} only (op times of this one step; "
                 "self = the layer's own ops, total = with its sub-layers)")
        if ctx.world_size > 1:
            t = ctx.step_times_s
            title += f" (profiled step time across ranks: min {time_text(min(t))}, max {time_text(max(t))})"
        table = render_tree_table(layers, root_name=ROOT_NAME, title=title)
        self.last_layers, self.last_table = layers, table
        if not ctx.is_global_zero:
            return
        if self.outputs.verbose:
            print(table)
        else:
            log.info("%s", table)
        sinks, log_step = self.sinks(trainer), ctx.log_step
        key = lambda name: metric_key("layers", name, ctx.stage)  # noqa: E731
        # a markdown table (TensorBoard's text plugin cuts a wide code block off on the right; a table wraps)
        sinks.log_text(key("table"), render_tree_markdown(layers, root_name=ROOT_NAME, title=title), log_step)
        scalars: dict[str, float] = {}
        chosen = ([L for p, L in layers.items() if p] if self.paths else top_layers(layers, self.outputs.top_k))
        for L in chosen:
            scalars[key(f"{L.path}/forward_ms")] = L.forward_s * 1e3
            scalars[key(f"{L.path}/backward_ms")] = L.backward_s * 1e3
        sinks.log_scalars(scalars, log_step)
        sinks.log_table(key("rows"), layer_rows(layers), log_step)
        if self.outputs.plot:
            try:
                from tscope_callbacks.render.plot import card_layer_bars

                sinks.log_figure(key("bars"), card_layer_bars(layers), log_step)  # sized for the image card
            except Exception as e:
                self.faults.report("drawing the layer bars", e)
        if self.outputs.save_json:
            sinks.write_json(step_file_name(ctx.step, ctx.stage, "layers"), inspector_gadgets_json(layers, model_name))
