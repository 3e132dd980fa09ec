"""What a capture installs for its region and takes down again, and the dispatch mode it runs the region under.

:func:`install` sets up, in order: the deferred garbage collection (``collector``), the compile stance (``eager``),
module paths and parameter owners, the per-module forward hooks, the optimizer step hooks (phase ``"optimizer"``,
``attribute.optimizer_hooks``), layer details and memory tracking, the CUDA kernel timeline and the dispatch mode
(:class:`_Mode`: the per-op hot path, which hands each op to ``CaptureState.record``). :meth:`Installed.remove` takes
all of it down on every path (the deferred collection ends after the result is built). The result is built at stop
by ``capture.build``.
"""

from __future__ import annotations

import logging
import time
import weakref
from typing import TYPE_CHECKING, Any

import torch
from torch._C._autograd import _get_sequence_nr
from torch._ops import OpOverload
from torch.utils._python_dispatch import TorchDispatchMode, is_traceable_wrapper_subclass_type

from tscope_callbacks.capture.attribute import optimizer_hooks
from tscope_callbacks.capture.collector import DeferredCollection
from tscope_callbacks.capture.compiled import CompiledState, is_compiled_wrapper, kernel_recorder
from tscope_callbacks.capture.cuda_timing import (
    PAUSED_RANGE,
    RANGE_PREFIX,
    KernelTimeline,
    cupti_teardown_note,
)
from tscope_callbacks.capture.eager import CompiledFrames, EagerStance
from tscope_callbacks.capture.layers import LayerDetails
from tscope_callbacks.capture.memory import MemoryTracker
from tscope_callbacks.capture.paths import ModelTree, clean_path
from tscope_callbacks.capture.step_memory import grad_bytes, local_tensor
from tscope_callbacks.formulas.bytes import op_plan
from tscope_callbacks.formulas.memo import CountCache
from tscope_callbacks.formulas.registry import FormulaRegistry

if TYPE_CHECKING:
    from tscope_callbacks.capture.profile_options import ProfileOptions
    from tscope_callbacks.capture.state import CaptureState

__all__ = ["Installed", "install", "count_cache", "resolve_timing", "PAUSED_RANGE"]

log = logging.getLogger("tscope_callbacks")

_WARNED_COMPILED: set[tuple[str, tuple[str, ...]]] = set()
_CACHES: weakref.WeakKeyDictionary[FormulaRegistry, CountCache] = weakref.WeakKeyDictionary()


def count_cache(registry: FormulaRegistry) -> CountCache:
    """The memoized counter of a registry, shared by every profile using it (hits carry over between steps)."""
    c = _CACHES.get(registry)
    if c is None or c.registry is not registry:
        c = _CACHES[registry] = CountCache(registry)
    return c.refresh()


def resolve_timing(model: torch.nn.Module, timing: str | None) -> str:
    if timing in (None, "none"):
        return "none"
    if timing == "auto":
        dev = next((p.device for p in model.parameters()), None)
        return "cuda" if dev is not None and dev.type == "cuda" and torch.cuda.is_available() else "cpu"
    return timing


class Installed:
    """Handles of one capture's installation; :meth:`remove` undoes all of it (idempotent, never raises)."""

    def __init__(self) -> None:
        self.stance = EagerStance()
        self.collector = DeferredCollection()
        self.paths: dict[int, str] = {}
        self.compiled: list[str] = []
        self.handles: list[Any] = []
        self.mode: Any = None

    def remove(self, st: CaptureState, *, keep_collector: bool = False) -> None:
        """Undo the installation; ``keep_collector``: the deferred garbage collection stays on (the caller ends it
        with ``collector.exit()`` once the result is built)."""
        if self.mode is not None:
            try:
                self.mode.__exit__(None, None, None)
            except Exception as e:
                st.error(e, "leaving the dispatch mode")
            self.mode = None
        if st.timeline is not None:
            st.timeline.abort()
            st.timeline = None
        for h in self.handles:
            try:
                h.remove()
            except Exception:
                pass
        self.handles.clear()
        if st.details is not None:
            st.details.remove_hooks()
        if st.memory is not None:
            st.memory.close()
        if st.cstate is not None:
            st.cstate.restore()
        self.stance.exit()
        if not keep_collector:
            self.collector.exit()


def install(p: ProfileOptions, st: CaptureState) -> Installed:
    """Install everything a capture of ``p.model`` needs into ``p``'s state ``st`` (the caller removes it with
    ``Installed.remove``)."""
    s = Installed()
    st.session = s  # visible to remove() even when a later step raises
    s.collector.enter()  # the cyclic collector runs after the region, not inside it for tscope's own objects
    st.cstate = None
    st.eager_fns = None
    model = p.model
    tree = st.tree = ModelTree(model)  # one walk, reused by build_result
    wrappers, inplace = [], []
    for path, mod in tree.modules:
        s.paths[id(mod)] = clean_path(path)
        # torch.compile's wrapper, or a module whose methods Lightning compiled in place (``_compiler_ctx``)
        if is_compiled_wrapper(mod):
            wrappers.append(mod)
            s.compiled.append(clean_path(path))
        elif isinstance(vars(mod).get("_compiler_ctx"), dict) or getattr(mod, "_compiled_call_impl", None):
            # (an instance attribute: read from the module's __dict__, a getattr miss goes through __getattr__)
            inplace.append(clean_path(path))
            s.compiled.append(clean_path(path))
    want = p.compiled == "kernels" or (p.compiled == "auto" and not p.layer_details)
    inner: set[int] = set()
    if wrappers and want and not inplace:  # run compiled: record the kernels that really run (capture.compiled)
        st.cstate = CompiledState()
        st.cstate.cudagraphs = any(_cudagraphs(w) for w in wrappers)
        inner = {id(m) for w in wrappers for m in w._orig_mod.modules()}
        for w in wrappers:
            s.handles.append(w.register_forward_pre_hook(_depth(st.cstate, 1), prepend=True))
            s.handles.append(w.register_forward_hook(_depth(st.cstate, -1), always_call=True))
    else:
        st.eager_fns = CompiledFrames()
        s.stance.enter(st.eager_fns)
        st.compiled = list(s.compiled)
        warn_key = (type(model).__qualname__, tuple(s.compiled))
        if s.compiled and warn_key not in _WARNED_COMPILED:  # once per model and process, not per profile
            _WARNED_COMPILED.add(warn_key)
            why = ("compiled in place (module.compile())" if inplace else "layer details need the eager modules"
                   if p.layer_details else "compiled='eager', e.g. RooflineCallback's compare_eager reference")
            log.warning("tscope: %s is torch.compile'd and runs eagerly under this profile (%s): op counts are exact, "
                        "times are eager-mode times", s.compiled[0] or "model", why)
    # on CUDA a value-dependent count waits for the stop (untimed captures too: reading values mid-step syncs)
    st.defer_values = p.timing == "cuda" or tree.device().type == "cuda"
    for mpath, mod in tree.modules:
        for prm in mod._parameters.values():
            if prm is not None:
                st.param_owner.setdefault(id(prm), st.collapse(clean_path(mpath)))
    if p.layer_details:
        st.grads_at_start = grad_bytes([prm for _, prm in tree.parameters])  # the step peak's (tracker only)
        st.memory = MemoryTracker(tree.device())
        st.memory.set_parameters([prm for _, prm in tree.parameters])
        s.handles += st.memory.watch_grads(tree.parameters, p.faults)
        s.handles.append(st.memory.watch_resizes())
        st.memory.watch_held([local_tensor(prm.grad) for _, prm in tree.parameters
                              if isinstance(prm.grad, torch.Tensor)])
        st.details = LayerDetails(p.check_finite, mute=st.mute, memory=st.memory, faults=p.faults)
    # Per-module hooks: ours run first before the module and last after it (after any user hook that replaces the
    # output), so shapes and finite-checks see what the module really hands downstream.
    pre, post = st.pre_hook, st.post_hook  # one bound method each for every module
    for _, mod in tree.modules:
        if id(mod) in inner:  # Dynamo guards on hooks inside a compiled module: one there recompiles the model
            continue
        s.handles.append(mod.register_forward_pre_hook(pre, prepend=True, with_kwargs=True))
        s.handles.append(mod.register_forward_hook(post, always_call=True, with_kwargs=True))
    s.handles += optimizer_hooks(st)
    if p.timing == "cuda":
        torch.cuda.synchronize()
        st.timeline = KernelTimeline()
        st.timeline.start()
        note = cupti_teardown_note()
        if note is not None:
            log.warning("tscope: %s", note)
    if st.cstate is not None:
        st.cstate.map_parameters(model, lambda path: st.collapse(clean_path(path)))
        st.cstate.wrap(kernel_recorder(st, st.cstate))
    s.mode = _mode_for(st)
    s.mode.__enter__()
    return s


def _cudagraphs(wrapper: Any) -> bool:
    """Whether a compile wrapper runs CUDA graphs (``mode="reduce-overhead"``)."""
    try:
        cfg = wrapper.get_compiler_config() if callable(getattr(wrapper, "get_compiler_config", None)) else None
        return bool(cfg and cfg.get("triton.cudagraphs"))
    except Exception:
        return False


def _depth(state: CompiledState, d: int) -> Any:
    def hook(module: Any, *args: Any) -> None:
        state.depth = max(0, state.depth + d)

    return hook


def _mode_for(st: CaptureState) -> Any:
    return _CompiledMode(st) if st.cstate is not None else _Mode(st)


_current_node = torch._C._current_autograd_node
_perf_ns = time.perf_counter_ns


#: id(op) -> (op, skip, call, view): ``skip`` for ops that are annotations, not work (``profiler::_record_function_*``:
#: run, never recorded); ``call`` runs the op (an ``OpOverload``'s C++ callable, one Python frame less per op);
#: ``view``: its schema makes every result a read-only alias of an input (``view``, ``t``, ``transpose``, ``expand``,
#: ``split``...: metadata, never a kernel), so on CUDA it runs without a Kineto range. Keyed by id
#: (``OpOverload.__hash__`` is a Python method); a hit must be that very op
_OPS: dict[int, tuple[Any, bool, Any, bool]] = {}


def _op_entry(func: Any) -> tuple[Any, bool, Any, bool]:
    overload = type(func) is OpOverload
    call = func._op if overload else func
    hit = _OPS[id(func)] = (func, getattr(func, "namespace", "") == "profiler", call,
                            overload and op_plan(func).view)
    return hit


class _Subclasses(dict):
    """``types`` of a dispatch call -> "skip" (fake/functional tensors: tracing, not work), "desugar" (a wrapper
    subclass such as DTensor, which runs ops on plain local tensors), or None."""

    def __missing__(self, types: tuple) -> str | None:
        names = {t.__name__ for t in types}
        if names & {"FakeTensor", "FunctionalTensor"}:
            kind: str | None = "skip"
        elif any(is_traceable_wrapper_subclass_type(t) for t in types):
            kind = "desugar"
        else:
            kind = None
        self[types] = kind
        return kind


_SUBCLASS = _Subclasses()


class _Mode(TorchDispatchMode):
    """The capture's dispatch mode: the per-op hot path (range or timer around the op, then one record)."""

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # torch wraps every mode's __torch_dispatch__ in a Dynamo-disable shim (~4 us per op, the largest single
        # cost of the hot path); our handler never runs compiled code of its own, and the capture holds Dynamo in
        # force_eager (or, in kernels mode, lets compiled artifacts run past the mode), so the shim buys nothing
        return False

    def __init__(self, state: CaptureState) -> None:
        super().__init__()
        self.state = state

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if types:
            kind = _SUBCLASS[types]
            if kind == "desugar":
                # a wrapper subclass (DTensor under FSDP2/TP, ...): let it desugar first; its local ops (the shards
                # this rank computes on) and the collectives it issues come back through this mode and are recorded
                return NotImplemented
            if kind == "skip":  # fake tensors (e.g. DTensor's sharding propagation): no real work, not recorded
                return func(*args, **(kwargs or {}))
        if kwargs is None:
            kwargs = {}
        st = self.state
        e = _OPS.get(id(func))
        if e is None or e[0] is not func:
            e = _op_entry(func)
        if st.paused or e[1]:
            return func(*args, **kwargs)
        seq = _get_sequence_nr()
        node = _current_node()
        if st.timeline is None:
            if st.timed:  # timed_call's CPU branch, inlined: one call less per op
                t0 = st.op_t0 = _perf_ns()
                out = e[2](*args, **kwargs)
                dt = (_perf_ns() - t0) * 1e-9
            else:
                out, dt = e[2](*args, **kwargs), None
        elif e[3]:  # a view on CUDA: no kernel to time, so no range (a quarter of a transformer's ops)
            st.unranged.append(len(st.pending))
            out, dt = e[2](*args, **kwargs), None
        else:  # timed_call's CUDA branch, inlined (the op's kernels are timed from Kineto's records at stop)
            tl = st.timeline
            h = tl.enter(f"{RANGE_PREFIX}{len(st.pending)}")
            try:
                out = e[2](*args, **kwargs)
            finally:
                tl.exit(h)
            dt = None
        try:
            st.record(func, args, kwargs, out, dt, seq, node)
        except Exception as e:  # our bookkeeping must never break the user's op
            st.error(e, "the capture's op record")
        return out


class _CompiledMode(_Mode):
    """The dispatch mode of a kernels-mode capture: Dynamo keeps running compiled artifacts under it (a mode that
    does not ignore compile internals is handed eager ops instead) and it still sees the ops they dispatch."""

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        return True
