"""What the analysis helpers read from a roofline, as typed protocols (no ``Any`` at their boundary).

The helpers (``comm``, ``model_summary``, ``memory_fit``, ``fsdp``, ``fsdp_memory``, ``advice``, ``layer_advice``,
``noise``, ``compare``, ``diff``) receive either a
:class:`~tscope_callbacks.analysis.roofline.RooflineAnalysis` (from inside the analysis) or the ``RooflineReport``
wrapping one (what ``tscope_callbacks.roofline`` returns; it forwards these attributes to its analysis). Both have
what :class:`RooflineView` lists. :class:`RooflineReportView` adds the options the report was analysed with: the
FSDP what-if reads ``options.what_if`` (the step's times were measured on another device than the roofs').
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from tscope_callbacks.analysis.analyze import AnalyzeOptions
    from tscope_callbacks.analysis.rows import OpRoof, Row
    from tscope_callbacks.devices.efficiency import KernelModel
    from tscope_callbacks.devices.spec import DeviceSpec
    from tscope_callbacks.records import LayerRecord

__all__ = ["RooflineView", "RooflineReportView"]


class RooflineView(Protocol):
    """The members of a ``RooflineAnalysis`` the analysis helpers read (each helper reads a subset)."""

    @property
    def op_roofs(self) -> list[OpRoof]: ...  # every op of the step on its roof, in execution order
    @property
    def spec(self) -> DeviceSpec: ...  # the roofs' device
    @property
    def meta(self) -> Mapping[str, Any]: ...  # the profile's own labels (device, timing, memory_categories, ...)
    @property
    def timed(self) -> bool: ...
    @property
    def measured_step_s(self) -> float | None: ...
    @property
    def step_time_source(self) -> str | None: ...
    @property
    def op_time_s(self) -> float | None: ...
    @property
    def estimated_step_s(self) -> float: ...
    @property
    def model_flops(self) -> float: ...
    @property
    def mfu_peak_flops(self) -> float: ...
    @property
    def mfu(self) -> float | None: ...
    @property
    def layer_records(self) -> Mapping[str, LayerRecord]: ...
    @property
    def layer_rows(self) -> list[Row]: ...  # layer x phase
    @property
    def layer_totals(self) -> list[Row]: ...  # per layer, all phases
    @property
    def kernel_model(self) -> KernelModel | None: ...

    def expected_time_s(self, phase: str | None = None) -> float: ...


class RooflineReportView(RooflineView, Protocol):
    """A roofline with the options it was analysed with: ``RooflineReport``."""

    @property
    def options(self) -> AnalyzeOptions: ...
