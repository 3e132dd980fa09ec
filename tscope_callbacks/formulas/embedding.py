"""Embedding lookups and their backward.

FLOPs: the forward gather is 0 FLOPs; a bag's sum/mean/max costs 1 per gathered element (+1 with
per_sample_weights); the dense backward scatter-adds 1 FLOP per grad_output element.
Bytes (override of the generic rule): a gather reads the indices and the *distinct* rows it gathers -- never the
whole table, and a row looked up 32 times is read once (the ideal lower bound; caches serve the repeats) -- and
writes its output. Distinct rows are counted from the index values (one ``unique`` per lookup; the capture takes
this count at stop on CUDA, so no host sync happens mid-step; on ``meta`` the values are unknown and every lookup
counts). The dense backward writes the whole (dense) grad table, as it
materialises it.
"""

from __future__ import annotations

import torch

from tscope_callbacks.formulas.bytes import tensor_bytes, tensors_in, unique_bytes
from tscope_callbacks.formulas.common import numel, reg

__all__ = ["embedding_bytes"]


def _rows(indices: torch.Tensor) -> int:
    """Distinct rows an index tensor looks up (every lookup when the values are unknown, on meta)."""
    if indices.device.type == "meta" or indices.numel() == 0:
        return indices.numel()
    try:
        return int(torch.unique(indices).numel())
    except Exception:
        return indices.numel()


def embedding_bytes(args, kwargs, out):
    """embedding(weight, indices, ...): indices + its distinct rows of weight -> out."""
    weight, indices = args[0], args[1]
    row = weight.shape[-1] * weight.element_size() if weight.dim() else 0
    read = tensor_bytes(indices) + _rows(indices) * row
    return read, tensor_bytes(out)


def _embedding_bag_bytes(args, kwargs, out):
    weight, indices, offsets = args[0], args[1], args[2]
    psw = args[6] if len(args) > 6 else kwargs.get("per_sample_weights")
    rows = indices.numel()
    read = unique_bytes([t for t in (indices, offsets, psw) if isinstance(t, torch.Tensor)])
    read += rows * weight.shape[-1] * weight.element_size()
    return read, unique_bytes(tensors_in(out))


def _embedding(weight, indices, *args, out=None, **kwargs) -> int:
    return 0


def _embedding_dense_backward(grad_output, indices, *args, out=None, **kwargs) -> int:
    return numel(grad_output)


def _embedding_bag(weight, indices, offsets, scale_grad_by_freq=False, mode=0, sparse=False,
                   per_sample_weights=None, *args, out=None, **kwargs) -> int:
    return numel(indices) * weight[-1] * (2 if per_sample_weights is not None else 1)


def _embedding_bag_backward(grad, indices, *args, out=None, **kwargs) -> int:
    return numel(indices) * grad[-1]


reg(["embedding"], "embedding", _embedding, bytes=embedding_bytes)
reg(["embedding_dense_backward", "embedding_sparse_backward"], "embedding", _embedding_dense_backward)
reg(["_embedding_bag", "_embedding_bag_forward_only"], "embedding", _embedding_bag, bytes=_embedding_bag_bytes)
reg(["_embedding_bag_backward", "_embedding_bag_dense_backward", "_embedding_bag_sparse_backward"], "embedding",
    _embedding_bag_backward)
