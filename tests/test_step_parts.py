"""The step's parts: which Lightning action is which part, the probe's exclusive accounting on an injected clock,
the verdicts (input-bound, loop overhead) and the late rank on scripted samples (no timing of the machine)."""

from __future__ import annotations

import math
import statistics
import time

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.loggers import CSVLogger
from torch.utils.data import DataLoader, Dataset

from tests.cb_utils import FAST
from tscope_callbacks.analysis import step_parts as sp
from tscope_callbacks.analysis.step_parts import PARTS, StepTimes
from tscope_callbacks.callbacks.loop_probe import LoopProbe, classify
from tscope_callbacks.callbacks.monitor import StepMonitor

_P = {p: i for i, p in enumerate(PARTS)}


def _parts(**ms: float) -> tuple[float, ...]:
    v = [0.0] * len(PARTS)
    for k, x in ms.items():
        v[_P[k]] = x / 1e3
    return tuple(v)


# ---------------------------------------------------------------------------------------------- classification
@pytest.mark.parametrize("action, part, name", [
    ("[_TrainingEpochLoop].train_dataloader_next", "fetch", ""),
    ("[Strategy]DDPStrategy.batch_to_device", "transfer", ""),
    ("[LightningModule]Net.on_before_batch_transfer", "transfer", ""),
    ("[LightningModule]Net.transfer_batch_to_device", "transfer", ""),
    ("[Strategy]SingleDeviceStrategy.training_step", "forward", ""),
    ("[Strategy]SingleDeviceStrategy.backward", "backward", ""),
    ("[LightningModule]Net.optimizer_step", "optimizer", ""),
    ("[LightningModule]Net.optimizer_zero_grad", "optimizer", ""),
    ("[LightningModule]Net.configure_gradient_clipping", "optimizer", ""),
    ("[LightningModule]Net.on_train_batch_end", "hooks", "Net.on_train_batch_end"),
    ("[Strategy]SingleDeviceStrategy.on_train_batch_start", "hooks", "SingleDeviceStrategy.on_train_batch_start"),
    # a state key with dots in it (a monitored metric name): the hook is after the last dot
    ("[Callback]ModelCheckpoint{'monitor': 'val.loss', 'mode': 'min'}.on_train_batch_end", "hooks", "ModelCheckpoint"),
    ("[Callback]StepMonitor{'stages': ('train',)}.on_train_batch_end", "tscope", "StepMonitor"),
    ("save_checkpoint", "checkpoint", "save_checkpoint"),
])
def test_classify_lightning_actions(action: str, part: str, name: str) -> None:
    tscope = {"StepMonitor{'stages': ('train',)}": "StepMonitor"}
    labels = {"ModelCheckpoint{'monitor': 'val.loss', 'mode': 'min'}": "ModelCheckpoint"}
    k = classify(action, tscope, labels)
    assert k is not None and PARTS[k[0]] == part and k[1] == name
    assert k[2] == (part == "fetch")  # only the fetch starts a step


def test_unmarked_actions_are_not_parts() -> None:
    for a in ("run_training_batch", "run_training_epoch", "[_EvaluationLoop].val_next", "my own thing"):
        assert classify(a, {}, {}) is None


# ---------------------------------------------------------------------------------------------- the probe
class _Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t

    def go(self, ms: float) -> None:
        self.t += ms / 1e3


def _step(p: LoopProbe, c: _Clock, step: int, *, fetch: float = 2.0, hook: float = 0.5, logging: float = 0.0,
          ckpt: float = 0.0, tail: float = 0.0) -> None:
    """One scripted step as Lightning marks it (ms): fetch, transfer (with a module hook inside), a callback's
    batch-start hook, optimizer_step around training_step (4 ms) and backward (3 ms, a callback hook of 0.25 ms
    inside), the update (1 ms), the batch end, the loop's logging and a checkpoint after it."""
    cb = "[Callback]Slow{'x': 1}"
    p.begin("[_TrainingEpochLoop].train_dataloader_next")
    c.go(fetch)
    p.end("[_TrainingEpochLoop].train_dataloader_next")
    p.begin("[Strategy]S.batch_to_device")
    c.go(0.2)
    p.begin("[LightningModule]Net.transfer_batch_to_device")
    c.go(0.3)
    p.end("[LightningModule]Net.transfer_batch_to_device")
    p.end("[Strategy]S.batch_to_device")
    p.batch_start(step)
    p.begin(f"{cb}.on_train_batch_start")
    c.go(hook)
    p.end(f"{cb}.on_train_batch_start")
    p.begin("run_training_batch")  # not a part: its own time is the loop's (other)
    c.go(0.1)
    p.begin("[LightningModule]Net.optimizer_step")
    c.go(0.05)
    p.begin("[Strategy]S.training_step")
    c.go(4.0)
    p.end("[Strategy]S.training_step")
    p.begin("[Strategy]S.backward")
    c.go(1.0)
    p.begin(f"{cb}.on_before_backward")
    c.go(0.25)
    p.end(f"{cb}.on_before_backward")
    c.go(2.0)
    if tail:
        p.tail.t = c()  # the last gradient accumulated here (DDP): the rest of backward is the reducer's wait
        c.go(tail)
    p.end("[Strategy]S.backward")
    c.go(0.95)
    p.end("[LightningModule]Net.optimizer_step")
    p.end("run_training_batch")
    p.begin("[Callback]StepMonitor{}.on_train_batch_end")  # tscope's own hook, logging inside it is tscope's too
    c.go(0.1)
    p.begin("<tscope>log")
    c.go(0.2)
    p.end("<tscope>log")
    p.end("[Callback]StepMonitor{}.on_train_batch_end")
    p.end_of_step()
    c.go(0.15)  # Lightning's bookkeeping: marked by nothing
    if logging:
        p.begin("<tscope>log")
        c.go(logging)
        p.end("<tscope>log")
    if ckpt:
        p.begin(f"{cb}.on_train_batch_end")
        p.begin("save_checkpoint")
        c.go(ckpt)
        p.end("save_checkpoint")
        p.end(f"{cb}.on_train_batch_end")


class _Tail:
    t: float | None = None

    def take(self, t0: float, t1: float):
        t, self.t = self.t, None
        return (t1 - t, None) if t is not None and t0 <= t <= t1 else (0.0, None)


def _probe() -> tuple[LoopProbe, _Clock]:
    c = _Clock()
    waits = iter([0.0, 0.001, 0.0015, 0.0035, 0.0035, 0.0035])
    p = LoopProbe(clock=c, cpu_wait=lambda: next(waits))
    p.tscope_keys = {"StepMonitor{}": "StepMonitor"}
    p.labels = {"Slow{'x': 1}": "Slow"}
    p._own["<tscope>log"] = (_P["logging"], "CSVLogger.log_metrics", False)
    return p, c


def test_probe_parts_are_exclusive_and_add_up_to_the_step() -> None:
    p, c = _probe()
    _step(p, c, 0)  # warm-up: dirty
    _step(p, c, 1, logging=0.4)
    _step(p, c, 2, fetch=5.0, ckpt=30.0)
    p.begin("[_TrainingEpochLoop].train_dataloader_next")  # the next step's fetch closes step 2
    done = [st for st, _, _ in p.take()]
    assert [s.step for s in done] == [0, 1, 2] and done[0].dirty and not done[1].dirty
    s1, s2 = done[1], done[2]
    # step 1 (ms): fetch 2; transfer 0.2 + 0.3; forward 4; backward 1 + 2 (its hook apart); optimizer 0.05 + 0.95;
    # hooks 0.5 + 0.25; tscope 0.1 + 0.2 (the log inside tscope's hook); logging 0.4 (after the batch end);
    # other: run_training_batch's own 0.1 and the unmarked 0.15
    want = dict(fetch=2.0, transfer=0.5, forward=4.0, backward=3.0, optimizer=1.0, hooks=0.75, logging=0.4,
                tscope=0.3, other=0.25)
    for k, v in want.items():
        assert s1.part(k) * 1e3 == pytest.approx(v, abs=1e-9), k
    assert s1.host_s * 1e3 == pytest.approx(12.2) and sum(s1.parts) == pytest.approx(s1.host_s)
    assert s1.named["hooks:Slow"] * 1e3 == pytest.approx(0.75)
    assert s1.named["logging:CSVLogger.log_metrics"] * 1e3 == pytest.approx(0.4)
    assert s1.named["tscope:StepMonitor"] * 1e3 == pytest.approx(0.3)  # its inner log counted as tscope's
    assert s1.cpu_wait_s == pytest.approx(0.0005)  # schedstat read at each step's start: 0.001 -> 0.0015
    # step 2: the checkpoint saved inside a callback's batch-end hook is the checkpoint part, the hook's rest hooks
    assert s2.part("fetch") * 1e3 == pytest.approx(5.0) and s2.part("checkpoint") * 1e3 == pytest.approx(30.0)
    assert s2.named["checkpoint:save_checkpoint"] * 1e3 == pytest.approx(30.0)
    assert s2.cpu_wait_s == pytest.approx(0.002)


def test_probe_moves_the_ddp_tail_wait_to_sync() -> None:
    p, c = _probe()
    p.tail = _Tail()
    _step(p, c, 0)
    _step(p, c, 1, tail=30.0)
    p.begin("[_TrainingEpochLoop].train_dataloader_next")
    s = [st for st, _, _ in p.take()][1]
    assert s.part("sync") * 1e3 == pytest.approx(30.0) and s.part("backward") * 1e3 == pytest.approx(3.0)
    assert s.named["sync:DDP gradient all-reduce wait"] * 1e3 == pytest.approx(30.0)


def test_probe_counts_its_own_cost_as_tscope() -> None:
    p, c = _probe()
    p.call_cost_s = 1e-6
    _step(p, c, 0)
    _step(p, c, 1)
    p.begin("[_TrainingEpochLoop].train_dataloader_next")
    s = [st for st, _, _ in p.take()][1]
    # 11 marked actions in step 1 (its fetch, transfer x2, 2 callback hooks, run_training_batch, optimizer_step,
    # training_step, backward, tscope's hook and the log inside it), 1 us each
    assert s.named["tscope:step-parts probe"] == pytest.approx(11e-6)
    assert s.part("tscope") == pytest.approx(0.0003 + 11e-6)


def test_probe_survives_a_stop_that_never_came() -> None:
    p, c = _probe()
    _step(p, c, 0)
    p.begin("[_TrainingEpochLoop].train_dataloader_next")
    c.go(1.0)
    p.end("[_TrainingEpochLoop].train_dataloader_next")
    p.batch_start(1)
    p.begin("[Strategy]S.training_step")
    p.begin("[Callback]Slow{'x': 1}.on_before_backward")  # raised inside: its stop never comes
    c.go(2.0)
    p.end("[Strategy]S.training_step")  # the outer one's stop pops it
    assert p._stack == []
    p.end("[Strategy]S.training_step")  # a stop without a start: ignored
    assert p.faults == 0


# ---------------------------------------------------------------------------------------------- verdicts
def _st(step: int, host_ms: float, dirty: bool = False, named: dict | None = None, wait: float | None = None,
        **parts: float) -> StepTimes:
    other = host_ms - sum(parts.values())
    return StepTimes(step, host_ms / 1e3, _parts(**parts, other=other), dict(named or {}),
                     None if wait is None else wait / 1e3, dirty=dirty)


def test_rolling_equals_summarize() -> None:
    steps = [_st(i, 10.0 + i % 3, fetch=1.0 + i % 2, forward=5.0, named={"hooks:A": 0.001 * (i % 4 == 0)},
                 wait=0.5) for i in range(40)]
    r = sp.Rolling(16)
    r.extend(steps)
    a, b = r.summary(), sp.summarize(steps[-16:])
    assert a.steps == b.steps == 16
    for p in PARTS:
        assert a.parts_ms[p] == pytest.approx(b.parts_ms[p])
    assert a.step_ms == pytest.approx(b.step_ms) and a.cpu_wait_ms == pytest.approx(b.cpu_wait_ms)
    assert [(c.name, c.occurrences) for c in a.named] == [(c.name, c.occurrences) for c in b.named]
    assert a.named[0].ms == pytest.approx(b.named[0].ms)


def test_input_bound_needs_the_fetch_over_the_threshold() -> None:
    # 10 ms steps: a 1 ms fetch + transfer (10%) is input-bound at the 10% threshold; 0.9 ms is not. The loop's
    # own work (here 3 ms of "other") never counts as fetching
    at = sp.summarize([_st(i, 10.0, fetch=0.6, transfer=0.4, forward=6.0) for i in range(4)])
    below = sp.summarize([_st(i, 10.0, fetch=0.5, transfer=0.4, forward=6.1) for i in range(4)])
    assert at.input_bound and at.fetch_share == pytest.approx(0.1) and not below.input_bound
    # on a GPU the device must wait as well: a host fetch the device does not idle for is hidden
    assert sp.input_bound(0.3, 0.12) and not sp.input_bound(0.3, 0.02)


def test_loop_text_names_the_biggest_items_and_keeps_tscope_apart() -> None:
    # 10 ms steps; a logger at every step (0.5 ms), a checkpoint of 40 ms every 20 steps (2 ms a step), a
    # callback 0.2 ms; tscope 0.2 ms
    steps = []
    for i in range(40):
        named = {"logging:CSVLogger.save": 0.0005, "hooks:Progress": 0.0002, "tscope:StepMonitor": 0.0002}
        ck = 40.0 if i % 20 == 0 else 0.0
        if ck:
            named["checkpoint:save_checkpoint"] = 0.04
        steps.append(_st(i, 10.0 + ck, named=named, forward=7.0, logging=0.5, hooks=0.2, tscope=0.2,
                         checkpoint=ck))
    b = sp.summarize(steps)
    text = sp.loop_text(b)
    assert text is not None
    assert "save_checkpoint 40 ms every 20 steps = 2 ms a step" in text
    assert "CSVLogger.save 500 µs a step" in text and text.index("save_checkpoint") < text.index("CSVLogger")
    assert "tscope's own hooks: 200 µs a step, not counted" in text
    quiet = sp.summarize([_st(i, 10.0, forward=9.9, logging=0.05, named={"logging:x": 5e-5}) for i in range(20)])
    assert sp.loop_text(quiet) is None  # 0.1 ms of 10 (1%): under the 5% share
    # the same as findings for the report: each names a change and its saving (the item's cost a step)
    f = sp.loop_findings(b)
    assert [x["saving_s"] for x in f] == pytest.approx([0.002, 0.0005, 0.0002])
    assert "every_n_train_steps" in f[0]["change"] and "40 ms, every 20 steps" in f[0]["change"]
    assert "log_every_n_steps" in f[1]["change"] and "make Progress's hooks cheaper" in f[2]["change"]
    assert f[0]["cause"].startswith("the loop's own work: save_checkpoint 40 ms every 20 steps = 2 ms a step")
    assert sp.loop_findings(quiet) == []


# ---------------------------------------------------------------------------------------------- late ranks
def _rank(step: float, sync: float, **parts: float) -> list[float]:
    b = sp.summarize([_st(0, step, sync=sync, **parts)])
    return sp.rank_vector(b)


@pytest.mark.parametrize("late, where, part", [(2, "fetch", "data"), (1, "forward", "compute"),
                                               (3, "hooks", "host")])
def test_late_rank_is_named_with_its_cost_and_part(late: int, where: str, part: str) -> None:
    # 4 ranks, a 20 ms step of their own; the late rank spends 30 ms more in one part, the others wait for it in
    # their sync (30 ms plus the 1 ms all-reduce everyone pays)
    rows = []
    for r in range(4):
        base = {"fetch": 2.0, "forward": 8.0, "backward": 6.0, "hooks": 1.0}
        if r == late:
            base[where] += 30.0
            rows.append(_rank(51.0, 1.0, **base))
        else:
            rows.append(_rank(51.0, 31.0, **base))
    lr = sp.late_rank(rows)
    assert lr is not None and lr.rank == late and lr.finding
    assert lr.cost_ms == pytest.approx(30.0) and lr.part == where and lr.kind == part
    assert lr.excess_ms == pytest.approx(30.0)
    assert f"rank {late} is late: every other rank waits 30 ms a step" in lr.text and f"in its {part}" in lr.text


def test_no_late_rank_when_the_ranks_wait_alike() -> None:
    rows = [_rank(20.0, 1.0 + 0.01 * r, forward=10.0) for r in range(4)]
    lr = sp.late_rank(rows)
    assert lr is not None and not lr.finding and lr.cost_ms < 0.05
    assert sp.late_rank(rows[:1]) is None  # one rank: nobody to wait for
    nan = [math.nan] * len(sp.RANK_FIELDS)
    assert sp.late_rank([rows[0], nan]) is None  # a rank without clean steps tells nothing


class _Data(Dataset):
    """In-memory samples; each sample spends 0.2 ms (a fetch worth timing)."""

    def __init__(self) -> None:
        g = torch.Generator().manual_seed(0)
        self.x, self.y = torch.randn(2048, 64, generator=g), torch.randn(2048, 8, generator=g)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        time.sleep(0.0002)
        return self.x[i], self.y[i]


class _Logged(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 8))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        self.log("loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=1e-3)

    def train_dataloader(self):
        return DataLoader(_Data(), batch_size=16)


# ---------------------------------------------------------------------------------------------- against Lightning
class _SlowHook(pl.Callback):
    """A callback whose batch-end hook sleeps 1 ms."""

    def on_train_batch_end(self, *args) -> None:
        time.sleep(0.001)


def _sp(durations: dict[str, list[float]], suffix: str) -> list[float]:
    (key,) = [k for k in durations if k.endswith(suffix)]
    return durations[key]


def test_parts_agree_with_lightnings_simple_profiler(tmp_path) -> None:
    # one fit timed by both, in real time: Lightning's SimpleProfiler (its own clocks) and the monitor's parts, per
    # step, over the
    # same steps. Each part is compared with the SimpleProfiler actions it is made of (within 10% or 0.2 ms, medians
    # over the steps: the machine's load is the same for both). The monitor marks the same points, so this checks
    # that each action lands in its part, exclusive of the actions nested in it, and each step is its own
    from lightning.pytorch.profilers import SimpleProfiler

    prof = SimpleProfiler()
    mon = StepMonitor(profile=False)
    seen: list[StepTimes] = []
    add = mon._add
    mon._add = lambda trainer, st: (seen.append(st), add(trainer, st))  # type: ignore[method-assign]

    trainer = pl.Trainer(max_steps=60, callbacks=[mon, _SlowHook()], profiler=prof, logger=CSVLogger(str(tmp_path)),
                         **{**FAST, "log_every_n_steps": 1})
    trainer.fit(_Logged())
    d = prof.recorded_durations
    steps = [st for st in seen if 5 <= st.step < 58]
    idx = [st.step for st in steps]  # one fetch and one of each hook per step: the i-th call is step i's
    med = lambda xs: statistics.median(xs) * 1e3  # noqa: E731

    def close(ours: list[float], theirs: list[float], what: str) -> None:
        a, b = med(ours), med(theirs)
        assert abs(a - b) <= max(0.10 * b, 0.2), f"{what}: tscope {a:.4g} ms, SimpleProfiler {b:.4g} ms"

    close([st.part("fetch") for st in steps], [_sp(d, "train_dataloader_next")[i] for i in idx], "fetch")
    close([st.named["hooks:_SlowHook"] for st in steps],
          [_sp(d, "]_SlowHook.on_train_batch_end")[i] for i in idx], "the callback's hooks")
    opt, fwd, bwd = (_sp(d, "_Logged.optimizer_step"), _sp(d, "Strategy.training_step"),
                     _sp(d, "Strategy.backward"))
    inner = [v for k, v in d.items() if k.endswith((".on_before_zero_grad", ".on_before_optimizer_step"))]
    in_bwd = [v for k, v in d.items() if k.endswith((".on_before_backward", ".on_after_backward"))]
    close([st.part("forward") for st in steps], [fwd[i] for i in idx], "forward (training_step)")
    close([st.part("backward") for st in steps], [bwd[i] - sum(v[i] for v in in_bwd) for i in idx], "backward")
    close([st.part("optimizer") for st in steps],
          [opt[i] - fwd[i] - bwd[i] - sum(v[i] for v in inner) for i in idx], "optimizer (its own time)")
    close([st.part("forward") + st.part("backward") + st.part("optimizer") for st in steps],
          [opt[i] - sum(v[i] for v in inner) - sum(v[i] for v in in_bwd) for i in idx], "optimizer_step")
    assert 0.9 < med([st.named["hooks:_SlowHook"] for st in steps]) < 20  # (the sleep: 1 ms and the wake-up)


def test_grad_tail_learns_the_last_gradient_and_keeps_one_hook() -> None:
    # DDP's reducer waits at the end of backward; the tail is measured from the last parameter's gradient
    # accumulation: the first backward learns which parameter that is (a hook on each), then one hook stays
    from tscope_callbacks.callbacks.loop_probe import GradTail

    net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    c = _Clock()
    tail = GradTail(net.parameters(), c, cuda=False)
    tail.arm()
    hooks = lambda: sum(len(p._post_accumulate_grad_hooks or {}) for p in net.parameters())  # noqa: E731
    assert hooks() == 4
    t0 = c()
    net(torch.randn(3, 4)).sum().backward()
    c.go(7.0)  # the reducer's wait after the last accumulation
    wait, ev = tail.take(t0, c())
    assert wait * 1e3 == pytest.approx(7.0) and ev is None
    assert tail.last == 0 and hooks() == 1  # the first layer's weight is accumulated last; one hook from here
    t1 = c()
    c.go(1.0)
    net(torch.randn(3, 4)).sum().backward()
    c.go(3.0)
    assert tail.take(t1, c())[0] * 1e3 == pytest.approx(3.0)
    assert tail.take(c(), c())[0] == 0.0  # a backward without the hooked accumulation: no tail
    tail.remove()
    assert hooks() == 0
