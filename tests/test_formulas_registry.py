"""Registry contract: overrides, duplicates, fallbacks, uncounted custom ops, failing formulas."""

from __future__ import annotations

import pytest
import torch
from formula_utils import count, one

import tscope_callbacks.formulas as formulas
from tscope_callbacks.formulas import DEFAULT_REGISTRY, Formula, FormulaRegistry, count_op, formula_errors
from tscope_callbacks.formulas.registry import op_key
from tscope_callbacks.records import CATEGORIES

aten = torch.ops.aten

_lib = torch.library.Library("tscope_formulas_test", "DEF")
_lib.define("mystery(Tensor x) -> Tensor")
_lib.impl("mystery", lambda x: x * 2, "CompositeExplicitAutograd")
_lib.define("myview(Tensor(a) x) -> Tensor(a)")
_lib.impl("myview", lambda x: x.view(x.shape), "CompositeExplicitAutograd")


def test_importing_the_package_registers_every_family():
    keys = set(DEFAULT_REGISTRY.keys())
    for k in ["aten.mm", "aten.convolution_backward", "aten._scaled_dot_product_flash_attention_for_cpu",
              "aten.native_layer_norm", "aten._softmax", "aten.gelu", "aten.sum", "aten.embedding",
              "aten.nll_loss_forward", "aten.native_dropout", "aten._fused_adam_", "aten._foreach_add_", "aten.cat",
              "aten.view", "aten.linear", "aten.max_pool2d_with_indices"]:
        assert k in keys, k
    assert {f.category for f in DEFAULT_REGISTRY._table.values()} <= set(CATEGORIES) - {"other"}
    assert set(formulas.__all__) >= {"count_op", "OpCount", "formula_errors"}


def test_user_override_via_with_overrides_and_default_untouched():
    x, w = torch.randn(4, 8), torch.randn(8, 3)

    def my_mm(a, b, *args, out=None, **kwargs):
        return 7

    reg = DEFAULT_REGISTRY.with_overrides({aten.mm: my_mm})
    assert one(count(lambda: torch.mm(x, w), reg), "aten.mm").flops == 7
    c = one(count(lambda: torch.mm(x, w), reg), "aten.mm")
    assert c.category == "matmul" and c.counted  # a bare function keeps the previous category
    assert one(count(lambda: torch.mm(x, w)), "aten.mm").flops == 192  # the default registry is unchanged
    reg2 = DEFAULT_REGISTRY.with_overrides({aten.mm.default: Formula(category="other", flops=lambda *a, **k: 1)})
    assert one(count(lambda: torch.mm(x, w), reg2), "aten.mm").flops == 1  # overload keys win over packets


def test_duplicate_registration_rejected():
    with pytest.raises(ValueError, match="already registered"):
        DEFAULT_REGISTRY.register(aten.mm, Formula(category="matmul", flops=lambda *a, **k: 0))
    reg = FormulaRegistry()
    reg.register("aten.foo", Formula(category="other"))
    with pytest.raises(ValueError):
        reg.register("aten.foo", Formula(category="other"))
    reg.register("aten.foo", Formula(category="memory"), override=True)
    assert reg._table[op_key("aten.foo")].category == "memory"


def test_unknown_custom_op_is_uncounted_but_bytes_are_computed():
    x = torch.randn(4, 8)
    c = one(count(lambda: torch.ops.tscope_formulas_test.mystery(x)), "tscope_formulas_test.mystery")
    # no formula: counted False, category other, 0 FLOPs; generic bytes: read x 128, write 128
    assert (c.counted, c.category, c.flops, c.bytes_read, c.bytes_written) == (False, "other", 0, 128, 128)
    assert c.dtype == "float32"


def test_custom_view_op_is_known_zero_by_alias_fallback():
    x = torch.randn(4, 8)
    c = one(count(lambda: torch.ops.tscope_formulas_test.myview(x)), "tscope_formulas_test.myview")
    assert (c.counted, c.category, c.flops, c.bytes_read, c.bytes_written) == (True, "view", 0, 0, 0)


def test_failing_formula_is_recorded_not_raised():
    def broken(*args, out=None, **kwargs):
        raise ZeroDivisionError("boom")

    reg = DEFAULT_REGISTRY.with_overrides({aten.mm: broken})
    x = torch.randn(2, 2)
    c = one(count(lambda: torch.mm(x, x), reg), "aten.mm")
    assert (c.counted, c.flops, c.category) == (False, 0, "matmul")
    assert (c.bytes_read, c.bytes_written) == (16, 16)  # bytes still computed
    assert ("aten.mm.default", "flop ZeroDivisionError: boom") in formula_errors()


def test_failing_byte_formula_falls_back_to_generic_rule():
    def bad_bytes(args, kwargs, out):
        raise RuntimeError("bad")

    reg = DEFAULT_REGISTRY.copy()
    reg.register(aten.mm, Formula(category="matmul", flops=lambda a, b, **k: 1, bytes=bad_bytes), override=True)
    x = torch.randn(2, 2)
    c = count_op(aten.mm.default, (x, x), {}, aten.mm.default(x, x), reg)
    assert (c.flops, c.counted, c.bytes_read, c.bytes_written) == (1, True, 16, 16)
    assert any(op == "aten.mm.default" and msg.startswith("bytes RuntimeError") for op, msg in formula_errors())


def test_lookup_order_overload_packet_fallbacks():
    assert DEFAULT_REGISTRY.lookup(aten.max.other).category == "pointwise"  # exact overload
    assert DEFAULT_REGISTRY.lookup(aten.max.dim).category == "reduction"  # packet
    assert DEFAULT_REGISTRY.lookup(aten.nextafter.default).category == "pointwise"  # tag fallback
    assert DEFAULT_REGISTRY.lookup(aten.diagonal.default).category == "view"
    assert DEFAULT_REGISTRY.lookup(torch.ops.tscope_formulas_test.mystery.default) is None
    assert DEFAULT_REGISTRY.lookup(torch.ops.profiler._record_function_exit._RecordFunction).category == "view"


def test_copy_is_independent():
    reg = DEFAULT_REGISTRY.copy()
    reg.register("tscope_formulas_test.mystery", Formula(category="pointwise", flops=lambda x, out=None: 99))
    x = torch.randn(3)
    assert one(count(lambda: torch.ops.tscope_formulas_test.mystery(x), reg), "tscope_formulas_test.mystery").flops == 99
    assert DEFAULT_REGISTRY.lookup(torch.ops.tscope_formulas_test.mystery.default) is None


def test_training_step_of_a_small_model_is_fully_counted():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.GELU(),
                                torch.nn.MaxPool2d(2), torch.nn.Flatten(), torch.nn.Linear(36, 10),
                                torch.nn.LayerNorm(10), torch.nn.Dropout(0.1))
    opt = torch.optim.AdamW(model.parameters(), foreach=True)
    x, y = torch.randn(2, 3, 8, 8), torch.tensor([1, 2])

    def step():
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        opt.zero_grad()

    rec = count(step)
    assert [n for n, c in rec if not c.counted] == []
    assert formulas.OpCount.__slots__  # slots dataclass


def test_inference_mode_composites_match_the_decomposed_counts():
    torch.manual_seed(0)

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)
            self.bn = torch.nn.BatchNorm2d(4)
            self.gn = torch.nn.GroupNorm(2, 4)
            self.ln = torch.nn.LayerNorm(16)
            self.drop = torch.nn.Dropout(0.1)

        def forward(self, x, y):
            h = self.gn(self.bn(self.conv(x))).flatten(2)  # (2, 4, 16)
            h = self.drop(self.ln(h)).reshape(2, 4, 2, 8).transpose(1, 2).contiguous()
            a = torch.nn.functional.scaled_dot_product_attention(h, h, h, is_causal=True)
            return torch.nn.functional.cross_entropy(a.softmax(-1).flatten(1), y)

    net = Net().eval()
    x, y = torch.randn(2, 3, 4, 4), torch.tensor([1, 5])
    with torch.inference_mode():
        inf = count(lambda: net(x, y))
    with torch.no_grad():
        ng = count(lambda: net(x, y))
    names = {n for n, _ in inf}
    assert {"aten.conv2d", "aten.layer_norm", "aten.scaled_dot_product_attention", "aten.cross_entropy_loss"} <= names
    assert all(c.counted for _, c in inf)
    by_cat = {}
    for recs, key in ((inf, "inf"), (ng, "ng")):
        for _, c in recs:
            if c.category != "memory":
                by_cat[(key, c.category)] = by_cat.get((key, c.category), 0) + c.flops
    for cat in ("conv", "norm", "attention"):
        assert by_cat[("inf", cat)] == by_cat[("ng", cat)], cat
    # cross_entropy_loss (category loss) = the decomposed _log_softmax (softmax) + nll_loss_forward (loss)
    assert sum(c.flops for _, c in inf) == sum(c.flops for _, c in ng)
    # eval dropout returns its input: no bytes; contiguous of a transposed view copies it (read + write 512 B)
    assert one(inf, "aten.dropout").bytes_read == 0
    cont = one(inf, "aten.contiguous")
    assert (cont.bytes_read, cont.bytes_written) == (512, 512)
