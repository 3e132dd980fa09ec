"""The capture's memoized counter: every op of real training steps gets exactly the count ``count_op`` gives."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

import tscope_callbacks as ts
from tscope_callbacks.demo.model import GPTConfig, TinyGPT
from tscope_callbacks.formulas.apply import count_op
from tscope_callbacks.formulas.memo import CountCache


class _Compare(TorchDispatchMode):
    """Counts every op twice, memoized and fresh, and keeps the disagreements."""

    def __init__(self, cache: CountCache) -> None:
        super().__init__()
        self.cache, self.bad, self.n, self.embeddings = cache, [], 0, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func.namespace == "profiler":  # the optimizer's record_function annotations: never recorded
            return out
        self.n += 1
        self.embeddings += str(func).startswith("aten.embedding.")
        a, b = self.cache.count(func, args, kwargs, out), count_op(func, args, kwargs, out)
        if a != b:
            self.bad.append((str(func), a, b))
        return out


class ConvNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.pool = nn.MaxPool2d(2)
        self.drop = nn.Dropout(0.25)
        self.fc = nn.Linear(8 * 4 * 4, 10)

    def forward(self, x):
        x = self.drop(self.pool(torch.relu(self.bn(self.conv(x)))))
        return self.fc(x.flatten(1))


@pytest.mark.parametrize("case", ["gpt-adamw-foreach", "gpt-adamw-loop", "conv-sgd-momentum", "gpt-fused"])
def test_memoized_counts_equal_fresh_counts_on_real_steps(case: str) -> None:
    torch.manual_seed(0)
    if case.startswith("gpt"):
        model = TinyGPT(GPTConfig(vocab_size=64, seq_len=16, d_model=32, n_layer=2, n_head=2))
        x = torch.randint(0, 64, (4, 16))
        loss_fn = lambda: model.loss(x, x)  # noqa: E731
        kw = {"foreach": case.endswith("foreach")} if "fused" not in case else {"fused": True}
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1, **kw)
    else:
        model = ConvNet()
        x = torch.randn(4, 3, 8, 8)
        loss_fn = lambda: model(x).square().mean()  # noqa: E731
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, nesterov=True)
    cache = CountCache()
    mode = _Compare(cache)
    for _ in range(3):  # learning-rate dependent scalars change every step: still one entry per signature
        with mode:
            loss_fn().backward()
            for g in opt.param_groups:
                g["lr"] *= 0.5
            opt.step()
            opt.zero_grad()
    assert mode.bad == []
    assert cache.hits > mode.n // 2  # repeated blocks and steps hit
    # every miss was stored, except the value-dependent embedding lookups (distinct rows: counted every call)
    assert len(cache.memo) == cache.misses - mode.embeddings


def test_zero_and_nonzero_float_arguments_are_different_keys() -> None:
    # a dropout probability / weight decay of 0 changes the count; its exact value does not
    cache = CountCache()
    x = torch.randn(8, 8)
    f = torch.ops.aten.native_dropout.default
    nz = cache.count(f, (x, 0.5, True), {}, f(x, 0.5, True))
    again = cache.count(f, (x, 0.25, True), {}, f(x, 0.25, True))
    assert again is nz and cache.hits == 1
    zero_out = f(x, 0.0, True)
    assert cache.count(f, (x, 0.0, True), {}, zero_out) == count_op(f, (x, 0.0, True), {}, zero_out)
    assert cache.misses == 2


def test_aliasing_between_arguments_is_part_of_the_key() -> None:
    # x * x reads x once; x * y reads both: same shapes, different bytes
    cache = CountCache()
    f = torch.ops.aten.mul.Tensor
    x, y = torch.randn(64), torch.randn(64)
    same = cache.count(f, (x, x), {}, f(x, x))
    diff = cache.count(f, (x, y), {}, f(x, y))
    assert same.bytes_read == 64 * 4 and diff.bytes_read == 2 * 64 * 4  # 64 fp32 elements = 256 B per input


def test_profiles_share_the_cache_per_registry() -> None:
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 8))
    x = torch.randn(4, 8)
    with ts.profile(model) as p1:
        model(x).sum().backward()
    model.zero_grad(set_to_none=True)  # the same step again (not an accumulation into existing grads)
    from tscope_callbacks.capture.region import count_cache
    from tscope_callbacks.formulas import DEFAULT_REGISTRY

    hits = count_cache(DEFAULT_REGISTRY).hits
    with ts.profile(model) as p2:
        model(x).sum().backward()
    assert count_cache(DEFAULT_REGISTRY).hits - hits == len(p2.ops)  # the second step: every op a hit
    assert [(r.op, r.flops, r.bytes) for r in p1.ops] == [(r.op, r.flops, r.bytes) for r in p2.ops]


def test_views_are_keyed_by_shapes_and_dtypes_only() -> None:
    # a view's count is its shapes, dtype and category: the cheap key must still tell dtypes and shapes apart
    cache = CountCache()
    f = torch.ops.aten.view.default
    x32, x64 = torch.randn(4, 6), torch.randn(4, 6, dtype=torch.float64)
    a = cache.count(f, (x32, [24]), {}, f(x32, [24]))
    b = cache.count(f, (x64, [24]), {}, f(x64, [24]))
    c = cache.count(f, (x32, [6, 4]), {}, f(x32, [6, 4]))
    assert (a.dtype, b.dtype) == ("float32", "float64") and c.output_shapes == [[6, 4]]
    assert cache.misses == 3 and cache.hits == 0
    y = torch.randn(4, 6)  # another tensor of the same shape and dtype: a hit, the same count
    assert cache.count(f, (y, [24]), {}, f(y, [24])) is a and cache.hits == 1
    assert a.flops == a.bytes_read == a.bytes_written == 0 and a.category == "view"


def test_a_formula_added_later_is_not_hidden_by_the_memo() -> None:
    # counts memoized before a registry change are dropped: the new formula applies to the next call
    from tscope_callbacks.formulas import FormulaRegistry
    from tscope_callbacks.formulas.registry import Formula

    reg = FormulaRegistry()
    cache = CountCache(reg)
    f = torch.ops.aten.mul.Tensor
    x = torch.randn(8)
    before = cache.count(f, (x, x), {}, f(x, x))
    assert before.counted is False  # an empty registry: no formula
    reg.register("aten.mul", Formula(category="pointwise", flops=lambda *a, **k: 8))
    after = cache.count(f, (x, x), {}, f(x, x))
    assert after.counted is True and after.flops == 8 and after.category == "pointwise"


def test_hf_gpt2_step_memoized_counts_equal_fresh_counts() -> None:
    # the input-only key (outputs left out) on a real HF step: fused QKV splits, GELU, SDPA, cross-entropy, AdamW
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=64, n_positions=16))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ids = torch.randint(0, 64, (2, 16))
    cache = CountCache()
    mode = _Compare(cache)
    for _ in range(2):
        with mode:
            model(ids, labels=ids).loss.backward()
            opt.step()
            opt.zero_grad()
    assert mode.bad == [] and cache.hits > mode.n // 2


def test_ops_whose_output_shape_depends_on_values_are_keyed_by_their_outputs() -> None:
    # nonzero / masked_select / boolean indexing: same input metadata, different outputs -> different counts
    cache = CountCache()
    x = torch.randn(64)
    for f, make in [(torch.ops.aten.nonzero.default, lambda m: (m,)),
                    (torch.ops.aten.masked_select.default, lambda m: (x, m)),
                    (torch.ops.aten.index.Tensor, lambda m: (x, [m]))]:
        few, many = torch.zeros(64, dtype=torch.bool), torch.ones(64, dtype=torch.bool)
        few[:4] = True
        a = cache.count(f, make(few), {}, f(*make(few)))
        b = cache.count(f, make(many), {}, f(*make(many)))
        assert a == count_op(f, make(few), {}, f(*make(few))) and b == count_op(f, make(many), {}, f(*make(many)))
        assert a.bytes_written < b.bytes_written, f  # 4 vs 64 selected elements


def test_arguments_sharing_a_storage_are_keyed_with_their_offsets() -> None:
    # x[0:8] * x[4:12] reads 12 distinct elements, x[0:8] * x[8:16] reads 16: same shapes, strides and storage,
    # other offsets. The input-only key falls back to the full signature whenever two arguments share a storage
    cache = CountCache()
    f = torch.ops.aten.mul.Tensor
    x = torch.randn(16)
    reads = []
    for a, b in [(slice(0, 8), slice(4, 12)), (slice(0, 8), slice(8, 16)), (slice(0, 8), slice(4, 12))]:
        args = (x[a], x[b])
        c = cache.count(f, args, {}, f(*args))
        assert c == count_op(f, args, {}, f(*args))
        reads.append(c.bytes_read)
    assert reads == [12 * 4, 16 * 4, 12 * 4]  # fp32: 4 B an element
    assert cache.hits == 1 and cache.misses == 2


def test_a_new_default_dtype_is_not_hidden_by_the_memo() -> None:
    # an integer tensor times a Python float is of the default dtype: the key leaves outputs out, so a profile
    # started under another default dtype drops the memo (CountCache.refresh)
    cache = CountCache()
    f = torch.ops.aten.mul.Tensor
    n = torch.arange(8)
    a = cache.count(f, (n, 0.5), {}, f(n, 0.5))
    prev = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        b = cache.refresh().count(f, (n, 0.5), {}, f(n, 0.5))
    finally:
        torch.set_default_dtype(prev)
    assert a.bytes_written == 8 * 4 and b.bytes_written == 8 * 8  # 8 float32 vs 8 float64 results


def test_bool_list_arguments_are_part_of_the_input_key():
    # convolution_backward's output_mask (a bool list) took the full signature; it is now in the input-only key,
    # and masks that ask for other gradients (other outputs, other bytes written) stay different keys
    cache = CountCache()
    f = torch.ops.aten.convolution_backward.default
    x, w = torch.randn(2, 3, 8, 8), torch.randn(4, 3, 3, 3)
    g = torch.randn(2, 4, 6, 6)

    def call(mask):
        args = (g, x, w, [4], [1, 1], [0, 0], [1, 1], False, [0, 0], 1, mask)
        return args, f(*args)

    counts = []
    for mask in ([True, True, True], [True, True, False], [True, True, True]):
        args, out = call(mask)
        c = cache.count(f, args, {}, out)
        assert c == count_op(f, args, {}, out)
        counts.append(c)
    assert cache.misses == 2 and cache.hits == 1 and counts[2] is counts[0]
    # without the bias gradient: 4 float32 values (16 B) fewer written
    assert counts[0].bytes_written - counts[1].bytes_written == 4 * 4
