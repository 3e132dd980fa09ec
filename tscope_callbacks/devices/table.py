"""Loading, validating and searching device roof tables (``gpu_specs.json`` and user JSON files).

Name resolution never guesses by substring (Lightning's ThroughputMonitor reads "NVIDIA L40S" as an L4 that way).
A name is normalized (case, runs of spaces/``-``/``_``) and looked up in three levels, first hit wins:

1. exact: a row's canonical ``name`` or one of its ``match`` strings (the real ``torch.cuda.get_device_name()``);
2. alias: a row's ``aliases`` ("h100", "a100-80gb", "4090") and its name / match strings without the vendor prefix
   ("H100 SXM", "L40S", "Tesla T4" -> "T4");
3. pattern: a row's ``patterns``, regexes matched against the whole name, case-insensitive.

A key that several rows claim at the same level is ambiguous and raises instead of picking one.
"""

from __future__ import annotations

import difflib
import functools
import os
import re
from pathlib import Path

from tscope_callbacks.devices.spec import (
    AmbiguousDeviceError,
    DeviceSpec,
    SpecFileError,
    UnknownDeviceError,
    read_rows,
    row_to_spec,
)

__all__ = ["SpecTable", "norm_key", "default_table_path",
           "load_table", "builtin_table", "spec_from_file", "resolve", "all_specs", "closest_names"]

_PREFIXES = ("nvidia geforce ", "geforce ", "nvidia ", "tesla ", "amd instinct ", "amd radeon ", "amd ", "instinct ")


def norm_key(name: str) -> str:
    """Lower case, runs of whitespace / ``-`` / ``_`` collapsed to one space."""
    return re.sub(r"[\s\-_]+", " ", name.strip().lower()).strip()


def _strip_vendor(key: str) -> str:
    for p in _PREFIXES:
        if key.startswith(p) and len(key) > len(p):
            return key[len(p):]
    return key


def default_table_path() -> Path:
    """The built-in ``gpu_specs.json`` shipped inside the package."""
    return Path(__file__).resolve().parent.parent / "gpu_specs.json"


# ---------------- the searchable table ----------------
class SpecTable:
    """Rows plus the exact / alias / pattern indexes described in the module docstring."""

    def __init__(self, specs: list[DeviceSpec], *, origin: str = "") -> None:
        self.specs = list(specs)
        self.origin = origin
        self._levels: list[dict[str, set[int]]] = [{}, {}]
        self._patterns: list[tuple[re.Pattern[str], int]] = []
        for i, s in enumerate(self.specs):
            for n in (s.name, *s.match):
                self._add(0, norm_key(n), i)
            for n in (s.name, *s.match):
                self._add(1, _strip_vendor(norm_key(n)), i)
            for a in s.aliases:
                self._add(1, norm_key(a), i)
            self._patterns += [(re.compile(p, re.IGNORECASE), i) for p in s.patterns]

    def _add(self, level: int, key: str, i: int) -> None:
        if level == 1 and i in self._levels[0].get(key, ()):
            return
        self._levels[level].setdefault(key, set()).add(i)

    def ambiguous_keys(self) -> dict[str, list[str]]:
        """Keys claimed by several rows at the same level (the built-in table must have none)."""
        return {k: sorted(self.specs[i].name for i in rows)
                for level in self._levels for k, rows in level.items() if len(rows) > 1}

    def lookup(self, name: str, *, hint: str = "") -> DeviceSpec | None:
        """The row ``name`` resolves to, None when no row fits; raises AmbiguousDeviceError on a tie."""
        key = norm_key(name)
        for level in self._levels:
            rows = level.get(key)
            if rows:
                return self._one(name, rows, hint)
        flat = " ".join(name.split())
        rows = {i for pat, i in self._patterns if pat.fullmatch(flat)}
        return self._one(name, rows, hint) if rows else None

    def _one(self, name: str, rows: set[int], hint: str) -> DeviceSpec:
        if len(rows) > 1:
            raise AmbiguousDeviceError(name, sorted(self.specs[i].name for i in rows), table_path=self.origin,
                                       hint=hint)
        return self.specs[next(iter(rows))]

    def names(self) -> list[tuple[str, str]]:
        """(searchable string, canonical name) pairs for closest-name suggestions."""
        return [(n, s.name) for s in self.specs for n in (s.name, *s.match, *s.aliases)]


def closest_names(name: str, tables: list[SpecTable], *, n: int = 5, minimum: int = 3) -> list[str]:
    """3-5 canonical names closest to ``name`` (difflib over names, real device names and aliases)."""
    pairs = [p for t in tables for p in t.names()]
    key = norm_key(name)
    toks = set(key.split())

    def score(s: str) -> float:
        other = norm_key(s)
        ratio = difflib.SequenceMatcher(None, key, other).ratio()
        subset = toks <= set(other.split()) or set(other.split()) <= toks  # "NVIDIA H100" ~ "NVIDIA H100 SXM"
        return ratio + (0.25 if subset else 0.0)

    scored = sorted(((score(s), canon) for s, canon in pairs), key=lambda x: -x[0])
    out: list[str] = []
    for score, canon in scored:
        if canon not in out and (score >= 0.5 or len(out) < minimum):
            out.append(canon)
        if len(out) >= n:
            break
    return out


def load_table(path: str | os.PathLike[str]) -> SpecTable:
    """Read and validate a JSON table file."""
    rows = read_rows(path)
    return SpecTable([row_to_spec(r, where=str(path), index=i) for i, r in enumerate(rows)], origin=str(path))


@functools.lru_cache(maxsize=1)
def builtin_table() -> SpecTable:
    """The shipped ``gpu_specs.json`` (loaded once)."""
    return load_table(default_table_path())


@functools.lru_cache(maxsize=8)
def _cached_table(path: str, mtime: float) -> SpecTable:
    return load_table(path)


def _tables(extra_table: str | os.PathLike[str] | None) -> list[SpecTable]:
    if extra_table is None:
        return [builtin_table()]
    p = Path(extra_table)
    if not p.is_file():
        raise SpecFileError(f"device spec file not found: {str(p)!r}")
    return [_cached_table(str(p.resolve()), p.stat().st_mtime), builtin_table()]


def resolve(name: str, *, extra_table: str | os.PathLike[str] | None = None, hint: str = "") -> DeviceSpec:
    """Resolve a device name (see the module docstring); unknown names raise :class:`UnknownDeviceError`."""
    tables = _tables(extra_table)
    for t in tables:
        hit = t.lookup(name, hint=hint)
        if hit is not None:
            return hit
    raise UnknownDeviceError(name, closest_names(name, tables), table_path=str(default_table_path()), hint=hint)


def spec_from_file(path: str | os.PathLike[str]) -> DeviceSpec:
    """The one row of a JSON file given as the device (several rows: use ``get_device_spec(name, table=path)``)."""
    table = load_table(path)
    if len(table.specs) != 1:
        names = ", ".join(repr(s.name) for s in table.specs[:8]) or "none"
        raise SpecFileError(f"{path}: holds {len(table.specs)} rows ({names}); pass one row, or pick one with "
                            f"get_device_spec(NAME, table={str(path)!r})")
    return table.specs[0]


def all_specs(*, extra_table: str | os.PathLike[str] | None = None) -> list[DeviceSpec]:
    """Every row of the given tables, extra table first."""
    return [s for t in _tables(extra_table) for s in t.specs]
