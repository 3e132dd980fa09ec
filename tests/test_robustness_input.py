"""Bad input fails early and clearly; bad environments (unknown device, unwritable log dir, a failing W&B logger)
cost one warning and never the run."""

from __future__ import annotations

import json
import logging
import os
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from cb_utils import test_spec
from lightning.pytorch.loggers import CSVLogger
from robust_utils import MLPModule, all_callbacks, assert_nothing_left, fit

import tscope_callbacks as ts
from tscope_callbacks.devices import resolve as specs
from tscope_callbacks.devices.spec import UnknownDeviceError


# ---------------------------------------------------------------- devices
def test_unknown_explicit_gpu_fails_at_construction_naming_close_devices() -> None:
    with pytest.raises(ts.UnknownDeviceError) as e:
        ts.RooflineCallback(gpu="NVIDIA H100 SXM6 128GB")
    msg = str(e.value)
    assert "unknown device 'NVIDIA H100 SXM6 128GB'" in msg and "H100" in msg.split("Closest known names:")[1]
    assert "gpu_specs.json" in msg  # how to add a row


def test_auto_on_an_unknown_device_warns_once_skips_roofline_logs_counts(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    def unknown(device: Any = "auto", *a: Any, **k: Any) -> Any:
        raise UnknownDeviceError("NVIDIA Mystery GPU", ["NVIDIA L4"])


    monkeypatch.setattr(specs, "get_device_spec", unknown)
    cbs = [ts.RooflineCallback(gpu="auto", start_step=1, every_n_steps=1), ts.LayerProfilerCallback(start_step=1)]
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        trainer = fit(tmp_path, cbs, MLPModule(), max_steps=4, logger=CSVLogger(tmp_path, name="csv"))
    ours = [w for w in rec if "tscope" in str(w.message)]
    assert len(ours) == 1 and "roofline part is skipped" in str(ours[0].message), [str(w.message) for w in ours]
    assert trainer.global_step == 4 and cbs[0].last_report is None and len(cbs[0].history) == 3
    header = (Path(trainer.logger.log_dir) / "metrics.csv").read_text().splitlines()[0].split(",")
    assert {"tscope/roofline/flop_coverage", "tscope/roofline/achieved_tflops"} <= set(header)
    assert "tscope/roofline/mfu" not in header


ROW = {"name": "My GPU", "flops": {"bf16": 1e14, "fp32": 2e13}, "bandwidth": 1e12}


@pytest.mark.parametrize("content, words", [
    ("{not json", ["my_gpu.json", "JSON"]),
    (json.dumps({**ROW, "bandwidth": "fast"}), ["My GPU", "bandwidth"]),
    (json.dumps({k: v for k, v in ROW.items() if k != "flops"}), ["My GPU", "flops"]),
    (json.dumps({**ROW, "flops": {"bf16": -1}}), ["My GPU", "bf16"]),
    (json.dumps([ROW, {**ROW, "name": "Other", "bandwidth": None}]), ["Other", "bandwidth"]),
])
def test_malformed_spec_file_names_row_and_field(tmp_path: Path, content: str, words: list[str]) -> None:
    path = tmp_path / "my_gpu.json"
    path.write_text(content)
    with pytest.raises(ts.SpecFileError) as e:
        ts.RooflineCallback(gpu=str(path))
    for w in words:
        assert w in str(e.value), (w, str(e.value))


def test_valid_spec_file_is_accepted(tmp_path: Path) -> None:
    path = tmp_path / "my_gpu.json"
    path.write_text(json.dumps(ROW))
    cb = ts.RooflineCallback(gpu=str(path))
    assert cb.spec is not None and cb.spec.name == "My GPU"


def test_public_functions_stay_callable_after_their_modules_are_imported() -> None:
    import tscope_callbacks.analysis.roofline
    import tscope_callbacks.devices.calibrate  # noqa: F401 (submodules never shadow the package's functions)

    with ts.profile(torch.nn.Linear(2, 2)) as p:
        torch.nn.Linear(2, 2)(torch.randn(1, 2))
    assert ts.roofline(p.result, test_spec()).summary.total_flops >= 0
    assert callable(ts.calibrate)


# ---------------------------------------------------------------- arguments
PROFILERS = [ts.RooflineCallback, ts.LayerProfilerCallback]


@pytest.mark.parametrize("cls", PROFILERS)
@pytest.mark.parametrize("kwargs, exc, word", [
    (dict(every_n_steps=0), ValueError, "every_n_steps"),
    (dict(every_n_steps="10"), TypeError, "every_n_steps"),
    (dict(every_n_steps=2.5), TypeError, "every_n_steps"),
    (dict(start_step=-1), ValueError, "start_step"),
    (dict(start_step=None), TypeError, "start_step"),
    (dict(max_profiles=-2), ValueError, "max_profiles"),
    (dict(profile_first="yes"), TypeError, "profile_first"),
    (dict(every_n_steps=None, profile_first=False), ValueError, "profile_first"),
    (dict(stages="training_and_more"), ValueError, "stage"),
    (dict(stages=[1]), TypeError, "stages"),
    (dict(raise_errors="no"), TypeError, "raise_errors"),
])
def test_invalid_schedule_arguments_name_the_argument(cls: type, kwargs: dict, exc: type, word: str) -> None:
    with pytest.raises(exc, match=word):
        cls(gpu=test_spec(), **kwargs) if cls is ts.RooflineCallback else cls(**kwargs)


@pytest.mark.parametrize("kwargs, exc, word", [
    (dict(action="explode"), ValueError, "action"),
    (dict(every_n_steps=0), ValueError, "every_n_steps"),
    (dict(every_n_steps="1"), TypeError, "every_n_steps"),
    (lambda: dict(options=ts.NaNGuardOptions(max_skips=0)), ValueError, "max_skips"),
    (lambda: dict(options=ts.NaNGuardOptions(alert_every_s=-1.0)), ValueError, "alert_every_s"),
    (dict(max_skips=3), TypeError, r"moved: write options=ts\.NaNGuardOptions\(max_skips=3\)"),
    (dict(locate="yes"), TypeError, "locate"),
])
def test_invalid_nan_guard_arguments_name_the_argument(kwargs, exc: type, word: str) -> None:
    with pytest.raises(exc, match=word):
        ts.NaNGuardCallback(**kwargs() if callable(kwargs) else kwargs)


@pytest.mark.parametrize("kwargs, exc, word", [
    (lambda: dict(gpu=3), TypeError, "gpu"), (lambda: dict(what_if=ts.WhatIf(precision="fp7")), ValueError, "fp7"),
    (lambda: dict(outputs=ts.RooflineOutputs(top=0)), ValueError, "top"),
    (lambda: dict(outputs=ts.RooflineOutputs(plot="yes")), TypeError, "plot"),
    (lambda: dict(precision="fp8"), TypeError, r"moved: write what_if=ts\.WhatIf\(precision='fp8'\)"),
])
def test_invalid_roofline_arguments_name_the_argument(kwargs, exc: type, word: str) -> None:
    with pytest.raises(exc, match=word):
        ts.RooflineCallback(**kwargs())


# ---------------------------------------------------------------- unwritable outputs
def _unwritable_dir(tmp_path: Path) -> Path:
    """A directory nobody can create files in: read-only when that restricts us (not root), else a path below a
    regular file (fails for everyone, root included)."""
    if hasattr(os, "geteuid") and os.geteuid() != 0:
        d = tmp_path / "ro"
        d.mkdir()
        d.chmod(0o500)
        return d
    blocker = tmp_path / "file.txt"
    blocker.write_text("not a directory")
    return blocker / "sub"


def test_unwritable_log_dir_warns_once_and_training_continues(tmp_path: Path,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    root = _unwritable_dir(tmp_path)
    cbs = all_callbacks(start_step=1, every_n_steps=1)
    model = MLPModule()
    try:
        with warnings.catch_warnings(record=True) as rec, caplog.at_level(logging.WARNING, "tscope_callbacks"):
            warnings.simplefilter("always")
            trainer = fit(tmp_path, cbs, model, max_steps=4, default_root_dir=str(root))
    finally:
        if root.parent.name == "ro":
            root.parent.chmod(0o700)
    assert trainer.global_step == 4 and len(cbs[0].history) == 3  # every profile was still analysed
    msgs = [str(w.message) for w in rec if "tscope" in str(w.message)] + [
        r.getMessage() for r in caplog.records if r.name == "tscope_callbacks"]
    assert len(msgs) == 1, msgs  # one clear message, not one per profile/sink/callback
    assert str(root) in msgs[0]  # names the directory
    assert_nothing_left(model, trainer.optimizers)


# ---------------------------------------------------------------- failing W&B
def test_failing_wandb_logger_warns_once_and_training_continues(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                caplog: pytest.LogCaptureFixture) -> None:
    wandb = pytest.importorskip("wandb")
    from lightning.pytorch.loggers import WandbLogger

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    logger = WandbLogger(save_dir=str(tmp_path), offline=True)

    def broken(*a: Any, **k: Any) -> None:
        raise ConnectionError("wandb backend unreachable")

    for name in ("log_metrics", "log_table", "log_image", "log_text"):
        monkeypatch.setattr(logger, name, broken)
    cbs = all_callbacks(start_step=1, every_n_steps=1)
    model = MLPModule(log_loss=False)  # the user's own self.log would fail through Lightning, not through us
    try:
        with warnings.catch_warnings(record=True) as rec, caplog.at_level(logging.WARNING, "tscope_callbacks"):
            warnings.simplefilter("always")
            trainer = fit(tmp_path, cbs, model, max_steps=4, logger=logger)
    finally:
        wandb.finish()  # a run left open would be reused by the next WandbLogger in this process
    assert trainer.global_step == 4 and len(cbs[0].history) == 3
    msgs = [str(w.message) for w in rec if "tscope" in str(w.message)] + [
        r.getMessage() for r in caplog.records if r.name == "tscope_callbacks"]
    assert len(msgs) == 1 and "unreachable" in msgs[0] and "Wandb" in msgs[0], msgs
    # what does not go through W&B is still written
    # (in the W&B run's own folder)
    assert {"step_3.json", "layers_step_3.json"} <= {p.name for p in tmp_path.rglob("tscope/*.json")}
    assert_nothing_left(model, trainer.optimizers)
