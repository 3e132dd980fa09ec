"""Throughput and MFU over windows of steps (the maths of the automatic MFU; the callback only feeds it).

Like Lightning fabric's ``Throughput``: :meth:`Throughput.update` takes one finished window (its device time, the
steps, model FLOPs and samples in it), :meth:`Throughput.compute` returns the rates of the last window and of the
last ``window_size`` windows together.

Model FLOPs (what the windows count per step) are ``records.model_flops``, the report's and ``tscope diff``'s
definition too: recompute and the optimizer update excluded, attention backward as 2x its forward, causal attention
as the pairs attended or (``attention_flops="full"``) the full square, per device.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from tscope_callbacks.analysis.fmt import flops_text, pct_text, ratio_text, time_text
from tscope_callbacks.analysis.report import ReportData
from tscope_callbacks.records import ATTENTION_CONVENTIONS, model_flops

__all__ = ["Throughput", "Window", "ATTENTION_CONVENTIONS", "model_flops", "mfu_bases"]


@dataclass(frozen=True)
class Window:
    """One measured window of training steps."""

    end_step: int  #: the step at the window's end (where its figures are logged)
    time_s: float  #: device (CUDA events) or wall time of the window
    steps: int
    flops: float  #: model FLOPs of its steps
    samples: int = 0  #: samples of its micro-batches (0: not counted)
    tokens: int = 0  #: tokens of its micro-batches (0: not counted)


class Throughput:
    """Rates over finished windows. ``peak_flops``: the roof MFU is against (None: no MFU)."""

    def __init__(self, peak_flops: float | None = None, window_size: int = 10) -> None:
        if window_size < 1:
            raise ValueError(f"window_size must be >= 1, got {window_size}")
        self.peak_flops = peak_flops
        self.windows: deque[Window] = deque(maxlen=window_size)

    def update(self, window: Window) -> None:
        if window.time_s <= 0 or window.steps <= 0:
            return
        self.windows.append(window)

    def reset(self) -> None:
        self.windows.clear()

    def compute(self) -> dict[str, float]:
        """Bare keys: ``achieved_tflops``, ``step_ms``, ``mfu`` (with a peak), ``samples_per_s`` and ``tokens_per_s``
        (when counted), for the last window; ``*_avg`` over the kept windows."""
        if not self.windows:
            return {}
        out: dict[str, float] = {}
        for suffix, ws in (("", [self.windows[-1]]), ("_avg", list(self.windows))):
            t = sum(w.time_s for w in ws)
            fl = sum(w.flops for w in ws)
            out["achieved_tflops" + suffix] = fl / t / 1e12
            out["step_ms" + suffix] = t / sum(w.steps for w in ws) * 1e3
            if self.peak_flops:
                out["mfu" + suffix] = fl / t / self.peak_flops
            samples = sum(w.samples for w in ws)
            if samples:
                out["samples_per_s" + suffix] = samples / t
            tokens = sum(w.tokens for w in ws)
            if tokens:
                out["tokens_per_s" + suffix] = tokens / t
        return out


def mfu_bases(report: ReportData, window: Window, peak_flops: float | None) -> str | None:
    """One line on why the automatic MFU of ``window`` (its steps' model FLOPs over the window's whole time, against
    ``peak_flops``) differs from the profiled step's MFU in ``report`` (its model FLOPs over the median of the
    unprofiled steps around it): the two step times and their bases, and the FLOPs or roofs when they differ too.
    None when either MFU is missing."""
    s = report.summary
    if not peak_flops or s.mfu is None or not s.measured_step_s or window.steps <= 0 or window.time_s <= 0:
        return None
    auto_mfu = window.flops / window.time_s / peak_flops
    t_auto = window.time_s / window.steps
    first = window.end_step - window.steps + 1
    w = report.context.step_time_window
    around = f", steps {w[0]}-{w[1]}" if w else ""
    out = (f"Automatic MFU {pct_text(auto_mfu)} (steps {first}-{window.end_step}: {time_text(t_auto)} a step, the "
           f"window's time over its {window.steps} steps, every step and its logging included) vs MFU "
           f"{pct_text(s.mfu)} of the profiled step {report.step} ({time_text(s.measured_step_s)} a step: "
           f"{s.step_time_basis_text}{around})")
    why = []
    f_auto = window.flops / window.steps
    if s.model_flops and abs(f_auto / s.model_flops - 1) > 0.01:
        why.append(f"model FLOPs per step {flops_text(f_auto)} vs {flops_text(s.model_flops)}")
    if s.mfu_peak_flops and abs(peak_flops / s.mfu_peak_flops - 1) > 1e-3:
        why.append(f"roofs {flops_text(peak_flops)}/s vs {flops_text(s.mfu_peak_flops)}/s")
    took = f"the window's step time is {ratio_text(t_auto / s.measured_step_s)} the profiled step's"
    if not why:
        return out + f": the same model FLOPs per step on the same roof, so the difference is the step time ({took})"
    return out + ": " + "; ".join(why) + f"; {took}"
