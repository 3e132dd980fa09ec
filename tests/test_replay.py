"""Count once, time later (``capture.replay``): a step timed from kernel records alone, matched to a full capture's
kernels by launch order. No GPU here: the full capture runs on fake kernel records (one per op, names from the real
H100 GPT-2 step in ``tests/data/h100_kernel_names.txt``), and the replayed step's records are scripted from them."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch
from test_cuda_timing import CPU, CUDA, Ev, FakeTimeline
from torch.utils._python_dispatch import _get_current_dispatch_mode

import tscope_callbacks as ts
from tscope_callbacks.capture import replay as rp
from tscope_callbacks.capture.cuda_timing import PAUSED_RANGE, RANGE_PREFIX, assign_kernels
from tscope_callbacks.capture.profile import NestedProfileError, active_profile, paused
from tscope_callbacks.capture.replay import align

_TEXT = (Path(__file__).parent / "data" / "h100_kernel_names.txt").read_text()
GPT2_KERNELS = _TEXT.split("## GPT-2 training step (all kernels)")[1].strip().splitlines()


def name_of(i: int) -> str:
    """A real GPT-2-step kernel name for op i (names repeat, as they do in a step)."""
    return GPT2_KERNELS[(i * 7) % len(GPT2_KERNELS)].strip()


class SourceTimeline(FakeTimeline):
    """The full capture's Kineto session: each op range launches one kernel named ``name_of(op)`` lasting
    (op + 1) µs, launched in op order (correlation ids 1000 + op)."""

    def stop(self, n_ops, no_range=()):
        events = []
        for c, n in enumerate(self.names):
            events.append(Ev(n, CPU, _corr=c + 1, _start=c * 10_000, _end=c * 10_000 + 9_000))
        op_ranges = [n for n in self.names if n != PAUSED_RANGE]
        for i in range(n_ops):
            rng = self.names.index(f"{RANGE_PREFIX}{i}") + 1 if f"{RANGE_PREFIX}{i}" in op_ranges else None
            if rng is None:
                continue
            events.append(Ev(name_of(i), CUDA, _corr=1000 + i, _link=rng, _start=10**6 * i,
                             _end=10**6 * i + 1000 * (i + 1)))
        return assign_kernels(events, n_ops, no_range)


class ReplayTimeline(FakeTimeline):
    """A replayed step's Kineto session: plays ``script`` -- (name, duration ns) in launch order -- as kernels
    launched by runtime calls on thread 1, and drops kernels launched inside a ``tscope#paused`` range."""

    script: list[tuple[str, int]] = []
    paused_kernels = 0
    instances: list = []

    def __init__(self) -> None:
        super().__init__()
        ReplayTimeline.instances.append(self)

    def stop(self, n_ops, no_range=()):
        assert n_ops == 0  # a replay records no op range
        events, t = [], 0
        for j, (name, dur) in enumerate(self.script):
            corr = 5000 + j
            events.append(Ev("cudaLaunchKernel", CPU, _corr=corr, _start=j * 100, _end=j * 100 + 10, _stream=1))
            events.append(Ev(name, CUDA, _corr=corr, _start=t, _end=t + dur))
            t += dur + 500
        for j in range(self.paused_kernels):  # tscope's own kernels, inside the paused range
            corr = 9000 + j
            events.append(Ev(PAUSED_RANGE, CPU, _corr=8000 + j, _start=10**7, _end=10**7 + 100, _stream=1))
            events.append(Ev("cudaLaunchKernel", CPU, _corr=corr, _start=10**7 + 50, _end=10**7 + 60, _stream=1))
            events.append(Ev("reduce_kernel_isfinite", CUDA, _corr=corr, _start=t, _end=t + 10**6))
        return assign_kernels(events, 0)


@pytest.fixture
def fake(monkeypatch):
    import tscope_callbacks.capture.region as region

    monkeypatch.setattr(region, "KernelTimeline", SourceTimeline)
    monkeypatch.setattr(rp, "KernelTimeline", ReplayTimeline)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    ReplayTimeline.script, ReplayTimeline.paused_kernels, ReplayTimeline.instances = [], 0, []


def mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))


def step(model, opt):
    model(torch.randn(5, 8)).sum().backward()
    opt.step()
    opt.zero_grad()


def full_capture(model, opt):
    with ts.profile(model, timing="cuda", layer_details=True, info=ts.CaptureInfo(step=3)) as src:
        step(model, opt)
    return src


def plan_script(src, scale=2):
    """The source's kernels again, in launch order, each ``scale`` x as long."""
    return [(k.name, (k.end_ns - k.start_ns) * scale) for k in sorted(src.timeline.kernels, key=lambda k: k.corr)]


def test_a_replayed_step_times_every_op_from_its_own_kernels_with_the_source_counts(fake):
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    src = full_capture(model, opt)
    # every op launched one kernel but the views (the layers' weight transposes, autograd's detach: metadata, run
    # without a range, device time 0)
    views = {r.index for r in src.ops if r.time_s == 0.0}
    assert views and {src.ops[i].op for i in views} <= {"aten.t", "aten.detach", "aten.view", "aten.expand"}
    n_k = len(src.ops) - len(views)
    kernels = [r for r in src.ops if r.time_s]
    assert len(kernels) == n_k and src.info.step_time_basis == "device-busy"
    # the replayed step: same kernels at twice the time, plus a logging copy the source step did not run
    script = plan_script(src)
    script.insert(len(script) // 2, ("Memcpy DtoH (Device -> Pageable)", 7_000))
    ReplayTimeline.script = script
    modes = []
    # (16 kernels: the one extra is 6% of the run, over the default 5% a real step's thousand kernels allow)
    with ts.profile(model, replay=src, info=ts.CaptureInfo(step=9), min_match=0.9) as rep:
        modes.append(_get_current_dispatch_mode())
        n_hooks = sum(len(m._forward_pre_hooks) + len(m._forward_hooks) for m in model.modules())
        step(model, opt)
    assert modes == [None] and n_hooks == 0  # nothing of tscope runs per op in a replayed step
    r = rep.info.replay
    assert r["status"] == "matched" and r["kernels_matched"] == r["kernels_planned"] == n_k
    assert r["kernels_run"] == n_k + 1 and r["unmatched_s"] == pytest.approx(7e-6)
    # op i's source kernel took (i + 1) µs; replayed: 2 (i + 1) µs. Counts and layers are the source's
    assert [o.time_s for o in rep.ops] == [0.0 if i in views else pytest.approx(2 * (i + 1) * 1e-6)
                                           for i in range(len(src.ops))]
    assert [(o.op, o.flops, o.bytes, o.layer, o.phase) for o in rep.ops] == \
        [(o.op, o.flops, o.bytes, o.layer, o.phase) for o in src.ops]
    timed = {"time_s", "tensor_core", "start_s"}  # every other field is the source record's, copied
    assert all({k: v for k, v in a.to_dict().items() if k not in timed} ==
               {k: v for k, v in b.to_dict().items() if k not in timed} and a is not b for a, b in zip(rep.ops, src.ops))
    assert [o.time_s for o in src.ops] == [0.0 if i in views else pytest.approx((i + 1) * 1e-6)
                                           for i in range(len(src.ops))]  # untouched
    for path, L in rep.layers.items():
        S = src.layers[path]
        assert L.forward_s == pytest.approx(2 * S.forward_s) and L.backward_s == pytest.approx(2 * S.backward_s)
        assert L.self_forward_s == pytest.approx(2 * S.self_forward_s)
        assert (L.flops_fwd, L.memory_fwd_bytes, L.output_shapes) == (S.flops_fwd, S.memory_fwd_bytes, S.output_shapes)
    # the step time: every kernel of this step (the unmatched copy too), not the source's
    total = sum(d for _, d in script) * 1e-9
    assert rep.info.step_time_s == pytest.approx(total) and rep.info.step_time_basis == "device-busy"
    assert rep.info.step == 9 and rep.info.replay["source_step"] == 3
    assert len(rep.info.kernels) == len(script)
    assert rep.coverage() == src.coverage() and rep.uncounted_ops() == src.uncounted_ops()
    with warnings.catch_warnings():  # the fake step ran on the CPU: a what-if warning, once per process
        warnings.simplefilter("ignore")
        report = ts.roofline(rep.result, ts.get_device_spec("h100"))
    assert report.to_markdown()


def test_a_replay_of_other_kernels_is_a_mismatch_with_no_op_timed(fake):
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    src = full_capture(model, opt)
    ReplayTimeline.script = [(f"void other_kernel_{i}", 1000) for i in range(len(src.ops))]
    with ts.profile(model, replay=src) as rep:
        step(model, opt)
    assert rep.info.replay["status"] == "mismatch" and rep.info.replay["kernels_matched"] == 0
    assert "profile a step in full again" in rep.info.replay["note"]
    assert all(o.time_s is None for o in rep.ops)
    assert rep.info.step_time_s == pytest.approx(len(src.ops) * 1e-6)  # the device time is still this step's
    text = ts.roofline(rep.result, ts.get_device_spec("h100")).to_markdown()  # a report, without op times
    assert text.startswith("## Roofline")


def test_a_skipped_kernel_leaves_only_its_op_untimed(fake):
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    src = full_capture(model, opt)
    script = plan_script(src, scale=1)
    gone = sorted(src.timeline.kernels, key=lambda k: k.corr)[4].op  # the op of the step's fifth kernel
    del script[4]
    ReplayTimeline.script = script
    with ts.profile(model, replay=src, min_match=0.8) as rep:
        step(model, opt)
    assert rep.info.replay["status"] == "matched"
    assert rep.ops[gone].time_s is None
    assert all(o.time_s == (0.0 if s.time_s == 0.0 else pytest.approx((i + 1) * 1e-6))
               for i, (o, s) in enumerate(zip(rep.ops, src.ops)) if i != gone)  # a view: no kernel, 0


def test_tscope_own_kernels_in_a_replay_are_left_out(fake):
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    src = full_capture(model, opt)
    ReplayTimeline.script = plan_script(src)
    ReplayTimeline.paused_kernels = 2
    with ts.profile(model, replay=src) as rep:
        step(model, opt)
        with paused():  # e.g. the NaN guard's check: its kernels run in the paused range
            pass
    assert PAUSED_RANGE in ReplayTimeline.instances[-1].names
    assert rep.info.replay["kernels_run"] == len(src.timeline.kernels)
    assert not any(k[0] == "reduce_kernel_isfinite" for k in rep.info.kernels)


def test_a_replay_defers_the_garbage_collector_until_its_result_is_built(fake, monkeypatch):
    """As a full capture does: the collector's first threshold is raised from start to the end of stop (its
    read-out and build make thousands of objects), and the user's thresholds come back, also when the build fails."""
    import gc

    from tscope_callbacks.capture.collector import DEFERRED_THRESHOLD

    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    src = full_capture(model, opt)
    ReplayTimeline.script = plan_script(src)
    before = gc.get_threshold()
    seen = []
    build = rp.ReplayProfile._build

    def spy(self, tl, wall):
        seen.append(gc.get_threshold()[0])
        return build(self, tl, wall)

    monkeypatch.setattr(rp.ReplayProfile, "_build", spy)
    with ts.profile(model, replay=src) as rep:
        seen.append(gc.get_threshold()[0])
        step(model, opt)
    assert seen == [DEFERRED_THRESHOLD, DEFERRED_THRESHOLD] and gc.get_threshold() == before
    assert rep.info.replay["status"] == "matched"

    def broken(self, tl, wall):
        raise RuntimeError("boom")

    monkeypatch.setattr(rp.ReplayProfile, "_build", broken)
    with ts.profile(model, replay=src) as rep:
        step(model, opt)
    assert gc.get_threshold() == before and "boom" in rep.info.internal_errors[0]


def test_replay_needs_a_cuda_source_of_this_model(fake):
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with ts.profile(model, timing="cpu") as cpu:
        step(model, opt)
    with pytest.raises(ValueError, match="timed on CUDA"):
        ts.profile(model, replay=cpu)
    src = full_capture(model, opt)
    with pytest.raises(ValueError, match="another model"):
        ts.profile(mlp(), replay=src)
    with pytest.raises(TypeError, match="only info, user, raise_errors and faults.*layer_details"):
        ts.profile(model, replay=src, layer_details=True)
    with pytest.raises(TypeError, match="stopped ts.profile"):
        ts.profile(model, replay=src.result)
    ReplayTimeline.script = plan_script(src)
    with ts.profile(model, replay=src) as rep:
        with pytest.raises(NestedProfileError):
            ts.profile(model).start()
        step(model, opt)
    assert active_profile() is None
    rep2 = ts.profile(model, replay=rep)  # a replay of a replay counts from the same full capture
    assert rep2.source is src


def test_align_resynchronises_after_inserts_and_drops():
    plan = [name_of(i) for i in range(400)]
    assert align(plan, plan) == list(range(400))
    run = plan[:100] + ["Memcpy HtoD"] * 3 + plan[100:250] + plan[252:]  # 3 extra kernels, 2 planned ones missing
    m = align(plan, run)
    assert m[:100] == list(range(100)) and m[100:103] == [None] * 3
    assert m[103:253] == list(range(100, 250)) and m[253:] == list(range(252, 400))
    # a long foreign stretch: nothing of it matches, the rest resynchronises after it
    run = plan[:50] + [f"foreign_{i}" for i in range(30)] + plan[50:]
    m = align(plan, run)
    assert m[50:80] == [None] * 30 and m[80:] == list(range(50, 400))
    assert sum(x is not None for x in align(plan, [f"x{i}" for i in range(400)])) == 0


def fit_with(tmp_path, monkeypatch, callbacks_of):
    """Fit the demo LM for 5 steps on fake CUDA timing; each replayed step runs the source's kernels 3x as long.
    Returns the results the RooflineCallback got."""
    import lightning.pytorch as pl

    import tscope_callbacks.capture.region as region
    from tscope_callbacks.demo.lightning import DemoLM, RandomTokenData

    monkeypatch.setattr(region, "resolve_timing", lambda model, timing: "cuda")
    seen = []

    class Record(ts.RooflineCallback):
        def _on_profile(self, trainer, pl_module, result, ctx):
            seen.append(result)
            srcs = self.coordinator(trainer).replay_sources()
            if srcs:
                ReplayTimeline.script = plan_script(srcs[0], scale=3)
            super()._on_profile(trainer, pl_module, result, ctx)

    trainer = pl.Trainer(max_steps=5, callbacks=callbacks_of(Record), logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp_path)
    trainer.fit(DemoLM(vocab_size=64, seq_len=16, d_model=32, n_layer=1, n_head=2),
                RandomTokenData(vocab_size=64, seq_len=16, batch_size=4, num_samples=64))
    assert len(seen) >= 3
    return seen


def test_callbacks_replay_later_profiles_of_the_same_shapes(fake, monkeypatch, tmp_path):
    opts = {"gpu": "h100", "every_n_steps": 2, "start_step": 0, "outputs": ts.RooflineOutputs(plot=False, save_json=False)}
    seen = fit_with(tmp_path, monkeypatch, lambda Record: [Record(**opts)])
    assert seen[0].info.replay is None  # the first profile is a full capture
    for r in seen[1:]:
        assert r.info.replay["status"] == "matched"
        assert [o.time_s for o in r.ops] == [pytest.approx(3 * o.time_s) for o in seen[0].ops]
        assert r.info.step != seen[0].info.step


def test_callbacks_profile_in_full_when_asked_or_when_values_are_checked(fake, monkeypatch, tmp_path):
    opts = {"gpu": "h100", "every_n_steps": 2, "start_step": 0, "outputs": ts.RooflineOutputs(plot=False, save_json=False)}
    seen = fit_with(tmp_path, monkeypatch, lambda Record: [Record(capture=ts.CaptureOptions(replay=False), **opts)])
    assert not any(r.info.replay is not None for r in seen)
    layers = ts.LayerProfilerCallback(every_n_steps=2, start_step=0,
                                      outputs=ts.LayerOutputs(save_json=False, plot=False))  # check_finite
    seen = fit_with(tmp_path / "2", monkeypatch, lambda Record: [Record(**opts), layers])
    # the steps the value-checking callback shares are full captures; the roofline's own later steps of a k-step
    # series (reason "repeat", no value check) may replay
    assert not any(r.info.replay is not None for r in seen if r.info.reason != "repeat")


SOURCES: list[list] = []  #: the replay sources after each capture of the last ``_monitor_fit``


def _monitor_fit(monkeypatch, scale_or_script):
    """A 50-step fit with a loss spike at step 40 under the step monitor alone, on fake CUDA timing: its healthy
    baseline (a full capture) becomes the replay source; the spike's diagnosis profiles step 41. Returns (monitor,
    the profiles it got)."""
    from test_step_monitor import _fit, _Flags, _Net

    import tscope_callbacks.capture.region as region
    from tscope_callbacks.callbacks.coordinator import Coordinator
    from tscope_callbacks.callbacks.monitor import StepMonitor

    monkeypatch.setattr(region, "resolve_timing", lambda model, timing: "cuda")
    kept = Coordinator.after_capture
    SOURCES.clear()

    def after(self, key, prof, result):
        kept(self, key, prof, result)
        srcs = self.replay_sources()
        SOURCES.append(srcs)
        if srcs and not ReplayTimeline.script:
            ReplayTimeline.script = scale_or_script(srcs[0])

    monkeypatch.setattr(Coordinator, "after_capture", after)
    seen = []

    class Spy(StepMonitor):
        def _on_profile(self, trainer, pl_module, result, ctx):
            seen.append(result)
            super()._on_profile(trainer, pl_module, result, ctx)

    class Spiky(_Net):
        def training_step(self, batch, batch_idx):
            loss = super().training_step(batch, batch_idx)
            return loss * 20 if self.global_step == 40 else loss

    mon = Spy()
    _fit(Spiky(_Flags()), 50, mon)
    return mon, seen


def test_the_step_monitors_diagnosis_replays_from_its_baselines_full_capture(fake, monkeypatch, host):
    """On CUDA a diagnosis' profile is timed from kernel records with the healthy baseline's counts (a replay: a
    few percent of a step, not a full capture's several steps), and the diagnosis compares its op times."""
    mon, seen = _monitor_fit(monkeypatch, lambda src: plan_script(src, scale=3))
    base, diag = seen[0], seen[-1]
    assert base.info.reason == "baseline" and base.info.replay is None  # the first profile is a full capture
    assert diag.info.reason == "anomaly" and diag.info.step == 41
    assert diag.info.replay["status"] == "matched" and diag.info.replay["source_step"] == base.info.step
    assert [o.time_s for o in diag.ops] == [pytest.approx(3 * o.time_s) for o in base.ops]
    spikes = [a for a in mon.alerts if a["trigger"]["kind"] == "loss-spike"]
    assert len(spikes) == 1 and spikes[0]["profile_step"] == 41
    assert "no op times" not in spikes[0]["text"]


def test_a_diagnosis_whose_kernels_changed_says_so_and_the_next_profiles_in_full(fake, monkeypatch, host):
    mon, seen = _monitor_fit(monkeypatch, lambda src: [(f"other_kernel_{i}", 1000) for i in range(40)])
    diag = seen[-1]
    assert diag.info.replay["status"] == "mismatch" and all(o.time_s is None for o in diag.ops)
    [spike] = [a for a in mon.alerts if a["trigger"]["kind"] == "loss-spike"]
    n_plan = diag.info.replay["kernels_planned"]
    assert (f"no op times: the profiled step ran other kernels than the full capture of step {seen[0].info.step}, "
            f"0 of its {n_plan} matched in 40 run; the next diagnosis profiles in full") in spike["text"]
    assert SOURCES[-1] == []  # the source is dropped: this batch shape's next profile is a full capture
