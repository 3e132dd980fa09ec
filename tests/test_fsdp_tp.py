"""Scale-out on CPU (gloo, 2 processes): FSDP2 ``fully_shard``, tensor parallelism, FSDP2+TP, and the callbacks in a
Lightning ``ModelParallelStrategy`` fit -- exact collective bytes against hand arithmetic, per-rank FLOPs from the
local compute, clean layer paths, memory categories, rank skew, the trace, and a NaN on one rank stopping both.

TinyGPT's test config (d=32, 4d=128, vocab 64, seq 16, 2 blocks); parameter counts per FSDP unit:
  block: ln1 2x32 + qkv 96x32+96 + attn.proj 32x32+32 + ln2 2x32 + mlp.fc 128x32+128 + mlp.proj 32x128+32
         = 64 + 3168 + 1056 + 64 + 4224 + 4128 = 12,704 parameters -> S = 12,704 x 4 B = 50,816 B (fp32);
  root:  tok 64x32 + pos 16x32 + ln_f 2x32 + head 64x32 = 2048 + 512 + 64 + 2048 = 4,672 -> S = 18,688 B.
Each rank all-gathers S (and receives S x (n-1)/n = S/2 of it); nccl-tests' busbw factor is (n-1)/n = 0.5.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from ddp_harness import run_ddp, skip_ddp

pytestmark = skip_ddp

BLOCK_S, ROOT_S = 12_704 * 4, 4_672 * 4

RAW = """
    import json, os, sys
    import torch, torch.distributed as dist, torch.multiprocessing as mp

    def run(rank, out, modes):
        dist.init_process_group("gloo", rank=rank, world_size=2)
        torch.set_num_threads(1)
        x = torch.randint(0, 64, (4, 16), generator=torch.Generator().manual_seed(rank))
        def step(m):
            m(x).sum().backward()

        results = {{mode: one(mode, step, rank) for mode in modes}}
        with open(os.path.join(out, f"rank{{rank}}.json"), "w") as f:
            json.dump(results, f)
        dist.destroy_process_group()

    def one(mode, step, rank):
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
        import tscope_callbacks as ts
        from models import TINY_CFG
        from tscope_callbacks.demo.model import TinyGPT

        torch.manual_seed(0)
        plain = TinyGPT(TINY_CFG)
        with ts.profile(plain) as p0:
            step(plain)
        res = {{"plain_flops": p0.result.total_flops,
                "plain_mm": {{r.layer: r.flops for r in p0.ops if r.category == "matmul" and r.phase == "forward"}}}}
        m = TinyGPT(TINY_CFG)
        if mode in ("tp", "fsdp_tp"):
            mesh = init_device_mesh("cpu", (1, 2) if mode == "fsdp_tp" else (2,),
                                    mesh_dim_names=("dp", "tp") if mode == "fsdp_tp" else ("tp",))
            tp = mesh["tp"]
            for b in m.blocks:
                parallelize_module(b.mlp, tp, {{"fc": ColwiseParallel(), "proj": RowwiseParallel()}})
        if mode in ("fsdp", "fsdp_tp"):
            # a CPU mesh named (fully_shard's default mesh is CUDA's on a machine with a GPU)
            kw = {{"mesh": mesh["dp"] if mode == "fsdp_tp" else init_device_mesh("cpu", (2,))}}
            for b in m.blocks:
                fully_shard(b, **kw)
            fully_shard(m, **kw)
        step(m)  # warm
        for p in m.parameters():
            p.grad = None
        with ts.profile(m) as p:
            step(m)
        prof = p.result
        rep = ts.roofline(prof, ts.get_device_spec("h100"))
        res.update(flops=prof.total_flops, layers=sorted(prof.layers),
                   comm=[dict(r.comm, layer=r.layer, phase=r.phase) for r in prof.ops if r.comm],
                   mm={{r.layer: r.flops for r in prof.ops if r.category == "matmul" and r.phase == "forward"}},
                   cats=prof.info.memory_categories, md=rep.to_markdown(),
                   link=next((r["link_bytes"] for r in rep.communication["rows"] if r["collective"] == "all_gather"),
                             None) if rep.communication else None)
        return res

    if __name__ == "__main__":
        mp.spawn(run, args=(sys.argv[1], {modes!r}), nprocs=2)
"""


@pytest.fixture(scope="module")
def raw(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[dict]]:
    """FSDP2, TP and FSDP2+TP, one after the other in the same two rank processes (one launch: each costs two
    interpreters importing torch): mode -> each rank's results."""
    modes = ["fsdp", "tp", "fsdp_tp"]
    ranks = run_ddp(tmp_path_factory.mktemp("raw"), RAW.format(modes=modes), name="raw.py", timeout=300)
    return {mode: [r[mode] for r in ranks] for mode in modes}


def test_fsdp2_collectives_exact_and_flops_from_local_compute(raw: dict[str, list[dict]]):
    for res in raw["fsdp"]:
        gathers = [c for c in res["comm"] if c["collective"] == "all_gather"]
        scatters = [c for c in res["comm"] if c["collective"] == "reduce_scatter"]
        # forward: root, block 0, block 1; backward: blocks 1 and 0 re-gathered (resharded after forward)
        assert [c["bytes"] for c in gathers] == [ROOT_S, BLOCK_S, BLOCK_S, BLOCK_S, BLOCK_S]
        assert [c["phase"] for c in gathers] == ["forward"] * 3 + ["backward"] * 2
        assert sorted(c["bytes"] for c in scatters) == [ROOT_S, BLOCK_S, BLOCK_S]
        assert all(c["phase"] == "backward" for c in scatters)
        assert all(c["group_size"] == 2 and c["busbw_factor"] == 0.5 for c in res["comm"])
        # bytes on each rank's link, per all-gather: S x (n-1)/n; the report's row sums its 5 calls
        assert res["link"] == pytest.approx((ROOT_S + 4 * BLOCK_S) * 0.5)
        # compute runs on the all-gathered (unsharded) parameters: the same FLOPs as one unsharded process
        assert res["flops"] == res["plain_flops"]
        assert not any("fsdp" in name.lower() or "_orig_mod" in name for name in res["layers"])
        cats = res["cats"]
        # 2 ranks: each holds half of the 2 x 12,704 + 4,672 = 30,080 parameters (fp32)
        assert cats["unsharded_params"] == 30_080 * 4 and cats["sharded_params"] == 30_080 * 4 // 2
        assert cats["all_gather_buffer_max"] == BLOCK_S
        assert "### Communication" in res["md"] and "all_gather | 0 (2)" in res["md"]


def test_tensor_parallel_counts_local_shards(raw: dict[str, list[dict]]):
    for res in raw["tp"]:
        # colwise fc: this rank's weight is 64x32 of 128x32 -> 2 x 64 tokens x 32 x 64 = 262,144 FLOPs (half)
        for b in ("blocks.0", "blocks.1"):
            assert res["mm"][f"{b}.mlp.fc"] == res["plain_mm"][f"{b}.mlp.fc"] // 2 == 2 * 64 * 32 * 64
            assert res["mm"][f"{b}.mlp.proj"] == res["plain_mm"][f"{b}.mlp.proj"] // 2 == 2 * 64 * 64 * 32
        # rowwise proj: its partial outputs are all-reduced, 4 x 16 x 32 fp32 = 8192 B, busbw factor 2(n-1)/n = 1
        ar = [c for c in res["comm"] if c["collective"] == "all_reduce" and c["phase"] == "forward"]
        assert [c["bytes"] for c in ar] == [8192, 8192] and all(c["busbw_factor"] == 1.0 for c in ar)
        assert {c["layer"] for c in ar} == {"blocks.0.mlp.proj", "blocks.1.mlp.proj"}
        assert res["flops"] < res["plain_flops"]


def test_fsdp2_with_tensor_parallel(raw: dict[str, list[dict]]):
    for res in raw["fsdp_tp"]:
        kinds = {c["collective"] for c in res["comm"]}
        assert "all_reduce" in kinds  # TP's rowwise output
        assert res["mm"]["blocks.0.mlp.fc"] == res["plain_mm"]["blocks.0.mlp.fc"] // 2  # local TP shard
        assert not any("fsdp" in name.lower() for name in res["layers"])


#: a Lightning ModelParallelStrategy script's start: imports and TinyLM with FSDP2 on its blocks and root
SHARDED_LM = """
    import json, os, sys
    import torch
    import lightning.pytorch as pl
    from lightning.pytorch.strategies import ModelParallelStrategy
    from torch.distributed.fsdp import fully_shard
    from cb_utils import FAST
    from models import TinyLM
    import tscope_callbacks as ts

    torch.set_num_threads(1)
    out = sys.argv[1]

    class Sharded(TinyLM):
        def configure_model(self):
            for b in self.model.blocks:
                fully_shard(b, mesh=self.device_mesh["data_parallel"])
            fully_shard(self.model, mesh=self.device_mesh["data_parallel"])
"""

LIGHTNING = SHARDED_LM + """

    model = Sharded(n_batches=16)
    seen = {{}}

    def inject(mod, args, output):  # NaN on rank 1 only, for the batch of step {nan_step}
        t = model.trainer
        step = seen.setdefault(float(args[0].detach().sum()), t.global_step)
        return output * float("nan") if t.global_rank == 1 and step == {nan_step} else output

    model.model.blocks[1].mlp.register_forward_hook(inject)
    roof = ts.RooflineCallback(gpu="h100", start_step=1, every_n_steps=2,
                               outputs=ts.RooflineOutputs(plot=False, save_trace=True))
    lay = ts.LayerProfilerCallback(start_step=1, every_n_steps=2)
    guard = ts.NaNGuardCallback(action="stop")
    trainer = pl.Trainer(strategy=ModelParallelStrategy(data_parallel_size=2, tensor_parallel_size=1), max_steps=8,
                         default_root_dir=out, callbacks=[roof, lay, guard], logger=False,
                         **{{**FAST, "devices": 2}})
    trainer.fit(model)
    p = roof.last_profile
    with open(os.path.join(out, f"rank{{trainer.global_rank}}.json"), "w") as f:
        json.dump({{"steps": [h["step"] for h in roof.history], "global_step": trainer.global_step,
                   "comm": [r.comm for r in p.ops if r.comm], "layers": sorted(lay.last_layers),
                   "skew": p.info.skew, "errors": p.info.internal_errors,
                   "events": [e.to_dict() for e in guard.events], "replay_blocker": guard.replay_blocker,
                   "files": sorted(os.listdir(os.path.join(out, "tscope")))}}, f)
"""


def test_callbacks_in_a_model_parallel_fit_and_nan_on_one_rank(tmp_path: Path):
    import json

    results = run_ddp(tmp_path, LIGHTNING.format(nan_step=5), name="mps.py", timeout=240)
    for res in results:
        assert res["steps"] == [1, 2, 4] and res["errors"] == []
        assert {c["collective"] for c in res["comm"]} == {"all_gather", "reduce_scatter"}
        assert "model.blocks.1.mlp.fc" in res["layers"] and not any("fsdp" in n.lower() for n in res["layers"])
        assert res["skew"]["collectives"] == len(res["comm"])  # matched across the two ranks
        # the NaN of rank 1 at step 5: both ranks stop at the same step, the event names rank 1; no replay
        assert res["global_step"] == 6, res["global_step"]
        (ev,) = res["events"]
        assert ev["step"] == 5 and ev["ranks"] == [1]
        assert "sharded" in res["replay_blocker"]
    files = results[0]["files"]
    assert {"trace_step_1.json", "comm_table_step_1.md", "step_1.json"} <= set(files)
    trace = json.loads((tmp_path / "tscope" / "trace_step_1.json").read_text())
    assert {e["pid"] for e in trace["traceEvents"]} == {0, 1}  # one process per rank
    ops = [e for e in trace["traceEvents"] if e.get("cat") == "cpu_op"]
    assert ops and {"External id", "Input Dims", "layer", "flops", "bytes", "bound"} <= set(ops[0]["args"])


WATCH = SHARDED_LM + """
    import numpy as np
    from lightning.pytorch.callbacks import Callback

    class Probe(Callback):  # the whole gradients and weights (all-gathered) at the watched step, and after it
        def on_before_optimizer_step(self, trainer, pl_module, optimizer):
            if trainer.global_step == 2:
                self.grads = {n: p.grad.full_tensor().double().numpy() for n, p in pl_module.named_parameters()}
                self.before = {n: p.full_tensor().double() for n, p in pl_module.named_parameters()}

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            if trainer.global_step == 3:
                self.after = {n: p.full_tensor().double() for n, p in pl_module.named_parameters()}

    probe, watch = Probe(), ts.WatchCallback(every_n_steps=2, bins=16, update_ratio=True, raise_errors=True)
    trainer = pl.Trainer(strategy=ModelParallelStrategy(data_parallel_size=2, tensor_parallel_size=1), max_steps=3,
                         default_root_dir=out, callbacks=[probe, watch], logger=False, **{**FAST, "devices": 2})
    trainer.fit(Sharded(n_batches=8))
    res = {"step": watch.last["step"], "bad": [], "ratios": {}}
    for h in watch.last["gradients"]:
        v = probe.grads[h.name].reshape(-1)
        counts, edges = np.histogram(v, bins=16, range=(v.min(), v.max()))
        if h.counts != counts.tolist() or h.num != v.size or not np.allclose(h.edges, edges, atol=1e-12):
            res["bad"].append(h.name)
    d, w = {}, {}
    for n in probe.before:
        layer = n.rpartition(".")[0]
        d[layer] = d.get(layer, 0.0) + float((probe.after[n] - probe.before[n]).norm()) ** 2
        w[layer] = w.get(layer, 0.0) + float(probe.after[n].norm()) ** 2
    res["ratios"] = {k: [watch.last["update_ratio"][k], (d[k] / w[k]) ** 0.5] for k in d}
    same = sum(int((probe.after[n] == probe.before[n]).sum()) for n in probe.before)
    res["unchanged"] = [watch.last["update_unchanged"]["total"], same / sum(v.numel() for v in probe.before.values())]
    with open(os.path.join(out, f"rank{trainer.global_rank}.json"), "w") as f:
        json.dump(res, f)
"""


def test_watch_histograms_of_fsdp2_shards_are_the_whole_tensors(tmp_path: Path):
    # each rank bins its shard over the range reduced across ranks; the summed counts equal numpy's histogram of
    # the all-gathered gradient, and the update ratio equals the one computed from the all-gathered weights
    import math

    for res in run_ddp(tmp_path, WATCH, name="watch.py", timeout=240):
        assert res["step"] == 2 and res["bad"] == []
        assert res["ratios"] and all(math.isclose(a, b, rel_tol=1e-4) for a, b in res["ratios"].values())
        assert res["unchanged"][0] == res["unchanged"][1]  # shards' counts summed over the whole tensors' elements
