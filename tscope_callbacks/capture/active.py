"""The one capture that may run at a time (a full ``Profile`` or a ``ReplayProfile``), and :func:`paused`."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

__all__ = ["NestedProfileError", "active_profile", "paused", "claim", "release"]

_ACTIVE: Any = None
_LOCK = threading.Lock()


class NestedProfileError(RuntimeError):
    """Raised when a profile is started while another one is running."""


def active_profile() -> Any:
    """The profile currently capturing, if any."""
    return _ACTIVE


def claim(p: Any) -> None:
    """Make ``p`` the running capture; NestedProfileError when one already runs."""
    global _ACTIVE
    with _LOCK:
        if _ACTIVE is not None:
            raise NestedProfileError(
                "a tscope profile is already running; nested profile() calls are not supported "
                "(stop the outer one first, or profile the outer region only)"
            )
        _ACTIVE = p


def release(p: Any) -> None:
    global _ACTIVE
    with _LOCK:
        if _ACTIVE is p:
            _ACTIVE = None


_NOTHING_TO_PAUSE = contextlib.nullcontext()


def paused() -> contextlib.AbstractContextManager[None]:
    """Run tscope's own work (finite checks, the NaN guard's check and replay) inside a profiled region without
    recording it: ops run untouched and no module is tracked. A no-op when nothing is being profiled (a shared null
    context: the NaN guard enters this on every step)."""
    p = _ACTIVE
    return _NOTHING_TO_PAUSE if p is None else _paused(p)


@contextlib.contextmanager
def _paused(p: Any) -> Iterator[None]:
    p.pause()
    try:
        yield
    finally:
        p.resume()
