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

from tscope_callbacks.records import ATTENTION_CONVENTIONS, model_flops

__all__ = ["Throughput", "Window", "ATTENTION_CONVENTIONS", "model_flops"]


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
