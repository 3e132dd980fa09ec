"""FLOPs and bytes of an Inductor kernel from its name and its real arguments (TraceLens's method, for fused
kernels whose member ops never reach the dispatcher; see ``capture.compiled``).

Members: the aten ops in the kernel's name (``cpp_fused_add_native_layer_norm_view_2`` -> add, native_layer_norm,
view), longest known op name first. FLOPs: each member's per-element cost (the eager ops' table, ``formulas.costs``;
norms from ``formulas.norm``) times its iteration space: the largest input, or for norms the largest input normalized
over the size of a 1-D weight among the arguments; views and copies cost 0. A forward op fused beside
its own backward is a recompute (hardware FLOPs, not model FLOPs); ``*_backward`` members of a forward kernel are
statistics kept for the backward (not counted). Triton GEMM templates (``triton_tem_fused_mm``): 2 M N K from their
operands. Bytes: the kernel's inputs and outputs as its signature names them (``in_ptr`` read, ``out_ptr`` written,
``in_out_ptr`` both), each buffer once.
"""

from __future__ import annotations

import functools
import re

import torch

from tscope_callbacks.formulas.apply import OpCount
from tscope_callbacks.formulas.costs import (
    DROPOUT_COSTS,
    POINTWISE_COSTS,
    RANDOM_OPS,
    REDUCTION_COSTS,
    element_cost,
)
from tscope_callbacks.formulas.matmul import gemm_flops
from tscope_callbacks.formulas.norm import norm_backward_flops, norm_forward_flops

__all__ = ["members", "kernel_count"]

_ZERO = {"view", "reshape", "_unsafe_view", "permute", "transpose", "t", "expand", "squeeze", "unsqueeze", "slice",
         "select", "clone", "copy", "copy_", "_to_copy", "cat", "stack", "constant_pad_nd", "index", "index_select",
         "gather", "scatter", "embedding", "embedding_dense_backward", "as_strided", "split", "split_with_sizes",
         "full", "zeros", "ones", "empty", "fill", "new_zeros", "arange", "iota", "alias", "detach", "lift_fresh",
         "repeat", "roll", "flip", "unbind", "narrow", "pad", "slice_scatter", "select_scatter", "diagonal",
         "convert_element_type", "device_put", "nll_loss_forward", "nll_loss_backward", "scalar_tensor"}
_EXTRA = {"native_layer_norm": norm_forward_flops(1, weight=True, bias=True),
          "native_layer_norm_backward": norm_backward_flops(1, None, weight=True),
          "native_group_norm": norm_forward_flops(1, weight=True, bias=True),
          "native_batch_norm": norm_forward_flops(1, weight=True, bias=True),
          "_native_batch_norm_legit_functional": norm_forward_flops(1, weight=True, bias=True),
          "_fused_rms_norm": norm_forward_flops(1, weight=True, bias=False) - 1}
_MATMUL = {"mm", "addmm", "bmm", "baddbmm"}
_NORM = {"native_layer_norm", "native_layer_norm_backward", "native_group_norm", "native_group_norm_backward",
         "native_batch_norm", "native_batch_norm_backward", "_fused_rms_norm", "_fused_rms_norm_backward",
         "_native_batch_norm_legit_functional"}
_SOFTMAX = {"_softmax", "_log_softmax", "_softmax_backward_data", "_log_softmax_backward_data"}
_REDUCTION = {"sum", "mean", "amax", "amin", "max", "min", "var", "var_mean", "argmax", "prod"}


@functools.lru_cache(maxsize=1)
def _vocabulary() -> frozenset[str]:
    names = (set(POINTWISE_COSTS) | set(REDUCTION_COSTS) | set(DROPOUT_COSTS) | set(RANDOM_OPS) | set(_EXTRA) | _ZERO
             | _MATMUL | _NORM | _SOFTMAX | _REDUCTION | {"gelu", "gelu_backward"})
    try:
        names |= {n for n in dir(torch.ops.aten) if not n.startswith("__")}
    except Exception:
        pass
    return frozenset(names)


@functools.lru_cache(maxsize=4096)
def members(kernel: str) -> tuple[str, ...]:
    """The aten ops an Inductor kernel fused, from its name: ``cpp_fused_add_native_layer_norm_view_2`` ->
    ``("add", "native_layer_norm", "view")`` (longest known op name first; unknown words kept as they are)."""
    body = re.sub(r"^.*?fused_?", "", kernel) if "fused" in kernel else ""
    body = re.sub(r"_\d+$", "", body)
    vocab, out, i = _vocabulary(), [], 0
    while i < len(body):
        best = None
        for j in range(len(body), i, -1):
            if (j == len(body) or body[j] == "_") and body[i:j] in vocab:
                best = j
                break
        if best is None:  # an unknown word: up to the next separator
            best = body.find("_", i + 1)
            best = len(body) if best < 0 else best
        out.append(body[i:best])
        i = best + 1
    return tuple(w for w in out if w)


def _cost(member: str) -> int:
    if member in _ZERO:
        return 0
    if member in _EXTRA:
        return _EXTRA[member]
    cost = element_cost(member)  # the eager ops' table (formulas.costs)
    return cost if cost is not None else element_cost(member.rstrip("_")) or 1


def _category(ms: tuple[str, ...]) -> str:
    s = set(ms)
    if s & _MATMUL:
        return "matmul"
    for cat, group in (("norm", _NORM), ("softmax", _SOFTMAX), ("reduction", _REDUCTION)):
        if s & group:
            return cat
    if ms and all(_cost(m) == 0 for m in ms):
        return "memory"
    return "pointwise"


def kernel_count(name: str, args: tuple, roles: list[str] | None, phase: str = "forward") -> OpCount:
    """Counts of one Inductor kernel call (see the module doc); ``roles`` per argument ("in", "out", "in_out",
    or "" for scalars) from the kernel's signature, None when unknown (every tensor counted as read once).

    Member costs apply to the iteration space (the largest input), norms to the largest input normalized over the
    size of a 1-D weight among the arguments (a LayerNorm fused into a wider MLP kernel runs over d, not 4d). In a
    forward kernel ``*_backward`` members are statistics kept for the backward (the work is the forward op's)."""
    tensors = [(a, (roles[i] if roles is not None and i < len(roles) else "in")) for i, a in enumerate(args)
               if isinstance(a, torch.Tensor)]
    ms = members(name)
    if phase != "backward":
        ms = tuple(m for m in ms if not m.endswith("_backward"))
    read = written = 0
    seen: set[tuple[int, int, int]] = set()
    for t, role in tensors:
        key = (t.untyped_storage().data_ptr(), t.storage_offset(), t.numel())
        nbytes = t.numel() * t.element_size()
        if role in ("in", "in_out") and (key, "r") not in seen:
            seen.add((key, "r"))  # type: ignore[arg-type]
            read += nbytes
        if role in ("out", "in_out") and (key, "w") not in seen:
            seen.add((key, "w"))  # type: ignore[arg-type]
            written += nbytes
    ins = [t for t, r in tensors if r in ("in", "in_out")] or [t for t, _ in tensors]
    space = max((t.numel() for t in ins), default=0)
    cat = _category(ms)
    flops = 0
    if cat == "matmul":  # a Triton GEMM template: 2 M N K from its operands
        mats = [t for t in ins if t.dim() >= 2]
        for a in mats:
            b = next((b for b in mats if b is not a and b.shape[-2] == a.shape[-1]), None)
            if b is not None:
                flops = gemm_flops(a.numel() // a.shape[-1], a.shape[-1], b.shape[-1])  # leading dims as rows
                break
    else:
        widths = {t.shape[0] for t in ins if t.dim() == 1 and t.is_floating_point()}
        norm_space = max((t.numel() for t in ins if t.dim() >= 2 and t.shape[-1] in widths), default=space)

        def size(m: str) -> int:
            return norm_space if m in _NORM else space

        flops = sum(_cost(m) * size(m) for m in ms)
    # a forward op fused beside its own backward is recomputed there (Inductor's partitioner recomputes cheap
    # activations instead of saving them): hardware FLOPs, not model FLOPs
    recomputed = sum(_cost(m) * size(m) for m in ms if f"{m}_backward" in ms) if cat != "matmul" else 0
    main = max((t for t, _ in tensors if t.is_floating_point()), key=lambda t: t.numel(), default=None)
    return OpCount(flops=int(flops), bytes_read=read, bytes_written=written, category=cat, counted=True,
                   flops_model=int(flops - recomputed) if recomputed else None,
                   dtype=str(main.dtype).removeprefix("torch.") if main is not None else "",
                   input_shapes=[list(t.shape) for t, r in tensors if r != "out"],
                   output_shapes=[list(t.shape) for t, r in tensors if r in ("out", "in_out")])


