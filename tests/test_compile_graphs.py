"""Profiling never changes a compiled model's graphs (issue: 2.3x slower compiled runs after two profiles).

Dynamo used to trace tscope's own hook code (the per-layer finite checks run with the dispatch mode popped), which
added graph breaks and recompiles that outlived the profile. The counters of a fit with the callbacks must equal
those of the same fit without them, and a NaN replay on a compiled model must compile nothing either.
"""

from __future__ import annotations

from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
from torch._dynamo.utils import counters

import tscope_callbacks as ts
from tests.cb_utils import FAST, test_spec
from tests.models import TinyLM


def _dynamo_state() -> dict[str, int]:
    """Graph, graph-break and recompile counts of Dynamo since the last reset."""
    stats = counters["stats"]
    return {"unique_graphs": stats.get("unique_graphs", 0), "calls_captured": stats.get("calls_captured", 0),
            "graph_breaks": sum(counters["graph_break"].values()),
            "recompiles": sum(counters["recompiles"].values()) if "recompiles" in counters else 0}


def _fit(tmp_path: Path, callbacks: list, backend: str, steps: int = 30) -> dict[str, int]:
    torch._dynamo.reset()
    counters.clear()
    torch.manual_seed(0)
    module = TinyLM(n_batches=steps)
    module.model = torch.compile(module.model, backend=backend)
    trainer = pl.Trainer(max_steps=steps, default_root_dir=tmp_path, logger=False, callbacks=callbacks, **FAST)
    trainer.fit(module)
    return _dynamo_state()


# inductor compiles for 25 s on 2 cores: `make test-all`; the eager backend runs the same Dynamo counters in `make test`
@pytest.mark.parametrize("backend", ["eager", pytest.param("inductor", marks=pytest.mark.slow)])
def test_profiles_leave_the_compiled_graphs_unchanged(tmp_path: Path, backend: str) -> None:
    plain = _fit(tmp_path / "plain", [], backend)
    assert plain["unique_graphs"] >= 1  # the model really was compiled
    cbs = [ts.RooflineCallback(gpu=test_spec(), every_n_steps=10, start_step=5, max_profiles=2,
                               outputs=ts.RooflineOutputs(plot=False)),
           ts.LayerProfilerCallback(every_n_steps=10, start_step=5, max_profiles=2),
           ts.NaNGuardCallback()]
    profiled = _fit(tmp_path / "profiled", cbs, backend)
    assert [h["step"] for h in cbs[0].history] == [5, 10]  # two profiles happened, with layer details
    assert cbs[1].last_layers is not None
    assert profiled == plain


def test_nan_replay_on_a_compiled_model_compiles_nothing(tmp_path: Path) -> None:
    class BadWeights(pl.Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            if trainer.global_step == 8:
                with torch.no_grad():
                    pl_module.model.blocks[1].mlp.fc.weight[0, 0] = float("nan")

    plain = _fit(tmp_path / "plain", [], "eager", steps=12)
    guard = ts.NaNGuardCallback(action="warn")
    after = _fit(tmp_path / "nan", [guard, BadWeights()], "eager", steps=12)
    assert guard.replays >= 1 and guard.events[0].layer == "model.blocks.1.mlp.fc"
    assert after == plain


def test_module_clock_puts_no_hook_inside_a_compiled_module() -> None:
    # the step monitor's per-layer host clock, running while the model compiles: a compile wrapper is one layer,
    # nothing below it or below a module compiled in place is hooked (their hooks were traced: time.perf_counter is
    # a graph break), and a module called from a compiled function traces its hooks as no-ops
    from tscope_callbacks.capture.module_clock import ModuleClock, timed_modules

    def run(clocked: bool) -> tuple[dict[str, int], dict[str, float]]:
        torch._dynamo.reset()
        counters.clear()
        net = torch.nn.Sequential(torch.nn.Linear(4, 4),
                                  torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU()), torch.nn.Linear(4, 2))
        net[1] = torch.compile(net[1], backend="eager")
        net[2].compile(backend="eager")
        assert [p for p, _ in timed_modules(net)] == ["", "0", "1"]
        clock = ModuleClock(net)
        if clocked:
            clock.start()
        x = torch.randn(3, 4)
        net(x)
        times = clock.stop()
        net(x)
        return _dynamo_state(), times

    plain, _ = run(False)
    clocked, times = run(True)
    assert set(times) == {"", "0", "1"} and times["1"] > 0
    assert clocked == plain and plain["unique_graphs"] >= 1

    torch._dynamo.reset()
    counters.clear()
    inner = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
    fn = torch.compile(lambda t: inner(t) * 2, backend="eager")
    clock = ModuleClock(inner)
    clock.start()
    fn(torch.randn(3, 4))
    assert clock.stop() == {} and not counters["graph_break"]
