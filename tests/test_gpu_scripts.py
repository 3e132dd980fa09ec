"""The GPU verification script and benchmarks run end to end in their CPU smoke mode (their CUDA-only checks say
SKIP): a script that can only be run on a rented GPU must not first fail there on a typo.

Slow (80 s: each script imports torch and runs its CPU smoke model): `make test-all` runs them; in `make test`,
tests/test_script_imports.py resolves every package name each script imports."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent


def _run(*cmd: str) -> str:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, *cmd], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode in (0, 1), proc.stderr[-3000:]  # 1: a FAIL line (the smoke model's figures mean nothing)
    return proc.stdout


def test_gpu_check_smoke() -> None:
    out = _run("scripts/gpu_check.py", "--smoke")
    assert "[PASS] 5. forward matmul FLOPs" in out and "[PASS] 5. causal attention forward FLOPs" in out
    assert "[PASS] 7. Dynamo graphs unchanged by profiling" in out
    assert "[SKIP] 6. NaN guard" in out
    assert "[PASS] 9. NaN guard: the replay names the layer and the op + line" in out
    assert '[PASS] 10. training unchanged by every callback, gpu="auto" (bit for bit)' in out


def test_gpu_benchmarks_smoke() -> None:
    out = _run("benchmarks/gpu_nan_guard_overhead.py", "--smoke", "--runs", "1")
    assert "detect_anomaly=True" in out
    out = _run("benchmarks/gpu_fit_overhead.py", "--smoke", "--runs", "1")
    assert "automatic MFU" in out
    # the step monitor's baseline profile is found and left out of the always-on figure, its cost reported apart
    assert "the step monitor's healthy-baseline profile" in out and "- always-on: callbacks/plain" in out
    assert "- one-time: the profiles inside the window (step 10: the step monitor's healthy-baseline profile)" in out
    out = _run("benchmarks/gpu_guard_host.py", "--smoke", "--runs", "1")
    assert "The guard's hooks, host µs per step" in out and "the whole deferred check" in out
    assert "- guard / plain = " in out
    out = _run("benchmarks/roofline_accuracy.py", "--smoke")
    assert "measured / expected" in out and "analyze_model on meta" in out and "Top opportunities" in out
    out = _run("benchmarks/gpu_compiled_profile.py", "--smoke", "--runs", "2")
    assert "profiled compiled step (kernels)" in out and "Dynamo before" in out
    out = _run("benchmarks/gpu_capture_parts.py", "--smoke", "--runs", "1")
    assert "| ts: + finite checks |" in out and "plain step's host time" in out


def test_gpu_step_monitor_smoke() -> None:
    out = _run("scripts/gpu_step_monitor.py", "--smoke", "--steps", "20")
    for run in ("a. monitor alone, prog_bar=True", "b. monitor alone, prog_bar=False", "c. as b + 8 ms host work",
                "d. demo callbacks"):
        assert f"## {run}" in out, out[-3000:]
    assert "part          host ms   device ms" in out and "values read back every step" in out


def test_gpu_host_passes_runs() -> None:
    # GPT-2 124M-sized kernel records: every kernel goes to the op that launched it, and a replay matches them all
    out = _run("benchmarks/gpu_host_passes.py", "--runs", "1")
    assert "| assign_kernels, a full capture (Kineto's kinds) |" in out and "| a replayed profile's build" in out


def test_advice_effect_smoke() -> None:
    """The closed loop end to end on the inference CNN (channels-last, BatchNorm folding, then pool order in its
    second pass) and its CUDA path's skip: the figures of a smoke run mean nothing."""
    out = _run("benchmarks/advice_effect.py", "--smoke", "--models", "cnn_inference")
    assert "# Advice effect: predicted vs measured saving (cpu)" in out and "| model | finding |" in out
    assert "## CNN inference: top opportunities" in out  # which findings fire depends on the machine's times
    assert _run("benchmarks/advice_effect.py", "--device", "cuda").startswith("SKIP: --device cuda without a GPU")
