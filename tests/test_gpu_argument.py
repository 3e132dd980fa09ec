"""A device is named ``gpu=`` wherever a user names one, and every entry point takes a name, an alias or a
``DeviceSpec`` alike: ``ts.analyze(prof, "h100")``, ``ts.roofline(prof, "h100")`` and ``ts.analyze_model(model,
gpu="h100")`` give the same report as with ``ts.get_device_spec("h100")``. ``analyze_model(device=...)`` keeps its
own meaning: the torch device the model runs on."""

from __future__ import annotations

import pytest
import torch

import tscope_callbacks as ts
from tests.profiles import toy_profile


def _same(a: ts.StepReport, b: ts.StepReport) -> None:
    """The same report, but for when it was made (and, for two runs of a model, the capture's own wall time)."""
    da, db = a.to_dict(), b.to_dict()
    for d in (da, db):
        d.pop("created")
        for k in ("wall_time_s", "capture_cost"):
            d["summary"].pop(k)
    assert da == db


@pytest.mark.parametrize("entry", ["analyze", "roofline"])
def test_a_name_and_a_spec_give_the_same_report(entry: str) -> None:
    prof = toy_profile()
    spec = ts.get_device_spec("h100")
    fn = getattr(ts, entry)
    by_name, by_spec = fn(prof, "h100"), fn(prof, spec)
    assert type(by_name) is ts.StepReport and by_name.device.name == spec.name == "NVIDIA H100 SXM"
    _same(by_name, by_spec)
    # the keyword spelling is gpu= for both
    _same(fn(prof, gpu="h100"), by_spec)


def test_analyze_model_takes_a_name_or_a_spec_and_device_stays_the_torch_device() -> None:
    model = torch.nn.Linear(8, 4)
    spec = ts.get_device_spec("h100")
    by_name = ts.analyze_model(model, input_shape=[(2, 8)], gpu="h100", device="meta")
    by_spec = ts.analyze_model(model, input_shape=[(2, 8)], gpu=spec, device="meta")
    # gpu= names the roofs, device= where the model ran (meta: counted, not computed, so untimed)
    assert by_name.device.name == spec.name and not by_name.timed and by_name.profile.info.analysis_device == "meta"
    _same(by_name, by_spec)


def test_none_means_the_device_the_profile_ran_on() -> None:
    prof = toy_profile()  # recorded on an A100 80GB SXM
    assert ts.analyze(prof).device.name == ts.get_device_spec(prof.info.device_name).name


def test_an_unknown_name_is_one_clear_error() -> None:
    with pytest.raises(ts.UnknownDeviceError, match="unknown device 'h1000'"):
        ts.analyze(toy_profile(), "h1000")
