"""What one capture gathers while its region runs, and the handlers that gather it.

:class:`CaptureState` is owned by its :class:`~tscope_callbacks.capture.profile.Profile` (``Profile.state``). The
capture's helpers take it as an argument and read and write its fields: what ``capture.region`` installs and builds,
the phase and layer rules of ``capture.attribute``, the compiled-kernel recorder of ``capture.compiled`` and the op
timing of ``capture.cuda_timing``. The per-op hot path (:meth:`CaptureState.record`), the module hooks and the pause
bookkeeping are its methods, so every write to a field happens here or in a helper it was handed to.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode, _pop_mode_temporarily

from tscope_callbacks.capture.attribute import attribute
from tscope_callbacks.capture.cuda_timing import PAUSED_RANGE
from tscope_callbacks.capture.masks import MaskCounts
from tscope_callbacks.formulas.bytes import fresh_outputs, op_plan
from tscope_callbacks.formulas.comm import collective_info
from tscope_callbacks.formulas.memo import CountCache, value_dependent

__all__ = ["CaptureState", "fresh"]

_current_node = torch._C._current_autograd_node
_graph_task = torch._C._current_graph_task_id
_grad_enabled = torch.is_grad_enabled
_saved_hooks = torch._C._autograd._top_saved_tensors_default_hooks
_perf_ns = time.perf_counter_ns
_TO_COPY = torch.ops.aten._to_copy.default


def fresh(func: Any, out: Any) -> list:
    """The outputs of ``func`` that are new storage (not views or in-place results)."""
    return fresh_outputs(op_plan(func), out)


@dataclass(slots=True, eq=False)
class CaptureState:
    """The mutable state of one capture, from ``start()`` to ``stop()``, and the per-op and per-module handlers.

    ``collapse``/``collapsing``: the layer selection (``paths.Selection``); ``timed``: ops are timed; ``counter``:
    the memoized formula counter; ``error(e, part)``: where an internal error goes (the owning profile's faults).
    The pending list holds one tuple ``(func, count, layer, phase, seconds)`` per op or kernel, in execution
    order; the dicts keyed by a pending index hold what some records carry besides (kernel members, collective
    info, value-dependent ops counted at stop, CPU start times)."""

    collapse: Callable[[str], str]
    collapsing: bool
    timed: bool
    counter: CountCache
    error: Callable[[BaseException, str], None]
    running: bool = False
    session: Any = None  #: ``region.Installed``: what start() installed (hooks, mode, stance...)
    tree: Any = None  #: ``paths.ModelTree`` of the model, walked once per capture at start
    timeline: Any = None  #: ``cuda_timing.KernelTimeline`` on CUDA
    phase_override: str | None = None
    stack: list[tuple[str, bool]] = field(default_factory=list)  #: (module path, entered during backward)
    seq_layer: dict[int, str] = field(default_factory=dict)
    seq_hi: int = -1  #: the autograd sequence counter at the last forward op (-1: none yet this region)
    hooked: set[int] = field(default_factory=set)  #: nodes whose saved tensors went through saved-tensor hooks
    details: Any = None  #: ``layers.LayerDetails`` with layer details
    memory: Any = None  #: ``memory.MemoryTracker`` with layer details
    calls: dict[str, int] = field(default_factory=dict)
    param_owner: dict[int, str] = field(default_factory=dict)
    compiled: list[str] = field(default_factory=list)  #: compiled modules (run eagerly under the capture)
    cstate: Any = None  #: ``compiled.CompiledState`` when compiled modules run compiled
    eager_fns: Any = None  #: ``eager.CompiledFrames``: the ops compiled functions ran eagerly (force_eager captures)
    pending: list[tuple] = field(default_factory=list)
    fused: dict[int, tuple] = field(default_factory=dict)  #: pending index -> the aten ops an Inductor kernel fused
    comm: dict[int, dict] = field(default_factory=dict)  #: pending index -> a collective's info (formulas.comm)
    #: pending index -> (op, args, kwargs, out) of a value-dependent op on CUDA, counted at stop (reading its
    #: values now would sync the host in the middle of the step; stop has synchronized anyway)
    deferred: dict[int, tuple] = field(default_factory=dict)
    defer_values: bool = False  #: the model runs on CUDA: value-dependent counts wait for the stop (set at install)
    masks: MaskCounts = field(default_factory=MaskCounts)  #: explicit masks of attention calls
    starts: dict[int, float] = field(default_factory=dict)  #: pending index -> start (s after t0; CPU timing)
    #: pending indices of the ops run without a Kineto range on CUDA (views: no kernel, device time 0)
    unranged: list[int] = field(default_factory=list)
    op_t0: int = 0  #: perf_counter_ns at the current op's start (set by the dispatch mode when timed)
    inputs: list | None = None  #: [shape, dtype] of the root module's tensor inputs (first call)
    paused: int = 0
    pause_t0: int = 0
    paused_ns: int = 0
    pause_range: Any = None
    t0: int = 0  #: perf_counter_ns at the region's start
    in_backward: bool = False
    in_opt_step: int = 0  #: inside optimizer.step() (global optimizer hooks)
    optimizers: dict[int, Any] = field(default_factory=dict)  #: optimizers that stepped in the region
    grads_at_start: int = 0  #: bytes of the gradients that existed when the region started

    def clear_region(self) -> None:
        """Drop what only the region's records needed (at stop, after the result is built)."""
        self.pending = []
        self.fused = {}
        self.comm = {}
        self.deferred = {}
        self.masks.clear()
        self.tree = None
        self.starts = {}
        self.unranged = []
        self.seq_layer = {}
        self.seq_hi = -1
        self.hooked = set()

    # ---------------- pausing ----------------
    def pause(self) -> None:
        if self.paused == 0:
            self.pause_t0 = _perf_ns()
            if self.timeline is not None:  # kernels launched meanwhile are tscope's, not the step's
                self.pause_range = self.timeline.enter(PAUSED_RANGE)
        self.paused += 1

    def resume(self) -> None:
        if self.paused <= 0:
            return
        self.paused -= 1
        if self.paused == 0:
            self.paused_ns += _perf_ns() - self.pause_t0
            if self.pause_range is not None:
                self.timeline.exit(self.pause_range)
                self.pause_range = None

    def add_optimizer(self, optimizer: Any) -> None:
        self.optimizers.setdefault(id(optimizer), optimizer)

    @contextlib.contextmanager
    def mute(self) -> Iterator[None]:
        """Our own bookkeeping ops (finite checks in hooks) are not the user's: not recorded. When our mode is the
        innermost one it is popped meanwhile, so those ops skip the Python dispatch entirely (cheaper)."""
        self.pause()
        try:
            mode = self.session.mode if self.session is not None else None
            if mode is not None and _get_current_dispatch_mode() is mode:
                with _pop_mode_temporarily():
                    yield
            else:
                yield
        finally:
            self.resume()

    # ---------------- module hooks ----------------
    def pre_hook(self, module: torch.nn.Module, args: Any, kwargs: Any = None) -> None:
        s = self.session
        path = s.paths.get(id(module)) if s is not None else None
        if path is None or not self.running or self.paused:
            return
        try:
            in_bwd = _current_node() is not None
            if path == "" and self.inputs is None:  # the model's inputs (batch and sequence for throughput)
                self.inputs = [[list(a.shape), str(a.dtype).removeprefix("torch.")] for a in
                               list(args) + list((kwargs or {}).values()) if isinstance(a, torch.Tensor)]
            self.stack.append((path, in_bwd))
            # a call counts for the module called, and only if it is a reported layer (a selected path or within
            # depth): its descendants' calls are aggregated into its ops, not into its call count
            if not in_bwd and (not self.collapsing or self.collapse(path) == path):
                self.calls[path] = self.calls.get(path, 0) + 1
            if self.details is not None:
                self.details.on_enter(path, module, args, kwargs)
        except Exception as e:
            self.error(e, "the capture's module pre-hook")

    def post_hook(self, module: torch.nn.Module, args: Any, *rest: Any) -> None:
        s = self.session
        path = s.paths.get(id(module)) if s is not None else None
        if path is None or not self.stack or self.paused:
            return
        output = rest[-1]  # (output) or (kwargs, output) with with_kwargs=True
        try:
            stack = self.stack
            for i in range(len(stack) - 1, -1, -1):  # pop up to this module's frame (robust to a child that raised)
                if stack[i][0] == path:
                    in_bwd = stack[i][1]
                    del stack[i:]
                    break
            else:
                return
            if self.details is not None:
                self.details.on_exit(path, module, output, in_bwd)
        except Exception as e:
            self.error(e, "the capture's module post-hook")

    # ---------------- the per-op record ----------------
    def record(self, func, args, kwargs, out, dt, seq: int, node) -> None:
        # (phase, layer): ``attribute()``'s rules, its common cases inlined (this runs for every op)
        stack = self.stack
        override = self.phase_override
        if override is not None:
            phase, layer = override, stack[-1][0] if stack else ""
        elif self.cstate is not None:
            phase, layer = attribute(self, args, seq, node)
        elif node is None:
            if _graph_task() != -1:  # the backward engine's callbacks (FSDP's reduce-scatter)
                phase, layer = "backward", stack[-1][0] if stack else ""
            elif self.in_opt_step and not stack and not _grad_enabled():  # the update itself
                phase, layer = "optimizer", ""
            else:
                phase = "forward"
                layer = stack[-1][0] if stack else ""
                hi = self.seq_hi
                if hi < seq:  # the autograd nodes made since the last forward op are this op's
                    lo = hi if hi >= 0 else seq - 1
                    sl = self.seq_layer
                    for s in range(lo, seq):
                        sl.setdefault(s, layer)
                    if self.memory is not None and _saved_hooks(False) is not None:
                        self.hooked.update(range(lo, seq))
                    self.seq_hi = seq
                self.in_backward = False
        elif self.in_backward and not (stack and stack[-1][1]):  # a backward op (not the pass's first)
            phase = "backward"
            layer = self.seq_layer.get(node._sequence_nr())
            if layer is None:
                var = getattr(node, "variable", None)  # AccumulateGrad
                layer = self.param_owner.get(id(var), "") if var is not None else (stack[-1][0] if stack else "")
        else:
            phase, layer = attribute(self, args, seq, node)
        if self.collapsing:
            layer = self.collapse(layer)
        pending = self.pending
        i = len(pending)
        if self.defer_values and value_dependent(func):
            self.deferred[i] = (func, args, kwargs, out)
            c = None
            cat = None
        else:
            c = self.counter.count(func, args, kwargs, out)
            cat = c.category
        if phase == "forward":  # attention written as ops: its GEMMs' model FLOPs count the pairs the mask keeps
            self.masks.eager.forward(i, func, cat, args, out, seq, self.mute)
        elif node is not None:
            self.masks.eager.backward_op(i, node)
        if cat == "attention":
            self.masks.add(i, func, args, kwargs, self.mute)
        elif cat == "comm":
            info = collective_info(func, args, kwargs, out)
            if info is not None:
                self.comm[i] = info
        if dt is not None:
            self.starts[i] = (self.op_t0 - self.t0) * 1e-9
        pending.append((func, c, layer, phase, dt))
        ef = self.eager_fns
        if ef is not None and (ef.active or ef.seqs):  # inside a compiled function (or its backward), run eagerly
            ef.mark(i, node)
        mem = self.memory
        if mem is not None:
            if func is _TO_COPY and args and id(args[0]) in self.param_owner:  # a weight cast (autocast)
                mem.add_outputs(fresh(func, out))
                mem.on_cast(out)
                mem.op_done()
            else:
                mem.on_op(op_plan(func), out)

    def layer_of_node(self, node: Any) -> str | None:
        try:
            seq = node._sequence_nr()
        except Exception:
            return None
        return None if seq in self.hooked else self.seq_layer.get(seq)
