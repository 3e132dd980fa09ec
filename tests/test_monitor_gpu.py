"""The step monitor on a GPU, on a fake device: a host part costs a GPU step only where the device waited during it.

The host runs ahead of the device. A real fit (CPU, the scripted host of tests/scripted_host.py) runs with the
monitor taking the CUDA path on fake CUDA events that follow a scripted stream: work queued at host time ``h`` runs
from ``max(h, the end of the work before it)``; an event completes when the stream reaches it; a sync (Lightning
reading a logged value with ``.item()``) moves the host clock to the end of the queued work. So every figure below is
exact, whatever the machine's load:

- a value logged with ``prog_bar=True`` read back in Lightning's metric bookkeeping while the device still runs the
  step: 19 ms of host time in the bookkeeping that cost the device nothing: no loop-overhead verdict (the host-only
  monitor said "Lightning metrics (self.log) bookkeeping 19 ms a step");
- the same sync with 6 ms of host work after it (a callback at batch start): the device waits those 6 ms every step
  (its queue empty): named as a host-device sync with the logged value, the device's wait and the change;
- a callback's 15 ms of host work while the device idles (no sync): the loop-overhead verdict names it with the
  device's 11 ms wait, not its 15 ms of host time;
- with the step's kernel time known (a CUDA profile of the step), where the device's idle after host work falls in
  the next forward (the host launching it kernel by kernel into an empty queue): the sync's saving (an H200's run a:
  prog_bar=False saved 7.2 ms a step the parts' device times did not show) and a callback's cost (run c) are the
  step less the longer of the kernel time and the host's step without the work, each checked against the same fit
  with the change applied.
"""

from __future__ import annotations

import logging

import lightning.pytorch as pl
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from tests.cb_utils import FAST
from tests.scripted_host import ScriptedHost
from tscope_callbacks.analysis import step_parts as sp
from tscope_callbacks.analysis.step_parts import PARTS
from tscope_callbacks.callbacks import loop_probe
from tscope_callbacks.callbacks.loop_probe import read_segments
from tscope_callbacks.callbacks.monitor import MonitorOptions, StepMonitor
from tscope_callbacks.records import OpRecord


class _Stream:
    """One CUDA stream on the scripted host's clock (module doc)."""

    def __init__(self, host: ScriptedHost) -> None:
        self.host, self.free_at = host, host.t
        self.syncs = 0

    def launch(self, seconds: float) -> None:
        self.free_at = max(self.host.t, self.free_at) + seconds

    def sync(self) -> None:
        """The host waits for the device (``.item()``)."""
        self.syncs += 1
        self.host.advance(max(self.free_at - self.host.t, 0.0))


class _Event:
    """``torch.cuda.Event`` on :class:`_Stream`: recorded at the end of the queued work, complete once the host's
    clock has passed it; nothing may wait on it."""

    stream: _Stream

    def __init__(self, enable_timing: bool = False) -> None:
        self.d: float | None = None

    def record(self) -> None:
        self.d = max(self.stream.host.t, self.stream.free_at)

    def query(self) -> bool:
        return self.d is not None and self.stream.host.t >= self.d

    def synchronize(self) -> None:
        raise AssertionError("a CUDA event was waited on")

    def elapsed_time(self, end: _Event) -> float:
        return (end.d - self.d) * 1e3  # type: ignore[operator]


class _Net(pl.LightningModule):
    """Each step queues ``device_s`` of device work, then 1 ms of host work; the loss logged (``prog_bar``)."""

    def __init__(self, stream: _Stream, device_s: float, prog_bar: bool) -> None:
        super().__init__()
        self.stream, self.device_s, self.prog_bar = stream, device_s, prog_bar
        self.lin = torch.nn.Linear(4, 1)

    def training_step(self, batch, batch_idx):
        self.stream.launch(self.device_s)
        self.stream.host.advance(0.001)
        loss = torch.nn.functional.mse_loss(self.lin(batch[0]), batch[1])
        self.log("train/loss", loss, prog_bar=self.prog_bar)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=1e-3)

    def train_dataloader(self):
        g = torch.Generator().manual_seed(0)
        return DataLoader(TensorDataset(torch.randn(512, 4, generator=g), torch.randn(512, 1, generator=g)),
                          batch_size=4)


class _HostWork(pl.Callback):
    """``seconds`` of host work at batch start or end (no device work)."""

    def __init__(self, host: ScriptedHost, seconds: float, hook: str) -> None:
        self.host, self.seconds, self.hook = host, seconds, hook

    def on_train_batch_start(self, *args) -> None:
        if self.hook == "start":
            self.host.advance(self.seconds)

    def on_train_batch_end(self, *args) -> None:
        if self.hook == "end":
            self.host.advance(self.seconds)


@pytest.fixture
def gpu(host: ScriptedHost, monkeypatch) -> _Stream:
    """The monitor takes its CUDA path on the fake stream; Lightning's progress-bar conversion syncs with it."""
    from lightning.pytorch.trainer.connectors.logger_connector import result

    stream = _Stream(host)
    _Event.stream = stream
    monkeypatch.setattr(torch.cuda, "Event", _Event)
    reset = StepMonitor._reset
    monkeypatch.setattr(StepMonitor, "_reset", lambda self, cuda: reset(self, True))
    monkeypatch.setattr(loop_probe, "_on_device", lambda t: True)  # the logged loss lives on the (fake) device
    convert = result.convert_tensors_to_scalars

    def item(value):
        stream.sync()  # .item() waits for the device
        return convert(value)

    monkeypatch.setattr(result, "convert_tensors_to_scalars", item)
    return stream


def _fit(stream: _Stream, *, device_s: float, prog_bar: bool, work: _HostWork | None = None,
         net: type[_Net] | None = None, kernel: list[OpRecord] | None = None) -> StepMonitor:
    mon = StepMonitor(MonitorOptions(), profile=False, telemetry=False)
    extra = [work] if work else []
    if kernel is not None:
        extra.append(_KernelProfile(mon, kernel))
    trainer = pl.Trainer(max_steps=60, callbacks=[mon, *extra], **{**FAST, "logger": False, "log_every_n_steps": 10})
    trainer.fit((net or _Net)(stream, device_s, prog_bar))
    assert mon.cuda and mon.last_breakdown is not None
    return mon


def test_a_sync_while_the_device_is_busy_is_no_loop_overhead(gpu: _Stream, caplog) -> None:
    # 20 ms of device work a step; the host's 1 ms queues it, then waits 19 ms in Lightning's metric bookkeeping
    # (the logged loss read back for the progress bar); nothing else on the host: the device never waits
    with caplog.at_level(logging.WARNING, logger="tscope_callbacks"):
        mon = _fit(gpu, device_s=0.020, prog_bar=True)
    assert gpu.syncs >= 60
    v = mon._verdict.summary()
    assert v is not None and v.steps >= sp.MIN_VERDICT_STEPS
    assert v.step_ms == pytest.approx(20.0, abs=0.01)  # the device's step
    # the host's 19 ms in the bookkeeping are there (what the host-only monitor called loop overhead) ...
    book = next(c for c in v.named if c.name == "Lightning metrics (self.log) bookkeeping")
    assert book.ms == pytest.approx(19.0, abs=0.01) and v.loop_ms / v.host_ms > 0.9
    # ... and cost the device nothing: no verdict
    assert book.device_ms == pytest.approx(0.0, abs=1e-6)
    assert v.loop_device_ms == pytest.approx(0.0, abs=1e-6) and v.host_idle_ms == pytest.approx(0.0, abs=1e-6)
    assert mon.progress_bar_reads == ("train/loss",)
    assert mon.loop_finding is None
    assert sp.loop_text(v) is None and sp.sync_text(v, mon.progress_bar_reads) is None
    # with the step's kernel time known (20 ms: the device's step), taking the sync away gives nothing back either
    kernel = sp.KernelTime({"forward": 20.0, "backward": 0.0, "optimizer": 0.0}, 20)
    assert sp.sync_text(v, mon.progress_bar_reads, kernel=kernel) is None and sp.loop_text(v, kernel=kernel) is None
    assert sp.sync_findings(v, mon.progress_bar_reads, kernel=kernel) == []
    assert not [r for r in caplog.records if "loop overhead" in r.message or "sync" in r.message]
    # the host-only reading of the same steps (as on CPU) would have blamed the bookkeeping
    host_only = sp.summarize([s.__class__(**{**{f: getattr(s, f) for f in s.__slots__}, "dev_parts": None,
                                             "dev_named": None}) for s in mon._verdict.steps])
    assert host_only is not None and "bookkeeping 19 ms a step" in (sp.loop_text(host_only) or "")


def test_a_sync_the_device_then_waits_after_is_named_with_its_change(gpu: _Stream, caplog) -> None:
    # the same sync, then 6 ms of host work at the next batch start: the device, its queue empty, waits 6 ms a step
    with caplog.at_level(logging.WARNING, logger="tscope_callbacks"):
        mon = _fit(gpu, device_s=0.020, prog_bar=True, work=_HostWork(gpu.host, 0.006, "start"))
    v = mon._verdict.summary()
    assert v is not None
    assert v.step_ms == pytest.approx(26.0, abs=0.01)
    dev = v.device_parts_ms
    assert dev is not None and dev["hooks"] == pytest.approx(6.0, abs=0.01)  # the callback, while the device waited
    assert v.host_idle_ms == pytest.approx(6.0, abs=0.01)
    text = mon.loop_finding
    assert text is not None and text.startswith("the logged value 'train/loss' is read back to the host"), text
    assert "waits 6 ms a step (23.1% of the 26 ms step" in text, text
    assert "Lightning metrics (self.log) bookkeeping: 19 ms a step on the host, 19 ms of it while the device was busy" in text
    assert "prog_bar=False" in text and "on_step=False" in text
    # without the wait the host's own work is 7 ms a step, under the device's 20: the 6 ms come back
    assert "saves up to 6 ms a step" in text
    f = sp.sync_findings(v, mon.progress_bar_reads)
    assert len(f) == 1 and f[0]["saving_s"] == pytest.approx(0.006, abs=1e-5)
    assert [r for r in caplog.records if r.message.startswith("tscope StepMonitor: host-device sync:")]


def test_host_work_the_device_waits_for_is_loop_overhead_by_the_devices_wait(gpu: _Stream, caplog) -> None:
    # no sync: 5 ms of device work, then 15 ms of host work in a callback's batch end: the device waits 11 ms of them
    with caplog.at_level(logging.WARNING, logger="tscope_callbacks"):
        mon = _fit(gpu, device_s=0.005, prog_bar=False, work=_HostWork(gpu.host, 0.015, "end"))
    assert gpu.syncs == 0 and mon.progress_bar_reads == ()
    v = mon._verdict.summary()
    assert v is not None and v.step_ms == pytest.approx(16.0, abs=0.01)
    work = next(c for c in v.named if c.name == "_HostWork")
    assert work.ms == pytest.approx(15.0, abs=0.01) and work.device_ms == pytest.approx(11.0, abs=0.01)
    text = mon.loop_finding
    assert text is not None and text.startswith("the device waits 11 ms a step for the loop's own work (68.7% of the 16 ms"), text
    assert "_HostWork 11 ms a step (host 15 ms)" in text
    f = sp.loop_findings(v)
    assert f and f[0]["saving_s"] == pytest.approx(0.011, abs=1e-5) and "_HostWork" in f[0]["cause"]
    assert [r for r in caplog.records if r.message.startswith("tscope StepMonitor: loop overhead:")]


class _Launched(_Net):
    """The shape of a real step's launches: the forward launches 10 kernels of 0.8 ms, each after 1 ms of host time
    (the host's launch work); the backward queues 12 ms of kernels after 1 ms of host time: 20 ms of kernels a step,
    11 ms of host work. With a full queue the device runs 20 ms a step; after a sync (the queue empty) it runs each
    forward kernel as the host launches it and idles 0.2 ms before the next, and 1 ms before the first."""

    def training_step(self, batch, batch_idx):
        for _ in range(10):
            self.stream.host.advance(0.001)
            self.stream.launch(0.0008)
        loss = torch.nn.functional.mse_loss(self.lin(batch[0]), batch[1])
        self.log("train/loss", loss, prog_bar=self.prog_bar)
        return loss

    def backward(self, loss, *args, **kwargs):
        self.stream.host.advance(0.001)
        self.stream.launch(0.012)
        super().backward(loss, *args, **kwargs)


#: :class:`_Launched`'s kernels as a CUDA profile of its step records them (the op records' kernel time)
_KERNELS = [*(OpRecord("aten.mm", "lin", "forward", time_s=0.0008) for _ in range(10)),
            OpRecord("aten.mm", "lin", "backward", time_s=0.012)]


class _KernelProfile(pl.Callback):
    """The monitor's kernel time from a CUDA profile of the step (``records`` of timing "cuda-kernels") from the
    start, as a scheduled profile's or the monitor's own baseline's would give it."""

    def __init__(self, mon: StepMonitor, records: list[OpRecord]) -> None:
        self.mon, self.records = mon, records

    def on_train_start(self, *args) -> None:
        self.mon.kernel = sp.kernel_time(self.records, "cuda-kernels", 0)


def test_kernel_time_of_a_profile() -> None:
    k = sp.kernel_time(_KERNELS + [OpRecord("aten.add_", "", "optimizer", time_s=0.0005)], "cuda-kernels", 7)
    assert k is not None and k.parts_ms == pytest.approx({"forward": 8.0, "backward": 12.0, "optimizer": 0.5})
    assert k.ms == pytest.approx(20.5) and k.step == 7
    assert sp.kernel_time(_KERNELS, "cpu-wall") is None  # a CPU profile's op times are no kernel time
    assert sp.kernel_time(_KERNELS[:10], "cuda-kernels") is None  # no backward: not a training step


def test_a_sync_whose_idle_falls_in_the_next_forward_is_named_with_the_measured_saving(gpu: _Stream, caplog) -> None:
    # run a's shape: the loss read back after every batch; the device then idles between the next forward's kernels
    # while the host launches them (3 ms a step: 1 ms before the first, 0.2 ms before each of the next 9, 0.2 ms
    # before the backward's), not in the loop's parts: their device time is 0, the old rule's figure
    with caplog.at_level(logging.WARNING, logger="tscope_callbacks"):
        mon = _fit(gpu, device_s=0.0, prog_bar=True, net=_Launched, kernel=_KERNELS)
    v = mon._verdict.summary()
    assert v is not None and v.step_ms == pytest.approx(23.0, abs=0.01)
    assert v.host_idle_ms == pytest.approx(0.0, abs=1e-6)
    assert sp.sync_text(v, mon.progress_bar_reads) is None  # the parts' device times alone: no finding
    dev = v.device_parts_ms or {}
    assert dev["forward"] == pytest.approx(10.8, abs=0.01)  # 8 ms of kernels, 2.8 ms of idle between them
    text = mon.loop_finding
    assert text is not None and text.startswith("the logged value 'train/loss' is read back to the host"), text
    # the idle: the step less its 20 ms of kernels; the saving: 23 - max(20, the host's 11 ms without the wait)
    assert "waits 3 ms a step (13% of the 23 ms step, mean of" in text, text
    assert "its kernels take 20 ms (profile of step 0)" in text, text
    assert "forward (between its kernels: 8 ms of kernels) 2.8 ms (host 10 ms)" in text, text
    assert "saves up to 3 ms a step (the step less the longer of its kernel time and the host's own work a step " \
           "without the wait, 11 ms)" in text, text
    f = sp.sync_findings(v, mon.progress_bar_reads, kernel=mon.kernel)
    assert len(f) == 1 and f[0]["saving_s"] == pytest.approx(0.003, abs=1e-5)
    assert [r for r in caplog.records if r.message.startswith("tscope StepMonitor: host-device sync:")]
    # the witness: the change applied (prog_bar=False): the host runs ahead, the step is its 20 ms of kernels
    gpu.free_at = gpu.host.t
    b = _fit(gpu, device_s=0.0, prog_bar=False, net=_Launched, kernel=_KERNELS)
    vb = b._verdict.summary()
    assert vb is not None and b.loop_finding is None
    assert v.step_ms - vb.step_ms == pytest.approx(f[0]["saving_s"] * 1e3, abs=0.01)


def test_host_work_that_drains_the_queue_costs_what_it_adds_to_the_step(gpu: _Stream, caplog) -> None:
    # run c's shape: no sync; 14 ms of host work at batch end. The host's step (25 ms) now paces the device: the
    # queue drains during the work (the device's time while it ran: 2 ms, the old figure), then the device idles
    # between the next forward's kernels (3 ms more). Its cost: 25 - max(20 ms of kernels, 11 ms of host without it)
    with caplog.at_level(logging.WARNING, logger="tscope_callbacks"):
        mon = _fit(gpu, device_s=0.0, prog_bar=False, net=_Launched, kernel=_KERNELS,
                   work=_HostWork(gpu.host, 0.014, "end"))
    v = mon._verdict.summary()
    assert v is not None and v.step_ms == pytest.approx(25.0, abs=0.01)
    work = next(c for c in v.named if c.name == "_HostWork")
    assert work.device_ms == pytest.approx(2.0, abs=0.01)  # what the parts' device times alone say
    old = sp.loop_text(v)
    assert old is not None and "_HostWork 2 ms a step (host 14 ms)" in old and sp.NO_KERNEL in old
    text = mon.loop_finding
    assert text is not None and text.startswith("the device waits 5 ms a step for the loop's own work (20% of the 25 ms"), text
    assert "its kernels take 20 ms (profile of step 0), the host's step without it 11 ms" in text, text
    assert "_HostWork 5 ms a step (host 14 ms)" in text, text
    f = sp.loop_findings(v, kernel=mon.kernel)
    assert f and f[0]["saving_s"] == pytest.approx(0.005, abs=1e-5) and "_HostWork" in f[0]["cause"]
    assert [r for r in caplog.records if r.message.startswith("tscope StepMonitor: loop overhead:")]
    # the witness: the work taken away (as in run b): the step is its 20 ms of kernels, 5 ms less
    gpu.free_at = gpu.host.t
    b = _fit(gpu, device_s=0.0, prog_bar=False, net=_Launched, kernel=_KERNELS)
    vb = b._verdict.summary()
    assert vb is not None and v.step_ms - vb.step_ms == pytest.approx(f[0]["saving_s"] * 1e3, abs=0.01)


class _Slower(_Net):
    """The device's work a step grows by half from step 60 (a slower kernel): the host's wait in the read-back grows
    with it."""

    def training_step(self, batch, batch_idx):
        if self.global_step == 60:
            self.device_s *= 1.5
        return super().training_step(batch, batch_idx)


def test_a_slower_kernel_is_named_on_the_device_not_as_the_hosts_longer_wait(gpu: _Stream) -> None:
    mon = StepMonitor(MonitorOptions(), profile=False, telemetry=False)
    trainer = pl.Trainer(max_steps=110, callbacks=[mon], **{**FAST, "logger": False, "log_every_n_steps": 10})
    trainer.fit(_Slower(gpu, 0.020, True))
    slow = [a for a in mon.alerts if a["trigger"]["kind"] == "slow-steps"]
    assert slow, [a["text"] for a in mon.alerts]
    grew = {(f.kind, f.name): f for f in slow[0]["findings"]}
    # the forward's device time grew 20 -> 30 ms; the host's wait in Lightning's bookkeeping grew as much (19 -> 29
    # ms) but cost the device nothing: not named
    f = grew.get(("part", "forward"))
    assert f is not None and f.before == pytest.approx(20.0, abs=0.01) and f.after == pytest.approx(30.0, abs=0.01)
    assert "forward 20 ms -> 30 ms a step on the device" in slow[0]["text"]
    assert ("part", "logging") not in grew and ("hook", "Lightning metrics (self.log) bookkeeping") not in grew


def test_segments_share_their_device_time_by_host_time() -> None:
    class E:
        def __init__(self, d: float) -> None:
            self.d = d

        def query(self) -> bool:
            return True

        def elapsed_time(self, end: E) -> float:
            return (end.d - self.d) * 1e3

    HOOKS, LOGGING, FORWARD = (PARTS.index(p) for p in ("hooks", "logging", "forward"))
    e = [E(0.0), E(0.004), E(0.0045), E(0.0145)]
    segs = [(e[0], e[1], {(HOOKS, "hooks:A"): 0.003, (LOGGING, "logging:B"): 0.001}),  # 4 ms shared 3:1
            (e[1], e[2], {}),  # nothing ran on the host between two events: other
            (e[2], e[3], {(FORWARD, None): 0.002})]  # a compute part: its device time whole
    dev, named = read_segments(segs)  # type: ignore[misc]
    assert dev[HOOKS] == pytest.approx(0.003) and dev[LOGGING] == pytest.approx(0.001)
    assert dev[PARTS.index("other")] == pytest.approx(0.0005) and dev[FORWARD] == pytest.approx(0.010)
    assert named == {"hooks:A": pytest.approx(0.003), "logging:B": pytest.approx(0.001)}

    # a 10 us hook inside the optimizer step, in one segment with the optimizer's 200 us of host time that queued
    # 1.3 ms of device work: the hook costs at most its own 10 us, the optimizer the rest
    OPT = PARTS.index("optimizer")
    dev, named = read_segments([(E(0.0), E(0.0013), {(HOOKS, "hooks:A"): 10e-6, (OPT, None): 200e-6})])  # type: ignore[misc]
    assert dev[HOOKS] == pytest.approx(10e-6) and dev[OPT] == pytest.approx(0.0013 - 10e-6)
    assert named == {"hooks:A": pytest.approx(10e-6)}

    class Pending(E):
        def query(self) -> bool:
            return False

    assert read_segments([(e[0], Pending(0.01), {})]) is None  # not complete: not read, nothing waits


def test_breakdown_round_trips_its_device_figures() -> None:
    st = sp.StepTimes(1, 0.02, tuple([0.002] * len(PARTS)), {"hooks:A": 0.002}, None,
                      dev_parts=tuple([0.001] * len(PARTS)), dev_named={"hooks:A": 0.0005})
    b = sp.summarize([st])
    assert b is not None and b.device_parts_ms == pytest.approx({p: 1.0 for p in PARTS})
    assert b.named[0].device_ms == pytest.approx(0.5)
    again = sp.Breakdown.from_dict(b.to_dict())
    assert again.device_parts_ms == b.device_parts_ms and again.named == b.named
    r = sp.Rolling(4)
    r.add(st)
    rb = r.summary()
    assert rb is not None and rb.device_parts_ms == pytest.approx(b.device_parts_ms)
    assert rb.named[0].device_ms == pytest.approx(0.5)
    assert b.scalars()["loop_device_ms"] == pytest.approx(4.0)  # hooks, logging, checkpoint, other


def test_the_verdict_waits_for_the_baseline_profiles_kernel_time(gpu: _Stream, monkeypatch) -> None:
    # the monitor alone, profiling: its loop verdict waits for its baseline profile (after 20 clean steps), whose
    # kernel time (here: the CPU capture's records read as _Launched's kernels) gives the cost; without the wait it
    # would have said the parts' 2 ms at step 20
    seen: list[int | None] = []

    def kernel_time(ops, timing, step=None):
        seen.append(step)
        return sp.KernelTime({"forward": 8.0, "backward": 12.0, "optimizer": 0.0}, step)

    monkeypatch.setattr(sp, "kernel_time", kernel_time)
    mon = StepMonitor(MonitorOptions(), profile=True, telemetry=False)
    trainer = pl.Trainer(max_steps=60, callbacks=[mon, _HostWork(gpu.host, 0.014, "end")],
                         **{**FAST, "logger": False, "log_every_n_steps": 10})
    trainer.fit(_Launched(gpu, 0.0, False))
    assert mon.captures and seen and seen[0] == mon.captures[0] and mon.kernel is not None
    assert mon.loop_finding is not None, "no verdict"
    assert f"its kernels take 20 ms (profile of step {mon.captures[0]})" in mon.loop_finding, mon.loop_finding
    assert "_HostWork 5 ms a step (host 14 ms)" in mon.loop_finding, mon.loop_finding
