"""Late ranks with their cost: every rank's step parts are gathered at logging steps and the rank the others wait for
is named with how long they wait for it a step and the part it is slow in; in the scalars, an alert and the page's
per-rank series.

The fast test drives the gathering and naming on scripted rows (a fake strategy's all-gather). The slow one runs 4
gloo ranks on CPU, one fit: rank 2 late in its data (steps 20-39), rank 1 in its compute (40-59), rank 3 before the
step (60-79), each by a 30 ms sleep (robust on a loaded 2-core machine: a sleep does not need a CPU)."""

from __future__ import annotations

import math
import types
from pathlib import Path

import pytest
import torch
from ddp_harness import run_ddp, skip_ddp

from tscope_callbacks.analysis import step_parts as sp
from tscope_callbacks.analysis.step_parts import PARTS, StepTimes
from tscope_callbacks.callbacks.monitor import StepMonitor


class _Sink:
    def __init__(self) -> None:
        self.alerts: list[tuple[str, str]] = []

    def alert(self, key, title, text, step, wait_s=0.0) -> None:
        self.alerts.append((title, text))


class _Strategy:
    """All-gather of a scripted world: this rank's vector, the others' as given."""

    root_device = torch.device("cpu")

    def __init__(self, others: dict[int, list[float]], rank: int = 0) -> None:
        self.others, self.rank = others, rank

    def all_gather(self, t: torch.Tensor) -> torch.Tensor:
        rows = [self.others.get(r, t.tolist()) if r != self.rank else t.tolist()
                for r in range(len(self.others) + 1)]
        return torch.tensor(rows, dtype=torch.float64)


def _steps(n: int, **ms: float) -> list[StepTimes]:
    parts = tuple(ms.get(p, 0.0) / 1e3 for p in PARTS)
    return [StepTimes(i, sum(parts), parts, {}, 0.0) for i in range(n)]


def test_rank_gathering_names_the_late_rank_in_scalars_and_an_alert() -> None:
    # this rank (0) waits 31 ms a step in its sync; rank 2 spends 30 ms more fetching and waits 1 ms: rank 2 is
    # late in its data by 30 ms a step, every other rank waits 30 ms for it
    mon = StepMonitor(telemetry=False)
    sink = _Sink()
    mon.sinks = lambda trainer: sink  # type: ignore[method-assign]
    base = dict(fetch=2.0, forward=8.0, backward=6.0)
    fast = sp.rank_vector(sp.summarize(_steps(10, sync=31.0, **base)))
    late = sp.rank_vector(sp.summarize(_steps(10, sync=1.0, **{**base, "fetch": 32.0})))
    trainer = types.SimpleNamespace(world_size=4, strategy=_Strategy({1: fast, 2: late, 3: fast}))
    b = sp.summarize(_steps(10, sync=31.0, **base))
    scalars: dict[str, float] = {}
    mon._ranks(trainer, 40, b, scalars)
    assert mon.late is not None and mon.late.rank == 2 and mon.late.cost_ms == pytest.approx(30.0)
    assert (mon.late.part, mon.late.kind) == ("fetch", "data")
    assert scalars["tscope/ranks/late_rank"] == 2.0 and scalars["tscope/ranks/late_cost_ms"] == pytest.approx(30.0)
    assert [scalars[f"tscope/ranks/sync_ms/{r}"] for r in range(4)] == pytest.approx([31.0, 31.0, 1.0, 31.0])
    assert scalars["tscope/ranks/step_ms/2"] == pytest.approx(47.0)  # 32 + 8 + 6 + 1
    assert sink.alerts == []  # one interval: not yet (the warm-up's interval may be noisy)
    mon._ranks(trainer, 45, b, scalars)
    assert len(sink.alerts) == 1 and sink.alerts[0][0] == "Late rank 2"
    assert "every other rank waits 30 ms a step" in sink.alerts[0][1] and "in its data" in sink.alerts[0][1]
    assert [a["trigger"]["kind"] for a in mon.alerts] == ["late-rank"]
    # the gather's own wait is the other ranks' lateness: counted as sync in the running step, not as tscope's
    assert mon.probe._named.get("sync:tscope's gather of the ranks' parts", -1.0) >= 0.0
    mon._ranks(trainer, 50, b, scalars)
    assert len(sink.alerts) == 1  # once per late rank and kind
    # a rank without clean steps sends NaNs: no late rank is named from it
    nan = [math.nan] * len(sp.RANK_FIELDS)
    mon2 = StepMonitor(telemetry=False)
    mon2.sinks = lambda trainer: sink  # type: ignore[method-assign]
    mon2._ranks(types.SimpleNamespace(world_size=2, strategy=_Strategy({1: nan})), 10, b, {})
    assert mon2.late is None


def test_page_series_reads_the_per_rank_view(tmp_path: Path) -> None:
    from torch.utils.tensorboard import SummaryWriter

    from tscope_callbacks.dashboard.logdir import series

    w = SummaryWriter(str(tmp_path))
    for st in (10, 20):
        for r in range(2):
            w.add_scalar(f"tscope/ranks/step_ms/{r}", 40.0 + st, st)
            w.add_scalar(f"tscope/ranks/sync_ms/{r}", 30.0 if r == 0 else 1.0, st)
        w.add_scalar("tscope/ranks/late_rank", 1.0, st)
        w.add_scalar("tscope/ranks/late_cost_ms", 29.0, st)
        w.add_scalar("tscope/step/step_ms", 41.0, st)
    w.close()
    s = series(tmp_path)
    assert s["ranks"]["step_ms"] == {"0": [[10, 50.0], [20, 60.0]], "1": [[10, 50.0], [20, 60.0]]}
    assert s["ranks"]["sync_ms"]["1"] == [[10, 1.0], [20, 1.0]]
    assert s["ranks"]["late_rank"] == [[10, 1.0], [20, 1.0]] and s["ranks"]["late_cost_ms"][0] == [10, 29.0]
    assert s["step/step_ms"] == [[10, 41.0], [20, 41.0]] and not any(k.startswith("ranks/") for k in s)


SCRIPT = """
    import json, os, sys, time
    import lightning.pytorch as pl
    import torch
    from lightning.pytorch.loggers import TensorBoardLogger
    from torch.utils.data import DataLoader, TensorDataset
    from cb_utils import FAST
    import tscope_callbacks as ts
    from tscope_callbacks.dashboard.logdir import series

    torch.set_num_threads(1)
    out = sys.argv[1]
    LATE_S = 0.030
    # (first step, last step, late rank, where)
    PHASES = [(20, 39, 2, "data"), (40, 59, 1, "compute"), (60, 79, 3, "before")]

    def late(where, step):
        return next((r for a, b, r, w in PHASES if w == where and a <= step <= b), None)

    class Net(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))

        def training_step(self, batch, batch_idx):
            if late("compute", self.global_step) == self.global_rank:
                time.sleep(LATE_S)
            x, y = batch
            return torch.nn.functional.mse_loss(self.net(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=1e-3)

        def train_dataloader(self):
            g = torch.Generator().manual_seed(0)
            ds = TensorDataset(torch.randn(4096, 16, generator=g), torch.randn(4096, 4, generator=g))

            def collate(items):
                if late("data", self.trainer.global_step) == self.global_rank:
                    time.sleep(LATE_S)
                return torch.stack([a for a, _ in items]), torch.stack([b for _, b in items])

            return DataLoader(ds, batch_size=8, collate_fn=collate)

    class BeforeStep(pl.Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            if late("before", trainer.global_step) == trainer.global_rank:
                time.sleep(LATE_S)

    mon = ts.StepMonitor(telemetry=False)
    trainer = pl.Trainer(strategy="ddp", max_steps=80, callbacks=[BeforeStep(), mon],
                         logger=TensorBoardLogger(out, name="tb"), **{**FAST, "devices": 4, "log_every_n_steps": 10})
    trainer.fit(Net())
    rank = trainer.global_rank
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump({"history": [[s, l.rank, l.cost_ms, l.part, l.kind, l.finding, list(l.sync_ms)]
                               for s, l in mon.rank_history],
                   "alerts": [a["text"] for a in mon.alerts if a["trigger"]["kind"] == "late-rank"],
                   "series": series(os.path.join(out, "tb", "version_0")).get("ranks") if rank == 0 else None}, f)
"""


@skip_ddp
@pytest.mark.slow
def test_four_gloo_ranks_late_in_data_compute_and_before_the_step(tmp_path: Path) -> None:
    ranks = run_ddp(tmp_path, SCRIPT, name="ddp_late.py", ranks=4, timeout=300)
    h = ranks[0]["history"]
    assert h == ranks[1]["history"] or len(h) == len(ranks[1]["history"])  # every rank gathered the same rows
    by_step = {s: (r, cost, part, kind, finding) for s, r, cost, part, kind, finding, _ in h}
    # the logging step after each phase's second interval: its 10 steps all late (the gather reads the interval
    # before the logging step)
    for step, (rank, kind) in ((40, (2, "data")), (60, (1, "compute")), (80, (3, "host"))):
        r, cost, part, k, finding = by_step[step]
        assert (r, k) == (rank, kind) and finding, (step, by_step[step], h)
        assert cost == pytest.approx(30.0, rel=0.25), (step, by_step[step])
    assert by_step[40][2] == "fetch" and by_step[60][2] == "forward" and by_step[80][2] == "hooks"
    texts = ranks[0]["alerts"]
    assert [t.split(" is late")[0].split()[-2:] for t in texts] == [["rank", "2"], ["rank", "1"], ["rank", "3"]]
    assert "in its data" in texts[0] and "in its compute" in texts[1] and "in its host" in texts[2]
    page = ranks[0]["series"]  # the page's per-rank view (rank zero wrote the scalars)
    assert sorted(page["step_ms"]) == ["0", "1", "2", "3"] and sorted(page["sync_ms"]) == ["0", "1", "2", "3"]
    # logged at the interval's last step, as Lightning logs (the monitor's history says the logging step, 40)
    assert dict(map(tuple, page["late_rank"]))[39] == 2.0
    assert dict(map(tuple, page["late_cost_ms"]))[39] == pytest.approx(30.0, rel=0.25)


def test_cuda_rank_gather_is_read_once_complete_never_waited(monkeypatch) -> None:
    # on a GPU the all-gather runs on the stream: its rows are read at a later logging step, once an event says the
    # gather completed (no host sync on the step's path)
    from tscope_callbacks.callbacks.monitor import _RankGather

    class _Event:
        done = False

        def record(self) -> None:
            pass

        def query(self) -> bool:
            return _Event.done

        def synchronize(self) -> None:
            raise AssertionError("waited on the gather")

    class _Rows:
        """The gathered tensor stand-in: .tolist() must not be called before the event completed."""

        def __init__(self, rows):
            self.rows = rows

        def reshape(self, *shape):
            return self

        def tolist(self):
            assert _Event.done, "read before the gather completed (a host sync)"
            return self.rows

    monkeypatch.setattr(torch.cuda, "Event", lambda *a, **k: _Event())
    strategy = types.SimpleNamespace(root_device=torch.device("cpu"),
                                     all_gather=lambda t: _Rows([t.tolist(), [9.0] * len(t)]))
    g = _RankGather(cuda=True)
    trainer = types.SimpleNamespace(world_size=2, strategy=strategy)
    assert g.exchange(trainer, [1.0, 2.0], 10) == []  # not complete: nothing read
    _Event.done = True
    got = g.exchange(trainer, [3.0, 4.0], 20)
    assert [s for s, _ in got] == [10, 20] and got[0][1] == [[1.0, 2.0], [9.0, 9.0]]
