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
    "profile": "capture.profile",
    "Profile": "capture.profile",
    "NestedProfileError": "capture.profile",
    "active_profile": "capture.profile",
    # formulas
    "Formula": "formulas.registry",
    "FormulaRegistry": "formulas.registry",
    "DEFAULT_REGISTRY": "formulas",
    # device roofs
    "DeviceSpec": "devices.spec",
    "UnknownDeviceError": "devices.spec",
    "AmbiguousDeviceError": "devices.spec",
    "SpecFileError": "devices.spec",
    "precision_for_dtype": "devices.precision",
    "normalize_precision": "devices.precision",
    "get_device_spec": "devices.resolve",
    "list_specs": "devices.resolve",
    "calibrate": "devices.calibrate",
    # analysis
    "roofline": "api",
    "RooflineReport": "render.report",
    "StepReport": "analysis.report",
    "analyze": "analysis.analyze",
    "load_step_file": "analysis.report",
    "analyze_model": "api",
    "fsdp_whatif": "analysis.fsdp",
    "ElemCountAnalysis": "compat.elemcount",
    # callbacks (import Lightning)
    "RooflineCallback": "callbacks.roofline_cb",
    "LayerProfilerCallback": "callbacks.layers_cb",
    "NaNGuardCallback": "callbacks.nan_guard",
    "WatchCallback": "callbacks.watch",
    "NonFiniteEvent": "analysis.nonfinite",
    "NonFiniteError": "analysis.nonfinite",
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
