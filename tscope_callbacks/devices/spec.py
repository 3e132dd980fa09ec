"""A device's roofs (:class:`DeviceSpec`), the errors of spec handling, and the row schema of ``gpu_specs.json``.

CONTRACT (other modules rely on these names and meanings):
- ``DeviceSpec(name, flops: dict[str, float], bandwidth: float, l2_bytes=None, source="", measured=False,
  aliases=(), vendor="", achievable=None)``; ``flops`` maps canonical precision -> dense peak FLOP/s.
- ``spec.peak_flops(precision, matrix=True)`` -> float FLOP/s. ``matrix=False`` gives the vector (non tensor-core)
  rate used for pointwise ops. Accepts any precision ``normalize_precision`` accepts.
- ``spec.ridge(precision, matrix=True)`` -> FLOP/byte; ``spec.bandwidth`` bytes/s.
- ``normalize_precision(p)`` -> one of PRECISIONS; accepts "fp32", "float32", torch dtypes, "bf16-mixed",
  "16-mixed", "32-true", "tf32"...
- ``get_device_spec("auto" | name | path | DeviceSpec)``, ``UnknownDeviceError``, ``list_specs()``.

"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tscope_callbacks.devices.precision import MATRIX_CHAIN, VECTOR_CHAIN, normalize_precision, tf32_enabled

__all__ = ["DeviceSpec", "UnknownDeviceError", "AmbiguousDeviceError", "SpecFileError", "MINIMAL_ROW", "ROW_FIELDS",
           "read_rows", "row_to_spec"]

@dataclass
class DeviceSpec:
    """Roofs of one device: dense peak FLOP/s per precision and memory bandwidth.

    Keys of ``flops`` / ``vector_flops`` may be any spelling :func:`normalize_precision` accepts; they are
    normalized on construction. ``achievable`` holds measured roofs (:func:`tscope_callbacks.calibrate`).
    """

    name: str
    flops: dict[str, float]  #: canonical precision -> dense peak FLOP/s on matrix units (tensor cores)
    bandwidth: float  #: bytes/s
    l2_bytes: int | None = None
    source: str = ""
    measured: bool = False
    aliases: tuple[str, ...] = ()
    vendor: str = ""
    vector_flops: dict[str, float] = field(default_factory=dict)  #: non-matrix rates (fp32/fp64 vector units)
    achievable: DeviceSpec | None = None  #: measured roofs (calibrate()), shown beside the datasheet ones
    extra: dict[str, Any] = field(default_factory=dict)
    match: tuple[str, ...] = ()  #: exact ``torch.cuda.get_device_name()`` strings this row stands for
    patterns: tuple[str, ...] = ()  #: regexes (whole name, case-insensitive) this row stands for
    #: link -> bidirectional bytes/s per GPU ("nvlink", "infinity_fabric", "pcie"), as datasheets state it
    interconnect: dict[str, float] = field(default_factory=dict)
    memory_bytes: int | None = None  #: device memory (datasheet; a real GPU's own total), for the step-memory check

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.strip():
            raise ValueError(f"DeviceSpec.name must be a non-empty string, got {self.name!r}")
        self.flops = _rates(self.flops, f"DeviceSpec({self.name!r}).flops")
        self.vector_flops = _rates(self.vector_flops or {}, f"DeviceSpec({self.name!r}).vector_flops")
        if not self.flops and not self.vector_flops:
            raise ValueError(f"DeviceSpec({self.name!r}) needs at least one rate in flops, e.g. {{'fp32': 2e13}}")
        if not _positive(self.bandwidth):
            raise ValueError(f"DeviceSpec({self.name!r}).bandwidth must be a positive number of bytes/s, "
                             f"got {self.bandwidth!r}")
        self.bandwidth = float(self.bandwidth)
        if self.l2_bytes is not None and not _positive(self.l2_bytes):
            raise ValueError(f"DeviceSpec({self.name!r}).l2_bytes must be positive or None, got {self.l2_bytes!r}")
        if self.memory_bytes is not None and not _positive(self.memory_bytes):
            raise ValueError(f"DeviceSpec({self.name!r}).memory_bytes must be positive or None, "
                             f"got {self.memory_bytes!r}")
        self.aliases, self.match, self.patterns = tuple(self.aliases), tuple(self.match), tuple(self.patterns)

    # ---------------- rates ----------------
    def _resolve(self, precision: Any, matrix: bool, allow_tf32: bool | None) -> tuple[str, str, float]:
        p = normalize_precision(precision)
        if matrix and p == "fp32" and "tf32" in self.flops:
            if allow_tf32 is None:
                allow_tf32 = tf32_enabled()
            if allow_tf32:
                return "m", "tf32", self.flops["tf32"]
        for table, key in (MATRIX_CHAIN if matrix else VECTOR_CHAIN)[p]:
            rates = self.flops if table == "m" else self.vector_flops
            if key in rates:
                return table, key, rates[key]
        kind = "matrix" if matrix else "vector"
        raise ValueError(f"device {self.name!r} has no {kind} rate usable for {p} (it lists flops={sorted(self.flops)}, "
                         f"vector_flops={sorted(self.vector_flops)}); add a {p!r} figure to its row")

    def peak_flops(self, precision: Any = "fp32", matrix: bool = True, *, allow_tf32: bool | None = None) -> float:
        """Dense peak FLOP/s for ``precision`` (see the module docstring for fallbacks and the TF32 rule).

        ``allow_tf32=None`` reads ``torch.get_float32_matmul_precision()`` now; True/False force the choice.
        """
        return self._resolve(precision, matrix, allow_tf32)[2]

    def effective_precision(self, precision: Any = "fp32", matrix: bool = True, *,
                            allow_tf32: bool | None = None) -> str:
        """The precision whose rate :meth:`peak_flops` returns (``"tf32"`` for fp32 under TF32, ``"fp16"`` for fp8
        on an A100, ...). Vector rates come back as ``"<p> vector"``."""
        table, key, _ = self._resolve(precision, matrix, allow_tf32)
        return key if table == "m" else f"{key} vector"

    def ridge(self, precision: Any = "fp32", matrix: bool = True, *, allow_tf32: bool | None = None) -> float:
        """Ridge point (FLOP/byte) = peak FLOP/s / bandwidth: ops below it are memory-bound."""
        return self.peak_flops(precision, matrix, allow_tf32=allow_tf32) / self.bandwidth

    # ---------------- (de)serialization ----------------
    @property
    def link_bandwidth(self) -> float | None:
        """The collectives' roof: one direction of the fastest link (bytes/s), what nccl-tests' bus bandwidth
        compares with; None when the row lists no interconnect."""
        return max(self.interconnect.values()) / 2 if self.interconnect else None

    @property
    def link_name(self) -> str:
        return max(self.interconnect, key=self.interconnect.__getitem__) if self.interconnect else ""

    def to_dict(self) -> dict[str, Any]:
        """Row dict in the ``gpu_specs.json`` schema (``achievable`` nested the same way when set)."""
        d: dict[str, Any] = {"name": self.name, "vendor": self.vendor, "match": list(self.match),
                             "patterns": list(self.patterns), "aliases": list(self.aliases), "flops": dict(self.flops),
                             "vector_flops": dict(self.vector_flops), "bandwidth": self.bandwidth,
                             "l2_bytes": self.l2_bytes, "source": self.source, "measured": self.measured}
        if self.memory_bytes is not None:
            d["memory_bytes"] = self.memory_bytes
        if self.extra:
            d["extra"] = dict(self.extra)
        if self.interconnect:
            d["interconnect"] = dict(self.interconnect)
        if self.achievable is not None:
            d["achievable"] = self.achievable.to_dict()
        return d

    @classmethod
    def from_dict(cls, row: dict[str, Any], *, where: str = "<dict>") -> DeviceSpec:
        """Build from a row dict (the ``gpu_specs.json`` schema); errors name ``where`` and the field."""
        return row_to_spec(row, where=where, index=0)

    def with_achievable(self, achievable: DeviceSpec | None) -> DeviceSpec:
        """A copy with ``achievable`` set."""
        return dataclasses.replace(self, achievable=achievable)


def _positive(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and x > 0 and x != float("inf")


def _rates(rates: Any, what: str) -> dict[str, float]:
    if not isinstance(rates, dict):
        raise ValueError(f"{what} must be a dict precision -> FLOP/s, got {type(rates).__name__}")
    out: dict[str, float] = {}
    for k, v in rates.items():
        p = normalize_precision(k)
        if not _positive(v):
            raise ValueError(f"{what}[{k!r}] must be a positive number of FLOP/s, got {v!r}")
        out[p] = float(v)
    return out


# ---------------- errors ----------------
class SpecFileError(ValueError):
    """A device spec JSON file is missing, malformed, or has a bad row (the message names file, row and field)."""


class UnknownDeviceError(ValueError):
    """A device name not in the table. The message lists the closest names and how to add the device."""

    def __init__(self, name: str, candidates: list[str], *, table_path: str = "", hint: str = "") -> None:
        self.name, self.candidates = name, list(candidates)
        close = ", ".join(repr(c) for c in self.candidates) or "(none)"
        table = table_path or "gpu_specs.json"
        lines = [
            f"unknown device {name!r}. Closest known names: {close}.",
            *([hint] if hint else []),
            "To use a device that is not in the table, either:",
            f"  - pass a JSON file path (get_device_spec('my_gpu.json'), --gpu my_gpu.json) holding one row: {MINIMAL_ROW}",
            "    (FLOP/s are dense peaks per precision: fp64 fp32 tf32 fp16 bf16 fp8 int8; bandwidth in bytes/s),",
            "  - or pass DeviceSpec(name='My GPU', flops={'bf16': 1.0e14, 'fp32': 2.0e13}, bandwidth=1.0e12),",
            f"  - or add a row to gpu_specs.json ({table}).",
            "`tscope specs` lists the known devices.",
        ]
        super().__init__("\n".join(lines))


class AmbiguousDeviceError(UnknownDeviceError):
    """A name that fits several rows equally well: nothing is picked silently."""

    def __init__(self, name: str, candidates: list[str], *, table_path: str = "", hint: str = "") -> None:
        hint = (f"{name!r} is ambiguous: it fits {len(candidates)} rows; pass one of their canonical names. "
                + hint).strip()
        super().__init__(name, candidates, table_path=table_path, hint=hint)


MINIMAL_ROW = '{"name": "My GPU", "flops": {"bf16": 1.0e14, "fp32": 2.0e13}, "bandwidth": 1.0e12}'
REQUIRED_FIELDS = ("name", "flops", "bandwidth")
ROW_FIELDS = frozenset({*REQUIRED_FIELDS, "vendor", "match", "patterns", "aliases", "vector_flops", "l2_bytes", "memory_bytes",
                        "source", "notes", "measured", "extra", "achievable", "interconnect"})


# ---------------- reading and validation ----------------
def read_rows(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Raw rows of a JSON file: a list of rows, ``{"devices": [rows]}``, or one row object."""
    p = Path(path)
    if not p.is_file():
        raise SpecFileError(f"device spec file not found: {str(p)!r}")
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise SpecFileError(f"{p}: invalid JSON at line {e.lineno} column {e.colno}: {e.msg}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise SpecFileError(f"{p}: cannot read: {e}") from None
    if isinstance(data, dict) and "devices" in data:
        data = data["devices"]
        if not isinstance(data, list):
            raise SpecFileError(f"{p}: 'devices' must be a list of rows")
    elif isinstance(data, dict):
        data = [data]
    elif not isinstance(data, list):
        raise SpecFileError(f"{p}: expected a row object or a list of rows, got {type(data).__name__}")
    for i, row in enumerate(data):
        if not isinstance(row, dict):
            raise SpecFileError(f"{p}: row {i}: expected an object, got {type(row).__name__}; a row looks like {MINIMAL_ROW}")
    return data


def _str_list(row: dict[str, Any], key: str, err) -> tuple[str, ...]:
    v = row.get(key, ())
    if isinstance(v, str):
        v = [v]
    if not isinstance(v, (list, tuple)) or not all(isinstance(s, str) and s.strip() for s in v):
        raise err(key, "must be a list of non-empty strings")
    return tuple(v)


def row_to_spec(row: dict[str, Any], *, where: str, index: int) -> DeviceSpec:
    """Validate one row and build its :class:`DeviceSpec`; errors name ``where``, the row and the field."""
    label = f"row {index} ({row['name']!r})" if isinstance(row.get("name"), str) else f"row {index}"

    def err(fld: str, msg: str) -> SpecFileError:
        return SpecFileError(f"{where}: {label}: field {fld!r} {msg}; a minimal row is {MINIMAL_ROW}")

    for fld in REQUIRED_FIELDS:
        if fld not in row:
            raise err(fld, "is missing")
    unknown = sorted(k for k in row if k not in ROW_FIELDS and not k.startswith("_"))
    if unknown:
        raise err(unknown[0], f"is not a known field (known: {', '.join(sorted(ROW_FIELDS))})")
    if not isinstance(row["name"], str) or not row["name"].strip():
        raise err("name", "must be a non-empty string")
    for fld in ("flops", "vector_flops"):
        rates = row.get(fld, {})
        if not isinstance(rates, dict) or (fld == "flops" and not rates):
            raise err(fld, "must be a non-empty object precision -> FLOP/s, e.g. {\"bf16\": 1.0e14}")
        for k, v in rates.items():
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
                raise err(f"{fld}.{k}", f"must be a positive number of FLOP/s, got {v!r}")
    bw = row["bandwidth"]
    if isinstance(bw, bool) or not isinstance(bw, (int, float)) or not bw > 0:
        raise err("bandwidth", f"must be a positive number of bytes/s, got {bw!r}")
    l2 = row.get("l2_bytes")
    if l2 is not None and (isinstance(l2, bool) or not isinstance(l2, (int, float)) or not l2 > 0):
        raise err("l2_bytes", f"must be a positive number of bytes or null, got {l2!r}")
    mem = row.get("memory_bytes")
    if mem is not None and (isinstance(mem, bool) or not isinstance(mem, (int, float)) or not mem > 0):
        raise err("memory_bytes", f"must be a positive number of bytes or null, got {mem!r}")
    for fld in ("vendor", "source", "notes"):
        if not isinstance(row.get(fld, ""), str):
            raise err(fld, "must be a string")
    patterns = _str_list(row, "patterns", err)
    for pat in patterns:
        try:
            re.compile(pat)
        except re.error as e:
            raise err("patterns", f"has an invalid regex {pat!r}: {e}") from None
    links = row.get("interconnect", {})
    if not isinstance(links, dict):
        raise err("interconnect", "must be an object link -> bidirectional bytes/s, e.g. {\"nvlink\": 9.0e11}")
    for k, v in links.items():
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
            raise err(f"interconnect.{k}", f"must be a positive number of bytes/s, got {v!r}")
    extra = row.get("extra", {})
    if not isinstance(extra, dict):
        raise err("extra", "must be an object")
    if row.get("notes"):
        extra = {**extra, "notes": row["notes"]}
    achievable = row.get("achievable")
    if achievable is not None:
        if not isinstance(achievable, dict):
            raise err("achievable", "must be a row object")
        achievable = row_to_spec(achievable, where=f"{where}: {label}.achievable", index=0)
    try:
        return DeviceSpec(name=row["name"].strip(), flops=row["flops"], bandwidth=bw,
                          l2_bytes=int(l2) if l2 is not None else None, source=row.get("source", "") or where,
                          measured=bool(row.get("measured", False)), aliases=_str_list(row, "aliases", err),
                          vendor=row.get("vendor", ""), vector_flops=row.get("vector_flops", {}),
                          achievable=achievable, extra=extra, match=_str_list(row, "match", err), patterns=patterns,
                          interconnect={str(k): float(v) for k, v in links.items()},
                          memory_bytes=int(mem) if mem is not None else None)
    except ValueError as e:  # e.g. an unknown precision key
        raise SpecFileError(f"{where}: {label}: {e}; a minimal row is {MINIMAL_ROW}") from None
