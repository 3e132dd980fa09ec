"""Per-layer memory of a captured step, without an allocator call per op.

What is measured, per layer and per phase (DESIGN "Memory per layer"):

- ``memory_fwd_bytes``: allocator growth across the module's forward, summed over its calls: the allocated bytes
  after its forward hook minus before its pre-hook. On CUDA these are ``torch.cuda.memory_allocated()``-equivalent
  readings (the allocator's current allocated bytes) taken at the module's boundaries -- the same figure hooks
  around the module show; on CPU (no allocator statistics) the live bytes of the storages created inside the
  captured region (see below).
- ``memory_bwd_bytes``: the same across the module's backward, where the backward of a module spans its first to
  its last backward op (each attributed exactly through the autograd graph), measured with the tracked live bytes.
- ``peak_fwd_bytes`` / ``peak_bwd_bytes``: the highest allocated bytes while the module ran (forward / backward),
  above the level at its start: the tracked live bytes' maximum after any op of the span minus their value at the
  start. Temporaries inside a single kernel (workspaces) are not seen.
- ``saved_bytes``: activations the module's forward saved for backward (the saved tensors of the autograd nodes its
  ops created, read from the graph when backward starts; each storage counted once per layer, its descendants
  included, parameters and Python numbers excluded) -- what it keeps alive until its backward, apart from
  temporaries.

Tracked live bytes: every fresh (non-view) output storage of an op in the region is counted (its size rounded to
the CUDA caching allocator's 512-byte blocks on CUDA) until its last tensor dies (a weak reference on the storage).
No host sync, no per-op allocator statistics; one allocator reading per module boundary on CUDA.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import torch

from tscope_callbacks.capture.faults import Faults
from tscope_callbacks.formulas.bytes import fresh_outputs

__all__ = ["MemoryTracker", "allocator_reader"]

_BLOCK = 512  #: the CUDA caching allocator rounds every request up to a multiple of this


def allocator_reader(device: torch.device) -> Callable[[], int] | None:
    """A function returning the CUDA allocator's current allocated bytes on ``device`` (the figure
    ``torch.cuda.memory_allocated`` reports, without building its flattened dict), or None off CUDA."""
    if device.type != "cuda" or not torch.cuda.is_available():
        return None
    idx = device.index if device.index is not None else torch.cuda.current_device()
    stats = torch._C._cuda_memoryStats

    def read() -> int:
        return int(stats(idx)["allocated_bytes"]["all"]["current"])

    return read


_SAVED_NAMES: dict[type, tuple[str, ...]] = {}


def _saved_names(node: Any) -> tuple[str, ...]:
    """The attributes under which an autograd node may expose saved tensors (cached per node type; names seen
    holding something else are dropped by :func:`_not_a_tensor`)."""
    cls = type(node)
    names = _SAVED_NAMES.get(cls)
    if names is None:
        names = tuple(a for a in dir(node) if a.startswith("_saved_"))
        if hasattr(node, "saved_tensors"):  # custom autograd.Function nodes
            names += ("saved_tensors",)
        _SAVED_NAMES[cls] = names
    return names


def _not_a_tensor(node: Any, name: str, v: Any) -> None:
    """``node.<name>`` read ``v``, which holds no tensor and never will for this node type: forget the name.

    A node type's saved attributes have fixed C++ types (autograd's generated code): a number, a string, an int or
    SymInt list (``_saved_dilation``, ``_saved_self_sym_sizes``) stays one. Half of a step's ``_saved_*`` reads are
    such attributes, each a C++ -> Python conversion on every walk. ``None`` (an optional tensor, or an optional
    int) and empty or all-None lists (a tensor list, ``index_put``'s optional indices) say nothing and are kept."""
    if v is None:
        return
    if isinstance(v, (list, tuple)) and all(x is None for x in v):
        return
    cls = type(node)
    names = _SAVED_NAMES.get(cls)
    if names is not None and name in names:
        _SAVED_NAMES[cls] = tuple(n for n in names if n != name)


#: a wrapped number's dtype -> the narrowest 0-dim probe of its kind (see ``_python_scalar``)
_PROBES = {torch.float64: torch.zeros((), dtype=torch.float16), torch.int64: torch.zeros((), dtype=torch.int8),
           torch.complex128: torch.zeros((), dtype=torch.complex64)}


def _python_scalar(t: torch.Tensor) -> bool:
    """Whether ``t`` is a Python number autograd saved (``x * 0.5`` saves ``other`` as a "wrapped number": a 0-dim
    CPU double/long/complex tensor that never was an activation, on whatever device the model runs). Type
    promotion tells it from a real 0-dim tensor: a wrapped number gives way to a 0-dim tensor of its kind, a real
    one wins (``result_type(fp16 0-dim, 0.5 wrapped) = fp16``, ``(fp16 0-dim, tensor(0.5, float64)) = fp64``)."""
    probe = _PROBES.get(t.dtype)
    if probe is None or t.dim() != 0 or t.device.type != "cpu" or t.requires_grad:
        return False
    try:
        return torch.result_type(probe, t) == probe.dtype
    except (RuntimeError, TypeError):
        return False


class _Restore:
    """The handle of :meth:`MemoryTracker.watch_resizes`: ``remove()`` puts torch's ``resize_`` back."""

    __slots__ = ("orig", "patch")

    def __init__(self, orig: Any, patch: Any) -> None:
        self.orig, self.patch = orig, patch

    def remove(self) -> None:
        if torch.UntypedStorage.resize_ is self.patch:  # restore only our own patch (another may wrap it)
            torch.UntypedStorage.resize_ = self.orig


class MemoryTracker:
    """Tracks live storage bytes created in the region, module boundary readings and saved activations."""

    def __init__(self, device: torch.device, *, round_blocks: bool | None = None) -> None:
        self.device = device
        self._reader = allocator_reader(device)
        self._round = device.type == "cuda" if round_blocks is None else round_blocks
        self.live = 0  #: tracked bytes alive now
        self.live_after: list[int] = []  #: tracked live bytes after each recorded op (index = op index)
        self._storages: dict[int, weakref.ref] = {}
        #: weak reference -> (storage key, bytes) of each tracked storage; one shared callback (``_freed``) for all:
        #: no closure per storage (a step tracks hundreds, each one more object for the garbage collector)
        self._refs: dict[weakref.ref, tuple[int, int]] = {}
        self._on_free = self._freed
        #: (path, phase) -> [growth, peak above start] summed over calls / max over calls
        self.fwd: dict[str, list[int]] = {}
        self._open: list[tuple[str, int, int, int]] = []  #: (path, reading at start, live at start, op index)
        self.saved: dict[str, dict[int, int]] = {}  #: path -> {storage key: bytes} saved by that module's forward
        self._params: set[int] = set()
        self._closed: set[int] = set()  #: the storages still alive when tracking stopped
        self.at_start = self._reader() if self._reader is not None else None  #: allocator bytes at the start (CUDA)
        self._grads: dict[int, tuple[int, str]] = {}  #: storage key -> (bytes, parameter) of the step's gradients
        #: (op index from which it applies, +bytes when a gradient the step created was stored / -bytes when freed,
        #: the parameter's name)
        self.grad_events: list[tuple[int, int, str]] = []
        self._resized: dict[int, int] = {}  #: storage key -> bytes a tracked storage grew (+) or shrank (-) by resize_
        self._held: dict[int, Any] = {}  #: weak references to storages that lived before the region (old gradients)
        self.held_freed: list[tuple[int, int]] = []  #: (op index, bytes) when one of those was freed in the region
        self._casts: dict[int, int] = {}  #: storage key -> bytes of a parameter's dtype cast (autocast's weight copies)
        self.cast_events: list[tuple[int, int]] = []  #: (op index, +bytes made / -bytes freed) of those casts

    def peak(self) -> int:
        """The highest tracked live bytes of the region: what the step itself allocated, at its peak."""
        return max(self.live_after, default=0)

    def live_without_grads(self) -> list[int]:
        """Per recorded op, the tracked live bytes after it without the gradients: those the step created (noted by
        ``on_grad``, from the op that produced them to their release) and those it freed from before (``watch_held``):
        activations and temporaries, what data-parallel sharding (FSDP / ZeRO) does not divide."""
        events = sorted([(i, n) for i, n, _ in self.grad_events] + [(i, -n) for i, n in self.held_freed])
        if not events:
            return list(self.live_after)
        g = j = 0
        out = []
        for i, v in enumerate(self.live_after):
            while j < len(events) and events[j][0] <= i:
                g += events[j][1]
                j += 1
            out.append(v - g)
        return out

    def grads_created(self) -> int:
        """Bytes of the gradients the step created (first accumulation into an empty ``.grad``)."""
        return sum(n for _, n, _ in self.grad_events if n > 0)

    def on_grad(self, prm: torch.Tensor, name: str = "") -> None:
        """A parameter's post-accumulate-grad hook: its ``.grad`` is a storage this step created (not an in-place
        accumulation into one held from before): note it from the op that produced it."""
        g = prm.grad
        try:
            key = g.untyped_storage()._cdata if isinstance(g, torch.Tensor) else None
        except (RuntimeError, NotImplementedError, TypeError):
            return
        if key is None or key in self._grads or key not in self._storages:
            return
        n = self._size(g.untyped_storage().nbytes())
        self._grads[key] = (n, name)
        self.grad_events.append((max(0, len(self.live_after) - 1), n, name))

    def watch_held(self, tensors: list[torch.Tensor]) -> None:
        """Storages that exist when the region starts and count in its baseline (gradients kept from the last step):
        when one is freed inside the region (``zero_grad(set_to_none=True)`` after the forward, as Lightning runs
        it) the live bytes drop by its size, so a peak after that point does not count it."""
        for t in tensors:
            try:
                st = t.untyped_storage()
                key = st._cdata
                if key in self._held:
                    continue
                n = self._size(st.nbytes())

                def cb(_: Any, n: int = n, key: int = key) -> None:
                    self.live -= n
                    self._held.pop(key, None)
                    self.held_freed.append((len(self.live_after), n))

                self._held[key] = weakref.ref(st, cb)
            except (RuntimeError, NotImplementedError, TypeError):
                pass

    def watch_resizes(self) -> Any:
        """Count in-place storage resizes (``UntypedStorage.resize_``, which no dispatch mode sees: FSDP2 frees and
        re-allocates its unsharded parameters that way, as torch's ``MemTracker`` also patches) until the returned
        handle's ``remove()``."""
        orig = torch.UntypedStorage.resize_
        tracker = self

        def resize_(st: Any, size: int) -> Any:
            old = st.nbytes()
            out = orig(st, size)
            try:
                delta = tracker._size(st.nbytes()) - tracker._size(old)
                if delta:
                    tracker.live += delta
                    key = st._cdata
                    if key in tracker._storages:  # freed later at its new size
                        tracker._resized[key] = tracker._resized.get(key, 0) + delta
            except Exception:  # never let accounting break the user's resize
                pass
            return out

        torch.UntypedStorage.resize_ = resize_
        return _Restore(orig, resize_)

    def on_cast(self, out: Any) -> None:
        """``out`` is a parameter cast to another dtype (autocast's weight copy, kept for the backward): noted from
        the op about to be recorded, so a what-if where the parameters already have that dtype can leave it out."""
        try:
            key = out.untyped_storage()._cdata
        except (AttributeError, RuntimeError, NotImplementedError, TypeError):
            return
        n = self._size(out.untyped_storage().nbytes())
        if key in self._storages and key not in self._casts:
            self._casts[key] = n
            self.cast_events.append((len(self.live_after), n))

    def watch_grads(self, named: list[tuple[str, torch.Tensor]], faults: Faults | None = None) -> list[Any]:
        """Post-accumulate-grad hooks on the trainable leaf parameters of ``named`` ((name, parameter) pairs); their
        handles, to remove at the end. They run inside the user's backward: an error goes to ``faults``."""
        handles = []
        on_grad = (faults or Faults("memory tracking")).guard("the gradient memory hook", self.on_grad)
        for name, p in named:
            if p.requires_grad and p.is_leaf and hasattr(p, "register_post_accumulate_grad_hook"):
                try:
                    handles.append(p.register_post_accumulate_grad_hook(
                        lambda prm, name=name: on_grad(prm, name)))
                except RuntimeError:  # e.g. a tensor subclass that refuses hooks: its gradients stay in the peak
                    pass
        return handles

    def tracks(self, t: torch.Tensor) -> bool:
        """Whether ``t``'s storage was created in the region (and is tracked)."""
        try:
            return t.untyped_storage()._cdata in (self._storages or self._closed)
        except (RuntimeError, NotImplementedError, TypeError):
            return False

    # ---------------- live bytes ----------------
    def _size(self, nbytes: int) -> int:
        return -(-nbytes // _BLOCK) * _BLOCK if self._round and nbytes else nbytes

    def _freed(self, ref: Any) -> None:
        """A tracked storage died (the callback of its weak reference, ``self._on_free``)."""
        entry = self._refs.pop(ref, None)
        if entry is None:  # tracking has stopped
            return
        key, nbytes = entry
        self.live -= nbytes + self._resized.pop(key, 0)
        self._storages.pop(key, None)
        gone = self._grads.pop(key, None)
        if gone is not None:
            self.grad_events.append((len(self.live_after), -nbytes, gone[1]))
        elif self._casts.pop(key, None) is not None:
            self.cast_events.append((len(self.live_after), -nbytes))

    def add_outputs(self, fresh: list[torch.Tensor]) -> None:
        """Count the storages of an op's fresh outputs (not views, not in-place results)."""
        for t in fresh:
            self._add(t)

    def _add(self, t: torch.Tensor) -> None:
        try:
            st = t.untyped_storage()
            key = st._cdata
            if key in self._storages:
                return
            n = st.nbytes()
            if self._round and n:
                n = -(-n // _BLOCK) * _BLOCK
            ref = self._storages[key] = weakref.ref(st, self._on_free)
            self._refs[ref] = (key, n)
            self.live += n
        except (RuntimeError, NotImplementedError, TypeError):  # sparse / opaque layouts: not tracked
            pass

    def op_done(self) -> None:
        self.live_after.append(self.live)

    def on_op(self, plan: Any, out: Any) -> None:
        """One recorded op (``plan``: its ``formulas.bytes.OpPlan``): count its fresh outputs, then note the live
        bytes after it (``add_outputs`` and ``op_done`` in one call, a single tensor result without a list)."""
        if isinstance(out, torch.Tensor):
            if plan.fresh_returns and plan.fresh_returns[0]:
                self._add(out)
        else:
            for t in fresh_outputs(plan, out):
                self._add(t)
        self.live_after.append(self.live)

    def reading(self) -> int:
        """Allocated bytes now: the allocator's figure on CUDA, the tracked live bytes elsewhere."""
        return self._reader() if self._reader is not None else self.live

    # ---------------- forward spans (module hooks) ----------------
    def enter(self, path: str) -> None:
        self._open.append((path, self.reading(), self.live, len(self.live_after)))

    def exit(self, path: str) -> None:
        for i in range(len(self._open) - 1, -1, -1):
            if self._open[i][0] == path:
                _, r0, l0, i0 = self._open[i]
                del self._open[i:]
                break
        else:
            return
        growth = self.reading() - r0
        peak = max(max(self.live_after[i0:], default=l0) - l0, growth)
        acc = self.fwd.setdefault(path, [0, 0])
        acc[0] += growth
        acc[1] = max(acc[1], peak)

    # ---------------- saved activations ----------------
    def set_parameters(self, params: list[torch.Tensor]) -> None:
        for p in params:
            try:
                self._params.add(p.untyped_storage()._cdata)
            except (RuntimeError, NotImplementedError, TypeError):
                pass

    def on_saved(self, t: torch.Tensor, path: str) -> None:
        if _python_scalar(t):  # a Python number held by the node, not an activation (no allocation of the step)
            return
        try:
            st = t.untyped_storage()
            key = st._cdata
            if key in self._params:
                return
            self.saved.setdefault(path, {})[key] = self._size(st.nbytes())
        except (RuntimeError, NotImplementedError, TypeError):
            pass

    def walk_saved(self, root: Any, layer_of_node: Callable[[Any], str | None]) -> None:
        """Record the saved tensors of every autograd node reachable from ``root`` (call when backward starts:
        nothing has been freed yet) under the layer whose forward created the node. Read-only: the graph and its
        saved tensors are untouched."""
        # the nodes are kept alive while walking: ``next_functions`` hands out fresh Python wrappers, and the id of
        # one already collected can be reused by the next (on an H100 the walk of GPT-2 stopped after 3 nodes)
        seen: dict[int, Any] = {}
        stack = [root]
        while stack:
            node = stack.pop()
            if node is None or id(node) in seen:
                continue
            seen[id(node)] = node
            path = layer_of_node(node)
            if path is not None:
                for name in _saved_names(node):
                    try:
                        v = getattr(node, name)
                    except Exception:  # released, or not a tensor attribute
                        continue
                    if isinstance(v, torch.Tensor):
                        self.on_saved(v, path)
                        continue
                    found = False
                    for t in v if isinstance(v, (list, tuple)) else (v,):
                        if isinstance(t, torch.Tensor):
                            self.on_saved(t, path)
                            found = True
                    if not found:
                        _not_a_tensor(node, name, v)
            stack.extend(f for f, _ in getattr(node, "next_functions", ()))

    # ---------------- backward spans (op attribution) ----------------
    def backward_spans(self, layers_of_op: list[tuple[str, str]], ancestors: Callable[[str], list[str]],
                       wanted: set[str]) -> dict[str, tuple[int, int]]:
        """(growth, peak above start) of each layer's backward, from its first to its last backward op (inclusive
        of descendants), with the tracked live bytes."""
        first: dict[str, int] = {}
        last: dict[str, int] = {}
        up: dict[str, list[str]] = {}  # layer -> its wanted ancestors (itself included), once per layer
        for i, (layer, phase) in enumerate(layers_of_op):
            if phase != "backward":
                continue
            anc = up.get(layer)
            if anc is None:
                anc = up[layer] = [a for a in ancestors(layer) if a in wanted]
            for a in anc:
                first.setdefault(a, i)
                last[a] = i
        live = self.live_after
        out: dict[str, tuple[int, int]] = {}
        for path, i0 in first.items():
            i1 = last[path]
            start = live[i0 - 1] if i0 > 0 else 0
            out[path] = (live[i1] - start, max(live[i0:i1 + 1]) - start)
        return out

    def saved_inclusive(self, ancestors: Callable[[str], list[str]], wanted: set[str]) -> dict[str, int]:
        """Saved-activation bytes per layer, its descendants included, each storage once."""
        per: dict[str, dict[int, int]] = {}
        for path, storages in self.saved.items():
            for a in ancestors(path):
                if a in wanted:
                    per.setdefault(a, {}).update(storages)
        return {p: sum(s.values()) for p, s in per.items()}

    def close(self) -> None:
        """Stop tracking: drop the weak references (their callbacks never run again) and any open span."""
        self._open.clear()
        self._held.clear()
        self._closed = set(self._storages)
        self._storages.clear()
        self._refs.clear()
