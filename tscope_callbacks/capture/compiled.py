"""Capture of a ``torch.compile``'d module's *compiled* execution: the kernels that really run.

A compiled module under profiling runs its compiled code (no recompile, no graph break, nothing of ours traced):

- the capture's dispatch mode declares ``ignore_compile_internals``, so Dynamo keeps running the compiled artifact
  (a mode that does not is handed eager ops instead) and the mode still sees every op the artifact dispatches:
  extern kernels (cuBLAS/oneDNN GEMMs, flash/cuDNN attention, fallbacks), counted exactly by their formulas;
- the Inductor kernels themselves (``cpp_fused_*`` on CPU, ``triton_*`` on GPU) are called from the generated
  wrapper by global name: for the profiled region each one is replaced in its code module by a timing wrapper and
  restored at stop. A kernel's record: its name (``inductor.<name>``), the aten ops it fused (parsed from the name,
  TraceLens's method), FLOPs = the sum of its members' per-element costs (``formulas.pointwise``) times its
  iteration space (the largest input; a forward op fused beside its own backward is a recompute: in the hardware
  FLOPs, not the model FLOPs), bytes = its real inputs and outputs (roles from the kernel's signature:
  ``in_ptr`` read, ``out_ptr`` written, ``in_out_ptr`` both), time (CPU: its wall time; CUDA: its kernels, via the
  capture's Kineto ranges);
- no module hook goes inside a compiled module (Dynamo guards on them: a hook there recompiles the model for the rest
  of training). Ops and kernels of a compiled region get their layer from the parameters among their arguments
  (storage of a ``reinterpret_tensor`` view included), else the nearest such kernel before them in the region; the
  phase is forward inside the compiled forward and backward inside ``CompiledFunctionBackward``.

What is not split per kernel: CUDA-graph replays (``mode="reduce-overhead"``): their kernels count in the
device-busy time but have no record (``info.compiled_capture["limits"]`` says so). Modules compiled in place
(``module.compile()``) keep the eager path (``mode="eager"``). Provenance used is in ``info.compiled_capture``.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

import torch

from tscope_callbacks.capture.attribute import phase_of
from tscope_callbacks.capture.cuda_timing import timed_call
from tscope_callbacks.formulas.fused import kernel_count, members

if TYPE_CHECKING:
    from tscope_callbacks.capture.state import CaptureState

__all__ = ["KernelName", "members", "kernel_count", "CompiledState", "code_modules", "is_compiled_wrapper",
           "kernel_recorder", "TritonProxy", "PROVENANCE"]

PROVENANCE = "kernel names (fused aten ops) + parameter ownership of arguments (layer) + nearest kernel"
_KERNEL = re.compile(r"^(cpp_fused|triton_(?:poi|red|per|tem|for|mix)_fused|cpp_kernel|triton_)")
_ROLE = re.compile(r"\b(in_out_ptr|in_ptr|out_ptr)\d+")
class KernelName:
    """Stands for a kernel where records expect an op (``namespace`` + ``_opname``: ``inductor.<kernel>``)."""

    namespace = "inductor"
    __slots__ = ("_opname",)

    def __init__(self, name: str) -> None:
        self._opname = name

    def __str__(self) -> str:
        return f"inductor.{self._opname}"

    def __hash__(self) -> int:
        return hash(self._opname)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, KernelName) and other._opname == self._opname


def is_compiled_wrapper(mod: torch.nn.Module) -> bool:
    """``torch.compile(module)``'s wrapper (an ``OptimizedModule``)."""
    return type(mod).__name__ == "OptimizedModule" and hasattr(mod, "_orig_mod")


def code_modules() -> list[Any]:
    """Inductor's loaded output-code modules (where the kernels live), across torch versions."""
    try:
        from torch._inductor.codecache import PyCodeCache
    except Exception:
        return []
    mods = getattr(PyCodeCache, "modules", None)
    if isinstance(mods, list):
        return list(mods)
    cache = getattr(PyCodeCache, "cache", None) or getattr(PyCodeCache, "modules_no_attr", None) or {}
    return list(cache.values()) if isinstance(cache, dict) else []


def _roles(source: str, name: str) -> list[str] | None:
    """Argument roles of kernel ``name`` from the generated source: the C signature of a cpp kernel or the Python
    signature of a Triton kernel (``in_ptr``/``out_ptr``/``in_out_ptr``; other arguments are scalars)."""
    at = source.find(f"{name} = async_compile.")
    if at < 0:
        return None
    sig = re.search(r"(?:void\s+kernel|def\s+\w+)\s*\(([^)]*)\)", source[at:at + 20000])
    if sig is None:
        return None
    out = []
    for part in sig.group(1).split(","):
        m = _ROLE.search(part)
        out.append({"in_ptr": "in", "out_ptr": "out", "in_out_ptr": "in_out"}[m.group(1)] if m else "")
    return out


class CompiledState:
    """What a kernels-mode capture installs: wrapped kernels (restored by :meth:`restore`), the parameter-storage
    map, and the compiled-forward depth set by hooks on the compile wrappers."""

    def __init__(self) -> None:
        self.depth = 0  #: > 0 while a compiled module's forward runs
        self.storage_layer: dict[int, str] = {}
        self.last_layer = ""
        self.wrapped: list[tuple[Any, str, Any]] = []
        self.kernels = 0
        self.graphs = 0
        self.cudagraphs = False  #: a wrapper compiled with mode="reduce-overhead"
        self.guessed: dict[int, bool] = {}  #: pending index of a compiled-region record -> layer from a parameter
        self.shapes: dict[str, set[tuple[int, ...]]] = {}  #: layer -> shapes of its parameters
        self._exact = False

    def map_parameters(self, model: torch.nn.Module, owner: Any) -> None:
        for path, mod in model.named_modules():
            for t in list(mod.parameters(recurse=False)) + list(mod.buffers(recurse=False)):
                try:
                    self.storage_layer.setdefault(t.untyped_storage().data_ptr(), owner(path))
                    self.shapes.setdefault(owner(path), set()).add(tuple(t.shape))
                except Exception:
                    continue

    def layer_of(self, args: Any, default: str) -> str:
        """The layer owning a parameter among ``args`` (lists searched), else the last compiled layer seen (refined
        at stop by :meth:`resolve`). Call :meth:`note` next with the record's index."""
        sl = self.storage_layer
        for a in args:
            items = a if isinstance(a, (list, tuple)) else (a,)
            for t in items:
                if isinstance(t, torch.Tensor):
                    try:
                        layer = sl.get(t.untyped_storage().data_ptr())
                    except Exception:
                        layer = None
                    if layer is not None:
                        self.last_layer, self._exact = layer, True
                        return layer
        self._exact = False
        return self.last_layer or default

    def note(self, index: int) -> None:
        """Remember whether the record at pending ``index`` got its layer from a parameter (``layer_of``'s last)."""
        self.guessed[index] = self._exact

    def resolve(self, pending: list[tuple]) -> None:
        """Kernels without a parameter (activations, residual adds) sit between two that have one: give them the
        deepest common ancestor of the two (``fc`` .. ``proj`` -> their block), or the previous one's parent when
        that ancestor is the root (the block's last residual add before the next block or the head). A GEMM
        without a parameter (a weight gradient ``g^T @ x``) follows its layer's ``g @ W``: it takes that layer."""
        idx = sorted(self.guessed)
        exact = [i for i in idx if self.guessed[i]]
        nxt: dict[int, int | None] = {}
        j = len(exact) - 1
        following: int | None = None
        for i in reversed(idx):
            while j >= 0 and exact[j] > i:
                following = exact[j]
                j -= 1
            nxt[i] = following
        prev: int | None = None
        recent: list[str] = []  #: layers of the last exact records, newest last
        for i in idx:
            if self.guessed[i]:
                prev = i
                recent = (recent + [pending[i][2]])[-8:]
                continue
            c = pending[i][1]
            if c.category == "matmul" and c.output_shapes:  # a weight gradient: the recent layer of that shape
                shp = tuple(c.output_shapes[0])
                hit = next((lay for lay in reversed(recent) if shp in self.shapes.get(lay, ())), None) or next(
                    (lay for lay in reversed(recent) if shp[::-1] in self.shapes.get(lay, ())), None)
                if hit is not None:
                    f, _, _, phase, dt = pending[i]
                    pending[i] = (f, c, hit, phase, dt)
                    continue
            a = pending[prev][2] if prev is not None else ""
            n = nxt[i]
            b = pending[n][2] if n is not None and pending[n][3] == pending[i][3] else None
            if not a and not b:
                continue
            if b is None or not a or pending[i][1].category == "matmul":
                layer = a or b or ""  # a GEMM without a weight is the weight-gradient partner of the one before
            else:
                pa, pb = a.split("."), b.split(".")
                common = []
                for x, y in zip(pa, pb):
                    if x != y:
                        break
                    common.append(x)
                layer = ".".join(common) if common else ".".join(pa[:-1])
            f, c, _, phase, dt = pending[i]
            pending[i] = (f, c, layer, phase, dt)

    def wrap(self, record: Any) -> None:
        """Replace every kernel global of every loaded code module by ``record(name, fn, roles)``'s wrapper."""
        for mod in code_modules():
            try:
                names = [n for n, v in vars(mod).items() if _KERNEL.match(n) and (callable(v) or hasattr(v, "run"))]
            except Exception:
                continue
            if not names:
                continue
            try:
                source = open(mod.__file__, encoding="utf-8").read() if getattr(mod, "__file__", None) else ""
            except OSError:
                source = ""
            self.graphs += 1
            for n in names:
                orig = getattr(mod, n)
                setattr(mod, n, record(n, orig, _roles(source, n)))
                self.wrapped.append((mod, n, orig))
                self.kernels += 1

    def restore(self) -> None:
        while self.wrapped:
            mod, n, orig = self.wrapped.pop()
            try:
                setattr(mod, n, orig)
            except Exception:
                pass


class TritonProxy:
    """A Triton kernel object with its ``run`` recorded; every other attribute is the kernel's own."""

    def __init__(self, orig: Any, run: Any) -> None:
        object.__setattr__(self, "_orig", orig)
        object.__setattr__(self, "run", run)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._orig, name)


_current_node = torch._C._current_autograd_node


def kernel_recorder(st: CaptureState, state: CompiledState) -> Any:
    """``record(name, fn, roles)`` for :meth:`CompiledState.wrap`: a wrapper that runs the kernel inside the
    capture's timing (Kineto range on CUDA, wall time on CPU) and appends one record to the capture ``st``'s pending list."""
    def run(name: str, fn: Any, roles: list[str] | None, args: tuple, kwargs: dict) -> Any:
        if not st.running or st.paused:
            return fn(*args, **kwargs)
        out, dt = timed_call(st, fn, args, kwargs)
        try:
            i = len(st.pending)
            if dt is not None:
                st.starts[i] = (st.op_t0 - st.t0) * 1e-9
            phase = phase_of(st, _current_node())
            layer = state.layer_of(args, st.stack[-1][0] if st.stack else "")
            if st.collapsing:
                layer = st.collapse(layer)
            state.note(i)
            st.fused[i] = members(name)
            st.pending.append((KernelName(name), kernel_count(name, args, roles, phase), layer, phase, dt))
        except Exception as e:  # never break the user's kernel
            st.error(e, "recording a compiled kernel")
        return out

    def record(name: str, fn: Any, roles: list[str] | None) -> Any:
        if hasattr(fn, "run"):  # a Triton kernel object: the wrapper calls ``kernel.run(*args, stream=...)``
            orig_run = fn.run
            return TritonProxy(fn, lambda *a, **k: run(name, orig_run, roles, a, k))

        def call(*a: Any, **k: Any) -> Any:
            return run(name, fn, roles, a, k)

        call.__name__ = call.__qualname__ = name
        return call

    return record
