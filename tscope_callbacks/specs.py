"""Device roofs: the ``gpu_specs.json`` table, name resolution and precision handling.

CONTRACT (other modules rely on these names and meanings):
- ``DeviceSpec(name, flops: dict[str, float], bandwidth: float, l2_bytes=None, source="", measured=False,
  aliases=(), vendor="", achievable=None)``; ``flops`` maps canonical precision -> dense peak FLOP/s.
- ``spec.peak_flops(precision, matrix=True)`` -> float FLOP/s. ``matrix=False`` gives the vector (non tensor-core)
  rate used for pointwise ops. Accepts any precision ``normalize_precision`` accepts.
- ``spec.ridge(precision, matrix=True)`` -> FLOP/byte; ``spec.bandwidth`` bytes/s.
- ``normalize_precision(p)`` -> one of PRECISIONS; accepts "fp32", "float32", torch dtypes, "bf16-mixed",
  "16-mixed", "32-true", "tf32"...
- ``get_device_spec("auto" | name | path | DeviceSpec)``, ``UnknownDeviceError``, ``list_specs()``.

Precision fallbacks (a chip without a rate for the asked precision; documented, never an error while any
related rate exists):

========  =================================================================================
asked     matrix rate used, first that the chip lists
========  =================================================================================
fp64      fp64, then the fp64 vector rate
fp32      tf32 if the chip has TF32 and ``torch.get_float32_matmul_precision() != "highest"``
          (read at call time), else fp32, then the fp32 vector rate
tf32      tf32, fp32 (no TF32 units: runs as fp32)
fp16      fp16, bf16, fp32
bf16      bf16, fp32 (no bf16 units, e.g. V100/T4: runs at the fp32 rate)
fp8       fp8, fp16, bf16, fp32 (no fp8 units: a 16-bit kernel does the work)
int8      int8, fp16, bf16, fp32
========  =================================================================================

Vector rates (``matrix=False``): fp64 -> fp64 vector; fp32/tf32 -> fp32 vector; fp16/bf16/fp8/int8 -> their own
vector rate if listed, else the fp32 vector rate (pointwise math runs in fp32 registers). A rate that cannot be
derived at all (e.g. ``fp64`` on a user row without any fp64 figure) raises ``ValueError``.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Any

import torch

__all__ = [
    "PRECISIONS",
    "DeviceSpec",
    "UnknownDeviceError",
    "AmbiguousDeviceError",
    "SpecFileError",
    "normalize_precision",
    "precision_for_dtype",
    "get_device_spec",
    "list_specs",
]

PRECISIONS = ("fp64", "fp32", "tf32", "fp16", "bf16", "fp8", "int8")

_ALIASES: dict[str, str] = {}
for _canon, _names in {
    "fp64": ("fp64", "float64", "f64", "64", "64-true", "double", "torch.float64"),
    "fp32": ("fp32", "float32", "f32", "32", "32-true", "float", "single", "torch.float32"),
    "tf32": ("tf32", "tfloat32", "tensorfloat32", "tensorfloat-32"),
    "fp16": ("fp16", "float16", "f16", "half", "16", "16-mixed", "16-true", "torch.float16"),
    "bf16": ("bf16", "bfloat16", "bf16-mixed", "bf16-true", "torch.bfloat16"),
    "fp8": ("fp8", "float8", "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu",
            "e4m3", "e5m2", "transformer-engine", "transformer-engine-float16"),
    "int8": ("int8", "i8", "uint8", "qint8", "quint8"),
}.items():
    for _n in _names:
        _ALIASES[_n] = _canon

# Recorded op dtypes (``OpRecord.dtype``) that are not floating point but run on the vector units.
_VECTOR_DTYPES = {"int16", "int32", "int64", "uint16", "uint32", "uint64", "bool", "complex32", "complex64", ""}


def normalize_precision(precision: str | int | torch.dtype) -> str:
    """Map a precision spelling (Lightning flag, dtype name, ``torch.dtype``) to one of :data:`PRECISIONS`.

    ``"16-mixed"`` -> ``"fp16"``, ``"bf16-mixed"`` -> ``"bf16"``, ``torch.float32`` -> ``"fp32"``,
    ``"float8_e4m3fn"`` -> ``"fp8"``. Unknown spellings raise ``ValueError`` listing the accepted ones.
    """
    key = str(precision).strip().lower() if not isinstance(precision, bool) else ""
    if key.startswith("torch.") and key not in _ALIASES:
        key = key[len("torch."):]
    canon = _ALIASES.get(key)
    if canon is None:
        accepted = ", ".join(sorted(_ALIASES, key=lambda s: (_ALIASES[s], s)))
        raise ValueError(f"unknown precision {precision!r}; accepted: {accepted} (or a torch floating/int8 dtype)")
    return canon


def precision_for_dtype(dtype_str: str | torch.dtype, *, default: str | None = "fp32") -> str:
    """Canonical precision for a recorded dtype string (``"bfloat16"`` -> ``"bf16"``, ``"float8_e4m3fn"`` -> ``"fp8"``).

    Non-float dtypes other than int8 (``"int64"``, ``"bool"``, ``""``) and complex64 return ``default`` (their ops
    run on the fp32 vector units); ``"complex128"`` -> ``"fp64"``. With ``default=None`` those raise ``ValueError``.
    Note ``"float32"`` maps to ``"fp32"``: ``DeviceSpec.peak_flops`` applies the TF32 rule itself.
    """
    key = str(dtype_str).strip().lower().removeprefix("torch.")
    if key == "complex128":
        return "fp64"
    if key in _VECTOR_DTYPES:
        if default is None:
            raise ValueError(f"dtype {dtype_str!r} has no matrix precision")
        return normalize_precision(default)
    return normalize_precision(key)


# (table, key) chains: "m" = DeviceSpec.flops (matrix units), "v" = DeviceSpec.vector_flops.
_MATRIX_CHAIN = {
    "fp64": (("m", "fp64"), ("v", "fp64")),
    "fp32": (("m", "fp32"), ("v", "fp32")),
    "tf32": (("m", "tf32"), ("m", "fp32"), ("v", "fp32")),
    "fp16": (("m", "fp16"), ("m", "bf16"), ("m", "fp32"), ("v", "fp32")),
    "bf16": (("m", "bf16"), ("m", "fp32"), ("v", "fp32")),
    "fp8": (("m", "fp8"), ("m", "fp16"), ("m", "bf16"), ("m", "fp32"), ("v", "fp32")),
    "int8": (("m", "int8"), ("m", "fp16"), ("m", "bf16"), ("m", "fp32"), ("v", "fp32")),
}
_VECTOR_CHAIN = {
    "fp64": (("v", "fp64"), ("m", "fp64")),
    "fp32": (("v", "fp32"), ("m", "fp32")),
    "tf32": (("v", "fp32"), ("m", "fp32")),
    **{p: (("v", p), ("v", "fp32"), ("m", "fp32")) for p in ("fp16", "bf16", "fp8", "int8")},
}


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
        self.aliases, self.match, self.patterns = tuple(self.aliases), tuple(self.match), tuple(self.patterns)

    # ---------------- rates ----------------
    def _resolve(self, precision: Any, matrix: bool, allow_tf32: bool | None) -> tuple[str, str, float]:
        p = normalize_precision(precision)
        if matrix and p == "fp32" and "tf32" in self.flops:
            if allow_tf32 is None:
                allow_tf32 = torch.get_float32_matmul_precision() != "highest"
            if allow_tf32:
                return "m", "tf32", self.flops["tf32"]
        for table, key in (_MATRIX_CHAIN if matrix else _VECTOR_CHAIN)[p]:
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
    def to_dict(self) -> dict[str, Any]:
        """Row dict in the ``gpu_specs.json`` schema (``achievable`` nested the same way when set)."""
        d: dict[str, Any] = {"name": self.name, "vendor": self.vendor, "match": list(self.match),
                             "patterns": list(self.patterns), "aliases": list(self.aliases), "flops": dict(self.flops),
                             "vector_flops": dict(self.vector_flops), "bandwidth": self.bandwidth,
                             "l2_bytes": self.l2_bytes, "source": self.source, "measured": self.measured}
        if self.extra:
            d["extra"] = dict(self.extra)
        if self.achievable is not None:
            d["achievable"] = self.achievable.to_dict()
        return d

    @classmethod
    def from_dict(cls, row: dict[str, Any], *, where: str = "<dict>") -> DeviceSpec:
        """Build from a row dict (the ``gpu_specs.json`` schema); errors name ``where`` and the field."""
        from tscope_callbacks.spec_table import row_to_spec

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
        from tscope_callbacks.spec_table import MINIMAL_ROW

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


# ---------------- lookup ----------------
def _looks_like_path(s: str) -> bool:
    return s.lower().endswith(".json") or (os.sep in s and os.path.isfile(s))


def get_device_spec(device: str | os.PathLike[str] | DeviceSpec | torch.device | None = "auto", *,
                    table: str | os.PathLike[str] | None = None, cache: bool = True,
                    budget_s: float | None = None) -> DeviceSpec:
    """Resolve ``device`` to a :class:`DeviceSpec`.

    ``device``: ``"auto"`` (the current CUDA/ROCm device's name through the table; on a machine without CUDA a
    measured CPU roof, cached per machine under ``$TSCOPE_CACHE_DIR`` or ``~/.cache/tscope``), a canonical name,
    a real ``torch.cuda.get_device_name()`` string, an alias ("h100", "a100-80gb", "4090"), a path to a JSON file
    (one row object, or a list holding one row), a ``torch.device``, or a ``DeviceSpec`` (returned as is).
    Matching is case-insensitive: exact names first, then aliases, then the rows' regex patterns; a name fitting
    several rows raises :class:`AmbiguousDeviceError`, an unknown one :class:`UnknownDeviceError`.

    ``table``: an extra JSON table searched before the built-in one. ``cache`` / ``budget_s``: CPU measurement
    cache use and time budget in seconds (default 2.5).
    """
    from tscope_callbacks import spec_table

    if isinstance(device, DeviceSpec):
        return device
    if device is None:
        device = "auto"
    if isinstance(device, torch.device):
        if device.type == "cuda":
            idx = device.index if device.index is not None else torch.cuda.current_device()
            return _cuda_spec(idx, table=table)
        if device.type == "cpu":
            return _cpu_spec(cache=cache, budget_s=budget_s)
        raise ValueError(f"get_device_spec: no roofs for device type {device.type!r}; pass a name or DeviceSpec")
    if isinstance(device, os.PathLike) or (isinstance(device, str) and _looks_like_path(device)):
        return spec_table.spec_from_file(device)
    if not isinstance(device, str):
        raise TypeError(f"get_device_spec expects a name, a JSON path, a DeviceSpec or 'auto', got {type(device).__name__}")
    if device.strip().lower() == "auto":
        if torch.cuda.is_available():
            return _cuda_spec(torch.cuda.current_device(), table=table)
        return _cpu_spec(cache=cache, budget_s=budget_s)
    return spec_table.resolve(device, extra_table=table)


def _cuda_spec(index: int, *, table: Any) -> DeviceSpec:
    from tscope_callbacks import spec_table

    name = torch.cuda.get_device_name(index)
    hint = (f"{name!r} is the current GPU (cuda:{index}); `tscope calibrate` measures its achievable roofs, "
            "but roofline reports need a datasheet row.")
    spec = spec_table.resolve(name, extra_table=table, hint=hint)
    try:
        from tscope_callbacks.calibrate import cached_achievable

        ach = cached_achievable(name)
    except Exception:  # a broken cache never breaks name resolution
        ach = None
    return spec.with_achievable(ach) if ach is not None else spec


def _cpu_spec(*, cache: bool, budget_s: float | None) -> DeviceSpec:
    from tscope_callbacks.calibrate import DEFAULT_CPU_BUDGET_S, cpu_spec

    return cpu_spec(cache=cache, budget_s=DEFAULT_CPU_BUDGET_S if budget_s is None else budget_s)


def list_specs(*, table: str | os.PathLike[str] | None = None) -> list[DeviceSpec]:
    """All rows of the built-in table (after the rows of ``table``, when given), in file order."""
    from tscope_callbacks import spec_table

    return spec_table.all_specs(extra_table=table)
