"""The step monitor on a GPU: its parts (host and device time), its verdicts, and witnesses for them (<= 90 s, H200).

The demo's GPT-2-124M-shaped model (bf16, fused AdamW, in-memory tokens, batch 8 x 1024), 120 steps a run, with
Lightning's ``SimpleProfiler`` beside the monitor. Four runs:

a. the monitor alone; the loss logged with ``prog_bar=True`` (the demo's ``self.log``: Lightning reads it back with
   ``.item()`` after every batch: a device sync);
b. the same with ``prog_bar=False`` (the change the monitor names): the step time it saves is the witness of the
   sync finding's predicted saving (and of no finding, where the device kept busy);
c. as b plus a callback that spends 8 ms of host time at every batch end (``time.sleep``): the loop-overhead
   verdict's device time against the step time it added over b;
d. the demo's callbacks (``RooflineCallback`` with the monitor inside, ``NaNGuardCallback``, ``WatchCallback``)
   with ``prog_bar=True``, as ``tscope demo`` runs them: tscope's own hooks' host and device time.

Prints per run: the device step (CUDA events), the host step, every part's host ms and device ms a step (the
device's time while the host ran the part: for the loop's parts its idle), the DeviceClock's busy/idle, the values
read back every step, the step's kernel time (the monitor's CUDA profile of a step: the basis of the sync and loop
findings' cost, step - max(kernel time, host step without the work)), the verdicts (input-bound, loop overhead /
host-device sync), alerts, and the predictions beside their witnesses (a - b, c - b); SimpleProfiler's mean ms
of the same actions; the probe's CUDA events a step and their host cost. Writes nothing (stdout only).

    python scripts/gpu_step_monitor.py            # GPU (CUDA required)
    python scripts/gpu_step_monitor.py --smoke    # CPU, the demo's small model, 30 steps: exercises the script
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import time
import warnings
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.profilers import SimpleProfiler

import tscope_callbacks as ts
from tscope_callbacks.analysis.step_parts import PARTS
from tscope_callbacks.demo.lightning import CPU_DEMO, GPU_DEMO, DemoLM, RandomTokenData


class _QuietLM(DemoLM):
    """The demo's model, the loss logged without ``prog_bar`` (no read-back every step)."""

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        logits = self(x)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
        self.log("train/loss", loss)
        return loss


class _HostWork(pl.Callback):
    """8 ms of host time at every batch end (no device work)."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def on_train_batch_end(self, *args: Any) -> None:
        time.sleep(self.seconds)


class _Warnings(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        msg = record.getMessage()
        if "StepMonitor" in msg or "step monitor" in msg:
            self.lines.append(f"{record.levelname}: {msg}")


def _event_cost(n: int = 2000) -> tuple[float, float]:
    """Host µs per ``Event.record()`` and per ``elapsed_time`` of two completed events (the probe's per-event cost)."""
    evs = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    torch.cuda.synchronize()
    t = time.perf_counter()
    for e in evs:
        e.record()
    rec = (time.perf_counter() - t) / n * 1e6
    torch.cuda.synchronize()
    t = time.perf_counter()
    for a, b in zip(evs, evs[1:]):
        a.elapsed_time(b)
    el = (time.perf_counter() - t) / (n - 1) * 1e6
    return rec, el


def _run(name: str, size: dict[str, Any], steps: int, *, quiet: bool, work: float = 0.0, demo: bool = False,
         gpu: bool = True) -> dict[str, Any]:
    pl.seed_everything(0, verbose=False)
    model = (_QuietLM if quiet else DemoLM)(**size["model"])
    data = RandomTokenData(**size["data"])
    mon = ts.StepMonitor(ts.MonitorOptions(), telemetry=False)
    if demo:
        roof = ts.RooflineCallback(gpu="auto", start_step=60, every_n_steps=None, monitor=mon,
                                   outputs=ts.RooflineOutputs(plot=False, save_json=False))
        cbs: list[pl.Callback] = [roof, ts.NaNGuardCallback(action="warn"),
                                  ts.WatchCallback("all", every_n_steps=50, update_ratio=True)]
    else:
        cbs = [mon]
    if work:
        cbs.append(_HostWork(work))
    segs: list[int] = []
    release = mon.probe.release

    def counting(s: Any) -> None:
        segs.append(len(s))
        release(s)

    mon.probe.release = counting  # type: ignore[method-assign]
    prof = SimpleProfiler()
    trainer = pl.Trainer(max_steps=steps, accelerator="gpu" if gpu else "cpu", devices=1, logger=False,
                         callbacks=cbs, precision=size["precision"], log_every_n_steps=10,
                         enable_checkpointing=False, enable_model_summary=False, enable_progress_bar=False,
                         limit_val_batches=0, profiler=prof)
    t = time.perf_counter()
    trainer.fit(model, datamodule=data)
    wall = time.perf_counter() - t
    v = mon._verdict.summary()
    durs = {k: statistics.mean(x) * 1e3 for k, x in prof.recorded_durations.items() if x}
    return {"name": name, "mon": mon, "v": v, "wall": wall, "segs": segs, "simple": durs}


def _show(r: dict[str, Any]) -> None:
    v, mon = r["v"], r["mon"]
    print(f"\n## {r['name']}  (fit {r['wall']:.1f} s)")
    if v is None:
        print("   no clean steps summarized")
        return
    dev = v.device_parts_ms
    print(f"   step {v.step_ms:.2f} ms (device, CUDA events; mean of {v.steps} clean steps), host step {v.host_ms:.2f} ms")
    if v.device_busy_ms is not None:
        print(f"   DeviceClock: batch start->end on the device {v.device_busy_ms:.2f} ms, device idle between batches "
              f"{v.idle_ms:.2f} ms")
    print("   part          host ms   device ms")
    for p in PARTS:
        d = "" if dev is None else f"{dev[p]:9.3f}"
        print(f"   {p:<12} {v.parts_ms[p]:9.3f} {d}")
    if dev is not None:
        print(f"   loop (hooks+logging+checkpoint+other): host {v.loop_ms:.3f}, device {v.loop_device_ms:.3f}; "
              f"device time in the host-only parts {v.host_idle_ms:.3f} ms a step")
    print("   named items (host ms / device ms a step):")
    for c in v.named[:8]:
        d = "" if c.device_ms is None else f" / {c.device_ms:.3f}"
        print(f"     {c.part}:{c.name}  {c.ms:.3f}{d}  ({c.occurrences} of {c.steps} steps)")
    if r["segs"]:
        print(f"   probe: {statistics.median(r['segs']):.0f} CUDA events a step (median), "
              f"{len(r['segs'])} steps read")
    k = mon.kernel
    if k is not None:
        print(f"   kernel time (CUDA profile of step {k.step}): {k.ms:.3f} ms a step ("
              + ", ".join(f"{p} {x:.3f}" for p, x in k.parts_ms.items()) + "); the device's idle = step - kernels "
              f"{v.step_ms - k.ms:.3f} ms")
    else:
        print("   kernel time: none (no CUDA profile of the step): the findings use the parts' device times")
    print(f"   values read back every step: {list(mon.progress_bar_reads)}")
    print(f"   verdict: input-bound={bool(mon.input_fixes)}; loop/sync: {mon.loop_finding}")
    for a in mon.alerts:
        print(f"   alert: {a['text']}")
    s = r["simple"]
    keys = [k for k in s if k.endswith("train_dataloader_next") or k in ("run_training_batch", "optimizer_step")
            or "training_step" in k or k.endswith(".backward") or "on_train_batch_end" in k]
    print("   SimpleProfiler mean ms: " + "; ".join(f"{k} {s[k]:.3f}" for k in sorted(keys)))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="CPU, small model, 30 steps, one thread")
    ap.add_argument("--steps", type=int, default=None)
    args = ap.parse_args()
    gpu = not args.smoke
    if gpu and not torch.cuda.is_available():
        print("needs a CUDA device (or --smoke)", file=sys.stderr)
        return 2
    size = GPU_DEMO if gpu else CPU_DEMO
    steps = args.steps or (120 if gpu else 30)
    if not gpu:
        torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    for n in ("lightning.pytorch", "lightning.fabric"):
        logging.getLogger(n).setLevel(logging.ERROR)
    h = _Warnings()
    logging.getLogger("tscope_callbacks").addHandler(h)
    t0 = time.perf_counter()
    dev = torch.cuda.get_device_name() if gpu else "cpu"
    print(f"# step monitor on {dev}, torch {torch.__version__}, {steps} steps a run")
    if gpu:
        rec, el = _event_cost()
        print(f"CUDA event: record {rec:.2f} us, elapsed_time {el:.2f} us (host, per call)")
    runs = [("a. monitor alone, prog_bar=True", dict(quiet=False)),
            ("b. monitor alone, prog_bar=False", dict(quiet=True)),
            ("c. as b + 8 ms host work at batch end", dict(quiet=True, work=0.008)),
            ("d. demo callbacks (Roofline+monitor, NaNGuard, Watch), prog_bar=True", dict(quiet=False, demo=True))]
    out = []
    for name, kw in runs:
        h.lines.clear()
        r = _run(name, size, steps, gpu=gpu, **kw)  # type: ignore[arg-type]
        _show(r)
        for line in h.lines:
            print(f"   log {line}")
        out.append(r)
    a, b, c = (r["v"] for r in out[:3])
    if a is not None and b is not None and c is not None:
        from tscope_callbacks.analysis import step_parts as sp

        ma, mc = out[0]["mon"], out[2]["mon"]
        print("\n## witnesses (device step, mean of the clean steps) beside the monitor's predictions")
        print(f"   a - b (what prog_bar=False saved): {a.step_ms - b.step_ms:+.2f} ms a step; "
              f"a's finding: {ma.loop_finding is not None}")
        f = sp.sync_findings(a, ma.progress_bar_reads, kernel=ma.kernel)
        old = sp.sync_findings(a, ma.progress_bar_reads)
        basis = (f"step - max(kernels {ma.kernel.ms:.2f}, host without the wait)" if ma.kernel is not None
                 else "no kernel time: the parts' device times")
        print(f"   a's predicted saving: {f[0]['saving_s'] * 1e3:.2f} ms a step ({basis})" if f else
              f"   a's predicted saving: none ({basis})")
        print("   a's saving by the parts' device times alone (the rule without a kernel time): "
              + (f"{old[0]['saving_s'] * 1e3:.2f} ms a step" if old else "no finding"))
        work = next((x for x in c.named if x.name == "_HostWork"), None)
        if work is not None:
            print(f"   c - b (what 8 ms of host work added): {c.step_ms - b.step_ms:+.2f} ms a step; the monitor's "
                  f"device time for it: {work.device_ms if work.device_ms is not None else float('nan'):.2f} ms "
                  f"(host {work.ms:.2f} ms)")
            if mc.kernel is not None:
                print(f"   c's predicted cost of _HostWork: {sp.removal_saving(c, work.ms, mc.kernel):.2f} ms a step, "
                      f"of the loop's work: {sp.removal_saving(c, c.loop_ms, mc.kernel):.2f} ms a step (step - "
                      f"max(kernels {mc.kernel.ms:.2f}, host without it))")
            else:
                print("   c's predicted cost: no kernel time (no CUDA profile of the step)")
        for r in out:
            k = r["mon"].kernel
            if k is not None and b is not None:
                print(f"   {r['name'][:2]} kernel time {k.ms:.2f} ms vs b's step {b.step_ms:.2f} ms (the host ahead)")
    print(f"\ntotal {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
