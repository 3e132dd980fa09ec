"""One per-element cost table for eager ops and compiled kernels (``formulas.costs``): an op costs the same whether
the dispatcher saw it alone or Inductor fused it into a kernel."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from tests.formula_utils import count, one
from tscope_callbacks.formulas.costs import DROPOUT_COSTS, POINTWISE_COSTS, REDUCTION_COSTS, element_cost
from tscope_callbacks.formulas.fused import kernel_count


def _kernel(member: str, n: int, phase: str) -> int:
    """FLOPs of a one-member Inductor kernel over an n-element iteration space (two inputs, one output)."""
    a, b, out = torch.empty(n), torch.empty(n), torch.empty(n)
    return kernel_count(f"triton_red_fused_{member}_0", (a, b, out), ["in", "in", "out"], phase).flops


def test_the_ops_whose_eager_and_compiled_counts_differed_cost_the_same_both_ways():
    x = torch.randn(4, 16, requires_grad=True)  # 64 elements
    rec = count(lambda: (F.softmax(x, -1) + F.log_softmax(x, -1) + F.dropout(x, 0.5)).sum().backward())
    # softmax backward y * (g - sum(g y)): g*y, the sum's add, sub, mul = 4 per element; log-softmax backward
    # g - exp(y) * sum(g): the sum's add, exp, mul, sub = 4 (derivations: formulas.costs)
    for op in ("_softmax_backward_data", "_log_softmax_backward_data"):
        assert one(rec, f"aten.{op}").flops == 4 * 64 == _kernel(op, 64, "backward")
    # dropout backward g * mask * scale: 2 multiplies per element (native_dropout_backward's registered formula;
    # on CPU F.dropout decomposes, so the formula is called directly)
    from tscope_callbacks.formulas import DEFAULT_REGISTRY

    s = torch.Size([4, 16])
    eager = DEFAULT_REGISTRY.lookup(torch.ops.aten.native_dropout_backward.default).flops(s, s, 2.0, out=s)
    assert eager == 2 * 64 == _kernel("native_dropout_backward", 64, "backward")
    # var_mean: var's work (mean accumulate 1, centre 1, square-accumulate 1) = 3 per input element; the mean is
    # already computed
    y = torch.randn(8, 8)
    rec = count(lambda: (torch.var_mean(y, 0), torch.var(y, 0)))
    assert one(rec, "aten.var_mean").flops == one(rec, "aten.var").flops == 3 * 64 == _kernel("var_mean", 64,
                                                                                               "forward")


def test_every_tabled_op_costs_the_same_in_a_kernel_as_its_per_element_entry():
    from tscope_callbacks.formulas.fused import _cost
    from tscope_callbacks.formulas.reductions import reduction_flops

    names = set(POINTWISE_COSTS) | set(REDUCTION_COSTS) | set(DROPOUT_COSTS) | {"gelu", "gelu_backward"}
    assert {n: _cost(n) for n in names} == {n: element_cost(n) for n in names}
    for name, (per_in, _) in REDUCTION_COSTS.items():  # per input element, as the eager formula's per-input term
        assert reduction_flops(per_in)(torch.Size([10, 7]), out=torch.Size([])) == 70 * _cost(name)


def test_eager_reductions_register_the_table():
    from tscope_callbacks.formulas import DEFAULT_REGISTRY

    s, o = torch.Size([6, 5]), torch.Size([6])
    checked = 0
    for name, (per_in, per_out) in REDUCTION_COSTS.items():
        packet = getattr(torch.ops.aten, name, None)
        if packet is None or "default" not in packet.overloads():
            continue
        f = DEFAULT_REGISTRY.lookup(packet.default)
        assert f is not None and f.flops(s, out=o) == 30 * per_in + 6 * per_out, name
        checked += 1
    assert checked >= 10
