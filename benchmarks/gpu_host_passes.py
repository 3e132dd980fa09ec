"""The host passes of a CUDA capture, timed on any machine: the Python work a GPU profile does after its step, on
records shaped like a GPT-2 124M training step's (1,797 ops, 1,163 kernels with the real H100 kernel names of such a
step from ``tests/data/h100_kernel_names.txt``, one launch call per kernel, 150 layers):

- ``assign_kernels``: each kernel to the op whose range launched it (a full capture's "kernels to ops" pass), and
  the same pass over a replayed step's events (no op range: the kernel list alone);
- a replayed profile's build: the source capture's records with this step's kernel times (``ts.profile(replay=)``,
  the callbacks' later profiles).

The events are ``_KinetoEvent``-shaped Python objects, so a real profiler's events (C++ accessors) may read at
another speed: the figures measure tscope's own passes, not Kineto's read-out. Median of ``--runs``.

    python benchmarks/gpu_host_passes.py [--runs 7] [--write]
"""

from __future__ import annotations

import argparse
import platform
import random
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
from common import publish

from tscope_callbacks.capture.cuda_timing import RANGE_PREFIX, KernelRecord, Timeline, assign_kernels
from tscope_callbacks.records import CaptureInfo, LayerRecord, OpRecord, StepProfile

N_OPS, N_KERNELS, N_LAYERS = 1797, 1163, 150
OTHER_CALLS = 25  #: runtime calls besides each launch in the second mix (about 30,000 events a step)
CPU, CUDA = torch.autograd.DeviceType.CPU, torch.autograd.DeviceType.CUDA
NAMES = Path(__file__).resolve().parent.parent / "tests" / "data" / "h100_kernel_names.txt"


class Event:
    """The ``_KinetoEvent`` methods the passes call."""

    __slots__ = ("_name", "_dev", "_corr", "_start", "_end", "_res", "_kind")

    def __init__(self, name: str, dev: Any, corr: int, start: int, end: int, res: int, kind: str | None = None) -> None:
        self._name, self._dev, self._corr, self._start, self._end, self._res = name, dev, corr, start, end, res
        self._kind = kind

    def activity_type(self) -> str | None: return self._kind  # noqa: E704

    def name(self) -> str: return self._name  # noqa: E704
    def device_type(self) -> Any: return self._dev  # noqa: E704
    def correlation_id(self) -> int: return self._corr  # noqa: E704
    def linked_correlation_id(self) -> int: return 0  # noqa: E704
    def start_ns(self) -> int: return self._start  # noqa: E704
    def end_ns(self) -> int: return self._end  # noqa: E704
    def duration_ns(self) -> int: return self._end - self._start  # noqa: E704
    def device_resource_id(self) -> int: return self._res  # noqa: E704
    def device_index(self) -> int: return 0  # noqa: E704
    def is_user_annotation(self) -> bool: return False  # noqa: E704


def kernel_names() -> list[str]:
    text = NAMES.read_text().split("## GPT-2 training step (all kernels)")[1]
    return [line.strip() for line in text.splitlines() if line.strip() and not line.startswith("#")]


def step_events(seed: int = 0, *, kinds: bool = False, other_calls: int = 0) -> tuple[list[Event], list[int]]:
    """(events as Kineto hands them over, the ops that launched a kernel). ``kinds``: each event has its Kineto kind
    (``activity_type``, as torch's events do; without it the passes sort events by device and name, as on a torch
    without the accessor); ``other_calls``: runtime calls besides each launch (device queries, stream checks) that
    CUPTI records too."""
    rnd = random.Random(seed)
    names = kernel_names()
    launching = sorted(rnd.sample(range(N_OPS), N_KERNELS))
    ks = set(launching)
    k = (lambda x: x) if kinds else (lambda x: None)
    events, corr, gpu = [], 1, 0
    for i in range(N_OPS):
        start = i * 20_000
        events.append(Event(f"{RANGE_PREFIX}{i}", CPU, corr, start, start + 20_000, 111, k("user_annotation")))
        corr += 1
        if i in ks:
            for _ in range(other_calls):
                events.append(Event("cudaGetDevice", CPU, corr, start + 4_000, start + 4_100, 111, k("cuda_runtime")))
                corr += 1
            events.append(Event("cudaLaunchKernel", CPU, corr, start + 5_000, start + 9_000, 111, k("cuda_runtime")))
            gpu = max(gpu, start) + 1_000
            events.append(Event(rnd.choice(names), CUDA, corr, gpu, gpu + 30_000, 7, k("kernel")))
            gpu += 30_000
            corr += 1
    rnd.shuffle(events)  # Kineto lists CPU and device events apart, not in launch order
    return events, launching


def source_profile(timeline: Timeline) -> Any:
    """A stopped full capture as ``ReplayProfile`` reads it."""
    layers = {f"h.{i // 12}.m{i % 12}" if i else "": LayerRecord(path=f"h.{i // 12}.m{i % 12}" if i else "")
              for i in range(N_LAYERS)}
    paths = list(layers)
    ops = [OpRecord("aten.mm", paths[i % N_LAYERS], "forward" if i < N_OPS // 3 else "backward", flops=1 << 20,
                    bytes_read=1 << 16, bytes_written=1 << 14, input_shapes=[[64, 64], [64, 64]],
                    output_shapes=[[64, 64]], index=i, time_s=timeline.times[i]) for i in range(N_OPS)]
    model = torch.nn.Linear(2, 2)
    res = StepProfile(ops=ops, layers=layers, wall_time_s=0.1, info=CaptureInfo(step=1))
    return SimpleNamespace(timeline=timeline, result=res, model=model, running=False, layer_details=True), model


def timed(fn: Any, runs: int) -> float:
    ts = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--write", action="store_true", help="write benchmarks/results/gpu_host_passes.md")
    args = ap.parse_args()
    from tscope_callbacks.capture.replay import ReplayProfile

    rows = []  # (pass, events, ms): assign_kernels on each event mix, by device and name, then by Kineto's kinds
    for other in (0, OTHER_CALLS):
        for kinds in (False, True):
            events, launching = step_events(kinds=kinds, other_calls=other)
            tl = assign_kernels(events, N_OPS)
            assert sorted(k.op for k in tl.kernels) == launching  # every kernel to the op that launched it
            bare = [e for e in events if not e.name().startswith(RANGE_PREFIX)]  # a replay records no op range
            assert len(assign_kernels(bare, 0).kernels) == N_KERNELS
            how = "Kineto's kinds" if kinds else "device and name"
            more = f", {other} other runtime calls a kernel" if other else ""
            rows.append((f"assign_kernels, a full capture ({how}{more})", len(events),
                         timed(lambda ev=events: assign_kernels(ev, N_OPS), args.runs)))
            rows.append((f"assign_kernels, a replayed step: no op range ({how}{more})", len(bare),
                         timed(lambda ev=bare: assign_kernels(ev, 0), args.runs)))
    events, _ = step_events(kinds=True)
    tl = assign_kernels(events, N_OPS)
    src, model = source_profile(tl)
    rep = ReplayProfile(model, src)
    run = Timeline([None] * N_OPS, [None] * N_OPS,
                   [KernelRecord(k.name, k.start_ns, k.end_ns, k.stream, k.device, None, k.corr) for k in tl.kernels])
    built = rep._build(run, 0.1)
    assert built.info.replay["status"] == "matched"
    build_s = timed(lambda: rep._build(run, 0.1), args.runs)
    with open("/proc/loadavg") as f:
        load = " ".join(f.read().split()[:3])
    text = "\n".join([
        f"# The host passes of a CUDA capture (torch {torch.__version__}, {platform.processor() or platform.machine()}, "
        f"load average {load})", "",
        f"GPT-2 124M-sized step: {N_OPS} ops, {N_KERNELS} kernels, {N_LAYERS} layers; median of {args.runs} runs. "
        "Events sorted by device and name (a torch whose events lack `activity_type`) or by Kineto's kinds (one "
        "read for each runtime call).", "",
        "| pass | events | ms |", "|---|---:|---:|",
        *[f"| {name} | {n} | {t * 1e3:.1f} |" for name, n, t in rows],
        f"| a replayed profile's build (later profiles) | | {build_s * 1e3:.1f} |"])
    publish(text, args, "gpu_host_passes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
