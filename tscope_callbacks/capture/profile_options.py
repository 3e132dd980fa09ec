"""What the installation (``capture.region``) and the result's build (``capture.build``) read of a capture: its
options as :class:`~tscope_callbacks.capture.profile.Profile` holds them. ``Profile`` imports both helpers; they see
it through this Protocol, never the class itself, so no import runs back up."""

from __future__ import annotations

from typing import Any, Protocol

import torch

from tscope_callbacks.capture.faults import Faults
from tscope_callbacks.formulas.registry import FormulaRegistry
from tscope_callbacks.records import CaptureInfo

__all__ = ["ProfileOptions"]


class ProfileOptions(Protocol):
    """A capture's options and the caller's data (see ``Profile``'s arguments)."""

    model: torch.nn.Module
    registry: FormulaRegistry  #: the formulas the ops are counted with
    timing: str  #: "cpu", "cuda" or "none" (resolved)
    layer_details: bool
    check_finite: bool
    compiled: str  #: "auto", "kernels" or "eager"
    record_shapes: bool
    given: CaptureInfo  #: the caller's facts about the step
    user: dict[str, Any]  #: the caller's own data, copied as is
    errors: list[str]  #: internal errors noted during the capture
    faults: Faults  #: where internal errors are logged
