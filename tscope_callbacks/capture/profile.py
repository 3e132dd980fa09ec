"""Capture: record every aten op of a region (forward, backward, optimizer) with FLOPs, bytes, time and layer.

How ops are attributed to layers (the part torch's ``ModuleTracker`` gets wrong with activation checkpointing and
unused outputs):

- Forward: module forward pre/post hooks keep a stack of module paths; an op belongs to the top.
- Backward: the autograd engine runs one graph node at a time (``torch._C._current_autograd_node()``). Every node
  was created by a forward op, and at dispatch time the sequence counter (``_get_sequence_nr()``) is the new
  node's number + 1. So the forward op records ``seq -> layer`` and each backward op is attributed exactly to the
  layer whose forward created the node it runs in. ``AccumulateGrad`` nodes map to the parameter's owner.
- Recompute: a module forward that *starts* while the backward engine is running (activation checkpointing) is
  a re-run; its ops get phase ``"recompute"``.
- Optimizer: any ``optimizer.step()`` inside the region (torch's global optimizer step hooks) is phase
  ``"optimizer"``, as is everything inside ``prof.phase("optimizer")``.

The per-op path is built for a GPU host: no allocator statistics, no host sync, one memoized count per op
(``formulas.memo.CountCache``) and a tuple appended; records, layers and kernel times are built once, at
:meth:`Profile.stop`. On CUDA each op runs in a Kineto USER_SCOPE range (``cuda_timing``); on CPU it is timed with
``perf_counter_ns``. Off-region nothing is installed; ``stop()`` removes every hook on every path (also when the
region raised). Tscope's own work inside a region runs under :func:`paused`, so a profile holds only the user's ops.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode, _pop_mode_temporarily

from tscope_callbacks.capture import region as _session
from tscope_callbacks.capture.active import NestedProfileError, active_profile, claim, paused, release
from tscope_callbacks.capture.attribute import attribute
from tscope_callbacks.capture.faults import Faults
from tscope_callbacks.capture.masks import MaskCounts
from tscope_callbacks.capture.paths import Selection
from tscope_callbacks.formulas import DEFAULT_REGISTRY, FormulaRegistry
from tscope_callbacks.formulas.comm import collective_info
from tscope_callbacks.formulas.memo import value_dependent
from tscope_callbacks.records import LayerRecord, OpRecord, StepProfile

__all__ = ["profile", "Profile", "NestedProfileError", "active_profile", "paused"]

log = logging.getLogger("tscope_callbacks")

_current_node = torch._C._current_autograd_node
_perf_ns = time.perf_counter_ns
_TO_COPY = torch.ops.aten._to_copy.default


class Profile:
    """A capture session. Use as a context manager, or ``start()``/``stop()`` (stop is idempotent).

    After stop: ``ops``, ``layers``, ``wall_time_s``, ``meta`` and ``result`` (a :class:`StepProfile`);
    ``timeline`` holds the CUDA kernel timeline (None off CUDA). ``labels`` (and :meth:`label`) are copied into
    ``meta`` at stop (e.g. the step number, or a ``step_time_s`` measured on unprofiled steps by the caller).

    ``meta["capture_cost"]``: tscope's own host seconds -- ``start_s`` (hooks, dispatch mode, Kineto's prepare and
    enable), ``region_s`` (start to the device done: the step with the per-op work; ``wall_time_s``), on CUDA
    ``sync_s`` (waiting for the device at stop), ``kineto_s`` (Kineto's teardown and event read-out) and
    ``assign_s`` (kernels to ops), then ``build_s`` (records, layers, memory), and ``ops``.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        *,
        formulas: dict | FormulaRegistry | None = None,
        timing: str | None = "auto",
        layer_details: bool = False,
        check_finite: bool = False,
        paths: Sequence[str] | None = None,
        depth: int | None = None,
        record_shapes: bool = True,
        raise_errors: bool = False,
        labels: dict[str, Any] | None = None,
        compiled: str = "auto",
        faults: Faults | None = None,
    ) -> None:
        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"profile() needs a torch.nn.Module, got {type(model).__name__}")
        if timing not in ("auto", "cpu", "cuda", None, "none"):
            raise ValueError(f"timing must be 'auto', 'cpu', 'cuda' or None, got {timing!r}")
        if compiled not in ("auto", "kernels", "eager"):
            raise ValueError(f"compiled must be 'auto', 'kernels' or 'eager', got {compiled!r}")
        self.compiled = compiled
        self.model = model
        if isinstance(formulas, FormulaRegistry):
            self.registry = formulas
        else:
            self.registry = DEFAULT_REGISTRY.with_overrides(formulas)
        self._counter = _session.count_cache(self.registry)
        self.timing = _session.resolve_timing(model, timing)
        self._timed = self.timing != "none"
        self.layer_details = layer_details
        self.check_finite = check_finite
        self.selection = Selection(paths or None, depth)  # validates both
        self._collapsing = not self.selection.everything
        self._collapse = self.selection.collapse
        self.record_shapes = record_shapes
        self.raise_errors = raise_errors
        self.labels: dict[str, Any] = dict(labels or {})
        self.result = StepProfile()
        self.timeline: Any = None
        self.errors: list[str] = []
        #: where internal errors are logged (once per part): the owning callback's, or this profile's own
        self.faults = faults if faults is not None else Faults("capture", raise_errors=raise_errors)
        self._pending: list[tuple] = []
        self._running = False
        self._session: _session.Installed | None = None  #: what start() installed (hooks, mode, stance...)
        self._tree: Any = None  #: ``paths.ModelTree`` of the model, walked once per capture at start
        self._timeline: Any = None
        self._phase_override: str | None = None
        self._stack: list[tuple[str, bool]] = []  #: (module path, entered during backward)
        self._seq_layer: dict[int, str] = {}
        self._seq_hi = -1  #: the autograd sequence counter at the last forward op (-1: none yet this region)
        self._hooked: set[int] = set()  #: nodes whose saved tensors went through saved-tensor hooks
        self._details: Any = None
        self._memory: Any = None
        self._calls: dict[str, int] = {}
        self._param_owner: dict[int, str] = {}
        self._compiled: list[str] = []  #: compiled modules (run eagerly under the capture)
        self._cstate: Any = None  #: ``capture.compiled.CompiledState`` when compiled modules run compiled
        self._fused: dict[int, tuple] = {}  #: pending index -> the aten ops an Inductor kernel fused
        self._comm: dict[int, dict] = {}  #: pending index -> a collective's info (formulas.comm)
        #: pending index -> (op, args, kwargs, out) of a value-dependent op on CUDA, counted at stop (reading its
        #: values now would sync the host in the middle of the step; stop has synchronized anyway)
        self._deferred: dict[int, tuple] = {}
        self._masks = MaskCounts()  #: explicit masks of attention calls (counted when the call runs)
        self._starts: dict[int, float] = {}  #: pending index -> start (s after the region start; CPU timing)
        self._op_t0 = 0  #: perf_counter_ns at the current op's start (set by the dispatch mode when timed)
        self._inputs: list | None = None  #: [shape, dtype] of the root module's tensor inputs (first call)
        self._paused = 0
        self._pause_t0 = 0
        self._paused_ns = 0
        self._pause_range: Any = None
        self._t0 = 0
        self._start_s = 0.0  #: host seconds start() took (hooks, dispatch mode, Kineto's prepare and enable)
        self._in_backward = False
        self._in_opt_step = 0  #: inside optimizer.step() (global optimizer hooks)
        self._optimizers: dict[int, Any] = {}  #: optimizers that stepped in the region (their state: step memory)
        self._grads_at_start = 0  #: bytes of the gradients that existed when the region started

    # ---------------- public surface ----------------
    @property
    def ops(self) -> list[OpRecord]:
        return self.result.ops

    @property
    def layers(self) -> dict[str, LayerRecord]:
        return self.result.layers

    @property
    def wall_time_s(self) -> float | None:
        return self.result.wall_time_s

    @property
    def meta(self) -> dict[str, Any]:
        return self.result.meta

    def uncounted_ops(self) -> dict[str, int]:
        return self.result.uncounted_ops()

    def coverage(self) -> float:
        return self.result.coverage()

    def __enter__(self) -> Profile:
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    @contextlib.contextmanager
    def phase(self, name: str | None) -> Iterator[None]:
        """Mark the ops run inside as phase ``name`` (e.g. ``"optimizer"``)."""
        prev, self._phase_override = self._phase_override, name
        try:
            yield
        finally:
            self._phase_override = prev

    def set_phase(self, name: str | None) -> None:
        self._phase_override = name

    def label(self, **labels: Any) -> None:
        """Add labels copied into ``meta`` at stop."""
        self.labels.update(labels)

    def add_optimizer(self, optimizer: Any) -> None:
        """Count ``optimizer``'s state in the step's memory (an optimizer whose ``step()`` runs in the region is
        added by itself)."""
        self._optimizers.setdefault(id(optimizer), optimizer)

    def pause(self) -> None:
        """Stop recording until :meth:`resume` (nestable): ops run untouched, modules are not tracked, and the
        paused time is left out of ``wall_time_s`` (e.g. a validation run inside a profiled training window)."""
        if self._paused == 0:
            self._pause_t0 = _perf_ns()
            if self._timeline is not None:  # kernels launched meanwhile are tscope's, not the step's
                self._pause_range = self._timeline.enter(_session.PAUSED_RANGE)
        self._paused += 1

    def resume(self) -> None:
        if self._paused <= 0:
            return
        self._paused -= 1
        if self._paused == 0:
            self._paused_ns += _perf_ns() - self._pause_t0
            if self._pause_range is not None:
                self._timeline.exit(self._pause_range)
                self._pause_range = None

    # ---------------- lifecycle ----------------
    def start(self) -> Profile:
        claim(self)
        self._inputs = None
        t = _perf_ns()
        try:
            self._session = _session.install(self)
            self._running = True
            self._t0 = _perf_ns()
            self._start_s = (self._t0 - t) * 1e-9
        except BaseException:
            self._uninstall()
            release(self)
            raise
        return self

    def stop(self) -> StepProfile:
        if not self._running:
            return self.result
        wall = None
        timeline = None
        cost: dict[str, Any] = {"start_s": self._start_s}  #: tscope's own host time, per part (see meta doc)
        try:
            if self._paused:  # stopped while paused (e.g. an exception inside a paused block)
                self._paused = 1
                self.resume()
            end = _perf_ns()
            kt = self._timeline
            if kt is not None:
                timeline = kt.stop(len(self._pending))
                end = kt.synced_ns or end  # the device done: Kineto's teardown and read-out are tscope's work
                cost.update(kt.cost)
            wall = (end - self._t0 - self._paused_ns) * 1e-9
        except Exception as e:
            self._internal_error(e, "stopping the capture")
        finally:
            self._uninstall()
            release(self)
        self.timeline = timeline
        t = _perf_ns()
        try:
            self.result = _session.build_result(self, wall, timeline)
        except Exception as e:
            self._internal_error(e, "building the step's records")
            self.result = StepProfile(wall_time_s=wall, meta={**_session.base_meta(self), **self.labels})
        cost.update(region_s=wall, build_s=(_perf_ns() - t) * 1e-9, ops=len(self.result.ops))
        self.result.meta["capture_cost"] = cost
        self._pending = []
        self._fused = {}
        self._comm = {}
        self._deferred = {}
        self._masks.clear()
        self._tree = None
        self._starts = {}
        self._seq_layer = {}
        self._seq_hi = -1
        self._hooked = set()
        return self.result

    def _uninstall(self) -> None:
        self._running = False
        s, self._session = self._session, None
        if s is not None:
            s.remove(self)
        self._stack.clear()

    # ---------------- internals ----------------
    def _internal_error(self, e: BaseException, part: str = "the capture's op record") -> None:
        if len(self.errors) < 20:
            self.errors.append(f"{type(e).__name__}: {e} (in {part})")
        self.faults.report(part, e)

    @contextlib.contextmanager
    def _mute(self) -> Iterator[None]:
        """Our own bookkeeping ops (finite checks in hooks) are not the user's: not recorded. When our mode is the
        innermost one it is popped meanwhile, so those ops skip the Python dispatch entirely (cheaper)."""
        self.pause()
        try:
            mode = self._session.mode if self._session is not None else None
            if mode is not None and _get_current_dispatch_mode() is mode:
                with _pop_mode_temporarily():
                    yield
            else:
                yield
        finally:
            self.resume()

    def _pre_hook(self, module: torch.nn.Module, args: Any, kwargs: Any = None) -> None:
        s = self._session
        path = s.paths.get(id(module)) if s is not None else None
        if path is None or not self._running or self._paused:
            return
        try:
            in_bwd = _current_node() is not None
            if path == "" and self._inputs is None:  # the model's inputs (batch and sequence for throughput)
                self._inputs = [[list(a.shape), str(a.dtype).removeprefix("torch.")] for a in
                                list(args) + list((kwargs or {}).values()) if isinstance(a, torch.Tensor)]
            self._stack.append((path, in_bwd))
            # a call counts for the module called, and only if it is a reported layer (a selected path or within
            # depth): its descendants' calls are aggregated into its ops, not into its call count
            if not in_bwd and (not self._collapsing or self._collapse(path) == path):
                self._calls[path] = self._calls.get(path, 0) + 1
            if self._details is not None:
                self._details.on_enter(path, module, args, kwargs)
        except Exception as e:
            self._internal_error(e, "the capture's module pre-hook")

    def _post_hook(self, module: torch.nn.Module, args: Any, *rest: Any) -> None:
        s = self._session
        path = s.paths.get(id(module)) if s is not None else None
        if path is None or not self._stack or self._paused:
            return
        output = rest[-1]  # (output) or (kwargs, output) with with_kwargs=True
        try:
            stack = self._stack
            for i in range(len(stack) - 1, -1, -1):  # pop up to this module's frame (robust to a child that raised)
                if stack[i][0] == path:
                    in_bwd = stack[i][1]
                    del stack[i:]
                    break
            else:
                return
            if self._details is not None:
                self._details.on_exit(path, module, output, in_bwd)
        except Exception as e:
            self._internal_error(e, "the capture's module post-hook")

    def _record(self, func, args, kwargs, out, dt, seq: int, node) -> None:
        phase, layer = attribute(self, args, seq, node)
        if self._collapsing:
            layer = self._collapse(layer)
        i = len(self._pending)
        if self._timeline is not None and value_dependent(func):
            self._deferred[i] = (func, args, kwargs, out)
            c = None
        else:
            c = self._counter.count(func, args, kwargs, out)
        cat = c.category if c is not None else None
        if phase == "forward":  # attention written as ops: its GEMMs' model FLOPs count the pairs the mask keeps
            self._masks.eager.forward(i, func, cat, args, out, seq, self._mute)
        elif node is not None:
            self._masks.eager.backward_op(i, node)
        if cat == "attention":
            self._masks.add(i, func, args, kwargs, self._mute)
        elif cat == "comm":
            info = collective_info(func, args, kwargs, out)
            if info is not None:
                self._comm[i] = info
        if dt is not None:
            self._starts[i] = (self._op_t0 - self._t0) * 1e-9
        self._pending.append((func, c, layer, phase, dt))
        mem = self._memory
        if mem is not None:
            mem.add_outputs(_session.fresh(func, out))
            if func is _TO_COPY and args and id(args[0]) in self._param_owner:  # a weight cast (autocast)
                mem.on_cast(out)
            mem.op_done()

    def _layer_of_node(self, node: Any) -> str | None:
        try:
            seq = node._sequence_nr()
        except Exception:
            return None
        return None if seq in self._hooked else self._seq_layer.get(seq)


def profile(model: torch.nn.Module, *, replay: Any = None, **kwargs: Any) -> Any:
    """Profile a region (forward, backward, optimizer step) of ``model``. See :class:`Profile` for options.

    >>> with profile(model) as prof:
    ...     model(x).sum().backward()
    >>> prof.ops[0].op, prof.layers[""].flops_fwd

    ``replay=<a full profile of an earlier step, same shapes>`` (CUDA): time this step from kernel records alone
    with that profile's counts (``capture.replay.ReplayProfile``; takes ``labels``, ``raise_errors`` and ``faults``
    only)."""
    if replay is None:
        return Profile(model, **kwargs)
    from tscope_callbacks.capture import replay as _replay

    return _replay.ReplayProfile(model, replay, **kwargs)
