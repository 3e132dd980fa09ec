"""The closed loop (``benchmarks/advice_effect.py``) applies a process-wide setting the way a user does: for the whole
step (forward, backward, optimizer) and around the capture, which reads it when it stops. The setting restored
right after the forward left cuDNN's autotuner off for the backward convolutions and off when the capture read it,
so ``cudnn_benchmark`` fired again after its change (H200 closed loop, every CNN's second pass)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import torch
from torch import nn

ROOT = Path(__file__).resolve().parent.parent


def _bench():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    spec = importlib.util.spec_from_file_location("advice_effect_under_test", ROOT / "benchmarks" / "advice_effect.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


def test_a_variants_settings_hold_for_the_backward_and_the_capture() -> None:
    ae = _bench()
    before = torch.backends.cudnn.benchmark
    seen: list[bool] = []

    class Probe(nn.Module):  # records the flag in the forward and in the backward
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            seen.append(torch.backends.cudnn.benchmark)
            y = x * 1.0
            y.register_hook(lambda g: seen.append(torch.backends.cudnn.benchmark))
            return y

    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), Probe(), nn.Flatten(), nn.Linear(4 * 6 * 6, 2))
    x, y = torch.randn(2, 3, 8, 8), torch.tensor([0, 1])
    v = ae.Variant("probe", model, x, y, ae._call, ae._image_ce)
    ae.cudnn_benchmark(v, None)
    v.step()
    assert seen == [True, True]  # forward and backward (before the fix: [True, False])
    assert torch.backends.cudnn.benchmark is before  # restored after the step
    rep = ae.report_of(v, 1, False, "cpu")
    assert rep.profile.info.cudnn_benchmark is True  # what the capture read at its stop (before the fix: False)
    plain = ae.Variant("probe", model, x, y, ae._call, ae._image_ce)
    assert ae.report_of(plain, 1, False, "cpu").profile.info.cudnn_benchmark is False  # witness: the default
