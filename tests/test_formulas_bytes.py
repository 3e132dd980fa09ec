"""The generic ideal-bytes rule: in-place, out=, broadcast, duplicates, views, lists, dtypes."""

from __future__ import annotations

import torch
from formula_utils import count, one, only

from tscope_callbacks.formulas import count_op, generic_bytes
from tscope_callbacks.formulas.bytes import tensor_bytes, unique_bytes

aten = torch.ops.aten


def test_inplace_add_reads_and_writes_self_once():
    x, y = torch.randn(4, 8), torch.randn(4, 8)
    c = one(count(lambda: x.add_(y)), "aten.add_")
    # read x 128 + y 128 = 256; write x 128 (the returned alias of x is not counted again)
    assert (c.flops, c.bytes_read, c.bytes_written) == (32, 256, 128)
    o = one(count(lambda: x.add(y)), "aten.add")
    assert (o.flops, o.bytes_read, o.bytes_written) == (32, 256, 128)  # the same traffic out of place


def test_out_argument_is_written_not_read():
    a, b, out = torch.randn(4, 8), torch.randn(8, 3), torch.empty(4, 3)
    c = one(count(lambda: torch.mm(a, b, out=out)), "aten.mm")
    # read a 128 + b 96 = 224; write out 48; mm.out returns the out tensor, not counted twice
    assert (c.flops, c.bytes_read, c.bytes_written) == (192, 224, 48)
    assert c.input_shapes == [[4, 8], [8, 3]]  # out= is not an input


def test_broadcast_stride0_input_counts_real_storage():
    x, bias = torch.randn(64, 32), torch.randn(32)
    c = one(count(lambda: x + bias), "aten.add")
    # read x 64*32*4 = 8192 + bias 32*4 = 128 (broadcast inside the kernel); write 8192
    assert (c.bytes_read, c.bytes_written) == (8192 + 128, 8192)
    e = bias.expand(64, 32)  # an explicit stride-0 view: its real storage is 32 elements
    assert tensor_bytes(e) == 128
    c2 = one(count(lambda: x + e), "aten.add")
    assert c2.bytes_read == 8192 + 128


def test_duplicate_and_aliased_inputs_counted_once():
    x = torch.randn(16, 16)
    c = one(count(lambda: x * x), "aten.mul")
    assert (c.bytes_read, c.bytes_written) == (1024, 1024)  # x read once
    m = one(count(lambda: torch.mm(x, x.t())), "aten.mm")
    assert m.bytes_read == 1024  # x and its transpose view share one storage extent
    halves = one(count(lambda: torch.add(x[:8], x[8:])), "aten.add")
    assert halves.bytes_read == 1024  # disjoint slices of one storage: both halves really read
    overlap = one(count(lambda: torch.add(x[:12], x[4:])), "aten.add")
    assert overlap.bytes_read == 1024  # 12 rows each, overlapping: the union is the whole 16 rows


def test_overlapping_as_strided_counts_referenced_memory():
    base = torch.randn(10)
    win = base.as_strided((8, 3), (1, 1))  # sliding windows: 24 elements over 10 floats
    assert tensor_bytes(win) == 10 * 4
    c = one(count(lambda: win.sum()), "aten.sum")
    assert c.flops == 24 and c.bytes_read == 40


def test_scalars_and_none_move_nothing():
    x = torch.randn(8)
    c = one(count(lambda: x.add(2.5)), "aten.add")
    assert (c.bytes_read, c.bytes_written) == (32, 32)


def test_tensor_lists_counted_elementwise():
    a, b = torch.randn(3, 4), torch.randn(5, 4)
    c = one(count(lambda: torch.cat([a, b])), "aten.cat")
    # 0 FLOPs; read (12 + 20) * 4 = 128; write 32 * 4 = 128
    assert (c.flops, c.bytes_read, c.bytes_written, c.category) == (0, 128, 128, "memory")
    assert c.input_shapes == [[3, 4], [5, 4]]
    f = one(count(lambda: torch._foreach_mul_([a, b], 2.0)), "aten._foreach_mul_")
    assert (f.flops, f.bytes_read, f.bytes_written) == (32, 128, 128)  # read and written in place


def test_copy_and_fills_do_not_read_the_destination():
    dst, src = torch.empty(4, 8), torch.randn(4, 8, dtype=torch.float64)
    rec = count(lambda: (dst.copy_(src), dst.fill_(1.0), dst.zero_(), torch.zeros_like(dst)))
    assert (one(rec, "aten.copy_").bytes_read, one(rec, "aten.copy_").bytes_written) == (256, 128)
    for name in ("aten.fill_", "aten.zero_", "aten.zeros_like"):
        c = one(rec, name)
        assert (c.bytes_read, c.bytes_written) == (0, 128), name


def test_gathers_read_only_what_they_gather():
    table = torch.randn(1000, 4)
    idx = torch.tensor([3, 7, 7])
    rec = count(lambda: (table.index_select(0, idx), table[idx], torch.gather(table, 0, idx[:, None].expand(3, 4))))
    sel = one(rec, "aten.index_select")
    assert (sel.bytes_read, sel.bytes_written) == (24 + 3 * 16, 48)  # indices + 3 gathered rows; not 16000 B
    ind = one(rec, "aten.index")
    assert (ind.bytes_read, ind.bytes_written) == (24 + 48, 48)
    g = one(rec, "aten.gather")
    assert g.bytes_read == 24 + 48  # the expanded index is 3 int64s of storage


def test_index_put_writes_the_indexed_region_only():
    x = torch.zeros(100, 4)
    idx = torch.tensor([1, 5])
    vals = torch.ones(2, 4)
    c = one(count(lambda: x.index_put_((idx,), vals)), "aten.index_put_")
    # read indices 16 + values 32; write 2 rows * 4 * 4 = 32 (not the 1600 B tensor)
    assert (c.bytes_read, c.bytes_written) == (48, 32)
    acc = one(count(lambda: x.index_put_((idx,), vals, accumulate=True)), "aten.index_put_")
    assert (acc.bytes_read, acc.bytes_written) == (48 + 32, 32)  # accumulate also reads the targets


def test_dtype_is_first_floating_input():
    ids = torch.tensor([1, 2])
    emb = torch.randn(5, 3, dtype=torch.float16)
    c = one(count(lambda: torch.nn.functional.embedding(ids, emb)), "aten.embedding")
    assert c.dtype == "float16"  # weight (arg 0) is the floating input
    i = one(count(lambda: ids + 1), "aten.add")
    assert i.dtype == "int64"
    r = one(count(lambda: torch.randn(3, dtype=torch.bfloat16)), "aten.randn")
    assert r.dtype == "bfloat16"  # no tensor input: the output's dtype


def test_generic_bytes_matches_count_op_and_views_are_zero():
    x, y = torch.randn(4, 8), torch.randn(8)
    out = aten.add.Tensor(x, y)
    c = count_op(aten.add.Tensor, (x, y), {}, out)
    assert generic_bytes(aten.add.Tensor, (x, y), {}, out) == (c.bytes_read, c.bytes_written) == (160, 128)
    v = aten.view.default(x, [32])
    assert generic_bytes(aten.view.default, (x, [32]), {}, v) == (0, 0)
    assert unique_bytes([x, x, x.t(), y]) == 128 + 32


def test_want_shapes_false_skips_shapes_only():
    x = torch.randn(4, 8)
    out = aten.mul.Tensor(x, x)
    c = count_op(aten.mul.Tensor, (x, x), {}, out, want_shapes=False)
    assert (c.input_shapes, c.output_shapes, c.flops, c.bytes_read) == ([], [], 32, 128)


def test_meta_tensors_count_like_real_ones():
    x = torch.empty(64, 32, device="meta")
    b = torch.empty(32, device="meta")
    rec = count(lambda: (x + b, x * x))
    add, mul = one(rec, "aten.add"), one(rec, "aten.mul")
    assert (add.bytes_read, add.bytes_written) == (8192 + 128, 8192)
    assert mul.bytes_read == 8192  # distinct meta tensors are not confused with each other
    assert only(rec, "aten.add")[0].flops == 2048
