"""The op that made the first non-finite value of a replayed step, and the line of code that called it.

``torch.autograd.detect_anomaly`` answers this for the backward only, by raising, at a 1.4-5.8x cost on every step
(``benchmarks/results``). Here the question is asked once, on the replay of a bad step (``capture.locate``):
:class:`OpOrigin`, a dispatch mode, checks every op's floating outputs and keeps the first op that turned finite
inputs into a non-finite output:

- in the forward: the aten op, the user's line that called it (the innermost frame outside torch, Lightning and
  tscope: a model file, HF's modeling code, a ``training_step``), and its inputs (shape, dtype, range, zeros and
  negatives: a ``log`` of zeros, a ``div`` by zero, an overflowing ``exp`` or matmul); the module is the locate
  tracer's;
- in the backward: the aten op of the gradient formula, the autograd node running it (``SqrtBackward0``) and the line
  of the forward op that created that node (recorded by sequence number during the replay's forward).

An allocation (``empty``, ``empty_like``, ``empty_strided``, ``new_empty``...) is never an origin: its contents are
undefined, and may hold a NaN bit pattern. An op's inputs are read as the op saw them: an in-place argument is checked
before the op overwrites it, and an ``out=`` buffer (often such an allocation) is not an input at all.

An op given an explicit infinite scalar whose output has infinities but no NaN (``masked_fill(mask, -inf)``,
``full(..., -inf)``: attention masks) is intentional and skipped; a NaN scalar, or an infinity that made a NaN
(``0 * inf``), is an origin. Each op's check reads its outputs on the host (one sync per op): acceptable in the
replay of a bad step, never run on healthy steps (on the test model the replay takes 40 ms instead of 21 on CPU).
"""

from __future__ import annotations

import linecache
import math
import os
import sys
from dataclasses import dataclass
from typing import Any

import torch
from torch._C._autograd import _get_sequence_nr
from torch.utils._python_dispatch import TorchDispatchMode

from tscope_callbacks.capture.tensors import floating, iter_tensors

__all__ = ["OpOrigin", "Origin", "is_library_file", "user_frame"]

_current_node = torch._C._current_autograd_node
_OWN_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep  # tscope_callbacks/
_SKIP_DIRS = (os.path.dirname(os.path.abspath(torch.__file__)) + os.sep, _OWN_DIR)
_DEMO = os.path.join(_OWN_DIR, "demo", "")  # the demo's model and LightningModule are user code


def is_library_file(filename: str) -> bool:
    """Whether ``filename`` is torch's, Lightning's or tscope's (not the user's; tscope's demo model counts as user
    code), or not a file at all."""
    if filename.startswith(_SKIP_DIRS) and not filename.startswith(_DEMO) or filename.startswith("<"):
        return True
    return f"{os.sep}lightning{os.sep}" in filename or f"{os.sep}pytorch_lightning{os.sep}" in filename


def user_frame() -> str | None:
    """``file:line in function: code`` of the innermost caller outside torch, Lightning and tscope; None if none."""
    f: Any = sys._getframe(1)
    while f is not None and is_library_file(f.f_code.co_filename):
        f = f.f_back
    if f is None:
        return None
    code = linecache.getline(f.f_code.co_filename, f.f_lineno).strip()
    where = f"{os.path.basename(f.f_code.co_filename)}:{f.f_lineno} in {f.f_code.co_name}"
    return f"{where}: {code}" if code else where


@dataclass
class Origin:
    """The first op that made a non-finite value from finite inputs."""

    op: str  #: overload packet, e.g. ``aten.log``
    phase: str  #: "forward" | "backward"
    inputs: list[str]  #: one description per floating tensor input
    line: str | None = None  #: forward: the calling line; backward: the line of the forward op that made the node
    node: str | None = None  #: backward: the autograd node running (``SqrtBackward0``)
    nan: bool = True  #: NaN (else only +-inf)

    def __str__(self) -> str:
        what = "NaN" if self.nan else "inf"
        head = (f"first {what} made by {self.op} in the backward of {self.node}" if self.phase == "backward"
                else f"first {what} made by {self.op} in the forward")
        where = (f", whose forward op was called at {self.line}" if self.phase == "backward" else f", called at "
                 f"{self.line}") if self.line else ""
        ins = f"; its inputs were finite: {'; '.join(self.inputs)}" if self.inputs else ""
        return head + where + ins


def _describe(t: torch.Tensor) -> str:
    shape = "x".join(str(s) for s in t.shape) or "scalar"
    dt = str(t.dtype).removeprefix("torch.")
    if not t.numel():
        return f"{dt}[{shape}] (empty)"
    x = t.detach().float() if not t.is_complex() else t.detach().abs().float()
    lo, hi = float(x.min()), float(x.max())
    zeros = int((x == 0).sum())
    neg = int((x < 0).sum())
    tiny = float(x.abs().min())
    parts = [f"{dt}[{shape}] min {lo:.4g} max {hi:.4g}"]
    if zeros:
        parts.append(f"{zeros} zero")
    elif tiny and tiny < 1e-30:
        parts.append(f"smallest |x| {tiny:.3g}")
    if neg and lo < 0 < hi:
        parts.append(f"{neg} negative")
    return ", ".join(parts)


_aten = torch.ops.aten
#: ops whose output contents are undefined: never an origin
_UNDEFINED = frozenset(getattr(_aten, n) for n in ("empty", "empty_like", "empty_strided", "new_empty",
                                                   "new_empty_strided", "empty_permuted") if hasattr(_aten, n))


def _finite(tensors: list[torch.Tensor]) -> bool:
    return all(bool(torch.isfinite(t).all()) for t in tensors)


def _written(func: Any, args: tuple, kwargs: dict) -> tuple[list[torch.Tensor], set[int]]:
    """``(in-place inputs, ids of every written tensor)``: the arguments the op writes (schema ``Tensor(a!)``); an
    in-place input's old values are read, a keyword ``out`` buffer's are not."""
    inplace: list[torch.Tensor] = []
    ids: set[int] = set()
    for i, arg in enumerate(func._schema.arguments):
        if arg.alias_info is None or not arg.alias_info.is_write:
            continue
        val = kwargs.get(arg.name) if arg.kwarg_only or i >= len(args) else args[i]
        ts = [t for t in iter_tensors(val) if floating(t) and t.numel()]
        ids.update(id(t) for t in ts)
        if not arg.kwarg_only:
            inplace += ts
    return inplace, ids


def _inf_scalar(args: Any, kwargs: dict) -> bool:
    vals = list(args) + list(kwargs.values())
    return any(isinstance(v, float) and math.isinf(v) for v in vals)


class OpOrigin(TorchDispatchMode):
    """Record the first op (forward or backward) whose floating output is non-finite while its floating inputs are
    finite (module doc): ``origin`` after the run."""

    def __init__(self) -> None:
        super().__init__()
        self.origin: Origin | None = None
        self._lines: dict[int, str | None] = {}  #: forward: autograd sequence number of a node -> the calling line

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.origin is not None or func.overloadpacket in _UNDEFINED:  # found, or contents undefined
            return func(*args, **kwargs)
        try:
            inplace, written = _written(func, args, kwargs)
            inplace_finite = _finite(inplace)  # as the op reads them, before it overwrites them
        except Exception:
            inplace_finite, written = False, set()
        out = func(*args, **kwargs)
        node = _current_node()
        try:
            if node is None and torch.is_grad_enabled():  # a forward op that may have made a node: its line
                seq = _get_sequence_nr() - 1
                if seq not in self._lines:
                    self._lines[seq] = user_frame()
            if inplace_finite:
                self._check(func, args, kwargs, out, node, written)
        except Exception:  # never let the diagnosis break the replay
            pass
        return out

    def _check(self, func: Any, args: tuple, kwargs: dict, out: Any, node: Any, written: set[int]) -> None:
        outs = [t for t in iter_tensors(out) if floating(t) and t.numel()]
        bad = [t for t in outs if not bool(torch.isfinite(t).all())]
        if not bad:
            return
        nan = any(bool(torch.isnan(t).any()) for t in bad)
        if not nan and _inf_scalar(args, kwargs):
            return  # an explicit infinity that stays one (a -inf mask fill): intended
        ins = [t for t in iter_tensors((args, kwargs)) if floating(t) and t.numel() and id(t) not in written]
        if not _finite(ins):
            return  # carried, not made here
        name = f"{func.namespace}.{func._opname}" if hasattr(func, "_opname") else str(func)
        if node is None:
            self.origin = Origin(name, "forward", [_describe(t) for t in ins[:4]], user_frame(), nan=nan)
        else:
            try:
                line = self._lines.get(node._sequence_nr())
            except Exception:
                line = None
            self.origin = Origin(name, "backward", [_describe(t) for t in ins[:4]], line, node.name(), nan=nan)
