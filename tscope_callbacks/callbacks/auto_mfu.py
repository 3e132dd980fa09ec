"""The automatic MFU between profiles (``RooflineCallback(mfu=MFUOptions(automatic=True))``): the model FLOPs of each
batch shape, learnt from the profiles, summed over the optimizer steps of a logging window and divided by the window's time
(:class:`~tscope_callbacks.callbacks.clock.WindowTimer`: CUDA events read one window late, wall clock on CPU).
:class:`AutoMFU` owns that state; it writes nowhere: :meth:`AutoMFU.windows` returns the scalars of the finished windows
(bare keys) and the callback logs them."""

from __future__ import annotations

from collections.abc import Hashable

from lightning.pytorch.utilities import rank_zero_warn

from tscope_callbacks.analysis.throughput import Throughput, Window
from tscope_callbacks.callbacks.clock import WindowTimer

__all__ = ["AutoMFU", "MAX_SIGNATURES", "WINDOW_KEYS"]

#: distinct batch-shape signatures whose FLOPs are kept (each new one costs a recount: one more profiled step)
MAX_SIGNATURES = 8
#: the bare keys a window logs (``tscope/roofline/<key>``)
WINDOW_KEYS = ("achieved_tflops", "mfu", "step_ms", "samples_per_s", "tokens_per_s")


class AutoMFU:
    """Model FLOPs per batch signature, the running window and the rates over finished windows."""

    def __init__(self, max_signatures: int = MAX_SIGNATURES) -> None:
        self.max_signatures = max_signatures
        self.flops: dict[Hashable, int] = {}  #: model FLOPs of one optimizer step, per batch signature
        self.timer: WindowTimer | None = None  #: None: off (no timer yet, or it failed)
        self.throughput = Throughput()
        self.last_mfu: float | None = None
        self._shape_warned = False

    def start(self, cuda: bool) -> WindowTimer:
        """A fresh window timer (at ``setup``)."""
        self.timer = WindowTimer(cuda)
        return self.timer

    def learn(self, signature: Hashable, flops: int, peak_flops: float | None) -> None:
        """A profiled training step of ``signature`` counted ``flops`` model FLOPs; ``peak_flops``: the roof the
        profile's MFU is against (the windows' MFU uses the same one)."""
        if signature and (signature in self.flops or len(self.flops) < self.max_signatures):
            self.flops[signature] = flops
        if peak_flops:
            self.throughput.peak_flops = float(peak_flops)

    def count_micro_batch(self, samples: int, tokens: int) -> None:
        if self.timer is not None:
            self.timer.add_samples(samples, tokens)

    def count_step(self, signature: Hashable) -> bool:
        """One optimizer step of ``signature`` in the running window. True when its FLOPs are unknown and a
        profile should count them (the window is then unusable); more than ``max_signatures`` shapes are said
        once."""
        if self.timer is None:
            return False
        flops = self.flops.get(signature)
        if flops is not None:
            self.timer.add(flops)
            return False
        self.timer.mark_dirty()
        if len(self.flops) < self.max_signatures:
            return True
        if not self._shape_warned:
            self._shape_warned = True
            rank_zero_warn(f"tscope RooflineCallback: more than {self.max_signatures} batch shapes; the automatic MFU "
                           "skips windows with a shape that was never profiled")
        return False

    @property
    def running(self) -> bool:
        """A window is open (steps are being counted into it)."""
        return self.timer is not None and self.timer.current is not None

    def windows(self, step: int, *, final: bool = False) -> list[tuple[int, dict[str, float]]]:
        """At a logging step: close the running window and start the next; the finished windows as (their last
        step, bare scalars). ``final`` (end of training): close the last window and wait for the device."""
        timer = self.timer
        if timer is None:
            return []
        if not final or (timer.current is not None and timer.current.steps):
            timer.boundary(step)
        out = []
        for w, seconds in timer.ready(wait=final):
            self.throughput.update(Window(w.end_step - 1, seconds, w.steps, w.flops, w.samples, w.tokens))
            vals = self.throughput.compute()
            self.last_mfu = vals.get("mfu", self.last_mfu)
            out.append((w.end_step - 1, {k: vals[k] for k in WINDOW_KEYS if k in vals}))
        return out
