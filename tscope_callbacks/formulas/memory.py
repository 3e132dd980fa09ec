"""Memory ops: copies, concatenation, indexing, scatters and fills. Category "memory", 0 FLOPs (the scatter-add
family, ``index_add`` and ``index_put(accumulate=True)`` count 1 FLOP per accumulated element), real bytes.

Byte overrides (everything else uses the generic rule: read inputs once, write outputs once):
    gather / index_select / index / _unsafe_index   read the indices and only the gathered elements of ``self``
    scatter_ / scatter_add_ / scatter_reduce_        read index + src (the index-sized part); the accumulating
                                                     ones also read the targeted elements; write those elements
    index_put_ / _index_put_impl_ / index_add_       read indices + values; write the indexed region only (for a
    index_copy_ / index_fill_ / masked_fill_         boolean mask the region is bounded by the mask's size)
    copy_ fill_ zero_ *_like new_zeros/ones/full     ``self``'s values are not read (see ``bytes.write_only_bytes``)
"""

from __future__ import annotations

from math import prod

import torch

from tscope_callbacks.formulas.bytes import copy_bytes, tensor_bytes, tensors_in, unique_bytes, write_only_bytes
from tscope_callbacks.formulas.common import numel, reg

__all__: list[str] = []


def _gather_bytes(args, kwargs, out):
    """Read index tensors + numel(out) gathered elements of self; write out."""
    self_ = args[0]
    idx = [t for a in args[1:] for t in tensors_in(a)]
    res = out if isinstance(out, torch.Tensor) else kwargs.get("out")
    return unique_bytes(idx) + res.numel() * self_.element_size(), tensor_bytes(res)


def _scatter_add_bytes(args, kwargs, out):
    self_, index = args[0], args[2]
    src = args[3] if len(args) > 3 else kwargs.get("src")
    n = index.numel()
    item = self_.element_size()
    read = tensor_bytes(index) + n * item  # targets are read-modify-written
    if isinstance(src, torch.Tensor):
        read += min(n, src.numel()) * src.element_size()
    return read, n * item


def _scatter_bytes(args, kwargs, out):
    self_, index = args[0], args[2]
    src = args[3] if len(args) > 3 else kwargs.get("src", kwargs.get("value"))
    n = index.numel()
    read = tensor_bytes(index)
    if isinstance(src, torch.Tensor):
        read += min(n, src.numel()) * src.element_size()
    return read, n * self_.element_size()


def _indexed_region(self_: torch.Tensor, indices) -> int:
    """Elements of ``self`` addressed by advanced indexing ``self[indices]`` (bool masks: their size, an upper bound)."""
    covered: set[int] = set()
    shapes = []
    pos = 0
    for idx in indices:
        if idx is None:
            pos += 1
            continue
        if idx.dtype in (torch.bool, torch.uint8):
            covered.update(range(pos, pos + idx.dim()))
            pos += idx.dim()
            shapes.append((idx.numel(),))
        else:
            covered.add(pos)
            pos += 1
            shapes.append(tuple(idx.shape))
    rest = prod(s for d, s in enumerate(self_.shape) if d not in covered)
    return int(prod(torch.broadcast_shapes(*shapes))) * rest if shapes else self_.numel()


def _index_put_bytes(args, kwargs, out):
    self_, indices, values = args[0], args[1], args[2]
    accumulate = bool(args[3]) if len(args) > 3 else bool(kwargs.get("accumulate", False))
    region = _indexed_region(self_, indices) * self_.element_size()
    idx = [t for t in indices if isinstance(t, torch.Tensor)]
    read = unique_bytes([*idx, values]) + (region if accumulate else 0)
    return read, region


def _index_add_accum_bytes(args, kwargs, out):
    self_, index, source = args[0], args[2], args[3]
    region = source.numel() * self_.element_size()
    return unique_bytes([index, source]) + region, region


def _index_copy_bytes(args, kwargs, out):
    self_, index, source = args[0], args[2], args[3]
    return unique_bytes([index, source]), source.numel() * self_.element_size()


def _index_fill_bytes(args, kwargs, out):
    self_, dim, index = args[0], args[1], args[2]
    value = args[3] if len(args) > 3 else None
    per_slice = self_.numel() // max(1, self_.shape[dim]) if self_.dim() else 1
    read = unique_bytes([index] + ([value] if isinstance(value, torch.Tensor) else []))
    return read, index.numel() * per_slice * self_.element_size()


def _masked_fill_inplace_bytes(args, kwargs, out):
    self_, mask = args[0], args[1]
    value = args[2] if len(args) > 2 else None
    read = unique_bytes([mask] + ([value] if isinstance(value, torch.Tensor) else []))
    return read, tensor_bytes(self_)


def _scatter_add_flops(self_, dim, index, *args, out=None, **kwargs) -> int:
    return numel(index)


def _index_add_flops(self_, dim, index, source, *args, out=None, **kwargs) -> int:
    return numel(source)


def _index_put_flops(self_, indices, values, accumulate=False, *args, out=None, **kwargs) -> int:
    """``accumulate=True`` (the backward of advanced indexing ``x[idx]``) adds each value into its target: one FLOP
    per value, as ``index_add_`` counts its source; a plain put moves data only."""
    return numel(values) if accumulate else 0


def _masked_index_put_accumulate_flops(self_, mask, indices, values, *args, out=None, **kwargs) -> int:
    return numel(values)


def _grad_accumulate_flops(grad, *args, out=None, **kwargs) -> int:
    return numel(grad)


reg(["_to_copy", "clone", "cat", "stack", "hstack", "vstack", "constant_pad_nd", "repeat", "repeat_interleave", "roll",
     "flip", "tril", "triu", "narrow_copy", "slice_scatter", "select_scatter", "diagonal_scatter",
     "as_strided_scatter", "masked_scatter", "masked_scatter_", "masked_select", "masked_fill", "scatter", "index_copy", "index_fill", "nonzero", "_local_scalar_dense",
     "lift_fresh_copy", "alias_copy", "detach_copy", "view_copy", "_reshape_copy", "permute_copy", "t_copy",
     "transpose_copy", "expand_copy", "slice_copy", "select_copy", "unsqueeze_copy", "squeeze_copy", "split_copy",
     "split_with_sizes_copy", "unbind_copy", "diagonal_copy", "as_strided_copy", "unfold_copy", "view_as_real_copy",
     "view_as_complex_copy", "zeros", "ones", "full", "scalar_tensor", "arange", "linspace", "logspace", "eye",
     "tensor", "_pin_memory", "reflection_pad1d", "reflection_pad2d", "reflection_pad3d", "replication_pad1d",
     "replication_pad2d", "replication_pad3d", "im2col", "native_channel_shuffle", "channel_shuffle",
     "pixel_shuffle", "pixel_unshuffle", "_unique2", "unique_dim", "unique_consecutive", "bucketize", "searchsorted",
     "one_hot", "_copy_from", "_copy_from_and_resize", "select_backward", "slice_backward",
     "diagonal_backward", "as_strided_backward", "_unsafe_masked_index"], "memory")
reg(["copy_", "copy"], "memory", None, bytes=copy_bytes)
reg(["fill_", "zero_", "fill", "zeros_like", "ones_like", "full_like", "new_zeros", "new_ones", "new_full"],
    "memory", None, bytes=write_only_bytes)
reg(["gather", "index_select", "index", "_unsafe_index", "take", "take_along_dim"], "memory", None,
    bytes=_gather_bytes)
reg(["scatter_"], "memory", None, bytes=_scatter_bytes)
reg(["scatter_add_", "scatter_reduce_"], "memory", _scatter_add_flops, bytes=_scatter_add_bytes)
reg(["scatter_add", "scatter_reduce"], "memory", _scatter_add_flops)
reg(["index_put_", "_index_put_impl_"], "memory", _index_put_flops, bytes=_index_put_bytes)
reg(["index_put", "_unsafe_index_put"], "memory", _index_put_flops)
reg(["_unsafe_masked_index_put_accumulate"], "memory", _masked_index_put_accumulate_flops)
reg(["index_add_"], "memory", _index_add_flops, bytes=_index_add_accum_bytes)
reg(["index_add"], "memory", _index_add_flops)
reg(["index_copy_"], "memory", None, bytes=_index_copy_bytes)
reg(["index_fill_"], "memory", None, bytes=_index_fill_bytes)
reg(["masked_fill_"], "memory", None, bytes=_masked_fill_inplace_bytes)
# backward of pads/gathers: scatter-accumulate one FLOP per grad element
reg(["reflection_pad1d_backward", "reflection_pad2d_backward", "reflection_pad3d_backward",
     "replication_pad1d_backward", "replication_pad2d_backward", "replication_pad3d_backward", "col2im",
     "index_select_backward", "gather_backward", "masked_scatter_backward", "unfold_backward"], "memory", _grad_accumulate_flops)
