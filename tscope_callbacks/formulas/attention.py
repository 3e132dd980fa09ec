"""Fused attention (SDPA and its flash / memory-efficient / cuDNN kernels), forward and backward.

Only the two GEMM-like products are counted, 2 FLOPs per multiply-add, over the (query, key) pairs the kernel
actually attends (softmax/scale/mask work is not counted, as in ``torch.utils.flop_counter``):
    forward   2 * P * d_qk  (scores = Q K^T)  +  2 * P * d_v  (out = P V)
    backward  2 * P * (3 * d_qk + 2 * d_v)    (recompute scores, dP = dO V^T, dV = P^T dO, dQ = dS K, dK = dS^T Q)
summed over batch and *query* heads (GQA: key/value heads are broadcast, so the work follows the query heads).

Convention for P, the attended (query, key) pairs per (batch, head), exact rather than "half":
    no mask / arbitrary attn_mask      P = L_q * S_k for the hardware count (a dense mask does not skip work);
                                         the model count (MFU) takes the pairs the mask lets through, counted
                                         on the device when the call runs (``mask_kept``, once per mask) and
                                         read at the end of a capture (``kept_share``; ``capture.masks``): a
                                         causal mask passed as a tensor counts as ``is_causal`` does, so MFU
                                         does not depend on how a model spells its mask
    is_causal, top-left alignment      P = sum_{i<L_q} min(i + 1, S_k)        (PyTorch SDPA semantics: row i
                                         attends keys 0..i; = L(L+1)/2 when L_q == S_k == L)
    causal, bottom-right alignment     P = sum_{i<L_q} clamp(i + 1 + S_k - L_q, 0, S_k)
                                         (flash-attn's ``_flash_attention_forward`` and the mem-efficient kernel's
                                         ``custom_mask_type == 2``)
    flash sliding window (wl, wr)      row i attends keys j with  -wl <= j - i - (S_k - L_q) <= wr
This is where we deliberately differ from ``torch.utils.flop_counter``, which ignores causality (counts L*S).

Three conventions travel with every count (``AttentionFlops``, an int): the int itself is the work the kernels do
(hardware FLOPs: the backward recomputes the scores); ``.model`` is what MFU counts -- the backward as 2x the forward
(4 GEMMs), as PaLM and Megatron count it; ``.dense`` is ``.model`` over the full L x S square (FlopCounterMode, PaLM
and Megatron ignore causality), for comparing with published MFU figures. FlopCounterMode (torch 2.13,
``sdpa_backward_flop_count``) counts the backward as 2.5x the forward when d_qk == d_v: 5 GEMMs, the recomputed
scores included, which is our hardware count over the full square.

Layouts: the ``_scaled_dot_product_*`` ops and ``_cudnn_attention_*`` take (B, H, L, D); the low-level
``_flash_attention_*`` and ``_efficient_attention_*`` take (B, L, H, D) (torch's flop counter reads those as
(B, H, L, D); we do not). Variable-length (nested/jagged) calls pass cumulative offsets whose values would need a
device sync to read, so they are counted as ``n_seq`` sequences of the average length (exact when all lengths are
equal). The mem-efficient kernel's ``window_size`` is not modelled.
"""

from __future__ import annotations

from typing import Any

import torch

from tscope_callbacks.formulas.common import reg

__all__ = ["AttentionFlops", "attended_pairs", "attention_flops", "mask_argument", "mask_kept", "kept_share",
           "masked_counts"]


class AttentionFlops(int):
    """Hardware FLOPs (the int), with ``model`` (backward = 2x forward) and ``dense`` (model, full square) FLOPs."""

    model: int
    dense: int

    def __new__(cls, hardware: int, model: int, dense: int) -> AttentionFlops:
        obj = super().__new__(cls, hardware)
        obj.model, obj.dense = model, dense
        return obj


def _sum_clamp(a: int, n: int, cap: int) -> int:
    """sum_{t=0}^{n-1} clamp(a + t, 0, cap)."""
    if n <= 0 or cap <= 0:
        return 0
    lo, hi = a, a + n - 1
    total = 0
    c0 = max(lo, cap)
    if hi >= c0:
        total += (hi - c0 + 1) * cap
    m0, m1 = max(lo, 1), min(hi, cap - 1)
    if m1 >= m0:
        total += (m0 + m1) * (m1 - m0 + 1) // 2
    return total


def attended_pairs(lq: int, sk: int, lo: int | None = None, hi: int | None = None) -> int:
    """Number of (i, j), 0 <= i < lq, 0 <= j < sk, with lo <= j - i <= hi (None: unbounded)."""

    def below(d: int) -> int:  # pairs with j - i <= d
        return _sum_clamp(d + 1, lq, sk)

    upper = lq * sk if hi is None else below(hi)
    lower = 0 if lo is None else below(lo - 1)
    return max(0, upper - lower)


def attention_flops(batch_heads: int, lq: int, sk: int, d_qk: int, d_v: int, *, lo=None, hi=None,
                    backward: bool = False) -> AttentionFlops:
    p = attended_pairs(lq, sk, lo, hi)
    per_pair = 2 * (3 * d_qk + 2 * d_v) if backward else 2 * (d_qk + d_v)
    model_per_pair = 2 * (2 * d_qk + 2 * d_v) if backward else 2 * (d_qk + d_v)
    return AttentionFlops(batch_heads * p * per_pair, batch_heads * p * model_per_pair,
                          batch_heads * lq * sk * model_per_pair)


def _bhld(q, k, v, is_causal, backward=False) -> int:
    """(B, H, L, D) or (H, L, D) layout, top-left causal alignment."""
    if len(q) == 3:
        (hq, lq, dqk), sk, dv, b = q, k[-2], v[-1], 1
    else:
        (b, hq, lq, dqk), sk, dv = q, k[-2], v[-1]
    return attention_flops(b * hq, lq, sk, dqk, dv, hi=0 if is_causal else None, backward=backward)


def _blhd(q, k, v, cum_q, cum_k, align, wl=None, wr=None, backward=False) -> int:
    """(B, L, H, D) layout, or varlen (T, H, D) / (1, T, H, D) with cumulative offsets (average lengths).

    ``align``: None (no causal mask), "top_left" or "bottom_right"; wl/wr: flash sliding window (None/-1: off)."""
    hq, dqk, dv = q[-2], q[-1], v[-1]
    if cum_q is not None:
        n_seq = max(1, cum_q[0] - 1)
        lq = round(q[-3] / n_seq)
        sk = round(k[-3] / max(1, (cum_k[0] - 1) if cum_k is not None else n_seq))
        b = n_seq
    else:
        b, lq, sk = q[0], q[1], k[1]
    wl = None if wl is None or wl < 0 else wl
    wr = None if wr is None or wr < 0 else wr
    lo = hi = None
    if align == "top_left":
        hi = 0
    elif align == "bottom_right" or wl is not None or wr is not None:
        shift = sk - lq  # flash-attn aligns causal and window masks bottom-right
        hi = shift if align == "bottom_right" else None
        if wr is not None:
            hi = shift + wr if hi is None else min(hi, shift + wr)
        if wl is not None:
            lo = shift - wl
    return attention_flops(b * hq, lq, sk, dqk, dv, lo=lo, hi=hi, backward=backward)


# ---- SDPA-level ops, (B, H, L, D) ----
def _sdpa_flash(q, k, v, dropout_p=0.0, is_causal=False, *args, out=None, **kwargs) -> int:
    return _bhld(q, k, v, is_causal)


def _sdpa_flash_quantized(q, k, v, q_descale=None, k_descale=None, v_descale=None, dropout_p=0.0, is_causal=False,
                          *args, out=None, **kwargs) -> int:
    return _bhld(q, k, v, is_causal)


def _sdpa_efficient(q, k, v, attn_bias=None, compute_lse=False, dropout_p=0.0, is_causal=False, *args, out=None,
                    **kwargs) -> int:
    return _bhld(q, k, v, is_causal)


def _sdpa_overrideable(q, k, v, attn_bias=None, dropout_p=0.0, is_causal=False, *args, out=None, **kwargs) -> int:
    return _bhld(q, k, v, is_causal)


def _sdpa_flash_bwd(g, q, k, v, o, lse, cum_q=None, cum_k=None, max_q=0, max_k=0, dropout_p=0.0, is_causal=False,
                    *args, out=None, **kwargs) -> int:
    return _bhld(q, k, v, is_causal, backward=True)


def _sdpa_flash_cpu_bwd(g, q, k, v, o, lse, dropout_p=0.0, is_causal=False, *args, out=None, **kwargs) -> int:
    return _bhld(q, k, v, is_causal, backward=True)


def _sdpa_efficient_bwd(g, q, k, v, attn_bias, o, lse, seed, offset, dropout_p=0.0, grad_input_mask=None,
                        is_causal=False, *args, out=None, **kwargs) -> int:
    return _bhld(q, k, v, is_causal, backward=True)


def _sdpa_cudnn_bwd(g, q, k, v, o, lse, seed, offset, attn_bias, cum_q, cum_k, max_q, max_k, dropout_p=0.0,
                    is_causal=False, *args, out=None, **kwargs) -> int:
    return _bhld(q, k, v, is_causal, backward=True)


def _sdpa_overrideable_bwd(g, q, k, v, attn_bias, grad_input_mask, o, lse, cum_q, cum_k, max_q, max_k,
                           dropout_p=0.0, is_causal=False, *args, out=None, **kwargs) -> int:
    return _bhld(q, k, v, is_causal, backward=True)


# ---- low-level kernels ----
def _flash_fwd(q, k, v, cum_q=None, cum_k=None, max_q=0, max_k=0, dropout_p=0.0, is_causal=False, *args, out=None,
               window_size_left=None, window_size_right=None, **kwargs) -> int:
    return _blhd(q, k, v, cum_q, cum_k, "bottom_right" if is_causal else None, window_size_left, window_size_right)


def _flash_bwd(g, q, k, v, o, lse, cum_q=None, cum_k=None, max_q=0, max_k=0, dropout_p=0.0, is_causal=False,
               *args, out=None, window_size_left=None, window_size_right=None, **kwargs) -> int:
    return _blhd(q, k, v, cum_q, cum_k, "bottom_right" if is_causal else None, window_size_left, window_size_right,
                 backward=True)


_MASK_TYPES = {0: None, 1: "top_left", 2: "bottom_right"}


def _efficient_fwd(q, k, v, bias=None, cu_q=None, cu_k=None, max_q=None, max_k=None, dropout_p=0.0,
                   custom_mask_type=0, *args, out=None, **kwargs) -> int:
    return _blhd(q, k, v, cu_q, cu_k, _MASK_TYPES.get(custom_mask_type))


def _efficient_bwd(g, q, k, v, bias, o, cu_q=None, cu_k=None, max_q=0, max_k=0, lse=None, dropout_p=0.0, seed=None,
                   offset=None, custom_mask_type=0, *args, out=None, **kwargs) -> int:
    return _blhd(q, k, v, cu_q, cu_k, _MASK_TYPES.get(custom_mask_type), backward=True)


def _cudnn_layout(q, k, v, cum_q, cum_k, is_causal, backward):
    if cum_q is not None and len(q) == 3:  # varlen (T, H, D)
        return _blhd(q, k, v, cum_q, cum_k, "top_left" if is_causal else None, backward=backward)
    return _bhld(q, k, v, is_causal, backward=backward)


def _cudnn_fwd(q, k, v, attn_bias=None, cum_q=None, cum_k=None, max_q=0, max_k=0, compute_lse=False, dropout_p=0.0,
               is_causal=False, *args, out=None, **kwargs) -> int:
    return _cudnn_layout(q, k, v, cum_q, cum_k, is_causal, False)


def _cudnn_bwd(g, q, k, v, o, lse, seed, offset, attn_bias, cum_q, cum_k, max_q, max_k, dropout_p=0.0,
               is_causal=False, *args, out=None, **kwargs) -> int:
    return _cudnn_layout(q, k, v, cum_q, cum_k, is_causal, True)


reg(["_scaled_dot_product_flash_attention", "_scaled_dot_product_flash_attention_for_cpu"], "attention", _sdpa_flash)
reg(["_scaled_dot_product_flash_attention.quantized"], "attention", _sdpa_flash_quantized)
reg(["_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention"], "attention", _sdpa_efficient)
reg(["_scaled_dot_product_fused_attention_overrideable"], "attention", _sdpa_overrideable)
reg(["_scaled_dot_product_flash_attention_backward"], "attention", _sdpa_flash_bwd)
reg(["_scaled_dot_product_flash_attention_for_cpu_backward"], "attention", _sdpa_flash_cpu_bwd)
reg(["_scaled_dot_product_efficient_attention_backward"], "attention", _sdpa_efficient_bwd)
reg(["_scaled_dot_product_cudnn_attention_backward"], "attention", _sdpa_cudnn_bwd)
reg(["_scaled_dot_product_fused_attention_overrideable_backward"], "attention", _sdpa_overrideable_bwd)
reg(["_flash_attention_forward"], "attention", _flash_fwd)
reg(["_flash_attention_backward"], "attention", _flash_bwd)
reg(["_efficient_attention_forward"], "attention", _efficient_fwd)
reg(["_efficient_attention_backward"], "attention", _efficient_bwd)
reg(["_cudnn_attention_forward"], "attention", _cudnn_fwd)
reg(["_cudnn_attention_backward"], "attention", _cudnn_bwd)


#: op name -> position of its ``attn_bias`` / mask argument (the ops that take an explicit mask)
_MASK_ARG = {
    "_scaled_dot_product_efficient_attention": 3, "_scaled_dot_product_cudnn_attention": 3,
    "_scaled_dot_product_fused_attention_overrideable": 3, "_efficient_attention_forward": 3,
    "_scaled_dot_product_efficient_attention_backward": 4, "_efficient_attention_backward": 4,
    "_scaled_dot_product_cudnn_attention_backward": 8, "_scaled_dot_product_fused_attention_overrideable_backward": 4,
    "_scaled_dot_product_flash_attention_for_cpu": None, "_scaled_dot_product_flash_attention_for_cpu_backward": None,
}  # None: keyword-only ``attn_mask``


def mask_argument(op_name: str, args: tuple, kwargs: dict | None = None) -> Any:
    """The explicit mask tensor of an attention op call (``op_name`` without namespace or overload), else None."""
    if op_name not in _MASK_ARG:
        return None
    i, kw = _MASK_ARG[op_name], kwargs or {}
    m = args[i] if i is not None and len(args) > i else kw.get("attn_mask", kw.get("attn_bias", kw.get("bias")))
    return m if isinstance(m, torch.Tensor) and m.dim() >= 2 else None


def mask_kept(mask: torch.Tensor | None) -> torch.Tensor | None:
    """The number of (query, key) pairs a mask lets through, as a 0-dim tensor on the mask's device (no host sync:
    read it later with :func:`kept_share`): True entries of a boolean mask; entries of an additive float mask above
    half its dtype's lowest value (masked entries are -inf or ``finfo.min``, HF's choice). Taken when the attention
    call runs, because the mask's memory may hold other data later (Inductor reuses a dead buffer in place).
    None for meta/fake tensors or an empty mask."""
    if mask is None or mask.device.type == "meta" or mask.numel() == 0:
        return None
    try:
        with torch.no_grad():
            if mask.dtype == torch.bool:
                return mask.sum()
            return (mask > torch.finfo(mask.dtype).min / 2).sum()
    except (RuntimeError, TypeError, NotImplementedError):
        return None


def kept_share(kept: torch.Tensor | None, numel: int) -> float | None:
    """``kept`` (from :func:`mask_kept`) as a share of the mask's ``numel`` entries (reads a value: a device sync
    on a GPU). Broadcasting repeats the mask uniformly, so the share over the mask's own shape is the share over
    the full score matrix."""
    if kept is None or numel <= 0:
        return None
    try:
        return float(kept.item()) / numel
    except (RuntimeError, TypeError, NotImplementedError):
        return None


def masked_counts(flops_model: int, flops_dense: int | None, fraction: float | None) -> tuple[int, int | None]:
    """(model FLOPs, dense FLOPs) of a masked attention call: the model count scaled to the pairs the mask lets
    through, the full square kept as the dense convention."""
    if fraction is None:
        return flops_model, flops_dense
    return int(round(flops_model * fraction)), (flops_dense if flops_dense is not None else flops_model)
