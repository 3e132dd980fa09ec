"""When to profile: the schedule shared by :class:`RooflineCallback` and :class:`LayerProfilerCallback`.

Pure logic, no Lightning. Steps are optimizer steps (``trainer.global_step``) for training, batch indices for the
validation/test/predict stages. A step ``s`` is due when ``s >= start_step`` and either ``s % every_n_steps == 0``
or (``profile_first`` and ``s == start_step``), until ``max_profiles`` profiles were taken.

The callbacks keep the next due step as a plain int (:meth:`Schedule.next_due`), so an off-schedule step costs one
integer comparison.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

__all__ = ["Schedule", "STAGES", "NEVER", "normalize_stages"]

#: Stages a callback can profile. ``train`` profiles forward, backward and optimizer step of an optimizer step;
#: the others profile one batch's forward, picked by batch index.
STAGES = ("train", "validation", "test", "predict")
_STAGE_ALIASES = {"fit": "train", "training": "train", "val": "validation", "validate": "validation"}

#: "no further step is due"
NEVER = sys.maxsize


def _check_int(name: str, value: Any, *, minimum: int, allow_none: bool = False, none_means: str = "no limit") -> None:
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, int):
        extra = f" or None ({none_means})" if allow_none else ""
        raise TypeError(f"{name} must be an int >= {minimum}{extra}, got {type(value).__name__} {value!r}")
    if value < minimum:
        extra = f" (or None: {none_means})" if allow_none else ""
        raise ValueError(f"{name} must be >= {minimum}{extra}, got {value!r}")


def normalize_stages(stages: str | Iterable[str]) -> tuple[str, ...]:
    """Validate ``stages`` (a name or an iterable of names from :data:`STAGES`) and return them as a tuple."""
    if isinstance(stages, str):
        stages = (stages,)
    try:
        items = list(stages)
    except TypeError:
        raise TypeError(f"stages must be a stage name or a sequence of them, got {type(stages).__name__}") from None
    out: list[str] = []
    for s in items:
        if not isinstance(s, str):
            raise TypeError(f"stages must contain strings from {STAGES}, got {s!r}")
        name = _STAGE_ALIASES.get(s.lower(), s.lower())
        if name not in STAGES:
            raise ValueError(f"unknown stage {s!r} in stages; accepted: {', '.join(STAGES)}")
        if name not in out:
            out.append(name)
    if not out:
        raise ValueError(f"stages must name at least one of {', '.join(STAGES)}")
    return tuple(out)


@dataclass
class Schedule:
    """Which steps to profile.

    Args:
        every_n_steps: profile every N-th step (steps that are multiples of N); ``None``: only ``start_step``
            (needs ``profile_first=True``).
        start_step: no step before this one is profiled (skips warm-up).
        max_profiles: stop after this many profiles; ``None`` = unlimited.
        profile_first: also profile ``start_step`` itself, even when it is not a multiple of ``every_n_steps``.
    """

    every_n_steps: int | None = 500
    start_step: int = 10
    max_profiles: int | None = None
    profile_first: bool = True
    taken: int = 0  #: profiles taken so far (restored on resume)
    last_step: int = -1  #: the last step profiled or reserved (never profiled twice, also after resume)

    def __post_init__(self) -> None:
        _check_int("every_n_steps", self.every_n_steps, minimum=1, allow_none=True,
                   none_means="profile start_step only")
        _check_int("start_step", self.start_step, minimum=0)
        _check_int("max_profiles", self.max_profiles, minimum=0, allow_none=True)
        if not isinstance(self.profile_first, bool):
            raise TypeError(f"profile_first must be a bool, got {type(self.profile_first).__name__}")
        if self.every_n_steps is None and not self.profile_first:
            raise ValueError("every_n_steps=None profiles only start_step, which needs profile_first=True")

    @property
    def exhausted(self) -> bool:
        return self.max_profiles is not None and self.taken >= self.max_profiles

    def is_due(self, step: int, *, ignore_last: bool = False) -> bool:
        """Whether ``step`` should be profiled (given the profiles taken so far)."""
        return self.next_due(step, ignore_last=ignore_last) == step

    def next_due(self, step: int, *, ignore_last: bool = False) -> int:
        """The first due step ``>= step``, or :data:`NEVER`.

        ``ignore_last``: for stages counted by batch index (restarting at 0 each epoch), a step at or before the
        last profiled one may be due again.
        """
        if self.exhausted:
            return NEVER
        lo = max(step, self.start_step) if ignore_last else max(step, self.start_step, self.last_step + 1)
        if self.profile_first and lo == self.start_step:
            return lo
        n = self.every_n_steps
        if n is None:
            return NEVER
        return lo if lo % n == 0 else lo + (n - lo % n)

    def mark(self, step: int) -> None:
        """Record that ``step`` was profiled."""
        self.taken += 1
        self.last_step = step

    def reserve(self, until: int) -> None:
        """No step before ``until`` is due any more: the last profile spans the steps up to it (a series and the
        unprofiled steps timed after it). Kept across a resume like ``last_step``."""
        self.last_step = max(self.last_step, until - 1)

    def steps(self, max_steps: int) -> list[int]:
        """The steps in ``[0, max_steps)`` a fresh copy of this schedule would profile (for docs and tests)."""
        sched = Schedule(self.every_n_steps, self.start_step, self.max_profiles, self.profile_first)
        out = []
        s = sched.next_due(0)
        while s < max_steps:
            out.append(s)
            sched.mark(s)
            s = sched.next_due(s + 1)
        return out

    def state_dict(self) -> dict[str, int]:
        return {"taken": self.taken, "last_step": self.last_step}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.taken = int(state.get("taken", 0))
        self.last_step = int(state.get("last_step", -1))
