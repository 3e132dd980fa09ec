"""Whether a step fits its device's memory, and what to change when it does not.

From the step's memory by category (``capture.step_memory``: weights, gradients, optimizer state, saved
activations, the step's peak) and the device's memory (``DeviceSpec.memory_bytes``: the datasheet, or a real GPU's
own total). The step peak is an estimate of tensor bytes: the CUDA caching allocator reserves more (fragmentation,
cached blocks), so a step within 90% of the device is flagged as tight.
"""

from __future__ import annotations

import math
from typing import Any

__all__ = ["memory_fit", "report_capacity", "verdict", "TIGHT"]

TIGHT = 0.9  #: a peak above this share of the device leaves the allocator little room


def verdict(peak: int, capacity: int) -> str:
    """"fits" (within ``TIGHT`` of the device), "tight" (within the device) or "does not fit"."""
    return "fits" if peak <= TIGHT * capacity else "tight" if peak <= capacity else "does not fit"


def report_capacity(memory_bytes: int | None, what_if: str | None = None) -> int | None:
    """The memory a report's step is checked against: its device's (``memory_bytes``, the roofs' device's); None for
    a what-if (``what_if``, the device the step ran on, when it is another than the roofs')."""
    return None if what_if else memory_bytes


def memory_fit(mc: dict[str, Any] | None, capacity: int | None) -> dict[str, Any] | None:
    """``{"peak", "capacity", "share", "verdict" ("fits", "tight", "does not fit"), "states", "rest",
    "shard_over"}``; None without a step peak. ``states`` = weights + gradients + optimizer state (what FSDP /
    ZeRO-3 divides by the number of GPUs); ``rest`` = the step's tracked peak (activations, temporaries and the
    gradients the step creates: what sharding leaves, at most; checkpointing and a smaller micro-batch reduce it);
    ``shard_over``: the fewest GPUs whose shards of the states fit beside the rest within ``TIGHT`` of the device
    (None when the rest alone does not)."""
    if not mc or not mc.get("step_peak"):
        return None
    peak = int(mc["step_peak"])
    states = int((mc.get("params") or 0) + (mc.get("grads") or mc.get("params") or 0)
                 + (mc.get("optimizer_state") or 0))
    rest = int(mc.get("step_tracked_peak") or 0)
    out: dict[str, Any] = {"peak": peak, "capacity": capacity, "share": None, "verdict": None, "states": states,
                           "rest": rest, "shard_over": None}
    if not capacity:
        return out
    out["share"] = peak / capacity
    out["verdict"] = verdict(peak, capacity)
    room = TIGHT * capacity - out["rest"]
    if out["verdict"] != "fits" and room > 0 and states:
        out["shard_over"] = max(2, math.ceil(states / room))
    return out
