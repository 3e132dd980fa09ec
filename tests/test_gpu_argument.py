"""A device is named ``gpu=`` wherever a user names one; the older spellings (``spec=``, ``device=``) stay one version
as deprecated aliases that warn naming ``gpu=``. ``analyze_model(device=...)`` keeps its own meaning: the torch device
the model runs on."""

from __future__ import annotations

import dataclasses
import warnings

import pytest

import tscope_callbacks as ts
from tests.profiles import a100, toy_profile
from tscope_callbacks.cli import main


def test_roofline_spec_is_a_deprecated_alias_of_gpu() -> None:
    prof, spec = toy_profile(timed=False), a100()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        new = ts.roofline(prof, gpu=spec)
        positional = ts.roofline(prof, spec)
    with pytest.warns(DeprecationWarning, match=r"roofline\(spec=\.\.\.\) is deprecated.*gpu="):
        old = ts.roofline(prof, spec=spec)
    assert old.to_markdown() == new.to_markdown() == positional.to_markdown()
    assert old.spec.name == new.spec.name == spec.name
    with pytest.warns(DeprecationWarning), pytest.raises(TypeError, match="name the device once, as gpu="):
        ts.roofline(prof, gpu="h100", spec=spec)


def test_analyze_spec_is_a_deprecated_alias_of_gpu() -> None:
    prof, spec = toy_profile(timed=True), a100()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        new = ts.analyze(prof, gpu=spec)
    with pytest.warns(DeprecationWarning, match=r"analyze\(spec=\.\.\.\) is deprecated.*gpu="):
        old = ts.analyze(prof, spec=spec)
    # ('created' is the wall-clock second each was built in: two analyses may straddle a second on a busy machine)
    again = dataclasses.replace(ts.analyze(prof, spec), created=new.created)
    assert old.to_dict() | {"created": None} == new.to_dict() | {"created": None} and again == new


def test_analyze_model_device_stays_the_torch_device_the_model_runs_on() -> None:
    import torch

    rep = ts.analyze_model(torch.nn.Linear(8, 4), input_shape=[(2, 8)], gpu="h100", device="meta")
    # gpu= names the roofs, device= where the model ran (meta: counted, not computed, so untimed)
    assert rep.spec.name == ts.get_device_spec("h100").name and not rep.timed


def test_get_device_spec_device_is_a_deprecated_alias_of_gpu() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the new spelling warns about nothing
        new = ts.get_device_spec(gpu="h100")
    with pytest.warns(DeprecationWarning, match=r"get_device_spec\(device=\.\.\.\) is deprecated.*gpu="):
        old = ts.get_device_spec(device="h100")
    assert old == new == ts.get_device_spec("h100")
    with pytest.warns(DeprecationWarning), pytest.raises(TypeError, match="name the device once, as gpu="):
        ts.get_device_spec(gpu="a100", device="h100")


def test_calibrate_device_is_a_deprecated_alias_of_gpu() -> None:
    # "meta" has no roofs to measure: the call ends at the device check, after the argument is read
    with pytest.raises(ValueError, match="unsupported device 'meta'"):
        ts.calibrate(gpu="meta")
    with pytest.warns(DeprecationWarning, match=r"calibrate\(device=\.\.\.\).*gpu="), \
            pytest.raises(ValueError, match="unsupported device 'meta'"):
        ts.calibrate(device="meta")


def test_cli_calibrate_device_option_is_a_deprecated_alias_of_gpu(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["calibrate", "--gpu", "meta"]) == 2
    err = capsys.readouterr().err
    assert "unsupported device 'meta'" in err and "deprecated" not in err
    assert main(["calibrate", "--device", "meta"]) == 2
    err = capsys.readouterr().err
    assert "--device is deprecated" in err and "use --gpu" in err and "unsupported device 'meta'" in err
    assert main(["calibrate", "--device", "meta", "--gpu", "cpu"]) == 2
    assert "name the device once, as --gpu" in capsys.readouterr().err
