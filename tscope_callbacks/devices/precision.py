"""Precision rules, in one place: spellings, dtype mapping, the TF32 rule and the per-precision roof fallbacks.

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

import torch

__all__ = ["PRECISIONS", "MATRIX_CHAIN", "VECTOR_CHAIN", "TORCH_DTYPES", "normalize_precision", "precision_for_dtype",
           "tf32_enabled"]

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
MATRIX_CHAIN = {
    "fp64": (("m", "fp64"), ("v", "fp64")),
    "fp32": (("m", "fp32"), ("v", "fp32")),
    "tf32": (("m", "tf32"), ("m", "fp32"), ("v", "fp32")),
    "fp16": (("m", "fp16"), ("m", "bf16"), ("m", "fp32"), ("v", "fp32")),
    "bf16": (("m", "bf16"), ("m", "fp32"), ("v", "fp32")),
    "fp8": (("m", "fp8"), ("m", "fp16"), ("m", "bf16"), ("m", "fp32"), ("v", "fp32")),
    "int8": (("m", "int8"), ("m", "fp16"), ("m", "bf16"), ("m", "fp32"), ("v", "fp32")),
}
VECTOR_CHAIN = {
    "fp64": (("v", "fp64"), ("m", "fp64")),
    "fp32": (("v", "fp32"), ("m", "fp32")),
    "tf32": (("v", "fp32"), ("m", "fp32")),
    **{p: (("v", p), ("v", "fp32"), ("m", "fp32")) for p in ("fp16", "bf16", "fp8", "int8")},
}



#: torch dtype a precision runs with (fp8/int8 analyses run in bf16 against the fp8/int8 roof; tf32 is float32)
TORCH_DTYPES = {"fp32": torch.float32, "tf32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16,
                "fp64": torch.float64, "fp8": torch.bfloat16, "int8": torch.bfloat16}


def tf32_enabled(float32_matmul_precision: str | None = None) -> bool:
    """THE TF32 rule: fp32 matmuls run on TF32 tensor cores when ``float32_matmul_precision`` (a profile's recorded
    setting; None reads ``torch.get_float32_matmul_precision()`` now) is not ``"highest"``."""
    if float32_matmul_precision is None:
        float32_matmul_precision = torch.get_float32_matmul_precision()
    return str(float32_matmul_precision).lower() != "highest"
