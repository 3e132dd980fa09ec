"""The FSDP what-if (``analysis.fsdp``): a step profiled on one device, predicted under FSDP2 over N GPUs.

Ground truth is a real FSDP2 step of the same model: ``fully_shard`` on every block and the root over a fake process
group of N ranks in one process (``torch.testing._internal.distributed.fake_pg``: collectives allocate their outputs
and move nothing), its memory by torch's ``FSDPMemTracker`` and its collectives by tscope's own capture. Plus hand
arithmetic for the padding, the collective bytes of GPT-2 and the schedule.

TinyGPT's test config (d=32, 4d=128, vocab 64, seq 16, 2 blocks, no head bias): per block, each parameter padded to
a multiple of N rows on dim 0 (FSDP2 shards dim 0):
  N=3: ln1 w,b 2x33 + qkv.weight 96x32 + qkv.bias 96 + attn.proj.weight 33x32 + bias 33 + ln2 w,b 2x33
       + mlp.fc.weight 129x32 + bias 129 + mlp.proj.weight 33x128 + bias 33
       = 66 + 3072 + 96 + 1056 + 33 + 66 + 4128 + 129 + 4224 + 33 = 12,903 elements (12,704 unpadded)
  root, N=3: tok 66x32 + pos 18x32 + ln_f 2x33 + head 66x32 = 2112 + 576 + 66 + 2112 = 4,866 (4,672 unpadded)
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import tscope_callbacks as ts
from tscope_callbacks.analysis.fsdp import auto_units, fsdp_units, fsdp_whatif, simulate_step
from tscope_callbacks.demo.model import GPTConfig, TinyGPT

TESTS = Path(__file__).parent
TINY = GPTConfig(vocab_size=64, seq_len=16, d_model=32, n_layer=2, n_head=2)

pytest.importorskip("torch.testing._internal.distributed.fake_pg")
pytest.importorskip("torch.distributed._tools.fsdp2_mem_tracker")

# One process per comparison set: the fake process group is process-wide state.
SCRIPT = r"""
import json, sys, warnings, dataclasses
warnings.filterwarnings("ignore")
import torch, torch.distributed as dist
from torch.testing._internal.distributed.fake_pg import FakeStore
from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard, MixedPrecisionPolicy
import tscope_callbacks as ts
from tscope_callbacks.analysis.fsdp import fsdp_whatif
from tscope_callbacks.demo.model import GPTConfig, TinyGPT

TINY = GPTConfig(vocab_size=64, seq_len=16, d_model=32, n_layer=2, n_head=2)

def one(n, cfg, reshard=True, opt="adamw", mixed=False, batch=4):
    x = torch.randint(0, cfg.vocab_size, (batch, cfg.seq_len), generator=torch.Generator().manual_seed(0))
    make = ((lambda ps: torch.optim.AdamW(ps, lr=1e-3, foreach=True)) if opt == "adamw"
            else (lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9)))
    def step(m, o):
        o.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=mixed):
            loss = m(x).float().sum()
        loss.backward()
        o.step()
    torch.manual_seed(0)
    m0 = TinyGPT(cfg); o0 = make(m0.parameters())
    step(m0, o0)
    with ts.profile(m0, layer_details=True) as p:
        step(m0, o0)
    rep = ts.roofline(p.result, ts.get_device_spec("h100"))
    low = torch.bfloat16 if mixed else None
    w = fsdp_whatif(rep, m0, n, param_dtype=low, reduce_dtype=torch.float32 if mixed else None,
                    reshard_after_forward=reshard)
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=n)
    torch.manual_seed(0)
    m1 = TinyGPT(cfg)
    # a CPU mesh named: fully_shard's default mesh is CUDA's on a machine with a GPU (the step then ran there)
    kw = {"mesh": init_device_mesh("cpu", (n,))}
    if mixed:
        kw["mp_policy"] = MixedPrecisionPolicy(param_dtype=low, reduce_dtype=torch.float32)
    for b in m1.blocks:
        fully_shard(b, reshard_after_forward=reshard, **kw)
    fully_shard(m1, **kw)
    o1 = make(m1.parameters())
    step(m1, o1)
    mt = FSDPMemTracker(m1, o1)
    with mt:
        step(m1, o1)
    peak = mt.get_tracker_snapshot("peak")[torch.device("cpu")]["Total"]
    with ts.profile(m1, layer_details=True) as p1:
        step(m1, o1)
    ops = p1.result.ops
    dist.destroy_process_group()
    real = {k: [sum(r.comm["bytes"] for r in ops if r.comm and r.comm["collective"] == k),
                sum(1 for r in ops if r.comm and r.comm["collective"] == k)] for k in ("all_gather", "reduce_scatter")}
    return {"memory": w["memory"], "comm": w["comm"], "truth_peak": peak, "real_comm": real,
            "real_peak": p1.result.info.memory_categories["step_peak"],
            "sharded_params": sum(q._local_tensor.numel() * q._local_tensor.element_size() for q in m1.parameters())}

cases = json.loads(sys.argv[1])
print(json.dumps([one(c["n"], dataclasses.replace(TINY, **c.get("cfg", {})), reshard=c.get("reshard", True),
                      opt=c.get("opt", "adamw"), mixed=c.get("mixed", False), batch=c.get("batch", 4)) for c in cases]))
"""


def _run(cases: list[dict]) -> list[dict]:
    r = subprocess.run([sys.executable, "-c", SCRIPT, json.dumps(cases)], capture_output=True, text=True, timeout=600,
                       cwd=TESTS.parent)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def compared() -> list[dict]:
    return _run([{"n": 8}, {"n": 3}, {"n": 8, "opt": "sgd"}, {"n": 4, "reshard": False},
                 {"n": 4, "cfg": {"n_layer": 4, "seq_len": 64}, "batch": 8}, {"n": 4, "mixed": True}])


def test_collectives_equal_a_real_fsdp2_step(compared: list[dict]) -> None:
    for c in compared:
        for kind in ("all_gather", "reduce_scatter"):
            assert [c["comm"][kind]["bytes"], c["comm"][kind]["calls"]] == c["real_comm"][kind], (kind, c)
    # N=3 by hand (module doc): all-gather = root + 2 blocks forward + 2 blocks again in backward, fp32
    assert compared[1]["comm"]["all_gather"]["bytes"] == (4_866 + 4 * 12_903) * 4 == 225_912
    assert compared[1]["comm"]["reduce_scatter"]["bytes"] == (4_866 + 2 * 12_903) * 4 == 122_688
    # reshard_after_forward=False (N=4, no padding): one all-gather per unit
    assert compared[3]["comm"]["all_gather"]["bytes"] == (4_672 + 2 * 12_704) * 4 == 120_320


def test_per_gpu_memory_equals_fsdpmemtracker(compared: list[dict]) -> None:
    # fp32: N=8, N=3 (padded), SGD with momentum, reshard_after_forward=False, a 4-block model with 4x the tokens
    for c in compared[:5]:
        assert c["memory"]["params"] == c["sharded_params"]
        assert abs(c["memory"]["peak"] - c["truth_peak"]) <= 8, c  # byte for byte, up to a step counter
    # the padded shard of N=3: ceil(rows/3) rows of every parameter (module doc), fp32
    assert compared[1]["memory"]["params"] == (4_866 + 2 * 12_903) // 3 * 4


def test_a_real_fsdp2_step_profile_has_fsdpmemtrackers_peak(compared: list[dict]) -> None:
    # tscope's own capture of the real FSDP2 step: FSDP2 re-allocates its unsharded parameters with
    # UntypedStorage.resize_ (no op: the tracker counts resizes) and zero_grad frees last step's gradient shards
    # inside the step (the tracker drops them when they die); every case, mixed precision included
    for c in compared:
        assert c["real_peak"] == c["truth_peak"], c


def test_mixed_precision_peak_is_an_upper_bound_within_15_percent(compared: list[dict]) -> None:
    # autocast over fp32 weights keeps an fp32 residual stream that bf16 parameters do not (fsdp_memory's doc)
    c = compared[5]
    truth = c["truth_peak"]
    assert truth <= c["memory"]["peak"] <= 1.15 * truth
    # bf16 gathers, fp32 reduce-scatters: S = 2 B / 4 B per padded element (N=4: no padding)
    assert c["comm"]["all_gather"]["bytes"] == (4_672 + 4 * 12_704) * 2
    assert c["comm"]["reduce_scatter"]["bytes"] == (4_672 + 2 * 12_704) * 4


def test_units_and_padding_by_hand() -> None:
    m = TinyGPT(TINY)
    assert auto_units(m) == ["blocks.0", "blocks.1"]
    us = fsdp_units(m, 3)
    assert [u.path for u in us] == ["blocks.0", "blocks.1", ""]
    assert [u.padded for u in us] == [12_903, 12_903, 4_866]
    assert [u.numel for u in us] == [12_704, 12_704, 4_672]
    assert us[0].local_bytes == 12_903 // 3 * 4 and us[0].gather_bytes == 12_903 * 4
    bf = fsdp_units(m, 3, param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    assert bf[0].gather_bytes == 12_903 * 2 and bf[0].reduce_bytes == 12_903 * 4 and bf[0].grad_bytes == 12_704 * 2
    assert [u.path for u in fsdp_units(m, 2, units="Block")] == ["blocks.0", "blocks.1", ""]
    assert [u.path for u in fsdp_units(m, 2, units=["blocks.1"])] == ["blocks.1", ""]


def test_bad_input_says_what_to_do() -> None:
    m = TinyGPT(TINY)
    with pytest.raises(ValueError, match="2 or more"):
        fsdp_units(m, 1)
    with pytest.raises(ValueError, match="inside unit"):
        fsdp_units(m, 2, units=["blocks.0", "blocks.0.mlp"])
    with pytest.raises(ValueError, match="classes there"):
        fsdp_units(m, 2, units="GPT2Block")
    with pytest.raises(ValueError, match="not module paths"):
        fsdp_units(m, 2, units=["blocks.7"])
    with pytest.raises(ValueError, match="2 or more"):
        ts.analyze_model(m, [(2, 16)], gpu="h100", backward=True, fsdp=1)


def test_schedule_by_hand() -> None:
    # 2 units: forward 2 each, backward 4 each; every all-gather / reduce-scatter 1; the root's forward and backward
    # compute 1 each, the optimizer 0.5.
    # forward: root all-gather 0-1; unit 0's all-gather 1-2, its compute 2-4; unit 1's all-gather 2-3, compute 4-6;
    #   the root's own forward 6-7. backward: root 7-8 while unit 1 re-gathers 7-8; unit 1 8-12 (unit 0's gather
    #   8-9, unit 1's reduce-scatter 12-13); unit 0 12-16, its reduce-scatter 16-17, the root's 17-18; optimizer
    #   18-18.5. Compute 4 + 8 + 1 + 1 + 0.5 = 14.5; exposed 18.5 - 14.5 = 4 (0-1, 1-2, 16-18)
    r = simulate_step([2, 2], [4, 4], [1, 1], [1, 1], root_ag=1, root_rs=1, root_fwd=1, root_bwd=1, after=0.5)
    assert r == {"step_s": 18.5, "compute_s": 14.5, "exposed_s": 4.0}
    # communication-bound: all-gathers of 3 against forward computes of 1 serialise on the link
    # forward: root 0-0 (none), ag0 0-3, c0 3-4, ag1 3-6, c1 6-7; backward: ag1 7-10, c1 10-11 (ag0 10-13), rs1
    # 13-14, c0 13-14, rs0 14-15; end 15. Compute 4, exposed 11
    r = simulate_step([1, 1], [1, 1], [3, 3], [1, 1], root_ag=0, root_rs=0, root_fwd=0, root_bwd=0)
    assert r == {"step_s": 15.0, "compute_s": 4.0, "exposed_s": 11.0}


def _gpt2():
    transformers = pytest.importorskip("transformers")
    with torch.device("meta"):
        return transformers.GPT2LMHeadModel(transformers.GPT2Config())


def test_gpt2_124m_on_8_h100s_by_hand() -> None:
    g = _gpt2()
    rep = ts.analyze_model(g, [(8, 1024)], gpu="h100", precision="bf16-mixed", backward=True,
                           optimizer="adamw-fused", fsdp=8)
    w = rep.fsdp_whatif
    assert w is not None and rep.area_scalars["fsdp_whatif"]["peak_mb"] == w["memory"]["peak"] / 2**20
    assert w["unit_summary"] == "12 x GPT2Block + the root"
    # per block: ln_1 2x768 + c_attn 768x2304 + 2304 + c_proj 768x768 + 768 + ln_2 2x768 + c_fc 768x3072 + 3072
    #   + mlp.c_proj 3072x768 + 768 = 7,087,872 (rows all multiples of 8: no padding)
    # root: wte 50257 rows padded to 50264 (x768) + wpe 1024x768 + ln_f 2x768 = 38,602,752 + 786,432 + 1,536
    #   = 39,390,720 (lm_head is wte: one parameter)
    block, root = 7_087_872, 39_390_720
    assert [u["padded"] for u in w["units"]] == [block] * 12 + [root]
    # bf16 all-gathers: every unit and the root forward, the 12 blocks again in backward
    assert w["comm"]["all_gather"] == {"calls": 25, "bytes": 2 * (root + 24 * block),
                                       "time_s": pytest.approx(w["comm"]["all_gather"]["time_s"])}
    assert w["comm"]["reduce_scatter"]["bytes"] == 4 * (root + 12 * block)
    # time of one all-gather: 20 µs + S x 7/8 / (0.8 x 450 GB/s); NVLink 900 GB/s bidirectional on the H100 row
    t = lambda s: 20e-6 + s * 7 / 8 / (0.8 * 450e9)  # noqa: E731
    assert w["comm"]["all_gather"]["time_s"] == pytest.approx(t(2 * root) + 24 * t(2 * block))
    # this rank's shards: fp32 weights / 8 (padded), AdamW (fused) state the same twice plus its step counters
    assert w["memory"]["params"] == (root + 12 * block) // 8 * 4
    mc = rep.profile.info.memory_categories
    assert w["memory"]["optimizer_state"] == (mc["optimizer_state_scalars"] + int(
        (mc["optimizer_state"] - mc["optimizer_state_scalars"]) * (root + 12 * block) / 8 / 124_439_808))
    tm = w["time"]
    assert tm["exposed_s"] >= 0 and tm["step_s"] == pytest.approx(tm["compute_s"] + tm["exposed_s"])
    assert tm["step_s"] < tm["single_step_s"] + tm["comm_s"]
    md = rep.to_markdown()
    assert "### FSDP over 8 GPUs (what-if, per GPU)" in md and "all-gather ×25" in md and "**fits**" in md


def test_past_one_node_the_network_is_the_link() -> None:
    g = _gpt2()
    rep = ts.analyze_model(g, [(8, 1024)], gpu="h100", precision="bf16-mixed", backward=True, fsdp=16)
    w = rep.fsdp_whatif
    assert w["link"] == "network" and w["link_bandwidth"] == 50e9
    near = fsdp_whatif(rep, g, 8, param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    assert w["time"]["comm_s"] > 5 * near["time"]["comm_s"]


def test_tracker_gradients_and_weight_casts() -> None:
    torch.manual_seed(0)
    m = TinyGPT(TINY)
    x = torch.randint(0, 64, (4, 16))
    with ts.profile(m, layer_details=True) as p:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = m(x).float().sum()
        loss.backward()
    mc = p.result.info.memory_categories
    n_params = sum(q.numel() for q in m.parameters())
    assert mc["grads_created"] == n_params * 4  # every gradient is new (none before), fp32
    assert len(mc["live_no_grads"]) == len(p.result.ops)
    assert mc["step_tracked_peak_no_grads"] <= mc["step_tracked_peak"]
    assert {name for _, n, name in mc["grad_events"] if n > 0} == {k for k, _ in m.named_parameters()}
    # autocast's bf16 copies of every Linear weight and bias (2 B per element); embeddings and norms stay fp32
    lin = sum(q.numel() for mod in m.modules() if isinstance(mod, torch.nn.Linear) for q in mod.parameters())
    assert sum(n for _, n in mc["cast_events"] if n > 0) == lin * 2


def test_hsdp_shards_over_the_node_and_all_reduces_across_nodes() -> None:
    """HSDP over 32 GPUs with 8-GPU shards: each GPU holds what FSDP over 8 holds, its all-gathers and reduce-scatters
    stay on NVLink, and each unit's reduced shard is all-reduced across the 4 replicas on the network."""
    g = _gpt2()
    rep = ts.analyze_model(g, [(8, 1024)], gpu="h100", precision="bf16-mixed", backward=True,
                           optimizer="adamw-fused", fsdp=32, fsdp_shard=8)
    w = rep.fsdp_whatif
    fsdp8 = fsdp_whatif(rep, g, 8, param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    assert (w["shard_size"], w["replicas"], w["link"], w["all_reduce_link"]) == (8, 4, "nvlink", "network")
    assert w["memory"] == fsdp8["memory"]  # sharded over 8 either way
    assert w["comm"]["all_gather"] == fsdp8["comm"]["all_gather"]
    assert w["comm"]["reduce_scatter"] == fsdp8["comm"]["reduce_scatter"]
    block, root = 7_087_872, 39_390_720  # padded elements (test above)
    # fp32 gradient shards: one eighth of each unit's padded gradient, 13 calls
    ar = w["comm"]["all_reduce"]
    assert (ar["calls"], ar["bytes"]) == (13, 4 * (root + 12 * block) // 8)
    # ring all-reduce over 4 replicas: 20 µs + 2 x 3/4 x S / (0.8 x 50 GB/s) a call
    t = lambda s: 20e-6 + 2 * s * 3 / 4 / (0.8 * 50e9)  # noqa: E731
    assert ar["time_s"] == pytest.approx(t(4 * root // 8) + 12 * t(4 * block // 8))
    tm, t8 = w["time"], fsdp8["time"]
    assert tm["compute_s"] == pytest.approx(t8["compute_s"]) and tm["step_s"] >= t8["step_s"]
    assert tm["comm_s"] == pytest.approx(t8["comm_s"] + ar["time_s"])
    # against FSDP over the same 32 GPUs: every collective on the network instead of the all-reduce alone
    flat = fsdp_whatif(rep, g, 32, param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    assert flat["memory"]["params"] < w["memory"]["params"] and flat["time"]["comm_s"] > tm["comm_s"]
    md = rep.to_markdown()
    assert "### HSDP over 32 GPUs (4 replicas x 8-GPU shards) (what-if, per GPU)" in md
    assert "all-reduce across the 4 replicas ×13" in md and "the all-reduce on network at 50 GB/s" in md
    with pytest.raises(ValueError, match="shard_size must divide the 32 GPUs"):
        fsdp_whatif(rep, g, 32, shard_size=6)
    with pytest.raises(ValueError, match="fsdp_shard= needs fsdp=N"):
        ts.analyze_model(g, [(8, 1024)], gpu="h100", backward=True, fsdp_shard=8)


def test_hsdp_schedule_by_hand() -> None:
    # the first schedule above with an all-reduce of 2 per unit and 1 for the root, on its own queue: unit 1's
    # reduce-scatter ends at 13 -> its all-reduce 13-15; unit 0's at 17 -> 17-19; the root's reduce-scatter 17-18 ->
    # its all-reduce 19-20 (the queue is busy); optimizer 20-20.5. Compute 14.5, exposed 6
    r = simulate_step([2, 2], [4, 4], [1, 1], [1, 1], root_ag=1, root_rs=1, root_fwd=1, root_bwd=1, after=0.5,
                      ar=[2, 2], root_ar=1)
    assert r == {"step_s": 20.5, "compute_s": 14.5, "exposed_s": 6.0}
