"""Explicit attention masks of a captured region: the model FLOPs of a masked call count the pairs its mask lets
through (``formulas.attention``). The count is taken on the device when the call runs (no host sync; tscope's own
kernel, not recorded) because the mask's memory may hold other data by the end of the step (Inductor reuses a dead
buffer in place), once per mask (a model passes the same mask to every layer), and read once at stop. On meta,
the count comes from the mask's CPU twin when the run knows its values (``capture.meta_values``: masks a model
builds from constants), so an estimate counts the pairs the real step does."""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch

from tscope_callbacks.capture.meta_values import value_of
from tscope_callbacks.formulas.attention import kept_share, mask_argument, mask_kept, masked_counts
from tscope_callbacks.formulas.bytes import storage_id

__all__ = ["MaskCounts", "EagerAttention"]


class MaskCounts:
    """Per pending op index, the kept-pair count of its explicit mask."""

    def __init__(self) -> None:
        self.calls: dict[int, tuple[Any, int]] = {}  #: pending index -> (kept count on the device, mask entries)
        self._kept: dict[tuple, tuple[Any, Any]] = {}  #: mask identity -> (mask, its kept count)
        #: on meta: storage -> (weak mask, kept count) of a bias of unknown values plus a mask of known values
        self.biased: dict[int, tuple[Any, Any]] = {}
        self.eager = EagerAttention(self)  #: attention written as ops (its GEMMs count the pairs the mask keeps)

    def add(self, index: int, func: Any, args: tuple, kwargs: dict | None, mute: Callable[[], Any]) -> None:
        """Note the mask of attention call ``index`` (``func(*args, **kwargs)``), if it has one."""
        mask = mask_argument(getattr(func, "_opname", ""), args, kwargs)
        if mask is not None:
            self.calls[index] = (self.count(mask, mute), mask.numel())

    def count(self, mask: torch.Tensor, mute: Callable[[], Any]) -> Any:
        """The kept-pair count of ``mask`` on its device (no sync; once per mask), None when it cannot be taken."""
        try:
            key = (id(mask), mask._version, mask.storage_offset(), tuple(mask.shape))
        except (RuntimeError, NotImplementedError):  # inference tensors have no version counter
            key = (id(mask), -1, mask.storage_offset(), tuple(mask.shape))
        hit = self._kept.get(key)
        if hit is not None and hit[0] is mask:
            return hit[1]
        with mute():
            # on meta: the mask's CPU twin, where the run knows its values (``capture.meta_values``)
            kept = mask_kept(value_of(mask) if mask.device.type == "meta" else mask)
            if kept is None and mask.device.type == "meta":
                kept = self._biased_kept(mask)
        self._kept[key] = (mask, kept)  # the mask is held so that its id is not reused within the region
        return kept

    def apply(self, pending: list[tuple]) -> None:
        """Scale the model FLOPs of every masked call in ``pending`` (``(func, count, layer, phase, dt)`` tuples) to
        the pairs its mask let through; the full square stays the dense count. Reads each mask's count once."""
        shares: dict[int, float | None] = {}
        for i, (kept, numel) in self.calls.items():
            if id(kept) not in shares:
                shares[id(kept)] = kept_share(kept, numel)
            f, c, layer, phase, dt = pending[i]
            model, dense = masked_counts(c.flops if c.flops_model is None else c.flops_model, c.flops_dense,
                                         shares[id(kept)])
            pending[i] = (f, replace(c, flops_model=model, flops_dense=dense), layer, phase, dt)
        eager = self.eager
        if eager.done:
            shares = eager.shares()
            for chain in eager.done:
                for i in chain.ops:
                    _eager_counts(pending, i, shares[id(chain)])
            for i, chain in eager.backward.items():
                _eager_counts(pending, i, shares[id(chain)])

    def note_bias(self, name: str, args: tuple, out: torch.Tensor, mute: Callable[[], Any]) -> None:
        """On meta, a bias whose values the run does not know (T5's position bias: learned) masked by a mask whose
        values it knows: ``bias + mask`` (``add``), or ``where(keep, bias, -inf)`` (``where``, either way round).
        ``out`` lets through the pairs the mask does (a bias is finite, far above the -inf / ``finfo.min`` of a
        masked pair), so its kept count is the mask's, scaled to the broadcast shape."""
        if len(args) < 2 or not isinstance(args[0], torch.Tensor):
            return
        if name == "where":
            if len(args) < 3 or args[0].dtype != torch.bool:
                return
            fills = [_fill(a) for a in args[1:3]]
            if (fills[0] is None) == (fills[1] is None):
                return
            mask, inverted = value_of(args[0]), fills[0] is not None
        else:
            if not all(isinstance(a, torch.Tensor) and a.is_floating_point() for a in args[:2]):
                return
            twins = [value_of(a) for a in args[:2]]
            if (twins[0] is None) == (twins[1] is None):
                return
            mask, inverted = (twins[0] if twins[0] is not None else twins[1]), False
        if mask is None or mask.dim() < 2 or mask.numel() == 0 or out.numel() % mask.numel():
            return
        with mute():
            kept = mask_kept(~mask if inverted else mask)
            if kept is None:
                return
            kept = kept * (out.numel() // mask.numel())
        try:
            self.biased[storage_id(out)] = (weakref.ref(out), kept)
        except (RuntimeError, TypeError):
            return
        if len(self.biased) > _RECENT:
            del self.biased[next(iter(self.biased))]

    def note_copy(self, src: Any, out: torch.Tensor) -> None:
        """On meta, a copy or view ``out`` of a biased mask (``note_bias``) lets through the same pairs."""
        if self.biased and isinstance(src, torch.Tensor):
            kept = self._biased_kept(src)
            if kept is not None and out.numel() == src.numel():
                try:
                    self.biased[storage_id(out)] = (weakref.ref(out), kept)
                except (RuntimeError, TypeError):
                    pass

    def _biased_kept(self, mask: torch.Tensor) -> Any:
        try:
            entry = self.biased.get(storage_id(mask))
        except (RuntimeError, TypeError):
            return None
        if entry is None or entry[0]() is None:
            return None
        ref = entry[0]()
        return entry[1] if ref.numel() == mask.numel() else None

    def clear(self) -> None:
        self.calls.clear()
        self._kept.clear()
        self.biased.clear()
        self.eager.clear()


def _eager_counts(pending: list[tuple], i: int, share: float) -> None:
    """Model FLOPs of op ``i`` of an eager attention: a GEMM's FLOPs times the share of pairs kept (the full square
    stays its dense count), nothing for the work between the GEMMs (the fused op's formula counts none for it)."""
    f, c, layer, phase, dt = pending[i]
    if c is None or not c.flops:
        return
    if c.category == "matmul":
        model = int(round(c.flops * share))
        if model != c.flops:
            pending[i] = (f, replace(c, flops_model=model, flops_dense=c.flops), layer, phase, dt)
    else:
        pending[i] = (f, replace(c, flops_model=0, flops_dense=None), layer, phase, dt)


_NEGATIVE = -1e4  #: a fill value at or below this masks a score out (HF uses finfo.min, others -inf or -1e9)
_RECENT = 8  #: storages remembered as scaled operands / converted masks (they feed the attention a few ops later)


def _fill(v: Any) -> float | None:
    """The value of a number or 0-dim tensor (its CPU twin on meta) when it masks a score out, else None."""
    if isinstance(v, torch.Tensor):
        if v.dim() != 0:
            return None
        v = value_of(v)
        if v is None or not v.is_floating_point():
            return None
        v = float(v)
    return v if isinstance(v, (int, float)) and v <= _NEGATIVE else None


class _Chain:
    """One eager attention in the making: ``scores = Q K^T`` (a bmm, its operands perhaps scaled just before),
    what the model does to the scores (scale, mask, softmax, dropout, casts), then ``probs V`` (a bmm whose first
    operand descends from the softmax)."""

    __slots__ = ("root", "ops", "seqs", "masks", "probs", "scaled")

    def __init__(self, root: int, seqs: range) -> None:
        self.root = root
        self.ops = [root]  #: pending indices of its forward ops
        self.seqs = set(seqs)  #: the autograd nodes its forward ops made (their backward belongs to it)
        self.masks: list[tuple[Any, int, bool]] = []  #: (kept count on the device, mask entries, inverted)
        self.probs = False  #: the softmax ran
        self.scaled: int | None = None  #: pending index of the first scale of Q or K ahead of its Q K^T GEMM


class EagerAttention:
    """Attention written as ops (HF ``attn_implementation="eager"``, SDPA's math path): its model FLOPs are counted
    as the fused op's are (``formulas.attention``), so MFU does not depend on how attention is implemented. The two
    GEMMs (Q K^T and P V, and the four of their backward) count the (query, key) pairs the mask lets through
    (their FLOPs times the mask's kept share; the full square stays the dense count), and the work between them
    (scale, mask, softmax, dropout, and their backward) counts no model FLOPs, as the fused op's formula counts
    none for it. Hardware FLOPs are unchanged: eager attention computes the full square.

    The chain is followed by storage: each output of a shape-keeping op (pointwise, softmax, copy) on a chain tensor
    joins the chain (views share the storage); a mask is what ``add`` / ``masked_fill`` / ``where`` combine the
    scores with, counted on the device when the op runs, like an SDPA mask. Backward ops belong to a chain when the
    autograd node running them was made by one of its forward ops.

    After the softmax only dropout joins the chain: ``native_dropout`` (CUDA), or the ops ``dropout`` decomposes
    into elsewhere (CPU: ``noise = empty_like(p).bernoulli_(1 - p_drop).div_(1 - p_drop)``, then ``p * noise``),
    which is how SDPA's math path (what CPU runs for ``dropout_p > 0``) and HF eager attention drop out on a CPU.
    Dropout is elementwise work between the GEMMs: no model FLOPs, as the fused op's formula counts none for it
    whatever its ``dropout_p`` (its hardware FLOPs stay). Two more pieces of the math path are the attention's own:
    the softmax scale it applies to Q and K before the first GEMM (``Q * sqrt(scale)``, ``K^T * sqrt(scale)``: a
    multiplication by a number whose result, through views and copies, is an operand of the Q K^T bmm), and the
    additive causal mask it builds from ``is_causal`` (``where(ones(L, S).tril(), 0, -inf)``, run after Q's scale
    and before the GEMM); they count no model FLOPs either, so that the math path counts what the fused op counts
    for the same call, forward and backward, under either convention. A mask the caller made additive (HF's masks,
    SDPA's conversion of a bool ``attn_mask`` ahead of any backend) keeps its count, as it does with a fused op."""

    _GEMMS = frozenset({"bmm", "baddbmm"})
    _FOLLOW = frozenset({"pointwise", "softmax", "memory", "view"})
    #: what may follow the softmax: dropout (fused, or as CPU's ``dropout`` decomposes it), casts, views
    _DROPOUT = frozenset({"native_dropout", "bernoulli_", "bernoulli", "div_", "div", "mul", "mul_"})
    #: the pointwise ops ``_note_scale_or_conversion`` looks at (others pass it by without a call)
    _NOTED = frozenset({"add", "where", "mul"})

    def __init__(self, masks: MaskCounts) -> None:
        self._masks = masks
        self._live: dict[int, list[tuple[Any, _Chain]]] = {}  #: storage -> (weak tensor, chain) of chain tensors
        self._hi = -1  #: the sequence counter at the last forward op seen (nodes made since belong to the next op)
        self.done: list[_Chain] = []  #: complete chains (a P V GEMM consumed the softmax)
        self._bwd: dict[int, _Chain] = {}  #: autograd sequence number -> its complete chain
        self.backward: dict[int, _Chain] = {}  #: pending index of a backward op -> its chain
        #: storage -> (weak tensors, (pending index, autograd sequence numbers)) of a tensor times a number, and of
        #: its views and copies: a Q or K scaled ahead of the Q K^T GEMM (the math path's softmax scale)
        self._scaled: dict[int, tuple[list, tuple[int, range]]] = {}
        #: storage -> (weak tensor, pending index) of ``where(bool_mask, 0, -inf)``: a mask made additive
        self._converted: dict[int, tuple[Any, int]] = {}

    def forward(self, i: int, func: Any, category: str | None, args: tuple, out: Any, seq: int,
                mute: Callable[[], Any]) -> None:
        """Note forward op ``i`` (``seq``: the sequence counter at its dispatch)."""
        lo, self._hi = (self._hi if 0 <= self._hi < seq else seq - 1), seq
        name = getattr(func, "_opname", "")
        if category == "matmul" and name in self._GEMMS:
            a = args[1] if name == "baddbmm" else args[0]
            chain = self._chain_of(a) if self._live else None
            if chain is not None and chain.probs:  # P V: the chain is complete
                chain.ops.append(i)
                chain.seqs.update(range(lo, seq))
                self.done.append(chain)
                self._bwd.update(dict.fromkeys(chain.seqs, chain))
                return
            if isinstance(out, torch.Tensor) and out.dim() == 3:
                chain = _Chain(i, range(lo, seq))
                if self._scaled:  # Q and K scaled just before (the math path's softmax scale)
                    for x in args[1:3] if name == "baddbmm" else args[:2]:
                        hit = self._scaled_of(x)
                        if hit is not None and hit[0] not in chain.ops:
                            chain.ops.append(hit[0])
                            chain.seqs.update(hit[1])
                            chain.scaled = hit[0] if chain.scaled is None else min(chain.scaled, hit[0])
                self._add(out, chain)
            return
        if isinstance(out, torch.Tensor) and (
                name in self._NOTED if category == "pointwise" else
                (self._scaled or self._masks.biased) and category in ("memory", "view")):
            self._note_scale_or_conversion(i, name, category, args, out, range(lo, seq), mute)
        if not self._live or category not in self._FOLLOW or not isinstance(out, torch.Tensor):
            return
        chain, src = None, None
        for a in args[:3]:
            if isinstance(a, torch.Tensor):
                c = self._chain_of(a)
                if c is not None:
                    chain, src = c, a
                    break
        if chain is None or chain.probs and name not in self._DROPOUT and category not in ("memory", "view"):
            return
        if out.shape != src.shape and out.numel() != src.numel():
            return
        chain.ops.append(i)
        chain.seqs.update(range(lo, seq))
        if category == "softmax":
            chain.probs = True
        elif not chain.probs:
            self._mask(chain, name, args, src, mute)
        self._add(out, chain)

    def _mask(self, chain: _Chain, name: str, args: tuple, src: torch.Tensor, mute: Callable[[], Any]) -> None:
        m, inverted = None, False
        if name in ("add", "add_") and len(args) > 1:
            m = args[1] if args[0] is src else args[0]
        elif name in ("masked_fill", "masked_fill_") and len(args) > 2:
            value = args[2]
            v = value if isinstance(value, (int, float)) else None
            if v is not None and v <= _NEGATIVE:
                m, inverted = args[1], True
        elif name == "where" and len(args) > 2:
            m, inverted = args[0], args[2] is src
        if isinstance(m, torch.Tensor) and m.dim() >= 2 and self._chain_of(m) is None:
            chain.masks.append((self._masks.count(m, mute), m.numel(), inverted))
            conversion = self.conversion_of(m)
            if conversion is not None and chain.scaled is not None and chain.scaled < conversion < chain.root:
                chain.ops.append(conversion)  # the math path's own causal mask: made between its scale and GEMM

    def _note_scale_or_conversion(self, i: int, name: str, category: str | None, args: tuple, out: torch.Tensor,
                                  seqs: range, mute: Callable[[], Any]) -> None:
        """Remember a tensor times a number (and its views and copies), a bool mask made additive, and (on meta) a
        bias added to a mask."""
        if category == "pointwise":
            if name in ("add", "where") and out.device.type == "meta" and out.dim() >= 2:
                self._masks.note_bias(name, args, out, mute)
            if name == "mul" and len(args) == 2 and out.dim() >= 3:
                a, b = args
                t, n = (a, b) if isinstance(a, torch.Tensor) else (b, a)
                if isinstance(t, torch.Tensor) and t.dim() >= 3 and (
                        isinstance(n, (int, float)) or isinstance(n, torch.Tensor) and n.dim() == 0):
                    self._remember(self._scaled, out, ([weakref.ref(out)], (i, seqs)))
            elif (name == "where" and len(args) == 3 and out.dim() >= 2 and isinstance(args[0], torch.Tensor)
                  and args[0].dtype == torch.bool
                  and all(isinstance(v, (int, float)) or isinstance(v, torch.Tensor) and v.dim() == 0
                          for v in args[1:])):
                self._remember(self._converted, out, (weakref.ref(out), i))
        elif self._masks.biased and category in ("memory", "view") and args:
            self._masks.note_copy(args[0], out)
        if self._scaled and category in ("memory", "view") and args:
            hit = self._scaled_entry(args[0])
            if hit is not None:
                try:
                    sid = storage_id(out)
                except (RuntimeError, TypeError):
                    return
                old = self._scaled.get(sid)
                # a live entry is this storage's (a view of a scaled tensor or of its copy); a dead one is an
                # earlier layer's whose storage address the allocator reused: replaced, or this copy would carry
                # the earlier scale's index and the Q K^T GEMM would miss its own scale (address-dependent flake)
                if old is not None and any(r() is not None for r in old[0]):
                    old[0].append(weakref.ref(out))
                else:
                    self._remember(self._scaled, out, ([weakref.ref(out)], hit[1]))

    @staticmethod
    def _remember(table: dict, t: torch.Tensor, entry: tuple) -> None:
        try:
            sid = storage_id(t)
        except (RuntimeError, TypeError):
            return
        table.pop(sid, None)
        table[sid] = entry
        if len(table) > _RECENT:
            del table[next(iter(table))]

    def _scaled_entry(self, t: Any) -> tuple[list, tuple[int, range]] | None:
        if not isinstance(t, torch.Tensor):
            return None
        try:
            entry = self._scaled.get(storage_id(t))
        except (RuntimeError, TypeError):
            return None
        if entry is None or not any(r() is not None for r in entry[0]):  # a dead storage's address reused
            return None
        return entry

    def _scaled_of(self, t: Any) -> tuple[int, range] | None:
        """(pending index, sequence numbers) of the multiplication by a number that ``t`` is a view or copy of."""
        entry = self._scaled_entry(t)
        return None if entry is None else entry[1]

    def conversion_of(self, mask: torch.Tensor) -> int | None:
        """The pending index of the ``where(bool_mask, 0, -inf)`` that made ``mask`` (additive), if one did."""
        try:
            entry = self._converted.get(storage_id(mask))
        except (RuntimeError, TypeError):
            return None
        if entry is None or entry[0]() is None:
            return None
        return entry[1]

    def backward_op(self, i: int, node: Any) -> None:
        """Note backward op ``i`` run by autograd ``node``."""
        if self._bwd:
            try:
                chain = self._bwd.get(node._sequence_nr())
            except Exception:
                return
            if chain is not None:
                self.backward[i] = chain

    def _add(self, t: torch.Tensor, chain: _Chain) -> None:
        try:
            self._live.setdefault(storage_id(t), []).append((weakref.ref(t), chain))
        except (RuntimeError, TypeError):
            pass

    def _chain_of(self, t: Any) -> _Chain | None:
        if not isinstance(t, torch.Tensor):
            return None
        try:
            entries = self._live.get(storage_id(t))
        except (RuntimeError, TypeError):
            return None
        if not entries:
            return None
        alive = [(r, c) for r, c in entries if r() is not None]
        if len(alive) != len(entries):
            if alive:
                self._live[storage_id(t)] = alive
            else:
                del self._live[storage_id(t)]
        return alive[-1][1] if alive else None

    def shares(self) -> dict[int, float]:
        """id(chain) -> the share of the (query, key) pairs its masks let through (1.0 without a mask; a product
        over several masks)."""
        out = {}
        for chain in self.done:
            share = 1.0
            for kept, numel, inverted in chain.masks:
                s = kept_share(kept, numel)
                if s is not None:
                    share *= (1.0 - s) if inverted else s
            out[id(chain)] = share
        return out

    def clear(self) -> None:
        self._live.clear()
        self.done.clear()
        self._bwd.clear()
        self.backward.clear()
        self._scaled.clear()
        self._converted.clear()
        self._hi = -1
