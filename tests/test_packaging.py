"""Packaging: ``python -m build`` makes a wheel and an sdist with the license, ``py.typed`` and the device tables, and
the wheel installs into a fresh venv that already has torch without touching that torch: ``tscope demo`` then runs.

The fresh venv sees this environment's packages the way ``python -m venv --system-site-packages`` sees a system
Python's: a ``.pth`` line puts this environment's site-packages after the venv's own. The install goes through
``--no-index`` and a constraints file pinning the installed torch (the README's recipe), so nothing is downloaded
and torch cannot be replaced. Takes about a minute on a 2-core CPU: marked slow (`make test-all` runs it).
"""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import tarfile
import zipfile
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
pytestmark = [pytest.mark.timeout(600), pytest.mark.slow]


def _env() -> dict[str, str]:
    # the machine's pip settings stay (the isolated build fetches its backend from the configured index); nothing
    # points the fresh venv at this checkout or this environment except the .pth line below
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV"))}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return env


def _run(cmd: list[str], cwd: Path, timeout: int = 300) -> str:
    proc = subprocess.run(cmd, cwd=cwd, env=_env(), capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{' '.join(cmd)} exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout + proc.stderr


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("build")
    out = tmp_path_factory.mktemp("dist")
    # isolated (the build backend comes from the index); a working setuptools here is used when there is no index
    log = _run([sys.executable, "-m", "build", "--outdir", str(out), str(ROOT)], cwd=out)
    assert "is deprecated" not in log and "SetuptoolsDeprecationWarning" not in log, log
    return out


def test_wheel_and_sdist_carry_license_types_and_device_tables(dist: Path) -> None:
    wheel = next(dist.glob("tscope_callbacks-*.whl"))
    sdist = next(dist.glob("tscope_callbacks-*.tar.gz"))
    names = zipfile.ZipFile(wheel).namelist()
    for member in ("tscope_callbacks/py.typed", "tscope_callbacks/gpu_specs.json", "tscope_callbacks/devices/data/h100.json"):
        assert member in names, member
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    # the TSCOPE tab: its ES module ships, and TensorBoard finds the plugin through the entry point
    assert "tscope_callbacks/dashboard/static/index.js" in names
    # the dashboard page's JavaScript modules (inlined into the page at run time)
    js = Path(ROOT, "tscope_callbacks/render/static/js")
    for f in sorted(js.glob("*.js")):
        assert f"tscope_callbacks/render/static/js/{f.name}" in names, f.name
    eps = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith(".dist-info/entry_points.txt"))).decode()
    assert "[tensorboard_plugins]\ntscope = tscope_callbacks.dashboard.plugin:TscopePlugin" in eps
    meta = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    assert "License-Expression: MIT" in meta and "Classifier: Typing :: Typed" in meta
    assert "Provides-Extra: wandb" in meta and "Provides-Extra: fvcore" in meta
    with tarfile.open(sdist) as tar:
        members = {Path(m).relative_to(Path(m).parts[0]).as_posix() for m in tar.getnames() if "/" in m}
    assert {"LICENSE", "README.md", "pyproject.toml", "tscope_callbacks/py.typed"} <= members


def test_wheel_installs_beside_an_installed_torch_and_the_demo_runs(dist: Path, tmp_path: Path) -> None:
    wheel = next(dist.glob("tscope_callbacks-*.whl"))
    venv = tmp_path / "venv"
    # no pip or setuptools of its own (an old bundled setuptools would shadow torch's requirement): this pip drives it
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], cwd=tmp_path)
    bindir = venv / ("Scripts" if os.name == "nt" else "bin")
    py = bindir / "python"
    purelib = Path(_run([str(py), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], cwd=tmp_path).strip())
    # the project's environment, torch included, as the fresh venv's "system" packages
    (purelib / "_with_torch.pth").write_text(sysconfig.get_path("purelib") + "\n")
    pin = tmp_path / "torch-pin.txt"
    pin.write_text(f"torch=={torch.__version__}\n")

    _run([sys.executable, "-m", "pip", "--python", str(py), "install", "--no-index", "-c", str(pin), str(wheel)],
         cwd=tmp_path)

    probe = "import torch, tscope_callbacks; print(torch.__version__); print(torch.__file__); print(tscope_callbacks.__file__)"
    version, torch_file, ts_file = _run([str(py), "-c", probe], cwd=tmp_path).split()[:3]
    assert version == torch.__version__ and Path(torch_file) == Path(torch.__file__)  # the same torch, untouched
    assert Path(ts_file).is_relative_to(purelib)  # the wheel's copy, not this checkout
    own = sorted(p.name for p in purelib.glob("*.dist-info"))
    assert not [n for n in own if n.lower().startswith(("torch-", "nvidia"))], own  # nothing pulled beside it

    out = _run([str(bindir / "tscope"), "demo", "--steps", "20", "--every", "10", "--out", str(tmp_path / "logs")],
               cwd=tmp_path)
    assert "tscope demo: 20 steps in" in out and "## Roofline" in out
