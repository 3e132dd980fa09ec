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
import dataclasses
import logging
import time
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import torch

from tscope_callbacks.capture import build
from tscope_callbacks.capture import region as _session
from tscope_callbacks.capture.active import NestedProfileError, active_profile, claim, paused, release
from tscope_callbacks.capture.collector import DeferredCollection
from tscope_callbacks.capture.faults import Faults
from tscope_callbacks.capture.paths import Selection
from tscope_callbacks.capture.state import CaptureState
from tscope_callbacks.formulas import DEFAULT_REGISTRY, FormulaRegistry
from tscope_callbacks.records import CaptureInfo, LayerRecord, OpRecord, StepProfile

if TYPE_CHECKING:
    from tscope_callbacks.capture.cuda_timing import Timeline
    from tscope_callbacks.capture.replay import ReplayProfile

__all__ = ["profile", "Profile", "NestedProfileError", "active_profile", "paused"]

log = logging.getLogger("tscope_callbacks")

_perf_ns = time.perf_counter_ns


class Profile:
    """A capture session. Use as a context manager, or ``start()``/``stop()`` (stop is idempotent).

    After stop: ``ops``, ``layers``, ``wall_time_s``, ``info`` (typed: ``records.CaptureInfo``), ``user`` and
    ``result`` (a :class:`StepProfile`); ``timeline`` holds the CUDA kernel timeline (None off CUDA). The caller's
    ``info`` (and :meth:`label`'s fields) are the result's at stop where set (``step``, a ``step_time_s`` measured
    on unprofiled steps by the caller...), over the capture's own; ``user`` (the caller's own data) is copied as is.

    ``info.capture_cost``: tscope's own host seconds -- ``start_s`` (hooks, dispatch mode, Kineto's prepare and
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
        info: CaptureInfo | None = None,
        user: dict[str, Any] | None = None,
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
        self.timing = _session.resolve_timing(model, timing)
        self.layer_details = layer_details
        self.check_finite = check_finite
        self.selection = Selection(paths or None, depth)  # validates both
        self.record_shapes = record_shapes
        self.raise_errors = raise_errors
        if info is not None and not isinstance(info, CaptureInfo):
            raise TypeError(f"profile(info=...) takes a CaptureInfo (tscope_callbacks.records), got "
                            f"{type(info).__name__}; put your own data in user={{...}}")
        self.given = info or CaptureInfo()  #: the caller's facts about the step (:meth:`label` adds to them)
        self.user: dict[str, Any] = dict(user or {})
        self.result = StepProfile()
        self.timeline: Timeline | None = None
        self.errors: list[str] = []
        #: where internal errors are logged (once per part): the owning callback's, or this profile's own
        self.faults = faults if faults is not None else Faults("capture", raise_errors=raise_errors)
        #: everything the region gathers; the capture's helpers are handed this object
        self.state = CaptureState(collapse=self.selection.collapse, collapsing=not self.selection.everything,
                                  timed=self.timing != "none", counter=_session.count_cache(self.registry),
                                  error=self._internal_error)
        self._start_s = 0.0  #: host seconds start() took (hooks, dispatch mode, Kineto's prepare and enable)

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
    def info(self) -> CaptureInfo:
        return self.result.info

    @property
    def running(self) -> bool:
        """Between ``start()`` and ``stop()``."""
        return self.state.running

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
        st = self.state
        prev, st.phase_override = st.phase_override, name
        try:
            yield
        finally:
            st.phase_override = prev

    def set_phase(self, name: str | None) -> None:
        self.state.phase_override = name

    def label(self, **fields: Any) -> None:
        """Set ``CaptureInfo`` fields of the result (at stop; a field it does not have is a TypeError)."""
        self.given = dataclasses.replace(self.given, **fields)

    def add_optimizer(self, optimizer: Any) -> None:
        """Count ``optimizer``'s state in the step's memory (an optimizer whose ``step()`` runs in the region is
        added by itself)."""
        self.state.add_optimizer(optimizer)

    def pause(self) -> None:
        """Stop recording until :meth:`resume` (nestable): ops run untouched, modules are not tracked, and the
        paused time is left out of ``wall_time_s`` (e.g. a validation run inside a profiled training window)."""
        self.state.pause()

    def resume(self) -> None:
        self.state.resume()

    # ---------------- lifecycle ----------------
    def start(self) -> Profile:
        claim(self)
        st = self.state
        st.inputs = None
        t = _perf_ns()
        try:
            _session.install(self, st)
            st.running = True
            st.t0 = _perf_ns()
            self._start_s = (st.t0 - t) * 1e-9
        except BaseException:
            self._uninstall()
            release(self)
            raise
        return self

    def stop(self) -> StepProfile:
        st = self.state
        if not st.running:
            return self.result
        wall = None
        timeline = None
        cost: dict[str, Any] = {"start_s": self._start_s}  #: tscope's own host time, per part (see the class doc)
        try:
            if st.paused:  # stopped while paused (e.g. an exception inside a paused block)
                st.paused = 1
                st.resume()
            end = _perf_ns()
            kt = st.timeline
            if kt is not None:
                timeline = kt.stop(len(st.pending), no_range=st.unranged)
                end = kt.synced_ns or end  # the device done: Kineto's teardown and read-out are tscope's work
                cost.update(kt.cost)
            wall = (end - st.t0 - st.paused_ns) * 1e-9
        except Exception as e:
            self._internal_error(e, "stopping the capture")
        finally:
            collector = self._uninstall(keep_collector=True)
            release(self)
        try:
            self.timeline = timeline
            t = _perf_ns()
            try:
                self.result = build.build_result(self, st, wall, timeline)
            except Exception as e:
                self._internal_error(e, "building the step's records")
                self.result = StepProfile(wall_time_s=wall, info=dataclasses.replace(
                    CaptureInfo(**build.base_info(self, st)), **self.given.to_dict()), user=dict(self.user))
            cost.update(region_s=wall, build_s=(_perf_ns() - t) * 1e-9, ops=len(self.result.ops))
            self.result.info = dataclasses.replace(self.result.info, capture_cost=cost)
            st.clear_region()
        finally:  # the region's garbage is collected from here on: its pending records are gone, the step's too
            if collector is not None:
                collector.exit()
        return self.result

    def _uninstall(self, keep_collector: bool = False) -> DeferredCollection | None:
        """Take down what start() installed; with ``keep_collector`` the deferred garbage collection stays on and
        is returned (the caller ends it)."""
        st = self.state
        st.running = False
        s, st.session = st.session, None
        if s is not None:
            s.remove(st, keep_collector=keep_collector)
        st.stack.clear()
        return s.collector if s is not None and keep_collector else None

    # ---------------- internals ----------------
    def _internal_error(self, e: BaseException, part: str = "the capture's op record") -> None:
        if len(self.errors) < 20:
            self.errors.append(f"{type(e).__name__}: {e} (in {part})")
        self.faults.report(part, e)


def profile(model: torch.nn.Module, *, replay: Profile | ReplayProfile | None = None,
            **kwargs: Any) -> Profile | ReplayProfile:
    """Profile a region (forward, backward, optimizer step) of ``model``. See :class:`Profile` for options.

    >>> with profile(model) as prof:
    ...     model(x).sum().backward()
    >>> prof.ops[0].op, prof.layers[""].flops_fwd

    ``replay=<a full profile of an earlier step, same shapes>`` (CUDA): time this step from kernel records alone
    with that profile's counts (``capture.replay.ReplayProfile``; takes ``info``, ``user``, ``raise_errors`` and
    ``faults`` only)."""
    if replay is None:
        return Profile(model, **kwargs)
    from tscope_callbacks.capture import replay as _replay

    return _replay.ReplayProfile(model, replay, **kwargs)
