"""The values a meta run can know: tensors computed from constants alone (``torch.ones``, ``arange``, comparisons,
``masked_fill`` ...), the attention masks a model builds for itself, carried beside their meta tensors as small CPU
twins.

On ``meta`` nothing is computed, so a model that reads a value (HF's ``_ignore_causal_mask_sdpa`` calls ``.item()``
on the padding mask it built from ``torch.ones``; Bart raised "Tensor.item() cannot be called on meta tensors") or
whose count depends on one (the pairs a sliding-window mask lets through: the model FLOPs of masked attention) cannot
be analysed. :class:`KnownValues` runs, beside each meta op whose tensor inputs all have known values (CPU tensors,
or meta tensors with a twin), the same op on the CPU twins, and keeps the result as the output's twin:

- factories (``ones``, ``arange``, ``full`` ...) are known; random and uninitialised ones (``empty``, ``rand*``) are
  not, nor is anything computed from weights or from the model's inputs (a meta tensor built outside the run);
- an in-place op with an unknown input makes its tensor's storage unknown from then on (views included);
- a twin larger than :data:`MAX_ELEMENTS` is not kept;
- an op that has no meta kernel because its result depends on values (``.item()``, ``nonzero``, ``equal``) runs on
  the twins when they exist: a Python result is returned as such, a tensor result as a meta tensor of its shape.
  Without twins it raises, saying that values are missing and that ``device="cpu"`` (``--device cpu``) runs it.

:func:`value_of` reads a meta tensor's twin (``capture.masks`` counts a meta mask's kept pairs from it).
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._pytree import tree_flatten, tree_map, tree_unflatten
from torch.utils.weak import WeakIdKeyDictionary

from tscope_callbacks.formulas.bytes import storage_id

__all__ = ["KnownValues", "value_of", "MAX_ELEMENTS", "MetaValueError"]

#: the largest twin kept, in elements (a (8, 1, 4096, 4096) boolean mask is 2**27)
MAX_ELEMENTS = 2**27
_META = torch.device("meta")
_CPU = torch.device("cpu")
_SEEDED = torch.Tag.nondeterministic_seeded
_UNINIT = ("empty", "rand", "normal", "uniform", "bernoulli", "dropout", "random", "multinomial", "exponential",
           "cauchy", "geometric", "log_normal", "resize", "set_", "poisson")

#: meta tensor -> its CPU twin (module state: one meta run at a time holds twins; cleared when it ends)
_TWINS: WeakIdKeyDictionary = WeakIdKeyDictionary()
#: storages of meta tensors that an op with an unknown input wrote to (their twins are stale)
_STALE: set[int] = set()
_KINDS: dict[int, tuple[Any, bool, tuple[int, ...]]] = {}  #: id(op) -> (op, known-able, written arg positions)


class MetaValueError(RuntimeError):
    """An op on meta needs tensor values that a meta run does not have."""


def value_of(t: Any) -> torch.Tensor | None:
    """The CPU twin of meta tensor ``t`` (itself for a CPU tensor), or None when its values are unknown."""
    if not isinstance(t, torch.Tensor):
        return None
    if t.device.type == "cpu":
        return t
    if t.device.type != "meta":
        return None
    v = _TWINS.get(t)
    if v is None or (_STALE and storage_id(t) in _STALE):
        return None
    return v


def _kind(func: Any) -> tuple[bool, tuple[int, ...]]:
    hit = _KINDS.get(id(func))
    if hit is None or hit[0] is not func:
        name = getattr(func, "_opname", "") or ""
        ok = _SEEDED not in getattr(func, "tags", ()) and not any(n in name for n in _UNINIT)
        try:
            written = tuple(i for i, a in enumerate(func._schema.arguments)
                            if a.alias_info is not None and a.alias_info.is_write)
        except AttributeError:
            written = ()
        hit = _KINDS[id(func)] = (func, ok, written)
    return hit[1], hit[2]


def _twin_args(args: tuple, kwargs: dict) -> tuple[tuple, dict, bool, bool] | None:
    """(args, kwargs) with every tensor replaced by its twin and meta devices by the CPU, whether a meta tensor was
    among them, and whether any device argument was meta; None when a tensor's values are unknown."""
    flat, spec = tree_flatten((args, kwargs))
    out, meta, dev = [], False, False
    for x in flat:
        if isinstance(x, torch.Tensor):
            if x.device.type == "meta":
                meta = True
            v = value_of(x)
            if v is None:
                return None
            out.append(v)
        elif isinstance(x, torch.device) and x.type == "meta":
            dev = True
            out.append(_CPU)
        else:
            out.append(x)
    a, k = tree_unflatten(out, spec)
    return a, k, meta, dev


def _meta_tensors(x: Any) -> list[torch.Tensor]:
    return [t for t in tree_flatten(x)[0] if isinstance(t, torch.Tensor) and t.device.type == "meta"]


class KnownValues:
    """The value bookkeeping of a meta run (see module doc); :meth:`run` is called from a dispatch mode's handler
    for every op (``func(*args, **kwargs)``), :meth:`clear` when the run ends."""

    def run(self, func: Any, args: tuple, kwargs: dict) -> Any:
        ok, written = _kind(func)
        try:
            out = func(*args, **kwargs)
        except (RuntimeError, NotImplementedError) as e:
            return self._fallback(func, args, kwargs, e)
        if not ok:
            self._written(func, args, kwargs, written)
            return out
        metas = _meta_tensors(out)
        if not metas or any(t.numel() > MAX_ELEMENTS for t in metas):
            self._written(func, args, kwargs, written)
            return out
        twins = _twin_args(args, kwargs)
        if twins is None or not (twins[2] or twins[3]):  # an unknown input, or no meta tensor involved
            self._written(func, args, kwargs, written)
            return out
        try:
            with torch.no_grad():
                got = func(*twins[0], **twins[1])
        except Exception:
            self._written(func, args, kwargs, written)
            return out
        self._pair(out, got)
        return out

    def _pair(self, out: Any, got: Any) -> None:
        outs, gots = tree_flatten(out)[0], tree_flatten(got)[0]
        if len(outs) != len(gots):
            return
        for o, g in zip(outs, gots):
            if isinstance(o, torch.Tensor) and o.device.type == "meta" and isinstance(g, torch.Tensor) \
                    and g.shape == o.shape:
                _TWINS[o] = g.detach()
                if _STALE:
                    _STALE.discard(storage_id(o))

    def _written(self, func: Any, args: tuple, kwargs: dict, written: tuple[int, ...]) -> None:
        """An op whose values are not followed wrote to its ``written`` arguments: their storages are unknown now."""
        if not written:
            return
        try:
            names = [a.name for a in func._schema.arguments]
        except AttributeError:
            return
        for i in written:
            t = args[i] if i < len(args) else kwargs.get(names[i])
            for m in _meta_tensors(t):
                _STALE.add(storage_id(m))

    def _fallback(self, func: Any, args: tuple, kwargs: dict, err: Exception) -> Any:
        """An op without a meta kernel for its values (``.item()``, ``nonzero``): run on the twins, or say why not."""
        if not _meta_tensors((args, kwargs)):
            raise err
        twins = _twin_args(args, kwargs)
        if twins is None:
            if "meta" in str(err) or "data-dependent" in str(err).lower():
                raise MetaValueError(
                    f"{func} needs the values of a tensor computed from the model's inputs or weights, and a meta "
                    f"run holds no values ({err}). Analyse it on a real device: analyze_model(..., device='cpu') "
                    "(tscope analyze --device cpu) runs the step for real; precision and input shape do not "
                    "matter here") from err
            raise err
        with torch.no_grad():
            got = func(*twins[0], **twins[1])
        if not isinstance(got, (torch.Tensor, list, tuple)):
            return got  # a Python scalar (.item(), equal)

        def to_meta(g: Any) -> Any:
            if not isinstance(g, torch.Tensor) or g.device.type != "cpu":
                return g
            m = torch.empty_strided(g.shape, g.stride(), dtype=g.dtype, device=_META)
            if g.numel() <= MAX_ELEMENTS:
                _TWINS[m] = g.detach()
            return m

        return tree_map(to_meta, got)

    @staticmethod
    def clear() -> None:
        _TWINS.clear()
        _STALE.clear()
