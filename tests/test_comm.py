"""Communication without a cluster: collective sizes and bus-bandwidth factors (nccl-tests conventions), the link
roof from the device table, HTA-style overlap and TraceLens-style skew on fake kernel events, the communication
section, and the Chrome trace (CPU ops, fake CUDA kernels, ``tscope report --trace``)."""

from __future__ import annotations

import json

import pytest
import torch
from profiles import make_profile, matmul, op

import tscope_callbacks as ts
from tscope_callbacks.analysis.comm import overlap, skew
from tscope_callbacks.analysis.report import comm_scalars
from tscope_callbacks.cli import main
from tscope_callbacks.devices.spec import DeviceSpec, SpecFileError
from tscope_callbacks.formulas.comm import collective_info
from tscope_callbacks.render.trace import chrome_trace

H100 = ts.get_device_spec("h100")
c10d, fn = torch.ops.c10d, torch.ops._c10d_functional


class FakeGroup:
    """Stands for a ProcessGroup: ``size()``, ``rank()``, ``group_name``."""

    def __init__(self, n: int, name: str = "7") -> None:
        self.n, self.group_name = n, name

    def size(self) -> int:
        return self.n

    def rank(self) -> int:
        return 0


def test_collective_sizes_and_busbw_factors():
    pg = FakeGroup(8)
    out, shard = torch.empty(8 * 1024), torch.empty(1024)  # fp32: S = 32 KiB for the gathered tensor
    ag = collective_info(c10d._allgather_base_.default, (out, shard, pg, True, -1), {}, None)
    assert ag == {"collective": "all_gather", "group": "7", "group_size": 8, "bytes": 32768, "busbw_factor": 7 / 8,
                  "async": True}
    rs = collective_info(c10d._reduce_scatter_base_.default, (shard, out, pg, None, False, -1), {}, None)
    assert (rs["collective"], rs["bytes"], rs["busbw_factor"], rs["async"]) == ("reduce_scatter", 32768, 7 / 8, False)
    ar = collective_info(c10d.allreduce_.default, ([out], pg, None, None, True, -1), {}, None)
    assert (ar["bytes"], ar["busbw_factor"]) == (32768, 2 * 7 / 8)  # all-reduce: 2(n-1)/n
    bc = collective_info(c10d.broadcast_.default, ([shard], pg, 0, 0, True, -1), {}, None)
    assert (bc["collective"], bc["bytes"], bc["busbw_factor"]) == ("broadcast", 4096, 1.0)
    a2a = collective_info(c10d.alltoall_base_.default, (out, out, pg, [], [], True, -1), {}, None)
    assert (a2a["collective"], a2a["busbw_factor"]) == ("all_to_all", 7 / 8)
    sr = collective_info(c10d.send.default, ([shard], pg, 1, 0), {}, None)
    assert (sr["collective"], sr["bytes"], sr["busbw_factor"]) == ("send", 4096, 1.0)
    # functional collectives (DTensor, compile): the group size is an argument; S = the gathered output
    g = collective_info(fn.all_gather_into_tensor.default, (shard, 4, "3"), {}, torch.empty(4096))
    assert (g["bytes"], g["group_size"], g["busbw_factor"]) == (16384, 4, 3 / 4)
    w = collective_info(fn.wait_tensor.default, (shard,), {}, shard)
    assert (w["collective"], w["bytes"]) == ("wait", 0)
    assert collective_info(torch.ops.aten.mm.default, (shard, shard), {}, None) is None


def test_link_roof_from_the_device_table():
    assert H100.interconnect == {"nvlink": 900e9, "pcie": 128e9}
    assert H100.link_bandwidth == 450e9 and H100.link_name == "nvlink"  # one direction of 900 GB/s NVLink
    assert ts.get_device_spec("l40s").link_bandwidth == 32e9  # PCIe Gen4 x16: 64 GB/s both ways
    assert DeviceSpec("x", {"bf16": 1e14}, 1e12).link_bandwidth is None
    with pytest.raises(SpecFileError, match="interconnect.nvlink"):
        DeviceSpec.from_dict({"name": "x", "flops": {"bf16": 1e14}, "bandwidth": 1e12, "interconnect": {"nvlink": -1}})


def _comm_op(kind_op, nbytes, n, t, layer="blocks.0", phase="forward", factor=None):
    r = op(kind_op, layer, phase, category="comm", time_s=t)
    r.comm = {"collective": kind_op.split(".")[-1].strip("_").replace("allgather_base", "all_gather")
              .replace("reduce_scatter_base", "reduce_scatter"), "group": "0", "group_size": n, "bytes": nbytes,
              "busbw_factor": factor if factor is not None else (n - 1) / n, "async": True}
    return r


def test_comm_rows_place_collectives_on_the_link_roof():
    # an all-gather of S = 100 MB over 8 ranks in 0.5 ms: algbw 200 GB/s, busbw 200 x 7/8 = 175 GB/s, 38.9% of 450
    ops = [matmul(4096, 4096, 4096, layer="blocks.0", time_s=0.2e-3),
           _comm_op("c10d._allgather_base_", 100_000_000, 8, 0.5e-3)]
    rep = ts.roofline(make_profile(ops, device="cuda", device_name=H100.name), H100)
    (row,) = rep.communication["rows"]
    assert row["algbw"] == pytest.approx(200e9) and row["busbw"] == pytest.approx(175e9)
    assert row["pct_of_link"] == pytest.approx(175 / 450)
    assert row["roof_s"] == pytest.approx(100e6 * 7 / 8 / 450e9)  # the roofline bound of the transfer
    assert row["layers"] == {"blocks.0": 1}
    o = next(o for o in rep.ops if o.category == "comm")
    assert o.bound == "comm" and o.flops == 0 and o.bytes == 0  # not on the HBM roof
    assert rep.summary.comm_time_frac == pytest.approx(0.5 / 0.7)
    md = rep.to_markdown()
    assert "### Communication" in md and "| all_gather | 0 (8) | 1 | 95.4 | 0.5 | 200 | 175 | 38.9% |" in md
    assert rep.area_scalars["comm"]["busbw_gbps"] == pytest.approx(175)
    # on a CPU host (gloo) times are launches: no bandwidths
    cpu = ts.roofline(make_profile(ops, device="cpu", device_name=H100.name), H100)
    assert cpu.communication["rows"][0]["busbw"] is None


def test_overlap_is_a_union_of_intervals_not_a_sum():
    # compute [0, 100) and [150, 300) on stream 7; NCCL [80, 200) on stream 9 (ns)
    ov = overlap([(0, 100, False), (150, 300, False), (80, 200, True)])
    # comm 120 ns; covered by compute: [80, 100) + [150, 200) = 70 -> exposed 50, overlap 70/120
    assert ov["comm_s"] == pytest.approx(120e-9) and ov["exposed_comm_s"] == pytest.approx(50e-9)
    assert ov["overlap_frac"] == pytest.approx(70 / 120)
    assert ov["compute_s"] == pytest.approx(250e-9) and ov["idle_s"] == 0.0 and ov["span_s"] == pytest.approx(300e-9)
    gap = overlap([(0, 100, False), (200, 300, False)])
    assert gap["idle_s"] == pytest.approx(100e-9) and gap["overlap_frac"] is None
    assert overlap([]) is None


def test_comm_scalars_only_for_a_step_that_ran_collectives():
    # every CUDA capture has an overlap; a single-GPU step's logged tscope/comm/idle_ms (the capture's idle: 341 ms
    # on an H200 GPT-2 step of 56 ms) and exposed_comm_ms 0 were figures of nothing
    assert comm_scalars({"rows": [], "overlap": overlap([(0, 100, False), (200, 300, False)])}) == {}
    got = comm_scalars({"rows": [], "overlap": overlap([(0, 100, False), (150, 300, False), (80, 200, True)])})
    # exposed 50 ns = 5e-5 ms, overlap 70/120; no idle (the capture's, not the step's)
    assert got == {"exposed_comm_ms": pytest.approx(5e-5), "overlap_frac": pytest.approx(70 / 120)}


def test_overlap_from_a_recorded_cuda_timeline():
    ops = [matmul(1024, 1024, 1024, layer="a", time_s=100e-9), _comm_op("c10d._allgather_base_", 1000, 2, 120e-9)]
    kernels = [["nvjet_sm90_tst_128x128", 0, 100, 7, 0], ["ncclDevKernel_AllGather_RING_LL", 80, 120, 9, 1]]
    rep = ts.roofline(make_profile(ops, device="cuda", device_name=H100.name, kernels=kernels,
                                   clock_origin_ns=10**9), H100)
    ov = rep.communication["overlap"]
    assert ov["exposed_comm_s"] == pytest.approx(100e-9) and ov["overlap_frac"] == pytest.approx(20 / 120)
    assert "**Overlap**" in rep.to_markdown()


def test_skew_latency_and_wait():
    # two collectives; rank 1 starts each later: latency = the shorter duration, wait = the rest
    r0 = [("all_gather", 0.000, 0.010), ("reduce_scatter", 0.050, 0.008)]
    r1 = [("all_gather", 0.004, 0.006), ("reduce_scatter", 0.053, 0.005)]
    sk = skew([r0, r1])
    assert sk["latency_s"] == pytest.approx(0.006 + 0.005)
    assert sk["wait_s"] == pytest.approx([0.004 + 0.003, 0.0])  # rank 0 waited for rank 1
    assert sk["spread_s"] == pytest.approx(0.004 + 0.003) and sk["slowest_rank"] == 1
    assert skew([r0, r1[:1]]) is None  # different sequences: not matched


def test_trace_of_a_cpu_profile_and_of_fake_cuda_kernels(tmp_path):
    from tscope_callbacks.demo.model import TinyGPT, random_tokens

    m = TinyGPT()
    x, y = random_tokens(m.cfg, batch=2)
    with ts.profile(m) as p:
        m.loss(x, y).backward()
    tr = chrome_trace(p.result, ts.roofline(p.result, H100))
    ops = [e for e in tr["traceEvents"] if e.get("cat") == "cpu_op"]
    assert len(ops) == sum(1 for r in p.ops if r.time_s is not None)
    first = ops[0]
    assert {"External id", "Input Dims", "Input type", "layer", "phase", "flops", "bytes", "bound"} <= set(first["args"])
    assert all(a["ts"] <= b["ts"] for a, b in zip(ops, ops[1:]))  # in execution order on the host clock
    json.dumps(tr)
    # CUDA: kernels on their streams, an annotation per op spanning its kernels
    prof = make_profile([matmul(64, 64, 64, layer="fc", time_s=3e-6)], device="cuda",
                        kernels=[["nvjet_a", 0, 1000, 7, 0], ["nvjet_b", 1500, 1500, 7, 0]], clock_origin_ns=5000)
    tr = chrome_trace(prof)
    kern = [e for e in tr["traceEvents"] if e.get("cat") == "kernel"]
    assert [(e["ts"], e["dur"], e["tid"], e["args"]["External id"]) for e in kern] == [(5.0, 1.0, 7, 0), (6.5, 1.5, 7, 0)]
    (ann,) = [e for e in tr["traceEvents"] if e.get("cat") == "gpu_user_annotation"]
    assert (ann["ts"], ann["dur"], ann["args"]["layer"]) == (5.0, 3.0, "fc")


def test_report_cli_writes_a_trace(tmp_path, capsys):
    from tscope_callbacks.demo.model import TinyGPT, random_tokens

    m = TinyGPT()
    x, y = random_tokens(m.cfg, batch=2)
    with ts.profile(m) as p:
        m.loss(x, y).backward()
    path = tmp_path / "step.json"
    path.write_text(json.dumps({"profile": p.result.to_dict(), "device": H100.to_dict()}))
    assert main(["report", str(path), "--trace", str(tmp_path / "t.json")]) == 0
    assert "trace written to" in capsys.readouterr().out
    tr = json.loads((tmp_path / "t.json").read_text())
    assert tr["tscope"]["device"] == "cpu" or tr["traceEvents"]
