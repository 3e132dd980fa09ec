"""One coordinator per trainer, no process-global state: two trainers in one process -- one after the other, and one
fitted inside the other's fit -- never see each other's captures, sinks, clocks or NaN guard; the callbacks' modules
keep no module-level registry; the NaN guard is found through the coordinator, not by class name."""

from __future__ import annotations

import ast
import warnings
from pathlib import Path

import lightning.pytorch as pl
import pytest
from lightning.pytorch.loggers import CSVLogger
from models import TinyLM

import tscope_callbacks as ts

PKG = Path(ts.__file__).parent
SPEC = "NVIDIA A100-SXM4-80GB"


class Spiky(TinyLM):
    """The loss x1000 at ``spike_at``: its gradient norm ~1000x the median of the steps before it (a guard spike)."""

    def __init__(self, spike_at: int | None = None) -> None:
        super().__init__()
        self.spike_at = spike_at

    def training_step(self, batch, batch_idx):
        loss = super().training_step(batch, batch_idx)
        return loss * 1000.0 if self.global_step == self.spike_at else loss


class Seen(pl.Callback):
    """What the tscope callbacks of this trainer share, read at every step (their coordinator and its guard)."""

    def __init__(self) -> None:
        self.coordinators: list = []  # the objects themselves (kept alive: ids of freed ones could be reused)
        self.guards: set[int] = set()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        for cb in trainer.callbacks:
            c = getattr(cb, "_coordinator", None)
            if c is not None:
                if not any(x is c for x in self.coordinators):
                    self.coordinators.append(c)
                self.guards.add(id(c.guard))


def _callbacks(guard: bool) -> list:
    roof = ts.RooflineCallback(gpu=SPEC, every_n_steps=6, start_step=13,
                               capture=ts.CaptureOptions(steps=1, wait_for_warmup=False, compare_eager=False),
                               outputs=ts.RooflineOutputs(plot=False),
                               monitor=ts.MonitorOptions(window=16, recent_steps=4, min_steps=8))
    return ([ts.NaNGuardCallback(action="warn")] if guard else []) + [roof, Seen()]


def _trainer(tmp_path: Path, name: str, callbacks: list, steps: int, extra: list | None = None) -> pl.Trainer:
    return pl.Trainer(max_steps=steps, logger=CSVLogger(str(tmp_path), name=name), callbacks=callbacks + (extra or []),
                      enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                      accelerator="cpu", devices=1, log_every_n_steps=1)


def _parts(callbacks: list) -> tuple:
    roof = next(c for c in callbacks if isinstance(c, ts.RooflineCallback))
    guard = next((c for c in callbacks if isinstance(c, ts.NaNGuardCallback)), None)
    seen = next(c for c in callbacks if isinstance(c, Seen))
    return roof, guard, seen


def _check_a(tmp_path: Path, a: list, b: list) -> None:
    """Trainer A (a guard, a spike at step 12) and trainer B (no guard) kept apart."""
    roof_a, guard_a, seen_a = _parts(a)
    roof_b, guard_b, seen_b = _parts(b)
    assert guard_b is None and [s["step"] for s in guard_a.spikes][:1] == [12]
    # each trainer had one coordinator, its own; A's carried A's guard, B's none
    assert len(seen_a.coordinators) == 1 and len(seen_b.coordinators) == 1
    assert seen_a.coordinators[0] is not seen_b.coordinators[0]
    assert seen_a.guards == {id(guard_a)} and seen_b.guards == {id(None)}
    # the step monitors: A's read A's guard (found through its coordinator), B's none
    assert roof_a.monitor._guard is guard_a and roof_b.monitor._guard is None
    # A's report carries A's spike; B's (profiled later, at the same steps) none
    assert [h["step"] for h in roof_a.history] == [13, 18] and [h["step"] for h in roof_b.history] == [13, 18]
    spiked = [s["step"] for s in guard_a.spikes if s["step"] <= 18]  # 12, and maybe steps after it
    assert [s["step"] for s in roof_a.last_report.grad_spikes] == spiked and spiked[0] == 12
    assert roof_b.last_report.grad_spikes == ()
    # each wrote into its own log dir only
    assert {p.name for p in (tmp_path / "a").rglob("step_*.json")} == {"step_13.json", "step_18.json"}
    assert {p.name for p in (tmp_path / "b").rglob("step_*.json")} == {"step_13.json", "step_18.json"}
    # teardown: every callback let go of its coordinator (nothing of a finished fit is kept)
    assert all(getattr(c, "_coordinator", None) is None for c in a + b)


def test_two_trainers_one_after_the_other_share_nothing(tmp_path: Path) -> None:
    a, b = _callbacks(guard=True), _callbacks(guard=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _trainer(tmp_path, "a", a, 20).fit(Spiky(spike_at=12))
        _trainer(tmp_path, "b", b, 20).fit(Spiky())
    _check_a(tmp_path, a, b)


def test_a_trainer_fitted_inside_another_trainers_fit_shares_nothing(tmp_path: Path) -> None:
    """Trainer B's whole fit (its own profiles, report, monitor, sinks) runs inside trainer A's fit, after A's spike
    and before A's first profile: A goes on as if B never ran (its schedule, its guard, its report)."""
    a, b = _callbacks(guard=True), _callbacks(guard=False)
    inner: list[pl.Trainer] = []

    class FitB(pl.Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            if trainer.global_step == 12 and not inner:  # A's step 12 (its spike's step), before A's own hooks
                inner.append(_trainer(tmp_path, "b", b, 20))
                inner[0].fit(Spiky())

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer_a = _trainer(tmp_path, "a", [FitB(), *a], 20)
        trainer_a.fit(Spiky(spike_at=12))
    assert inner and inner[0].global_step == 20 and trainer_a.global_step == 20
    _check_a(tmp_path, a, b)


def test_the_callbacks_keep_no_module_level_state() -> None:
    """No ``global`` statement and no module-level registry (an empty dict/list/set, a weak dictionary) in the
    callbacks' modules: what the callbacks of one trainer share lives on its coordinator."""
    found = []
    for path in sorted((PKG / "callbacks").glob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Global):
                found.append(f"{path.name}:{node.lineno}: global {', '.join(node.names)}")
        for node in tree.body:
            value = node.value if isinstance(node, (ast.Assign, ast.AnnAssign)) else None
            empty = (isinstance(value, (ast.Dict, ast.List, ast.Set)) and not getattr(value, "keys", None)
                     and not getattr(value, "elts", None))
            weak = isinstance(value, ast.Call) and "Weak" in ast.unparse(value.func)
            made = isinstance(value, ast.Call) and ast.unparse(value.func) in ("dict", "list", "set", "deque")
            if empty or weak or made:
                found.append(f"{path.name}:{node.lineno}: {ast.unparse(node)[:80]}")
    assert not found, found


def test_the_nan_guard_is_found_through_the_coordinator_not_by_class_name(tmp_path: Path) -> None:
    """A guard of a renamed subclass (its class name is not NaNGuardCallback) still reaches the report and the step
    monitor: the guard registers with its trainer's coordinator."""

    class MyGuard(ts.NaNGuardCallback):
        pass

    guard = MyGuard(action="warn")
    roof = _callbacks(guard=False)[0]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _trainer(tmp_path, "g", [guard, roof], 14).fit(Spiky(spike_at=12))
    assert roof.monitor._guard is guard
    assert [s["step"] for s in roof.last_report.grad_spikes][:1] == [12]


@pytest.mark.parametrize("reason", list(ts.ProfileReason))
def test_every_profile_reason_is_documented_and_a_str(reason: ts.ProfileReason) -> None:
    import inspect

    src = inspect.getsource(ts.ProfileReason)
    line = next(i for i, ln in enumerate(src.splitlines()) if ln.strip().startswith(f"{reason.name} ="))
    assert src.splitlines()[line - 1].strip().startswith("#:"), reason
    assert reason == reason.value and ts.CaptureInfo.from_dict({"reason": reason.value}).reason is reason
