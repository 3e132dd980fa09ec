"""GPU verification of every CUDA path against ground truth, with PASS/FAIL per line (commit its output).

Workload: HF GPT-2 124M from a config, batch 8x1024, bf16 autocast, fused AdamW. Checks:

1. capture cost: ``ts.profile`` step / plain step (CUDA events around the whole call), with and without layer
   details, beside a bare dispatch mode and torch.profiler (``benchmarks/gpu_capture_overhead.py``): <= 2.0;
2. headline MFU of a profiled step (device-busy basis) within 5% of the hand count over the plain step;
3. per-layer memory: ``memory_fwd_bytes`` of a few modules equal, within 1 MiB, to ``torch.cuda.memory_allocated()``
   read by hooks around the same modules on a plain step; backward against full backward hooks (reported);
4. tensor-core flags: bf16 GEMMs yes, fp32 with TF32 off no, TF32 on yes, every SDPA backend yes;
5. op kernel time vs torch.profiler's kernel total on the same step (0.97-1.03), forward matmul FLOPs and causal
   attention pairs against hand arithmetic (exact);
6. the NaN guard's healthy steps make no synchronizing call from tscope code (``set_sync_debug_mode("warn")``);
7. a compiled model's steps after two profiles as fast as before (within 2%) and Dynamo's counters unchanged;
8. WatchCallback: every gradient histogrammed, read without waiting, update ratios;
9. a matmul overflowing from a huge finite weight: the NaN guard's replay names the layer, and the op and line that
   made the first inf (``capture.op_origin``);
10. profiling never changes training: a seeded bf16-mixed Lightning fit on the GPU (dropout, shuffled loader) with
    every callback and ``gpu="auto"`` (empty roof cache) ends with the plain fit's weights, losses and CUDA and CPU
    random states, bit for bit (a second plain fit first shows the plain fit itself is reproducible there).

    python scripts/gpu_check.py [--out benchmarks/results/gpu_check_<device>.md]
    python scripts/gpu_check.py --smoke      # CPU, tiny model: exercises the script (CUDA-only lines say SKIP)
"""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

from common import median_time
from gpu_capture_overhead import measure
from gpu_workload import FULL, SMOKE, device_for, gpt2, ready

import tscope_callbacks as ts

RESULTS: list[tuple[str, str, str]] = []


def check(name: str, ok: bool | None, detail: str) -> None:
    status = "SKIP" if ok is None else ("PASS" if ok else "FAIL")
    RESULTS.append((status, name, detail))
    print(f"[{status}] {name}: {detail}", flush=True)


def memory_ground_truth(model, step, paths: list[str], cuda: bool) -> dict[str, int]:
    """Allocator growth across each module's forward, read by hooks on a plain step (no tscope)."""
    if not cuda:
        return {}
    out: dict[str, int] = {}
    handles = []
    for p in paths:
        mod = model.get_submodule(p)
        start: dict[str, int] = {}
        handles.append(mod.register_forward_pre_hook(lambda m, a, p=p, s=start: s.__setitem__(
            p, torch.cuda.memory_allocated())))
        handles.append(mod.register_forward_hook(lambda m, a, o, p=p, s=start: out.__setitem__(
            p, out.get(p, 0) + torch.cuda.memory_allocated() - s[p])))
    try:
        step()
    finally:
        for h in handles:
            h.remove()
    return out


def step_peak_check(model, step, prof, w, cuda: bool) -> None:
    """The profiled step's peak (``info.memory_categories["step_peak"]``) and the meta analysis's estimate of the
    same step against ground truth: ``torch.cuda.max_memory_allocated()`` over one plain step on CUDA (its peak
    statistic reset first), torch's ``MemTracker`` on the CPU."""
    got = (prof.info.memory_categories or {}).get("step_peak")
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        step()
        torch.cuda.synchronize()
        truth, how = torch.cuda.max_memory_allocated(), "max_memory_allocated"
    else:
        from torch.distributed._tools.mem_tracker import MemTracker

        mt = MemTracker()
        mt.track_external(model, step.optimizer)
        with mt:
            step()
        truth, how = mt.get_tracker_snapshot("peak")[torch.device("cpu")]["Total"], "MemTracker"
    ok = got is not None and abs(got / truth - 1) <= 0.05
    check(f"3. step peak memory within 5% of {how}", ok,
          f"{(got or 0) / 2**20:.1f} MiB vs {truth / 2**20:.1f} MiB")
    meta_model = gpt2(w.n_layer, w.d, w.heads, w.vocab, max(w.seq, 64), device="meta")
    rep = ts.analyze_model(meta_model, input_shape=[(w.batch, w.seq)], gpu="h100",
                           precision="bf16-mixed" if cuda else "fp32", backward=True,
                           optimizer="adamw-fused",  # the workload's fused AdamW
                           attention_backend=None if cuda else "cpu")
    est = rep.profile.info.memory_categories["step_peak"]
    check(f"3. meta analysis step peak within 10% of {how}", abs(est / truth - 1) <= 0.10,
          f"{est / 2**20:.1f} MiB vs {truth / 2**20:.1f} MiB")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=None)
    ap.add_argument("--smoke", action="store_true")
    args = ap.parse_args()
    w = SMOKE if args.smoke else FULL
    device = device_for(args.smoke)
    cuda = device == "cuda"
    name = torch.cuda.get_device_name() if cuda else "CPU smoke run"
    print(f"# GPU check: {name}\n\ntorch {torch.__version__}, CUDA {torch.version.cuda}\n")

    # 1-2. capture cost and headline MFU
    text, fig = measure(5, args.smoke)
    check("1. profiled step (layer details) / plain <= 2.0", fig["ratio"] <= 2.0, f"{fig['ratio']:.2f}")
    ok = fig["mfu"] is not None and abs(fig["mfu"] / fig["hand_mfu"] - 1) <= 0.05
    check("2. headline MFU within 5% of the hand count", ok, f"{fig['mfu']:.2%} vs {fig['hand_mfu']:.2%}")

    model, step = ready(w, device)
    # 3. per-layer memory against hooks
    paths = ["transformer.h.0.mlp", "transformer.h.0.attn", f"transformer.h.{w.n_layer // 2}", "lm_head"]
    truth = memory_ground_truth(model, step, paths, cuda)
    with ts.profile(model, layer_details=True) as prof:
        step()
    for p in paths:
        got = prof.layers[p].memory_fwd_bytes
        if p in truth:
            check(f"3. memory_fwd_bytes of {p} == hooks' allocator growth (1 MiB)", abs(got - truth[p]) <= 2**20,
                  f"{got / 2**20:.1f} MiB vs {truth[p] / 2**20:.1f} MiB; saved activations "
                  f"{prof.layers[p].saved_bytes / 2**20:.1f} MiB, peak {prof.layers[p].peak_fwd_bytes / 2**20:.1f} MiB")
        else:
            check(f"3. memory of {p}", None, f"{got / 2**20:.2f} MiB (no CUDA allocator here)")

    # 3b. the step's peak memory against the allocator's (CUDA) or torch's MemTracker (CPU smoke run)
    step_peak_check(model, step, prof, w, cuda)

    # 4. tensor cores
    mm = [r for r in prof.ops if r.category == "matmul" and r.dtype == "bfloat16"]
    n_tc = sum(r.tensor_core is True for r in mm)
    check("4. bf16 GEMMs on tensor cores", (n_tc == len(mm) and bool(mm)) if cuda else None, f"{n_tc}/{len(mm)}")
    if cuda:
        a = torch.randn(2048, 2048, device="cuda")
        lin = torch.nn.Linear(2048, 2048).cuda()
        prev = torch.backends.cuda.matmul.allow_tf32
        try:
            for tf32, expected in ((False, False), (True, True)):
                torch.backends.cuda.matmul.allow_tf32 = tf32
                with ts.profile(lin) as p32:
                    lin(a)
                flags = [r.tensor_core for r in p32.ops if r.category == "matmul"]
                check(f"4. fp32 GEMM with TF32 {'on' if tf32 else 'off'}: tensor cores {expected}",
                      flags == [expected] * len(flags) and bool(flags), str(flags))
        finally:
            torch.backends.cuda.matmul.allow_tf32 = prev
        from torch.nn.attention import SDPBackend, sdpa_kernel

        q = torch.randn(8, 12, 1024, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        anchor = torch.nn.Linear(1, 1).cuda()  # a profile is timed on its model's device: one on the GPU
        for backend in (SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION):
            try:
                with sdpa_kernel(backend), ts.profile(anchor) as ps:
                    torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True).sum().backward()
                flags = [r.tensor_core for r in ps.ops if r.category == "attention"]
                check(f"4. SDPA {backend.name} on tensor cores", bool(flags) and all(flags), str(flags))
            except RuntimeError as e:
                check(f"4. SDPA {backend.name}", None, f"backend not available: {e}")

    # 5. kernel time against torch.profiler, counts against hand arithmetic
    if cuda:
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CUDA]) as tp:
            step()
        torch.cuda.synchronize()
        tp_total = sum(e.device_time_total for e in tp.key_averages() if e.device_time_total) * 1e-6
        ours = sum(r.time_s or 0.0 for r in prof.ops) + sum(k.duration_s for k in prof.timeline.kernels
                                                            if k.op is None)
        check("5. op kernel time / torch.profiler kernel total in [0.97, 1.03]", 0.97 <= ours / tp_total <= 1.03,
              f"{ours * 1e3:.2f} ms / {tp_total * 1e3:.2f} ms = {ours / tp_total:.3f}")
    t = w.tokens
    d = w.d
    fwd_mm = 2 * t * (d * 3 * d + d * d + d * 4 * d + 4 * d * d) * w.n_layer + 2 * t * d * w.vocab
    got = sum(r.flops for r in prof.ops if r.phase == "forward" and r.category == "matmul")
    check("5. forward matmul FLOPs == 2 T (12 d^2 L + d V)", got == fwd_mm, f"{got:,} vs {fwd_mm:,}")
    pairs = w.seq * (w.seq + 1) // 2
    att = 2 * pairs * 2 * d * w.batch * w.n_layer  # 2 GEMMs x (head_dim x heads = d) x attended pairs
    got_att = sum(r.flops for r in prof.ops if r.phase == "forward" and r.category == "attention")
    check("5. causal attention forward FLOPs == 4 B pairs d L", got_att == att, f"{got_att:,} vs {att:,}")

    # 6. NaN guard sync-free
    nan_guard_check(w, device, cuda)
    # 7. compile
    compile_check(w, device, cuda)
    # 9. the op origin of a NaN event
    nan_origin_check(w, device)
    # 10. training unchanged
    training_unchanged_check(device)
    lines = [f"# GPU check: {name}", "", f"torch {torch.__version__}, CUDA {torch.version.cuda}", "",
             "| | check | result |", "|---|---|---|"] + [f"| {s} | {n} | {d_} |" for s, n, d_ in RESULTS]
    lines += ["", "## Capture cost", "", text]
    out = Path(args.out or f"benchmarks/results/gpu_check_{name.replace(' ', '_').replace('/', '-')}.md")
    if not args.smoke:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text("\n".join(lines) + "\n")
        print(f"\nwritten {out}")
    return 0 if all(s != "FAIL" for s, _, _ in RESULTS) else 1


def nan_guard_check(w, device: str, cuda: bool) -> None:
    """A short fit with the guard's default (deferred) read: no synchronizing call from tscope code on healthy
    steps, under ``torch.cuda.set_sync_debug_mode("warn")``."""
    from gpu_nan_guard_overhead import SyncWatch
    from gpu_workload import fit_window
    from lightning.pytorch.callbacks import Callback

    class NormProbe(Callback):  # each step's gradient norms in float64, kept on the device (no sync here)
        def __init__(self) -> None:
            self.norms: dict[int, torch.Tensor] = {}

        def on_before_optimizer_step(self, trainer, pl_module, optimizer):
            grads = [p.grad.detach().double() for p in pl_module.parameters() if p.grad is not None]
            self.norms[trainer.global_step] = torch.stack([g.norm() for g in grads])

    guard = ts.NaNGuardCallback()
    watch = SyncWatch(4, 12)
    probe = NormProbe()
    hist = ts.WatchCallback("all", every_n_steps=4, update_ratio=True)
    fit_window(w, device, [guard, watch, probe, hist], first=4, last=12)
    worst = 0.0
    for step, total, _ in guard.grad_history.steps:
        want = float(probe.norms[step].square().sum().sqrt())
        worst = max(worst, abs(total / want - 1))
    check("6. NaN guard: global gradient norm per checked step equals float64 norms (rel 1e-4)",
          bool(guard.grad_history.steps) and worst <= 1e-4,
          f"{len(guard.grad_history.steps)} steps, worst relative error {worst:.2e}")
    grads = (hist.last or {}).get("gradients") or []
    n = sum(1 for _ in probe.norms)
    check("8. WatchCallback: every gradient histogrammed (all values binned), read without waiting, update ratios",
          bool(grads) and all(sum(h.counts) == h.num and h.nonfinite == 0 for h in grads) and hist.host_waits <= 1
          and bool((hist.last or {}).get("update_ratio")),
          f"step {(hist.last or {}).get('step')}, {len(grads)} gradients, reads that waited {hist.host_waits} (the "
          f"last one at the end of training may), update ratio total "
          f"{(hist.last or {}).get('update_ratio', {}).get('total')}, {n} probed steps")
    if not cuda:
        check("6. NaN guard: no host sync on healthy steps", None, f"mode {guard.mode} on CPU (reads are free)")
        return
    check("6. NaN guard: no host sync on healthy steps", not watch.ours and guard.host_syncs == 0,
          f"mode {guard.mode}, flag reads that synced {guard.host_syncs}, sync warnings from tscope {watch.ours[:3]}; "
          f"from anything {watch.all}")


def nan_origin_check(w, device: str) -> None:
    """A finite weight so large that a matmul overflows (bf16-mixed on CUDA): the guard's replay must name the layer,
    and the op that made the first inf with the line that called it (HF GPT-2's Conv1D: an addmm)."""
    import lightning.pytorch as pl
    from gpu_workload import LM, loader
    from lightning.pytorch.callbacks import Callback

    class Blowup(Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            if trainer.global_step == 3:
                with torch.no_grad():
                    pl_module.model.transformer.h[1].mlp.c_fc.weight[:, 0] = 3e38

    guard = ts.NaNGuardCallback(action="stop")
    torch.manual_seed(0)
    trainer = pl.Trainer(max_steps=6, accelerator="gpu" if device == "cuda" else "cpu", devices=1,
                         precision="bf16-mixed" if device == "cuda" else "32-true", callbacks=[Blowup(), guard],
                         logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False)
    trainer.fit(LM(w), loader(w, 6))
    ev = guard.events[0] if guard.events else None
    note = ev.note if ev is not None else ""
    origin = note[note.find("Origin:"):] if "Origin:" in note else ""
    check("9. NaN guard: the replay names the layer and the op + line that made the first inf",
          ev is not None and ev.step == 3 and (ev.layer or "").endswith("h.1.mlp.c_fc")
          and "made by aten.addmm in the forward, called at" in origin,
          f"step {ev.step if ev else None}, layer {ev.layer if ev else None}: {origin[:240]}")


def compile_check(w, device: str, cuda: bool) -> None:
    """Compiled step time before and after two profiles (CUDA events), and Dynamo's counters."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    cmodel, step = ready(w, device, compile=True)
    graphs = dict(counters["stats"])
    before = median_time(step, 10, cuda=cuda)
    for _ in range(2):
        with ts.profile(cmodel, layer_details=True, check_finite=True):
            step()
    after = median_time(step, 10, cuda=cuda)
    check("7. compiled step after two profiles within 2% of before", after <= before * 1.02,
          f"{before * 1e3:.2f} ms -> {after * 1e3:.2f} ms")
    check("7. Dynamo graphs unchanged by profiling", dict(counters["stats"]) == graphs,
          f"{graphs} -> {dict(counters['stats'])}")


def training_unchanged_check(device: str) -> None:
    import os
    import tempfile

    import lightning.pytorch as pl
    from torch.utils.data import DataLoader, TensorDataset

    class Net(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Dropout(0.2),
                                           torch.nn.Linear(256, 1))
            self.losses: list[float] = []

        def forward(self, x):
            return self.net(x)

        def training_step(self, batch, batch_idx):
            x, y = batch
            loss = torch.nn.functional.mse_loss(self(x).float(), y)
            self.losses.append(loss.detach())
            return loss

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=1e-3)

        def train_dataloader(self):
            g = torch.Generator().manual_seed(3)
            x, y = torch.randn(512, 64, generator=g), torch.randn(512, 1, generator=g)
            return DataLoader(TensorDataset(x, y), batch_size=32, shuffle=True)

    def run(callbacks: list) -> tuple[Net, list[float], tuple]:
        pl.seed_everything(0, verbose=False)
        model = Net()
        with tempfile.TemporaryDirectory() as d:
            trainer = pl.Trainer(default_root_dir=d, accelerator="gpu" if device == "cuda" else "cpu", devices=1,
                                 precision="bf16-mixed", max_steps=10, callbacks=callbacks, logger=False,
                                 enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
            trainer.fit(model)
        states = (torch.get_rng_state(),) + ((torch.cuda.get_rng_state(),) if device == "cuda" else ())
        return model.cpu(), [float(v) for v in model.losses], states

    def same(a, b) -> bool:
        sa, sb = a[0].state_dict(), b[0].state_dict()
        return (all(torch.equal(sa[k], sb[k]) for k in sa) and a[1] == b[1]
                and all(torch.equal(x, y) for x, y in zip(a[2], b[2])))

    old = os.environ.get("TSCOPE_CACHE_DIR")
    with tempfile.TemporaryDirectory() as cache:
        os.environ["TSCOPE_CACHE_DIR"] = cache  # no cached roof: gpu="auto" resolves (and, on a CPU, measures) one
        try:
            plain, again = run([]), run([])
            sched = dict(start_step=1, every_n_steps=2)
            cbs = [ts.RooflineCallback(gpu="auto", **sched), ts.LayerProfilerCallback(**sched),
                   ts.NaNGuardCallback(), ts.WatchCallback(every_n_steps=2)]
            profiled = run(cbs)
        finally:
            if old is None:
                os.environ.pop("TSCOPE_CACHE_DIR", None)
            else:
                os.environ["TSCOPE_CACHE_DIR"] = old
    if not same(plain, again):
        check("10. training unchanged by every callback (bit for bit)", None,
              "two plain fits differ on this machine: nothing to compare against")
        return
    wmax = max(float((a.float() - b.float()).abs().max()) for a, b in
               zip(plain[0].state_dict().values(), profiled[0].state_dict().values()))
    check("10. training unchanged by every callback, gpu=\"auto\" (bit for bit)", same(plain, profiled),
          f"weights max |dw| {wmax:g}, losses {'equal' if plain[1] == profiled[1] else 'differ'} over "
          f"{len(plain[1])} steps, random states {'equal' if all(torch.equal(x, y) for x, y in zip(plain[2], profiled[2])) else 'differ'}")


if __name__ == "__main__":
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        sys.exit(main())
