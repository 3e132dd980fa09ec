"""Composite (CompositeImplicitAutograd) ops that reach the dispatcher undecomposed.

With autograd on they decompose before a TorchDispatchMode sees them (``linear`` arrives as ``t`` + ``addmm``), but
under ``torch.inference_mode()`` the mode sees ``linear``, ``conv2d``, ``layer_norm``, ``softmax``, ``einsum``,
``scaled_dot_product_attention``... themselves. Each is costed as the sum of what its decomposition would cost,
with the families' conventions (bias epilogues not counted, see matmul.py / conv.py).

Ops that may return their input or a copy (``contiguous``, ``to``, ``reshape``, ``flatten``, ``dropout`` in
eval...) move 0 bytes when the result aliases the input and read + write it when they copy.
"""

from __future__ import annotations

from math import prod

import torch

from tscope_callbacks.formulas.attention import _bhld
from tscope_callbacks.formulas.bytes import storage_id, tensor_bytes
from tscope_callbacks.formulas.common import numel, out_numel, reg
from tscope_callbacks.formulas.costs import DROPOUT_COSTS, REDUCTION_COSTS
from tscope_callbacks.formulas.embedding import _embedding_bag, _embedding_bag_bytes
from tscope_callbacks.formulas.losses import _nll, _nll_bytes, _red
from tscope_callbacks.formulas.matmul import gemm_flops
from tscope_callbacks.formulas.norm import norm_forward_flops

__all__ = ["maybe_copy_bytes", "einsum_flops"]


def maybe_copy_bytes(args, kwargs, out):
    """0 when ``out`` aliases ``args[0]`` (a no-op / view), else read the input and write the output once."""
    x = args[0]
    if not isinstance(out, torch.Tensor) or not isinstance(x, torch.Tensor) or out is x:
        return 0, 0
    try:
        if storage_id(out) == storage_id(x):
            return 0, 0
    except (RuntimeError, NotImplementedError):
        pass
    return tensor_bytes(x), tensor_bytes(out)


def _linear(x, w, *args, out=None, **kwargs) -> int:
    return gemm_flops(numel(out), w[-1], 1)  # one length-k dot product per output element


def _matmul(a, b, *args, out=None, **kwargs) -> int:
    return gemm_flops(numel(out), a[-1], 1)


def _outer(a, b, *args, out=None, **kwargs) -> int:
    return numel(out)


def _bilinear(x1, x2, w, *args, out=None, **kwargs) -> int:
    # out[n, o] = sum_ij x1[n, i] W[o, i, j] x2[n, j]: x1 W (2 * i * j per o) then dot with x2 (2 * j per o)
    return 2 * numel(out) * w[1] * w[2] + 2 * numel(out) * w[2]


def einsum_flops(equation: str, shapes: list) -> int:
    """Left-to-right pairwise evaluation: a contraction of two operands costs 2 FLOPs per point of the joint index
    space (1 when nothing is summed, a plain product); a single operand costs 1 per element (sum/transpose)."""
    lhs, _, rhs = equation.replace(" ", "").partition("->")
    terms = lhs.split(",")
    sizes: dict[str, int] = {}
    letters = []
    for term, shape in zip(terms, shapes):
        if "..." in term:  # broadcast dims get private letters, aligned from the right across operands
            pre, post = term.split("...")
            n_ell = len(shape) - len(pre) - len(post)
            term = pre + "".join(chr(0x100 + n_ell - 1 - i) for i in range(n_ell)) + post
        for ch, s in zip(term, shape):
            sizes[ch] = max(sizes.get(ch, 1), s)
        letters.append(term)
    if not rhs and "->" not in equation:
        counts = {}
        for t in letters:
            for ch in t:
                counts[ch] = counts.get(ch, 0) + 1
        rhs = "".join(sorted(ch for ch, c in counts.items() if c == 1))
    out_set = set(rhs) | {ch for t in letters for ch in t if ord(ch) >= 0x100}
    if len(letters) == 1:
        return int(prod(sizes[ch] for ch in letters[0]))
    total = 0
    cur = letters[0]
    for i, nxt in enumerate(letters[1:], start=1):
        later = set("".join(letters[i + 1:])) | out_set
        joint = set(cur) | set(nxt)
        summed = {ch for ch in joint if ch not in later}
        total += (2 if summed else 1) * int(prod(sizes[ch] for ch in joint))
        cur = "".join(ch for ch in joint if ch not in summed)
    return total


def _einsum(equation, tensors, *args, out=None, **kwargs) -> int:
    return einsum_flops(equation, list(tensors))


def _conv_nd(x, w, *args, out=None, **kwargs) -> int:
    return 2 * numel(out) * int(prod(w[1:]))


def _conv_transpose_nd(x, w, *args, out=None, **kwargs) -> int:
    return 2 * numel(x) * int(prod(w[1:]))


def _layer_norm(x, normalized_shape, weight=None, bias=None, *args, out=None, **kwargs) -> int:
    return norm_forward_flops(numel(x), weight=weight is not None, bias=bias is not None)


def _batch_norm(x, weight=None, bias=None, running_mean=None, running_var=None, training=True, *args, out=None,
                **kwargs) -> int:
    return norm_forward_flops(numel(x), weight=weight is not None, bias=bias is not None, stats=bool(training))


def _group_norm(x, num_groups, weight=None, bias=None, *args, out=None, **kwargs) -> int:
    return norm_forward_flops(numel(x), weight=weight is not None, bias=bias is not None)


def _softmax(x, *args, out=None, **kwargs) -> int:
    return REDUCTION_COSTS["_softmax"][0] * numel(x)


def _dropout(x, p=0.5, train=True, *args, out=None, **kwargs) -> int:
    return DROPOUT_COSTS["native_dropout"] * numel(x) if train and p else 0


def _sdpa(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, *args, out=None, **kwargs) -> int:
    return _bhld(q, k, v, is_causal)


def _cross_entropy(x, target, weight=None, reduction=1, ignore_index=-100, label_smoothing=0.0, *args, out=None,
                   **kwargs) -> int:
    n = numel(x)
    if len(target) == len(x):  # class probabilities: log_softmax, then -(p * logp) summed
        return 5 * n + 2 * n + (n if weight is not None else 0) + _red(reduction)
    rows = numel(target)
    smooth = 2 * n if label_smoothing else 0
    return 5 * n + rows * (1 + int(weight is not None)) + smooth


def _l1_loss(x, target, reduction=1, *args, out=None, **kwargs) -> int:
    return numel(x) * (2 + _red(reduction))


def _kl_div(x, target, reduction=1, *args, out=None, **kwargs) -> int:
    return numel(x) * (3 + _red(reduction))


def _adaptive_avg_pool(x, *args, out=None, **kwargs) -> int:
    return numel(x) + out_numel(out)


def _mha(q, k, v, embed_dim, num_head, qkv_w, qkv_b, proj_w, proj_b, *args, out=None, **kwargs) -> int:
    """nn.MultiheadAttention's inference fast path: q/k/v projections, attention, output projection."""
    b, lq, e = q[0], q[-2], q[-1]
    s = k[-2]
    proj = 2 * b * lq * e * e + 2 * 2 * b * s * e * e + 2 * b * lq * e * e
    return proj + 4 * b * lq * s * e


def _encoder_layer(src, embed_dim, num_heads, qkv_w, qkv_b, proj_w, proj_b, use_gelu, norm_first, eps, n1w, n1b,
                   n2w, n2b, ffn_w1, ffn_b1, ffn_w2, ffn_b2, *args, out=None, **kwargs) -> int:
    """nn.TransformerEncoderLayer's inference fast path (dense input)."""
    n, e = numel(src) // src[-1], src[-1]
    lq = src[-2] if len(src) == 3 else n
    f = ffn_w1[0]
    gemms = 2 * n * e * 3 * e + 4 * n * lq * e + 2 * n * e * e + 2 * 2 * n * e * f
    residuals = 2 * n * e
    return gemms + residuals + 2 * norm_forward_flops(n * e, weight=True, bias=True) + (5 if use_gelu else 1) * n * f


reg(["linear"], "matmul", _linear)
reg(["matmul"], "matmul", _matmul)
reg(["einsum"], "matmul", _einsum)
reg(["outer", "ger"], "pointwise", _outer)
reg(["bilinear"], "matmul", _bilinear)
reg(["conv1d", "conv2d", "conv3d", "conv_tbc"], "conv", _conv_nd)
reg(["conv_transpose1d", "conv_transpose2d", "conv_transpose3d"], "conv", _conv_transpose_nd)
reg(["layer_norm"], "norm", _layer_norm)
reg(["batch_norm", "instance_norm"], "norm", _batch_norm)
reg(["group_norm"], "norm", _group_norm)
reg(["softmax", "log_softmax"], "softmax", _softmax)
reg(["dropout", "feature_dropout", "alpha_dropout", "feature_alpha_dropout"], "pointwise", _dropout,
    bytes=maybe_copy_bytes)
reg(["scaled_dot_product_attention"], "attention", _sdpa)
reg(["_native_multi_head_attention"], "attention", _mha)
reg(["_transformer_encoder_layer_fwd"], "attention", _encoder_layer)
reg(["pad"], "memory")
reg(["contiguous", "to", "type_as"], "memory", None, bytes=maybe_copy_bytes)
reg(["reshape", "flatten", "unflatten", "view_as", "reshape_as"], "view", None, bytes=maybe_copy_bytes)
reg(["cross_entropy_loss"], "loss", _cross_entropy)
reg(["nll_loss", "nll_loss2d", "nll_loss_nd"], "loss", _nll, bytes=_nll_bytes)
reg(["l1_loss"], "loss", _l1_loss)
reg(["kl_div"], "loss", _kl_div)
reg(["embedding_bag"], "embedding", _embedding_bag, bytes=_embedding_bag_bytes)
reg(["adaptive_avg_pool2d", "adaptive_avg_pool3d"], "reduction", _adaptive_avg_pool)
