"""Roofline analysis on hand-made profiles: exact per-op numbers, TF32, rows vs totals, grouping, model level."""

from __future__ import annotations

import functools
import json
import math

import pytest
import torch
from profiles import a100, make_profile, matmul, op, pointwise, toy_profile

import tscope_callbacks as ts
from tscope_callbacks import api
from tscope_callbacks import api as specs_mod
from tscope_callbacks.devices.spec import DeviceSpec

MM_FLOPS = 2 * 4096**3  # 137438953472
MM_BYTES = 3 * 4096 * 4096 * 2  # A, B read + C written, bf16: 100663296

# these tests check the roofline arithmetic itself: no shape-aware kernel model on top of it
roofline = functools.partial(api.roofline, kernel_model=False)


def test_bf16_matmul_on_a100_is_compute_bound_with_exact_estimate():
    rep = roofline(make_profile([matmul(4096, 4096, 4096, time_s=1e-3)]), a100())
    (o,) = rep.ops
    assert (o.flops, o.bytes) == (137438953472, 100663296) == (MM_FLOPS, MM_BYTES)
    assert o.precision == "bf16" and o.matrix and o.peak == 312e12
    assert o.intensity == pytest.approx(1365.333, abs=1e-3)  # 2*4096/6 FLOP/B
    assert rep.roofs[0].ridge == pytest.approx(153.016, abs=1e-3)  # 312e12 / 2.039e12
    assert o.bound == "compute"
    assert o.estimate_s == MM_FLOPS / 312e12  # compute term wins: 0.44051 ms
    assert o.estimate_s * 1e3 == pytest.approx(0.4405, abs=1e-4)
    assert o.pct_of_roof == pytest.approx(0.44051, abs=1e-5)  # estimate / 1 ms
    assert rep.rows["total"][0].recoverable_s == pytest.approx(1e-3 - MM_FLOPS / 312e12)


def test_relu_fp32_is_memory_bound_on_the_vector_roof():
    n = 1 << 26
    rep = roofline(make_profile([pointwise(n, time_s=0.5e-3)]), a100())
    (o,) = rep.ops
    assert (o.flops, o.bytes) == (n, 536870912)  # 2^26 FLOPs; read + write 2^26 fp32 = 2*2^26*4
    assert not o.matrix and o.peak == 19.5e12  # vector fp32 roof
    assert o.intensity == 0.125 < rep.roofs[0].ridge
    assert o.bound == "memory"
    assert o.estimate_s == 536870912 / 2.039e12  # 0.2633 ms
    assert rep.rows["layer_phase"][0].bound == "memory"


@pytest.mark.parametrize(("mode", "prec", "peak"), [("highest", "fp32", 19.5e12), ("high", "tf32", 156e12),
                                                    ("medium", "tf32", 156e12)])
def test_tf32_switches_fp32_matmul_roof(mode, prec, peak):
    prof = make_profile([matmul(4096, 4096, 4096, dtype="float32"), pointwise(1024)], float32_matmul_precision=mode)
    rep = roofline(prof, a100())
    mm, pw = rep.ops
    assert (mm.precision, mm.peak) == (prec, peak)
    assert mm.estimate_s == MM_FLOPS / peak  # 7.05 ms at fp32, 0.881 ms at tf32
    assert (pw.precision, pw.peak) == ("fp32", 19.5e12)  # pointwise never uses the TF32 matrix roof
    assert rep.summary.mfu_precision == prec and rep.summary.mfu_peak_flops == peak


def test_tf32_needs_a_chip_with_tf32():
    v100ish = DeviceSpec(name="old", flops={"fp32": 15.7e12, "fp16": 125e12}, bandwidth=900e9,
                         vector_flops={"fp32": 15.7e12})
    prof = make_profile([matmul(256, 256, 256, dtype="float32")], float32_matmul_precision="high")
    assert roofline(prof, v100ish).ops[0].precision == "fp32"


def _sum(rows, attr):
    vals = [getattr(r, attr) for r in rows]
    return sum(v for v in vals if v is not None)


@pytest.mark.parametrize("timed", [True, False])
@pytest.mark.parametrize("kind", ["layer", "layer_total", "category", "op"])
def test_totals_equal_sum_of_rows(kind, timed):
    rep = roofline(toy_profile(timed), a100(), group_small=0.05)
    t = rep.totals
    for rows in ({"layer": rep.rows["layer_phase"], "layer_total": rep.rows["layer"], "category": rep.rows["category"],
                  "op": rep.rows["op_name"]}[kind], rep.table(kind), rep.table(kind, top=2)):
        assert _sum(rows, "flops") == t.flops == rep.summary.total_flops  # integers: exact
        assert _sum(rows, "bytes") == t.bytes
        assert _sum(rows, "n_ops") == t.n_ops == 12  # view ops included in totals
        assert _sum(rows, "estimate_s") == pytest.approx(t.estimate_s, rel=1e-12)
        if timed:
            assert _sum(rows, "measured_s") == pytest.approx(t.measured_s, rel=1e-12)


def test_grouping_keeps_totals_and_names_the_group():
    rep = roofline(toy_profile(), a100(), group_small=0.05)
    rows = rep.table("layer")
    other = [r for r in rows if r.kind == "other"]
    # under 5% of op time (3.847 ms) AND of FLOPs: optimizer 0.15 ms (3.9%), act fwd 0.1 ms, norm fwd 0.056 ms,
    # blocks.1 fwd 0.04 ms; act bwd (0.2 ms = 5.2%) stays
    assert [r.name for r in other] == ["(other 4 layers)"]
    assert other[0].n_ops == 6  # foreach_add, gelu, norm + add + mul, nonzero
    assert len(rows) == len(rep.rows["layer_phase"]) - 4 + 1
    # op table at 5%: aten.mm (86%) and gelu_backward (5.2%) stay, the 7 other op names are grouped
    assert [r.name for r in rep.table("op")] == ["aten.mm", "aten.gelu_backward", "(other 7 ops)"]
    # no share threshold, top=3: the three largest stay, the remaining 6 are grouped
    rows = roofline(toy_profile(), a100(), group_small=0).table("op", top=3)
    assert [r.name for r in rows] == ["aten.mm", "aten.gelu_backward", "aten._foreach_add_", "(other 6 ops)"]


def test_rows_per_layer_and_phase_with_types_and_view_ops():
    rep = roofline(toy_profile(), a100())
    keys = {(r.layer, r.phase) for r in rep.rows["layer_phase"]}
    assert ("blocks.0.fc", "forward") in keys and ("blocks.0.fc", "backward") in keys and ("", "optimizer") in keys
    fc_bwd = next(r for r in rep.rows["layer_phase"] if (r.layer, r.phase) == ("blocks.0.fc", "backward"))
    assert fc_bwd.type == "Linear" and fc_bwd.flops == 2 * MM_FLOPS and fc_bwd.measured_s == pytest.approx(2.2e-3)
    assert fc_bwd.estimate_s == pytest.approx(2 * MM_FLOPS / 312e12)
    # view op: its own "(view ops)" row in the op table, never an op-name row; counted in its layer and totals
    names = [r.name for r in rep.rows["op_name"]]
    assert "(view ops)" in names and "aten.view" not in names
    fc_fwd = next(r for r in rep.rows["layer_phase"] if (r.layer, r.phase) == ("blocks.0.fc", "forward"))
    assert fc_fwd.n_ops == 2 and fc_fwd.measured_s == pytest.approx(0.801e-3)
    total = next(r for r in rep.rows["layer"] if r.layer == "blocks.0.fc")
    assert total.phase == "total" and total.flops == 3 * MM_FLOPS


def test_inclusive_rows_include_children():
    rep = roofline(toy_profile(), a100())
    inc = {r.layer: r for r in rep.rows["inclusive"]}
    assert inc[""].flops == rep.summary.total_flops and inc[""].n_ops == 12
    # blocks.1 = its own nonzero + blocks.1.fc matmul + blocks.1.norm (norm, add, mul)
    assert inc["blocks.1"].n_ops == 5 and inc["blocks.1"].type == "Block"
    assert inc["blocks.1"].flops == 2 * 4096 * 1024 * 4096 + 5 * (1 << 22) + 128


def test_recompute_is_its_own_phase():
    prof = make_profile([matmul(64, 64, 64, layer="a", time_s=1e-5),
                         matmul(64, 64, 64, layer="a", phase="recompute", time_s=1e-5)])
    rep = roofline(prof, a100())
    assert {r.phase for r in rep.rows["layer_phase"]} == {"forward", "recompute"}
    est = {p: sum(o.estimate_s for o in rep.ops if o.phase == p) for p in ("forward", "recompute")}
    assert est["recompute"] == est["forward"] > 0


def test_uncounted_time_fraction_and_bound_fractions():
    rep = roofline(toy_profile(), a100())
    op_time = sum(o.time_s for o in rep.ops)  # 3.847 ms
    assert rep.summary.op_time_s == pytest.approx(op_time)
    assert rep.summary.uncounted_time_frac == pytest.approx(0.04e-3 / op_time)  # aten.nonzero
    assert rep.summary.overhead_time_frac == pytest.approx(1e-6 / op_time)  # aten.view
    # compute: the 4 matmuls (0.8 + 0.3 + 1.2 + 1.0 ms)
    assert rep.summary.compute_bound_time_frac == pytest.approx(3.3e-3 / op_time)
    fr = (rep.summary.compute_bound_time_frac, rep.summary.memory_bound_time_frac, rep.summary.uncounted_time_frac, rep.summary.overhead_time_frac)
    assert sum(fr) == pytest.approx(1.0)
    assert rep.summary.uncounted_ops == {"aten.nonzero": 1}


def test_model_level_mfu_mbu_and_scalars():
    prof = toy_profile()
    rep = roofline(prof, a100())
    assert rep.summary.measured_step_s == 4e-3 and rep.summary.step_time_source == "unprofiled-median"  # not the 9 ms wall
    assert rep.summary.mfu_precision == "bf16" and rep.summary.mfu_peak_flops == 312e12
    # MFU counts model FLOPs: forward and backward, not the optimizer update (the toy's _foreach_add_, 2**24 FLOPs)
    assert prof.model_flops == prof.total_flops - (1 << 24) == rep.summary.model_flops
    assert rep.summary.mfu == pytest.approx(prof.model_flops / 4e-3 / 312e12)
    assert rep.summary.hfu == pytest.approx(prof.total_flops / 4e-3 / 312e12)
    assert rep.summary.mbu == pytest.approx(prof.total_bytes / 4e-3 / 2.039e12)
    assert rep.summary.achieved_tflops == pytest.approx(prof.total_flops / 4e-3 / 1e12)
    assert rep.summary.flop_coverage == pytest.approx(prof.coverage())
    assert rep.summary.dominant_precision == "bf16"
    sc = rep.scalars
    assert set(sc) == {"mfu", "hfu", "mbu", "achieved_tflops", "measured_step_ms", "estimated_step_ms",
                       "compute_bound_time_frac", "memory_bound_time_frac", "flop_coverage"}  # bare keys
    assert sc["measured_step_ms"] == pytest.approx(4.0)
    assert sc["estimated_step_ms"] == pytest.approx(rep.summary.estimated_step_s * 1e3)
    assert all(isinstance(v, float) and math.isfinite(v) for v in sc.values())
    # the bound shares are of the measured 4 ms step, as the report's Time line and the page's split give them (the
    # logged scalar was the share of the 3.847 ms op time): the compute-bound matmuls, 0.8 + 0.3 + 1.2 + 1.0 = 3.3 ms
    assert sc["compute_bound_time_frac"] == pytest.approx(3.3e-3 / 4e-3)
    assert sc["compute_bound_time_frac"] == pytest.approx(rep.time_split.compute_bound_s / rep.time_split.step_s)
    assert sc["memory_bound_time_frac"] == pytest.approx(rep.time_split.memory_bound_s / 4e-3)
    assert f"{sc['compute_bound_time_frac']:.1%}" in rep.to_markdown()  # the same share on the Time line


def test_untimed_estimation_mode():
    rep = roofline(toy_profile(timed=False), a100())
    assert not rep.timed and rep.summary.measured_step_s is None and rep.summary.mfu is None
    assert all(r.measured_s is None and r.attained is None and r.recoverable_s is None for r in rep.rows["layer_phase"])
    by = {p: sum(o.estimate_s for o in rep.ops if o.phase == p) for p in ("forward", "backward", "recompute", "optimizer")}
    bwd = 2 * MM_FLOPS / 312e12 + (2 * (1 << 24) * 2) / 2.039e12  # 2 matmuls + gelu_backward (memory)
    assert by["backward"] == pytest.approx(bwd)
    assert rep.summary.roof_step_s == pytest.approx(sum(by.values())) == rep.totals.estimate_s
    assert "mfu" not in rep.scalars and "estimated_step_ms" in rep.scalars
    # model FLOPs over the estimated step, which includes the update's time but not its FLOPs
    assert rep.summary.estimated_mfu == pytest.approx((rep.summary.total_flops - (1 << 24)) /
                                                      rep.summary.estimated_step_s / 312e12)


def test_achievable_roof_beside_datasheet():
    ach = DeviceSpec(name="A100 measured", flops={"bf16": 250e12, "fp32": 19e12}, bandwidth=1.7e12,
                     vector_flops={"fp32": 18e12, "bf16": 30e12}, measured=True)
    prof = make_profile([matmul(4096, 4096, 4096, time_s=1e-3)])
    for rep in (roofline(prof, a100(), achievable=ach), roofline(prof, a100(achievable=ach))):
        row = rep.rows["layer_phase"][0]
        assert row.attained == pytest.approx(MM_FLOPS / 312e12 / 1e-3)
        assert row.attained_achievable == pytest.approx(MM_FLOPS / 250e12 / 1e-3)
        assert rep.summary.achievable_roof == "A100 measured"
    assert roofline(prof, a100()).rows["layer_phase"][0].attained_achievable is None


def test_category_comparison_ratio():
    rep = roofline(toy_profile(), a100())
    mm = next(c for c in rep.rows["category"] if c.category == "matmul")
    est = 3 * MM_FLOPS / 312e12 + 2 * 4096 * 1024 * 4096 / 312e12
    assert mm.estimate_s == pytest.approx(est) and mm.measured_s == pytest.approx(3.3e-3)
    assert mm.ratio == pytest.approx(3.3e-3 / est)


def test_zero_byte_and_zero_work_ops_stay_json_safe():
    prof = make_profile([op("aten.fill_", "x", flops=10, time_s=1e-6), op("aten.empty", "x", time_s=1e-6),
                         op("aten.t", "x", category="view", time_s=1e-6)])
    rep = roofline(prof, a100())
    fill = rep.ops[0]
    assert fill.intensity is None and fill.bound == "compute"  # FLOPs with no bytes: no finite intensity
    assert rep.ops[1].bound == "overhead" and rep.ops[2].bound == "overhead"
    json.dumps(rep.to_dict(), allow_nan=False)


def test_spec_resolved_by_name_from_meta(monkeypatch):
    seen = []

    def fake(name="auto"):
        seen.append(name)
        return a100()

    monkeypatch.setattr(specs_mod, "get_device_spec", fake)
    rep = roofline(make_profile([matmul(64, 64, 64)], device_name="NVIDIA A100-SXM4-80GB"))
    assert seen == ["NVIDIA A100-SXM4-80GB"] and rep.device.name == "NVIDIA A100-SXM4-80GB"
    roofline(make_profile([matmul(64, 64, 64)], device_name=""))
    roofline(make_profile([matmul(64, 64, 64)]), "A100")
    assert seen[1:] == ["auto", "A100"]


def test_precision_override_for_matrix_ops_only():
    prof = make_profile([matmul(4096, 4096, 4096), pointwise(1024, dtype="bfloat16")])
    rep = roofline(prof, a100(), precision="int8")
    assert [(o.precision, o.roof_precision, o.peak) for o in rep.ops] == [("int8", "int8", 624e12),
                                                                                ("bf16", "bf16", 39e12)]
    # the A100 has no fp8 units: an fp8 what-if runs on the fp16 roof, and the report says so
    rep = roofline(prof, a100(), precision="fp8")
    mm = rep.ops[0]
    assert (mm.precision, mm.roof_precision, mm.peak) == ("fp8", "fp16", 312e12)
    assert rep.summary.mfu_precision == "fp16" and "fp16 matrix 312 TFLOP/s" in rep.to_markdown()


def test_roof_fallbacks_follow_the_spec():
    # no bf16 vector rate listed: bf16 pointwise runs on the fp32 vector roof; no bf16 units: fp32 matrix roof
    old = DeviceSpec(name="old", flops={"fp32": 14e12}, bandwidth=900e9, vector_flops={"fp32": 14e12})
    rep = roofline(make_profile([matmul(1024, 1024, 1024), pointwise(1024, dtype="bfloat16")]), old)
    assert [(o.precision, o.roof_precision, o.matrix) for o in rep.ops] == [("bf16", "fp32", True),
                                                                                  ("bf16", "fp32", False)]
    assert rep.summary.mfu_precision == "fp32" and rep.summary.mfu_peak_flops == 14e12


def test_cpu_profile_uses_the_measured_cpu_roof(monkeypatch):
    import torch

    seen = []
    monkeypatch.setattr(specs_mod, "get_device_spec", lambda d="auto": seen.append(d) or a100())
    roofline(make_profile([pointwise(8)], device_name="cpu"))
    assert seen == [torch.device("cpu")]


def test_the_wall_time_of_a_captured_region_is_never_a_step_time():
    ops = [matmul(4096, 4096, 4096)]
    meta_run = roofline(make_profile(ops, wall_time_s=0.2, device="meta"), a100())
    assert meta_run.summary.measured_step_s is None and meta_run.summary.mfu is None
    slowed = roofline(make_profile([matmul(4096, 4096, 4096)], wall_time_s=1e-3, device="cuda"), a100())
    assert not slowed.timed and slowed.summary.measured_step_s is None and slowed.summary.mfu is None
    given = roofline(make_profile([matmul(4096, 4096, 4096)], wall_time_s=1e-3, device="cuda",
                                  step_time_s=2e-3, step_time_basis="device-busy"), a100())
    assert given.summary.mfu == pytest.approx(MM_FLOPS / 2e-3 / 312e12)  # 0.2202
    assert "measured 2 ms (device busy: union of kernel intervals)" in given.to_markdown()


def test_anything_but_a_profiled_step_is_one_clear_error():
    with pytest.raises(TypeError, match="needs a profiled step"):
        roofline({"ops": []}, a100())


def test_the_precision_label_says_what_ran_for_an_integer_only_model():
    # integer ops are placed on the fp32 vector roof, but the label said "fp32 dominant" for a model that ran no
    # float op at all: it now names the dtype that ran (ids * 31 + 7, % 1000, sum: all int64)
    class Hash(torch.nn.Module):
        def forward(self, ids):
            return ((ids * 31 + 7) % 1000).sum(-1)

    ids = torch.randint(0, 1000, (8, 64))
    with ts.profile(Hash()) as p:
        Hash()(ids)
    rep = ts.roofline(p.result, ts.get_device_spec("a100"))
    assert rep.summary.dominant_precision == "int64" and rep.summary.mfu_precision == "fp32"
    assert "int64 dominant" in rep.to_markdown()
    lin = torch.nn.Linear(8, 8)
    with ts.profile(lin) as q:
        lin(torch.randn(4, 8))
    assert ts.roofline(q.result, ts.get_device_spec("a100")).summary.dominant_precision == "fp32"
