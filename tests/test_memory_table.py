"""``tscope calibrate --gemm``'s memory-bound part (``devices.memory_table``): the cases' ops and their kernel bytes
on real captures (CPU here: op wall times), and the kernel model predicting an op from its own kernel-timed curve."""

from __future__ import annotations

import math

import pytest
from profiles import op

from tscope_callbacks.analysis.estimate import expected_s
from tscope_callbacks.devices import efficiency
from tscope_callbacks.devices import gemm_table as gt
from tscope_callbacks.devices import memory_table as mt
from tscope_callbacks.devices.efficiency import MIN_KERNEL_S, _curve
from tscope_callbacks.devices.resolve import get_device_spec

H100 = get_device_spec("h100")


@pytest.fixture(autouse=True)
def cache_in_tmp(tmp_path, monkeypatch):
    monkeypatch.setenv("TSCOPE_CACHE_DIR", str(tmp_path))
    efficiency.forget(H100.name)
    yield tmp_path
    efficiency.forget(H100.name)


def test_layer_norm_case_times_both_passes_with_their_kernel_bytes():
    timer = mt.kernel_memory_timer(reps=1, device_type="cpu")
    got = {o: (b, t) for o, _, b, t in timer("layer_norm", 1 << 16, "fp32")}
    # 65536 elements at width 768: 85 rows; an activation is 85 x 768 x 4 B = 261,120 B
    act = 85 * 768 * 4
    # forward: reads x, gamma, beta (261,120 + 2 x 3,072), writes y and mean, rstd (261,120 + 2 x 340)
    assert got["aten.native_layer_norm"][0] == 2 * act + 2 * 3072 + 2 * 340
    # backward counted: reads dY, X (2 x act), mean, rstd (680), gamma, beta (6,144); writes dX (act), dgamma,
    # dbeta (6,144) = 796,328; its kernels read dY and X once more for the parameter gradients: + 2 x act
    assert got["aten.native_layer_norm_backward"][0] == 3 * act + 680 + 6144 + 6144 + 2 * act
    assert all(t > 0 for _, t in got.values())


def test_every_case_runs_and_names_its_ops():
    timer = mt.kernel_memory_timer(reps=1, device_type="cpu")
    want = {"add": "aten.add", "gelu": "aten.gelu_backward", "softmax": "aten._softmax_backward_data",
            "cross_entropy": "aten._log_softmax_backward_data", "bias_grad": "aten.sum", "cast": "aten._to_copy",
            "embedding": "aten.embedding_dense_backward"}
    assert set(want) | {"layer_norm"} == set(mt.MEMORY_CASES)
    for case, name in want.items():
        rows = timer(case, 1 << 16, "fp32")
        assert rows and name in {o for o, _, _, _ in rows}, case
        assert all(c in efficiency.KIND_OF_CATEGORY for _, c, _, _ in rows), case  # memory-bound classes only


def test_calibrated_ops_follow_their_own_curve(monkeypatch):
    # a fake GPU whose layer_norm backward streams its kernel bytes at 1 TB/s after a 2.5 µs launch
    def timer(case, numel, precision):
        if case != "layer_norm":
            return None
        nbytes = 5 * numel * 4
        return [("aten.native_layer_norm_backward", "norm", nbytes, MIN_KERNEL_S + nbytes / 1e12)]

    packaged = efficiency.model_for(H100)
    before = packaged.memory_s("norm", 126e6, "fp32", "aten.native_layer_norm_backward")
    table = gt.measure_gemm_table(H100, quick=True, timer=lambda m, n, k, p: 1e-4, memory_timer=timer)
    assert table["memory_timing"] == "kernels" and "memory-bound: 1 ops" in table["source"]
    assert set(table["memory_ops"]) == {"aten.native_layer_norm_backward"}
    assert table["memory_op_class"] == {"aten.native_layer_norm_backward": "norm"}
    model = efficiency.model_for(H100)  # rebuilt from the cached calibration
    assert "memory-bound: 1 ops kernel-timed" in model.source
    # GPT-2's layer_norm backward (8 x 1024 x 768 fp32): 75.6 MB counted + 50.3 MB re-read = 126 MB, between the
    # measured 42 MB and 168 MB rows (2M and 8M elements x 5 x 4 B): 2.5 µs + 126e6 / 1e12 = 128.5 µs
    t = model.memory_s("norm", 126e6, "fp32", "aten.native_layer_norm_backward")
    assert t == pytest.approx(MIN_KERNEL_S + 126e6 / 1e12, rel=1e-3)
    assert t != pytest.approx(before, rel=0.05)
    # another op of the class follows the class's calibrated rows; an op of an unmeasured class, the packaged curve
    assert model.memory_s("norm", 126e6, "fp32", "aten.native_group_norm") == pytest.approx(t, rel=1e-3)
    assert model.memory_s("pointwise", 50e6, "fp32", "aten.mul") == packaged.memory_s("pointwise", 50e6, "fp32")
    # and the estimate of a recorded op asks for its own curve
    rec = op("aten.native_layer_norm_backward", phase="backward", read=75_000_000, written=1_000_000,
             category="norm", shapes=[[8192, 768], [8192, 768]])
    rec.output_shapes = [[8192, 768], [768], [768]]
    nbytes = 76_000_000 + 2 * 8192 * 768 * 4
    assert expected_s(rec, "fp32", model) == pytest.approx(MIN_KERNEL_S + nbytes / 1e12, rel=1e-3)


def test_rows_at_one_size_merge_into_one_point():
    # two ops' rows at 2**20 bytes (shares 0.5 and 0.8) and one at 2**22: geometric mean sqrt(0.4) = 0.632
    pts = _curve([(20.0, 0.5), (22.0, 0.9), (20.0, 0.8)])
    assert [x for x, _ in pts] == [20.0, 22.0]
    assert pts[0][1] == pytest.approx(math.sqrt(0.5 * 0.8))
