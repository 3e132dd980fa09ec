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

Off-region nothing is installed: ``start()`` installs a pre/post forward hook per module and one dispatch mode, ``stop()`` removes
them on every path (also when the region raised). Tscope's own work inside a region (per-layer finite checks, the
NaN guard's check and replay) runs under :func:`paused`, so a profile holds only the user's ops.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch._C._autograd import _get_sequence_nr
from torch.utils._python_dispatch import TorchDispatchMode, _get_current_dispatch_mode, _pop_mode_temporarily

from tscope_callbacks.capture.eager import EagerStance
from tscope_callbacks.capture.layers import LayerDetails, build_layers
from tscope_callbacks.capture.paths import Selection, clean_path
from tscope_callbacks.formulas import DEFAULT_REGISTRY, FormulaRegistry
from tscope_callbacks.formulas.apply import count_op
from tscope_callbacks.records import LayerRecord, OpRecord, StepProfile

__all__ = ["profile", "Profile", "NestedProfileError", "active_profile", "paused"]

log = logging.getLogger("tscope_callbacks")

_current_node = torch._C._current_autograd_node
_perf_ns = time.perf_counter_ns
_ACTIVE: Profile | None = None
_ACTIVE_LOCK = threading.Lock()
_WARNED_COMPILED: set[tuple[str, tuple[str, ...]]] = set()


class NestedProfileError(RuntimeError):
    """Raised when a profile is started while another one is running."""


def active_profile() -> Profile | None:
    """The profile currently capturing, if any."""
    return _ACTIVE


@contextlib.contextmanager
def paused() -> Iterator[None]:
    """Run tscope's own work (finite checks, the NaN guard's check and replay) inside a profiled region without
    recording it: ops run untouched and no module is tracked. A no-op when nothing is being profiled."""
    p = _ACTIVE
    if p is None:
        yield
        return
    p.pause()
    try:
        yield
    finally:
        p.resume()


class _Frame:
    __slots__ = ("in_backward", "path")

    def __init__(self, path: str, in_backward: bool) -> None:
        self.path = path
        self.in_backward = in_backward


class _Mode(TorchDispatchMode):
    def __init__(self, owner: Profile) -> None:
        super().__init__()
        self.owner = owner

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        p = self.owner
        if p._paused:
            return func(*args, **kwargs)
        seq = _get_sequence_nr()
        node = _current_node()
        rng = p._ranges.op_range(len(p._ops)) if p._ranges is not None else None
        if rng is not None:
            m0 = torch.cuda.memory_allocated() if p._details is not None else 0
            with rng:
                out = func(*args, **kwargs)
            dt = None
            p._last_alloc = (torch.cuda.memory_allocated() - m0) if p._details is not None else None
        elif p._timed:
            t0 = _perf_ns()
            out = func(*args, **kwargs)
            dt = (_perf_ns() - t0) * 1e-9
        else:
            out = func(*args, **kwargs)
            dt = None
        try:
            p._record(func, args, kwargs, out, dt, seq, node)
        except Exception as e:  # our bookkeeping must never break the user's op
            p._internal_error(e)
        return out


class Profile:
    """A capture session. Use as a context manager, or ``start()``/``stop()`` (stop is idempotent).

    After stop: ``ops``, ``layers``, ``wall_time_s``, ``meta`` and ``result`` (a :class:`StepProfile`).
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
    ) -> None:
        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"profile() needs a torch.nn.Module, got {type(model).__name__}")
        if timing not in ("auto", "cpu", "cuda", None, "none"):
            raise ValueError(f"timing must be 'auto', 'cpu', 'cuda' or None, got {timing!r}")
        self.model = model
        if isinstance(formulas, FormulaRegistry):
            self.registry = formulas
        else:
            self.registry = DEFAULT_REGISTRY.with_overrides(formulas)
        self.timing = self._resolve_timing(model, timing)
        self._timed = self.timing != "none"
        self.layer_details = layer_details
        self.check_finite = check_finite
        self.selection = Selection(paths or None, depth)  # validates both
        self._collapsing = not self.selection.everything
        self._collapse = self.selection.collapse
        self.record_shapes = record_shapes
        self.raise_errors = raise_errors
        self.result = StepProfile()
        self.errors: list[str] = []
        self._ops: list[OpRecord] = []
        self._running = False
        self._handles: list[Any] = []
        self._mode: _Mode | None = None
        self._ranges = None
        self._phase_override: str | None = None
        self._stack: list[_Frame] = []
        self._seq_layer: dict[int, str] = {}
        self._details: LayerDetails | None = None
        self._calls: dict[str, int] = {}
        self._mutating: dict[Any, bool] = {}
        self._paused = 0
        self._pause_t0 = 0
        self._paused_ns = 0
        self._t0 = 0
        self._stance = EagerStance()

    # ---------------- public surface ----------------
    @property
    def ops(self) -> list[OpRecord]:
        return self.result.ops if not self._running else self._ops

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

    def pause(self) -> None:
        """Stop recording until :meth:`resume` (nestable): ops run untouched, modules are not tracked, and the
        paused time is left out of ``wall_time_s`` (e.g. a validation run inside a profiled training window)."""
        if self._paused == 0:
            self._pause_t0 = _perf_ns()
        self._paused += 1

    def resume(self) -> None:
        if self._paused <= 0:
            return
        self._paused -= 1
        if self._paused == 0:
            self._paused_ns += _perf_ns() - self._pause_t0

    # ---------------- lifecycle ----------------
    def start(self) -> Profile:
        global _ACTIVE
        with _ACTIVE_LOCK:
            if _ACTIVE is not None:
                raise NestedProfileError(
                    "a tscope profile is already running; nested profile() calls are not supported "
                    "(stop the outer one first, or profile the outer region only)"
                )
            _ACTIVE = self
        try:
            self._install()
        except BaseException:
            self._uninstall()
            with _ACTIVE_LOCK:
                _ACTIVE = None
            raise
        return self

    def stop(self) -> StepProfile:
        global _ACTIVE
        if not self._running:
            return self.result
        wall = None
        times = None
        try:
            if self._ranges is not None:
                times = self._ranges.stop(len(self._ops))
                for r, tc in zip(self._ops, getattr(self._ranges, "tensor_core", None) or ()):
                    r.tensor_core = tc
                self._ranges = None
            now = _perf_ns()
            if self._paused:  # stopped while paused (e.g. an exception inside a paused block)
                self._paused_ns += now - self._pause_t0
                self._paused = 0
            wall = (now - self._t0 - self._paused_ns) * 1e-9
        except Exception as e:
            self._internal_error(e)
        finally:
            self._uninstall()
            with _ACTIVE_LOCK:
                if _ACTIVE is self:
                    _ACTIVE = None
        if times is not None:
            for r, t in zip(self._ops, times):
                r.time_s = t
        try:
            self.result = StepProfile(
                ops=self._ops,
                layers=build_layers(self.model, self._ops, self._details, self._collapse, self._calls),
                wall_time_s=wall,
                meta=self._meta(),
            )
        except Exception as e:
            self._internal_error(e)
            self.result = StepProfile(ops=self._ops, wall_time_s=wall, meta=self._meta())
        self._seq_layer = {}
        return self.result

    # ---------------- internals ----------------
    @staticmethod
    def _resolve_timing(model: torch.nn.Module, timing: str | None) -> str:
        if timing in (None, "none"):
            return "none"
        if timing == "auto":
            dev = next((p.device for p in model.parameters()), None)
            return "cuda" if dev is not None and dev.type == "cuda" and torch.cuda.is_available() else "cpu"
        return timing

    def _install(self) -> None:
        self._paths = {}
        self._compiled = []
        for path, mod in self.model.named_modules(remove_duplicate=True):
            self._paths[id(mod)] = clean_path(path)
            # torch.compile's wrapper, or a module whose methods Lightning compiled in place (``_compiler_ctx``)
            if type(mod).__name__ == "OptimizedModule" or isinstance(getattr(mod, "_compiler_ctx", None), dict):
                self._compiled.append(clean_path(path))
        warn_key = (type(self.model).__qualname__, tuple(self._compiled))
        if self._compiled and warn_key not in _WARNED_COMPILED:  # once per model and process, not per profile
            _WARNED_COMPILED.add(warn_key)
            log.warning(
                "tscope: %s is torch.compile'd; under profiling it runs eagerly, so op counts are exact but times "
                "are eager-mode times (fused kernels of the compiled graph are not seen)", self._compiled[0] or "model"
            )
        self._param_owner = {}
        for mpath, mod in self.model.named_modules():
            for p in mod.parameters(recurse=False):
                self._param_owner.setdefault(id(p), self._collapse(clean_path(mpath)))
        self._last_alloc: int | None = None
        if self.layer_details:
            self._details = LayerDetails(self.check_finite, mute=self._mute)
        # Per-module hooks: ours run first before the module and last after it (after any user hook that
        # replaces the output), so shapes and finite-checks see what the module really hands downstream.
        for mod in {id(m): m for m in self.model.modules()}.values():
            self._handles.append(mod.register_forward_pre_hook(self._pre_hook, prepend=True))
            self._handles.append(mod.register_forward_hook(self._post_hook, always_call=True))
        if self.timing == "cuda":
            from tscope_callbacks.capture.cuda_timing import OpRangeProfiler

            torch.cuda.synchronize()
            self._ranges = OpRangeProfiler()
            self._ranges.start()
        self._stance.enter()
        self._mode = _Mode(self)
        self._mode.__enter__()
        self._running = True
        self._t0 = _perf_ns()

    def _uninstall(self) -> None:
        self._running = False
        if self._mode is not None:
            try:
                self._mode.__exit__(None, None, None)
            except Exception as e:
                self._internal_error(e)
            self._mode = None
        if self._ranges is not None:
            self._ranges.abort()
            self._ranges = None
        for h in self._handles:
            h.remove()
        self._handles.clear()
        if self._details is not None:
            self._details.remove_hooks()
        self._stack.clear()
        self._stance.exit()

    def _meta(self) -> dict[str, Any]:
        dev = next((p.device for p in self.model.parameters()), torch.device("cpu"))
        name = "cpu"
        if dev.type == "cuda" and torch.cuda.is_available():
            name = torch.cuda.get_device_name(dev)
        return {
            "device": dev.type,
            "device_name": name,
            "timing": {"cpu": "cpu-wall", "cuda": "cuda-kernels"}.get(self.timing, "none"),
            "float32_matmul_precision": torch.get_float32_matmul_precision(),
            "model": type(self.model).__name__,
            "torch": torch.__version__,
            "internal_errors": list(self.errors),
            "compiled_modules_run_eagerly": list(getattr(self, "_compiled", [])),
            "paused_s": self._paused_ns * 1e-9,  #: left out of wall_time_s (tscope's own checks, validation)
        }

    def _internal_error(self, e: BaseException) -> None:
        msg = f"{type(e).__name__}: {e}"
        if len(self.errors) < 20:
            self.errors.append(msg)
        if len(self.errors) == 1:
            log.warning("tscope capture: internal error (profiling continues, training unaffected): %s", msg)
        if self.raise_errors:
            raise e

    @contextlib.contextmanager
    def _mute(self) -> Iterator[None]:
        """Our own bookkeeping ops (finite checks in hooks) are not the user's: not recorded. When our mode is the
        innermost one it is popped meanwhile, so those ops skip the Python dispatch entirely (cheaper)."""
        self.pause()
        try:
            if self._mode is not None and _get_current_dispatch_mode() is self._mode:
                with _pop_mode_temporarily():
                    yield
            else:
                yield
        finally:
            self.resume()

    def _pre_hook(self, module: torch.nn.Module, args: Any) -> None:
        path = self._paths.get(id(module))
        if path is None or not self._running or self._paused:
            return
        try:
            in_bwd = _current_node() is not None
            self._stack.append(_Frame(path, in_bwd))
            # a call counts for the module called, and only if it is a reported layer (a selected path or within
            # depth): its descendants' calls are aggregated into its ops, not into its call count
            if not in_bwd and (not self._collapsing or self._collapse(path) == path):
                self._calls[path] = self._calls.get(path, 0) + 1
            if self._details is not None:
                self._details.on_enter(path, module, args)
        except Exception as e:
            self._internal_error(e)

    def _post_hook(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        path = self._paths.get(id(module))
        if path is None or not self._stack or self._paused:
            return
        try:
            # pop up to and including this module's frame (robust to a child that raised)
            for i in range(len(self._stack) - 1, -1, -1):
                if self._stack[i].path == path:
                    frame = self._stack[i]
                    del self._stack[i:]
                    break
            else:
                return
            if self._details is not None:
                with self._mute():
                    self._details.on_exit(path, module, args, output, frame.in_backward)
        except Exception as e:
            self._internal_error(e)

    def _record(self, func, args, kwargs, out, dt, seq: int, node) -> None:
        stack = self._stack
        if self._phase_override is not None:
            phase = self._phase_override
            layer = stack[-1].path if stack else ""
        elif node is None:
            phase = "forward"
            layer = stack[-1].path if stack else ""
            if torch.is_grad_enabled():
                self._seq_layer.setdefault(seq - 1, layer)
        elif stack and stack[-1].in_backward:
            phase = "recompute"
            layer = stack[-1].path
            self._seq_layer.setdefault(seq - 1, layer)
        else:
            phase = "backward"
            layer = self._seq_layer.get(node._sequence_nr())
            if layer is None:
                var = getattr(node, "variable", None)  # AccumulateGrad
                layer = self._param_owner.get(id(var), "") if var is not None else (stack[-1].path if stack else "")
        if self._collapsing:
            layer = self._collapse(layer)
        c = count_op(func, args, kwargs, out, self.registry, want_shapes=self.record_shapes)
        names = _NAMES.get(func) or _names(func)
        rec = OpRecord(
            op=names[0],
            layer=layer,
            phase=phase,
            flops=c.flops,
            bytes_read=c.bytes_read,
            bytes_written=c.bytes_written,
            dtype=c.dtype,
            input_shapes=c.input_shapes,
            time_s=dt,
            counted=c.counted,
            category=c.category,
            overload=names[1],
            output_shapes=c.output_shapes,
            index=len(self._ops),
        )
        self._ops.append(rec)
        if self._details is not None:
            if self._ranges is not None:
                alloc = self._last_alloc or 0
            else:  # CPU: bytes of the fresh tensors the op returned (in-place/out= ops allocate nothing)
                mut = self._mutating.get(func)
                if mut is None:
                    mut = self._mutating[func] = bool(getattr(func, "_schema", None) and func._schema.is_mutable)
                alloc = 0 if mut else c.bytes_written
            self._details.on_op(rec, alloc)


_NAMES: dict[Any, tuple[str, str]] = {}


def _names(func) -> tuple[str, str]:
    """(packet name "aten.mm", overload name "aten.mm.default"), cached per op."""
    packet = f"{func.namespace}.{func._opname}" if hasattr(func, "_opname") else str(func)
    _NAMES[func] = (packet, str(func))
    return _NAMES[func]


def profile(model: torch.nn.Module, **kwargs: Any) -> Profile:
    """Profile a region (forward, backward, optimizer step) of ``model``. See :class:`Profile` for options.

    >>> with profile(model) as prof:
    ...     model(x).sum().backward()
    >>> prof.ops[0].op, prof.layers[""].flops_fwd
    """
    return Profile(model, **kwargs)
