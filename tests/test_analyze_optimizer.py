"""``analyze_model(..., optimizer=)``: the estimate is a whole training step, its update counted as the GPU runs it
(``capture.optim_step``)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import tscope_callbacks as ts

D = 256  # Linear(256, 256) x 2: 2 x (65,536 + 256) = 131,584 parameters
N_PARAMS = 2 * (D * D + D)


def _mlp() -> nn.Module:
    with torch.device("meta"):
        return nn.Sequential(nn.Linear(D, D), nn.ReLU(), nn.Linear(D, D))


def _update(optimizer, **kw) -> list:
    rep = ts.analyze_model(_mlp(), input_shape=[(32, D)], gpu="h100", precision=kw.pop("precision", "fp32"),
                           backward=True, optimizer=optimizer, **kw)
    return [o for o in rep.ops if o.phase == "optimizer"], rep


def test_fused_adamw_is_one_kernel_streaming_seven_fp32_tensors():
    ops, rep = _update("adamw-fused")
    # as on a GPU: the step counters (4 scalars, on the device) += 1, then the fused kernel
    assert [o.op for o in ops] == ["aten._foreach_add_", "aten._fused_adamw_"]
    # reads param, grad, exp_avg, exp_avg_sq and the 4 step counters; writes param, exp_avg, exp_avg_sq:
    # 7 x 4 B per parameter + 4 x 4 B
    assert ops[1].bytes == 7 * 4 * N_PARAMS + 16
    # the update is part of the step the report estimates
    fwd_bwd = ts.analyze_model(_mlp(), input_shape=[(32, D)], gpu="h100", precision="fp32", backward=True)
    assert rep.summary.estimated_step_s == pytest.approx(fwd_bwd.summary.estimated_step_s + sum(o.expected_s for o in ops),
                                                        rel=1e-6)
    assert rep.profile.info.optimizer == "adamw-fused"


def test_foreach_adamw_counts_the_device_ops_only():
    # PyTorch's foreach AdamW on a GPU: its step counters live on the CPU and are read with .item() (host work);
    # the device runs 8 foreach ops over every parameter
    ops, _ = _update("adamw")
    names = [o.op for o in ops]
    assert names == ["aten._foreach_mul_", "aten._foreach_lerp_", "aten._foreach_mul_", "aten._foreach_addcmul_",
                     "aten._foreach_sqrt", "aten._foreach_div_", "aten._foreach_add_", "aten._foreach_addcdiv_"]
    assert "aten._local_scalar_dense" not in names
    b = 4 * N_PARAMS  # one fp32 tensor list
    # mul_ p (r+w), lerp_ m,g (2r+w), mul_ v (r+w), addcmul_ v,g,g (g once: 2r+w), sqrt v (r+w new),
    # div_ d (r+w), add_ d (r+w), addcdiv_ p,m,d (3r+w)
    assert sum(o.bytes for o in ops) == (2 + 3 + 2 + 3 + 2 + 2 + 2 + 4) * b


def test_sgd_with_momentum_and_a_factory():
    ops, _ = _update("sgd")
    # momentum 0.9: buf *= 0.9; buf += g; p -= lr * buf
    assert [o.op for o in ops] == ["aten._foreach_mul_", "aten._foreach_add_", "aten._foreach_add_"]
    # a factory's optimizer runs as given: on meta PyTorch's default is the per-tensor loop (no momentum: p -= lr * g
    # for each of the 4 tensors); foreach=True is what it would pick on a GPU
    ops, rep = _update(lambda params: torch.optim.SGD(params, lr=0.1))
    assert [o.op for o in ops] == ["aten.add_"] * 4 and rep.profile.info.optimizer == "custom"
    ops, _ = _update(lambda params: torch.optim.SGD(params, lr=0.1, foreach=True))
    assert [o.op for o in ops] == ["aten._foreach_add_"]


def test_mixed_precision_updates_the_fp32_master_weights():
    ops, _ = _update("adamw-fused", precision="bf16-mixed")
    assert ops[1].dtype == "float32" and ops[1].bytes == 7 * 4 * N_PARAMS + 16


def test_bad_optimizer_arguments_are_clear_errors():
    with pytest.raises(ValueError, match="needs backward=True"):
        ts.analyze_model(_mlp(), input_shape=[(4, D)], gpu="h100", optimizer="adamw")
    with pytest.raises(ValueError, match="adamw-fused"):
        _update("lamb")
    with pytest.raises(TypeError, match="not a torch.optim.Optimizer"):
        _update(lambda params: object())
    with pytest.raises(ValueError, match="no meta kernel for _fused_sgd_"):
        _update("sgd-fused")
    # a fused optimizer from a factory cannot run on meta: the error names what can
    with pytest.raises(ValueError, match="name the optimizer instead: .*adamw-fused"):
        _update(lambda params: torch.optim.AdamW(params, fused=True))
