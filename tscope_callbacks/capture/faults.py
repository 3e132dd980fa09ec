"""tscope's own errors never reach the user's training: each is reported here, logged once per failing part.

A ``Faults`` belongs to one owner: a callback over its whole fit, or a bare ``ts.profile``. Code that runs inside the
user's step (module and tensor hooks, the dispatch mode, optimizer hooks, Lightning hooks) catches its exceptions and
calls :meth:`Faults.report` with the part that failed: the first error of a part is one log line on the
``tscope_callbacks`` logger, later ones of the same part are only counted (``counts``). With ``raise_errors`` the
exception propagates instead (tests, debugging).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["Faults"]

log = logging.getLogger("tscope_callbacks")
F = TypeVar("F", bound=Callable[..., Any])


class Faults:
    """The internal errors of one owner, by part."""

    def __init__(self, owner: str, *, raise_errors: bool = False) -> None:
        self.owner = owner
        self.raise_errors = raise_errors
        self.counts: dict[str, int] = {}  #: part -> errors seen
        self.first: dict[str, str] = {}  #: part -> "Type: message" of its first error

    def report(self, part: str, e: BaseException) -> None:
        """Log ``e`` if it is ``part``'s first error (else count it); re-raise it under ``raise_errors``."""
        if self.raise_errors:
            raise e
        n = self.counts.get(part, 0)
        self.counts[part] = n + 1
        if n == 0:
            self.first[part] = f"{type(e).__name__}: {e}"
            log.warning("tscope %s: internal error in %s (training continues unchanged; further errors there are not "
                        "logged): %s", self.owner, part, self.first[part])

    def guard(self, part: str, fn: F, default: Any = None) -> F:
        """``fn`` wrapped: an exception is reported as ``part``'s and ``default`` returned instead."""

        @functools.wraps(fn)
        def guarded(*args: Any, **kwargs: Any) -> Any:
            try:
                return fn(*args, **kwargs)
            except Exception as e:
                self.report(part, e)
                return default

        return guarded  # type: ignore[return-value]
