"""The per-machine cache of measured roofs (``$TSCOPE_CACHE_DIR``, else ``$XDG_CACHE_HOME/tscope``, else
``~/.cache/tscope``): one JSON file per kind, ``{"version": 1, "entries": {key: entry}}``, written atomically; a
missing, unreadable or corrupted file is ignored and rewritten on the next store."""

from __future__ import annotations

import json
import os
import tempfile
import warnings
from pathlib import Path
from typing import Any

from tscope_callbacks.devices.spec import DeviceSpec

__all__ = ["cache_dir", "cache_get", "cache_put", "spec_from_entry", "GEMM_CACHE", "gemm_cache_key",
           "cached_gemm_table"]

GEMM_CACHE = "gemm_tables.json"  #: ``tscope calibrate --gemm`` tables (``devices.gemm_table``)

_CACHE_VERSION = 1


def cache_dir() -> Path:
    """``$TSCOPE_CACHE_DIR``, else ``$XDG_CACHE_HOME/tscope``, else ``~/.cache/tscope``."""
    if os.environ.get("TSCOPE_CACHE_DIR"):
        return Path(os.environ["TSCOPE_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "tscope"


def _read_cache(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if isinstance(data, dict) and data.get("version") == _CACHE_VERSION and isinstance(data.get("entries"), dict):
            return data["entries"]
    except (OSError, ValueError):
        pass
    return {}  # missing, unreadable or corrupted: ignored (rewritten on the next store)


def cache_get(path: Path, key: str) -> dict[str, Any] | None:
    entry = _read_cache(path).get(key)
    return entry if isinstance(entry, dict) else None


def cache_put(path: Path, key: str, entry: dict[str, Any]) -> None:
    entries = _read_cache(path)
    entries[key] = entry
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=path.name, dir=path.parent)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump({"version": _CACHE_VERSION, "entries": entries}, f, indent=1)
        os.replace(tmp, path)
    except OSError as e:
        warnings.warn(f"tscope: could not write the roof cache {path}: {e}", stacklevel=3)


def spec_from_entry(entry: dict[str, Any] | None, where: str) -> DeviceSpec | None:
    if entry is None:
        return None
    try:
        return DeviceSpec.from_dict(entry["spec"], where=where)
    except (KeyError, TypeError, ValueError):
        return None




def gemm_cache_key(name: str) -> str:
    import torch

    return f"{name}|torch {torch.__version__}"


def cached_gemm_table(name: str) -> dict[str, Any] | None:
    """The GEMM table ``calibrate --gemm`` cached for device ``name`` (this torch version), None when none."""
    entry = cache_get(cache_dir() / GEMM_CACHE, gemm_cache_key(name))
    return entry if entry and isinstance(entry.get("gemm"), dict) else None
