"""tscope's own errors never change the user's training. Each test breaks one piece of tscope code that runs inside
the user's step (module and tensor hooks, the dispatch mode, optimizer hooks, Lightning hooks) and checks that the
fit completes with the plain fit's weights and losses, bit for bit, with exactly one log line per failing part."""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

import pytest
from cb_utils import test_spec
from robust_utils import SCHED, MLPModule, assert_nothing_left, assert_same_weights, seeded_fit

import tscope_callbacks as ts
from tscope_callbacks.analysis import histograms
from tscope_callbacks.callbacks import clock, layers_cb, nan_steps, roofline_cb
from tscope_callbacks.capture import layers, locate, memory, profile, state
from tscope_callbacks.capture.faults import Faults

#: what to break -> (object, attribute, the part named in the log line)
TARGETS: dict[str, tuple[Any, str, str]] = {
    # inside the user's backward: a tensor hook of the layer details
    "grad hook": (layers.LayerDetails, "_check", "the gradient hook of layer details"),
    # Lightning hooks, the three paths that had no guard
    "step clock": (clock.StepClock, "tick", "the step clock"),
    "batch signature": (roofline_cb, "batch_signature", "counting samples and FLOPs per step"),
    "window samples": (clock.WindowTimer, "add_samples", "counting samples and FLOPs per step"),
    # the dispatch mode's per-op record, the module hooks, the gradient memory hook, the optimizer hooks
    "op record": (state.CaptureState, "record", "the capture's op record"),
    "module pre-hook": (layers.LayerDetails, "on_enter", "the capture's module pre-hook"),
    "module post-hook": (layers.LayerDetails, "on_exit", "the capture's module post-hook"),
    "memory hook": (memory.MemoryTracker, "on_grad", "the gradient memory hook"),
    "optimizer pre-hook": (state.CaptureState, "add_optimizer", "the optimizer step hook"),
    "optimizer post-hook": (profile.Profile, "set_phase", "the optimizer step post-hook"),
    # the NaN guard (its snapshot, its check) and the watch callback's histograms
    "guard snapshot": (locate.StepSnapshot, "take", "snapshot"),
    "guard check": (nan_steps, "check_now", "check"),
    "histograms": (histograms, "device_stats", None),
    # rendering after a profile (a Lightning hook's own part)
    "layer table": (layers_cb, "render_tree_table", None),
}


def _boom(*a: Any, **k: Any) -> Any:
    raise RuntimeError("injected fault")


def _callbacks() -> list[Any]:
    return [ts.RooflineCallback(gpu=test_spec(), **SCHED), ts.LayerProfilerCallback(**SCHED), ts.NaNGuardCallback(),
            ts.WatchCallback(every_n_steps=2)]


def _parts(caplog: pytest.LogCaptureFixture) -> list[tuple[str, str]]:
    out = []
    for r in caplog.records:
        m = re.match(r"tscope (\w+): internal error in (.+?) \(training continues", r.getMessage())
        if r.name == "tscope_callbacks" and m:
            out.append((m.group(1), m.group(2)))
    return out


@pytest.mark.parametrize("name", list(TARGETS))
def test_a_fault_in_tscope_code_leaves_the_fit_unchanged_and_is_logged_once_per_part(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, name: str) -> None:
    plain, plain_log, _ = seeded_fit(tmp_path / "a", MLPModule, [], max_steps=6)
    owner, attr, part = TARGETS[name]
    if not hasattr(owner, attr):
        pytest.fail(f"{owner.__name__}.{attr} does not exist: the fault-injection target moved")
    monkeypatch.setattr(owner, attr, _boom)
    with caplog.at_level(logging.WARNING, logger="tscope_callbacks"):
        model, log, trainer = seeded_fit(tmp_path / "b", MLPModule, _callbacks(), max_steps=6)
    assert trainer.global_step == 6
    assert_same_weights(plain, model)
    assert plain_log.metrics["train_loss"] == log.metrics["train_loss"]
    assert_nothing_left(model, trainer.optimizers)
    parts = _parts(caplog)
    assert parts, "the fault was not logged"
    assert len(parts) == len(set(parts)), f"a part was logged more than once: {parts}"
    if part is not None:
        assert any(p == part for _, p in parts), parts


def test_faults_log_once_per_part_and_count_the_rest(caplog: pytest.LogCaptureFixture) -> None:
    f = Faults("Owner")
    with caplog.at_level(logging.WARNING, logger="tscope_callbacks"):
        for _ in range(3):
            f.report("part a", ValueError("x"))
        f.report("part b", KeyError("y"))
        assert f.guard("part c", _boom, default=7)() == 7
    assert [r.getMessage().split(" (")[0] for r in caplog.records] == [
        "tscope Owner: internal error in part a", "tscope Owner: internal error in part b",
        "tscope Owner: internal error in part c"]
    assert f.counts == {"part a": 3, "part b": 1, "part c": 1}
    with pytest.raises(ValueError):
        Faults("Owner", raise_errors=True).report("part", ValueError("raised"))


def test_a_deliberate_non_finite_error_still_ends_the_fit(tmp_path: Path) -> None:
    # the NaN guard's action="raise" is not an internal error: the hook guard lets it through
    from tscope_callbacks.analysis.nonfinite import NonFiniteError

    class Bad(MLPModule):
        def training_step(self, batch: Any, batch_idx: int) -> Any:
            loss = super().training_step(batch, batch_idx)
            return loss * float("nan") if self.trainer.global_step == 2 else loss

    with pytest.raises(NonFiniteError):
        seeded_fit(tmp_path, Bad, [ts.NaNGuardCallback(action="raise")], max_steps=5)


def test_a_users_subclass_hook_raises_as_its_own_code_would(tmp_path: Path) -> None:
    # only tscope's own code is guarded: an error in a hook the user wrote on a subclass is the user's
    class Mine(ts.NaNGuardCallback):
        def on_train_batch_end(self, *args: Any) -> None:
            super().on_train_batch_end(*args)
            raise KeyError("the user's bug")

    with pytest.raises(KeyError, match="the user's bug"):
        seeded_fit(tmp_path, MLPModule, [Mine()], max_steps=2)
