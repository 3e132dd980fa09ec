"""tscope_callbacks: roofline profiling, layer inspection and a NaN guard for PyTorch (Lightning) training.

Attributes are imported lazily, so ``import tscope_callbacks`` is cheap and the engine never imports Lightning
unless a callback is used.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

# public name -> module that defines it
_EXPORTS = {
    # records
    "OpRecord": "records",
    "LayerRecord": "records",
    "StepProfile": "records",
    # capture
    "profile": "capture",
    "Profile": "capture",
    "NestedProfileError": "capture",
    "active_profile": "capture",
    # formulas
    "Formula": "formulas.registry",
    "FormulaRegistry": "formulas.registry",
    "DEFAULT_REGISTRY": "formulas",
    # device roofs
    "DeviceSpec": "specs",
    "UnknownDeviceError": "specs",
    "AmbiguousDeviceError": "specs",
    "SpecFileError": "specs",
    "precision_for_dtype": "specs",
    "get_device_spec": "specs",
    "list_specs": "specs",
    "normalize_precision": "specs",
    "calibrate": "calibrate",
    # analysis
    "roofline": "roofline",
    "RooflineReport": "roofline",
    "analyze_model": "analyze",
    "ElemCountAnalysis": "elemcount",
    # callbacks (import Lightning)
    "RooflineCallback": "callbacks.roofline_cb",
    "LayerProfilerCallback": "callbacks.layers_cb",
    "NaNGuardCallback": "callbacks.nan_guard",
    "NonFiniteEvent": "callbacks.nan_guard",
    "NonFiniteError": "callbacks.nan_guard",
}

__all__ = sorted(_EXPORTS) + ["__version__"]


def __getattr__(name: str) -> Any:
    mod = _EXPORTS.get(name)
    if mod is None:
        raise AttributeError(f"module 'tscope_callbacks' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{mod}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
