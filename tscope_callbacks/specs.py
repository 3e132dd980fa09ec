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
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["DeviceSpec", "PRECISIONS", "normalize_precision"]

PRECISIONS = ("fp64", "fp32", "tf32", "fp16", "bf16", "fp8", "int8")


@dataclass
class DeviceSpec:
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
