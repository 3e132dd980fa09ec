"""Pooling and resampling (category "reduction"; nearest-neighbour resampling is a pure copy, "memory").

    max_pool{1,2,3}d(_with_indices), avg_pool{2,3}d    1 per window element per output: numel(out) * prod(k)
                                                       (compare or add; the average's divide is folded)
    max_pool backward                                  1 per grad_output element (scatter-add at the argmax)
    avg_pool backward                                  numel(grad_output) * prod(k) (spread each gradient)
    _adaptive_avg_pool{2,3}d                           numel(input) + numel(out) (every input summed once, divide)
    _adaptive_avg_pool backward                        numel(grad_input)
    adaptive_max_pool{2,3}d                            numel(input); backward numel(grad_output)
    upsample_{linear1d,bilinear2d,trilinear3d,bicubic2d} 3 per interpolation axis-lerp per output:
                                                       linear 3, bilinear 9, trilinear 21, bicubic 4x4 taps 32
    their backward                                     the same per grad_output element
    upsample_nearest*                                  0 (a gather); backward 1 per grad_output element
"""

from __future__ import annotations

from math import prod

from tscope_callbacks.formulas.common import numel, out_numel, reg

__all__: list[str] = []


def _kernel(kernel_size, nd: int) -> int:
    ks = list(kernel_size) if isinstance(kernel_size, (list, tuple)) else [kernel_size]
    if len(ks) == 1:
        ks = ks * nd
    return int(prod(ks))


def _pool(nd: int):
    def flops(x, kernel_size, *args, out=None, **kwargs) -> int:
        return out_numel(out) * _kernel(kernel_size, nd)

    return flops


def _avg_pool_backward(nd: int):
    def flops(g, x, kernel_size, *args, out=None, **kwargs) -> int:
        return numel(g) * _kernel(kernel_size, nd)

    return flops


def _per_grad(g, *args, out=None, **kwargs) -> int:
    return numel(g)


def _per_input(x, *args, out=None, **kwargs) -> int:
    return numel(x)


def _per_input_and_out(x, *args, out=None, **kwargs) -> int:
    return numel(x) + out_numel(out)


def _per_out(cost: int):
    def flops(*args, out=None, **kwargs) -> int:
        return cost * out_numel(out)

    return flops


def _per_grad_cost(cost: int):
    def flops(g, *args, out=None, **kwargs) -> int:
        return cost * numel(g)

    return flops


for _nd in (1, 2, 3):
    reg([f"max_pool{_nd}d", f"max_pool{_nd}d_with_indices", f"avg_pool{_nd}d", f"mkldnn_max_pool{_nd}d",
         f"quantized_max_pool{_nd}d"], "reduction", _pool(_nd))
    reg([f"avg_pool{_nd}d_backward"], "reduction", _avg_pool_backward(_nd))
reg(["max_pool2d_with_indices_backward", "max_pool3d_with_indices_backward", "max_pool2d_backward",
     "adaptive_max_pool2d_backward", "adaptive_max_pool3d_backward", "max_unpool2d", "max_unpool3d"],
    "reduction", _per_grad)
reg(["_adaptive_avg_pool2d", "_adaptive_avg_pool3d", "adaptive_avg_pool1d"], "reduction", _per_input_and_out)
reg(["_adaptive_avg_pool2d_backward", "_adaptive_avg_pool3d_backward"], "reduction", _per_grad)
reg(["adaptive_max_pool2d", "adaptive_max_pool3d"], "reduction", _per_input)
for _name, _cost in [("upsample_linear1d", 3), ("upsample_bilinear2d", 9), ("_upsample_bilinear2d_aa", 9),
                     ("upsample_trilinear3d", 21), ("upsample_bicubic2d", 32), ("_upsample_bicubic2d_aa", 32)]:
    reg([_name], "reduction", _per_out(_cost))
    reg([_name + "_backward"], "reduction", _per_grad_cost(_cost))
reg(["upsample_nearest1d", "upsample_nearest2d", "upsample_nearest3d", "_upsample_nearest_exact1d",
     "_upsample_nearest_exact2d", "_upsample_nearest_exact3d"], "memory")
reg(["upsample_nearest1d_backward", "upsample_nearest2d_backward", "upsample_nearest3d_backward",
     "_upsample_nearest_exact1d_backward", "_upsample_nearest_exact2d_backward",
     "_upsample_nearest_exact3d_backward"], "memory", _per_grad)
