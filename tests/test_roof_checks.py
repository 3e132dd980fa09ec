"""Roofs checked against the data: a measured roof is an upper bound (widened, and said so, when an op beats it); a
datasheet roof beaten is explained; times of one device against another's roofs are a labelled what-if."""

from __future__ import annotations

import warnings

import pytest
from profiles import a100, make_profile, matmul, pointwise

import tscope_callbacks as ts
from tscope_callbacks import DeviceSpec

# a CPU roof measured too low (a small calibration GEMM): 1.43 GFLOP/s bf16, 10 GB/s
LOW = DeviceSpec(name="CPU (test, 2 threads)", flops={"fp32": 50e9, "bf16": 1.43e9}, bandwidth=10e9,
                 vector_flops={"fp32": 50e9}, measured=True, vendor="cpu")


def test_a_measured_roof_the_data_beats_is_widened():
    # lm_head-like bf16 GEMM 256x512x1024 = 268 MFLOP in 0.113 s -> 2.38 GFLOP/s: 166% of a 1.43 GFLOP/s roof
    mm = matmul(256, 1024, 512, layer="lm_head", time_s=0.113)
    rep = ts.roofline(make_profile([mm], device="cpu", device_name=LOW.name), LOW)
    o = rep.ops[0]
    assert o.peak == pytest.approx(2 * 256 * 1024 * 512 / 0.113)  # the op's own rate: the roof is an upper bound
    assert o.pct_of_roof == pytest.approx(1.0)
    (note,) = rep.context.roof_notes
    assert "bf16 matrix roof widened from 1.43 GFLOP/s to 2.38 GFLOP/s" in note and "`lm_head`" in note
    assert "**Roof note**" in rep.to_markdown()
    assert rep.summary.mfu <= 1.0  # MFU against the widened roof


def test_ops_too_short_to_time_do_not_move_a_measured_roof():
    mm = matmul(16, 16, 16, time_s=1e-6)  # 8 kFLOP in 1 us: 8 GFLOP/s, but timer noise
    rep = ts.roofline(make_profile([mm], device="cpu", device_name=LOW.name), LOW)
    assert rep.ops[0].peak == LOW.flops["bf16"] and not rep.context.roof_notes


def test_bandwidth_widened_too():
    pw = pointwise(1 << 24, time_s=4e-3)  # 128 MiB moved in 4 ms: 33.6 GB/s > 10 GB/s
    rep = ts.roofline(make_profile([pw], device="cpu", device_name=LOW.name), LOW)
    assert rep.roofs[0].bandwidth == pytest.approx(2 * (1 << 24) * 4 / 4e-3)
    assert any("bandwidth roof widened" in n for n in rep.context.roof_notes)


def test_a_beaten_datasheet_roof_is_explained_not_moved():
    # a small pointwise op in L2: 2 MiB in 0.5 us = 4.2 TB/s on a 2.039 TB/s A100
    pw = pointwise(1 << 18, dtype="float32", time_s=0.5e-6)
    rep = ts.roofline(make_profile([pw], device="cuda", device_name="NVIDIA A100-SXM4-80GB"), a100())
    assert rep.what_if is None  # measured on the device the spec is named after: no what-if
    assert rep.roofs[0].bandwidth == 2.039e12 and rep.ops[0].pct_of_roof > 1
    (note,) = rep.context.roof_notes
    assert note.startswith("1 ops ran faster than their datasheet roof (1 memory-bound")


def test_times_of_one_device_on_anothers_roofs_are_a_what_if():
    from tscope_callbacks import api

    api._WARNED_WHAT_IF.clear()  # warned once per process and device pair
    prof = make_profile([matmul(512, 512, 512, time_s=1e-3)], device="cpu", device_name="cpu")
    with pytest.warns(UserWarning, match="compare two devices"):
        rep = ts.roofline(prof, ts.get_device_spec("a100"))
    assert rep.what_if.measured_on == "this machine's CPU"
    assert "**What-if**: times were measured on this machine's CPU" in rep.to_markdown()
    # the same device: no label, no warning
    gpu = make_profile([matmul(512, 512, 512, time_s=1e-6)], device="cuda", device_name="NVIDIA H100 80GB HBM3")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        rep = ts.roofline(gpu, ts.get_device_spec("h100"))
    assert rep.what_if is None
    # untimed (analyze on meta): an estimate anyway, nothing to label
    est = make_profile([matmul(512, 512, 512)], device="meta", device_name="NVIDIA H100 SXM")
    assert ts.roofline(est, ts.get_device_spec("h100")).what_if is None
