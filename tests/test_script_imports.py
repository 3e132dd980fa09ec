"""The scripts and benchmarks import only names the package has: a name moved or renamed in the package fails here,
not the day someone runs the script (most of them run on a GPU machine or take minutes, so the suite does not run
them). Every ``from tscope_callbacks... import NAME``, at any depth (inside functions too), is resolved."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FILES = sorted([*ROOT.glob("scripts/*.py"), *ROOT.glob("benchmarks/*.py")])


def _imports(path: Path) -> list[tuple[str, str, int]]:
    tree = ast.parse(path.read_text(), filename=str(path))
    out = []
    for n in ast.walk(tree):
        if isinstance(n, ast.ImportFrom) and n.module and n.module.split(".")[0] == "tscope_callbacks" and n.level == 0:
            out += [(n.module, a.name, n.lineno) for a in n.names]
        elif isinstance(n, ast.Import):
            out += [(a.name, "", n.lineno) for a in n.names if a.name.split(".")[0] == "tscope_callbacks"]
    return out


def test_there_are_scripts_to_check() -> None:
    assert len(FILES) > 10 and any(p.name == "screenshots.py" for p in FILES)


@pytest.mark.parametrize("path", FILES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_package_name_a_script_imports_exists(path: Path) -> None:
    missing = []
    for module, name, line in _imports(path):
        try:
            mod = importlib.import_module(module)
        except ImportError as e:
            missing.append(f"{path.name}:{line}: {module} ({e})")
            continue
        if name and name != "*" and not hasattr(mod, name):
            try:  # a submodule imported by name
                importlib.import_module(f"{module}.{name}")
            except ImportError:
                missing.append(f"{path.name}:{line}: {module} has no {name}")
    assert missing == [], missing
