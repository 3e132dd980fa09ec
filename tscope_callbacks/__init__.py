"""tscope_callbacks: roofline profiling, layer inspection and a NaN guard for PyTorch (Lightning) training.

Attributes are imported lazily, so ``import tscope_callbacks`` is cheap and the engine never imports Lightning
unless a callback is used.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

# The public API: the core names (``__all__``), each from the module that defines it. docs/api.md lists them.
_EXPORTS = {
    # Lightning callbacks (import Lightning)
    "RooflineCallback": "callbacks.roofline_cb",
    "LayerProfilerCallback": "callbacks.layers_cb",
    "NaNGuardCallback": "callbacks.nan_guard",
    "WatchCallback": "callbacks.watch",
    "StepMonitor": "callbacks.monitor",
    "MonitorOptions": "callbacks.monitor",
    "CaptureOptions": "callbacks.options",
    "RooflineOutputs": "callbacks.options",
    "MFUOptions": "callbacks.options",
    "WhatIf": "callbacks.options",
    "LayerOutputs": "callbacks.options",
    "NaNGuardOptions": "callbacks.options",
    "NonFiniteEvent": "analysis.nonfinite",
    "NonFiniteError": "analysis.nonfinite",
    # any loop: profile a region, place it on the roofline
    "profile": "capture.profile",
    "roofline": "api",
    "analyze": "api",
    "AnalyzeOptions": "analysis.analyze",
    # the one report type, from every entry point
    "StepReport": "report",
    "load_step_file": "report",
    # records
    "StepProfile": "records",
    "CaptureInfo": "records",
    "ProfileReason": "records",
    "OpRecord": "records",
    "LayerRecord": "records",
    # no training
    "analyze_model": "api",
    "fsdp_whatif": "analysis.fsdp",
    "ElemCountAnalysis": "compat.elemcount",
    # device roofs
    "DeviceSpec": "devices.spec",
    "get_device_spec": "devices.resolve",
    "list_specs": "devices.resolve",
    "calibrate": "devices.calibrate",
    "UnknownDeviceError": "devices.spec",
    "AmbiguousDeviceError": "devices.spec",
    "SpecFileError": "devices.spec",
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
