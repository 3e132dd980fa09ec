"""The top-level API: the core names (``__all__``) import quietly and include every name the README uses; the advanced
names live in their modules only; docs/api.md lists both."""

from __future__ import annotations

import importlib
import re
import warnings
from pathlib import Path

import pytest

import tscope_callbacks as ts

ROOT = Path(__file__).resolve().parents[1]
ADVANCED = {"Profile": "capture.profile", "NestedProfileError": "capture.profile", "active_profile": "capture.profile",
            "Formula": "formulas.registry", "FormulaRegistry": "formulas.registry", "DEFAULT_REGISTRY": "formulas",
            "precision_for_dtype": "devices.precision", "normalize_precision": "devices.precision"}


def test_the_readme_uses_core_names_only() -> None:
    used = set(re.findall(r"\bts\.([A-Za-z_]\w*)", (ROOT / "README.md").read_text()))
    assert used and used <= set(ts.__all__), used - set(ts.__all__)


def test_core_names_import_without_a_warning() -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for name in ts.__all__:
            assert getattr(ts, name) is not None
    assert [str(w.message) for w in caught if "tscope_callbacks." in str(w.message)] == []
    assert not set(ADVANCED) & set(ts.__all__) and set(dir(ts)) == set(ts.__all__)


@pytest.mark.parametrize("name", sorted(ADVANCED))
def test_advanced_names_live_in_their_module_only(name: str) -> None:
    assert getattr(importlib.import_module(f"tscope_callbacks.{ADVANCED[name]}"), name) is not None
    with pytest.raises(AttributeError):
        getattr(ts, name)


def test_docs_api_page_lists_every_name() -> None:
    page = (ROOT / "docs" / "api.md").read_text()
    listed = set(re.findall(r"`(\w+)`", page))
    missing = (set(ts.__all__) - {"__version__"} | set(ADVANCED)) - listed
    assert not missing, missing


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="has no attribute 'nope'"):
        ts.nope  # noqa: B018
