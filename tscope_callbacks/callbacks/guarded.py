"""The base of every tscope callback: no Lightning hook of it ever raises into the user's fit.

Each Lightning hook a subclass defines (``setup``, ``teardown`` and every ``on_*``) is wrapped when the class is
made: an exception from tscope's own code is reported to the callback's :class:`~tscope_callbacks.capture.faults.
Faults` (one log line per failing part over the fit) and the hook returns, so training goes on unchanged. The parts
a hook knows better report themselves with a finer name (``self.faults.report("the step clock", e)``) and carry on
with the rest of the hook. Exceptions a callback raises on purpose pass through (``_passthrough``: the NaN guard's
``NonFiniteError``), and so does everything under ``raise_errors=True``. Hooks a user's subclass overrides are not
wrapped: an error in the user's own code propagates as it would (the inherited tscope hooks stay guarded).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, ClassVar

from lightning.pytorch.callbacks import Callback

from tscope_callbacks.callbacks.coordinator import Coordinator, coordinator_of
from tscope_callbacks.capture.faults import Faults

__all__ = ["GuardedCallback", "HOOKS"]

#: Lightning's callback hooks (the methods a Trainer calls)
HOOKS = frozenset(n for n in dir(Callback) if n.startswith("on_") or n in ("setup", "teardown"))


def _guard_hook(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def hook(self: GuardedCallback, *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(self, *args, **kwargs)
        except self._passthrough:
            raise
        except Exception as e:
            self.faults.report(f"its {name} hook", e)
            return None

    hook._tscope_guarded = True  # type: ignore[attr-defined]
    return hook


class GuardedCallback(Callback):
    """A Lightning callback whose hooks log tscope's own errors once per part instead of raising (module doc)."""

    #: exceptions raised on purpose, never swallowed
    _passthrough: tuple[type[BaseException], ...] = ()
    raise_errors: bool = False
    #: keyword arguments the callback no longer takes -> what to write instead (``options.moved_arguments``)
    _moved: ClassVar[dict[str, str]] = {}
    #: the coordinator of the trainer this callback last served (``coordinator``)
    _coordinator: Coordinator | None = None

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        # a wrong keyword gets one line saying what to write, before ``__init__`` (and Python's own message) runs
        if kwargs:
            from tscope_callbacks.callbacks.options import moved_arguments

            moved_arguments(cls, kwargs, cls._moved)
        return super().__new__(cls)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if not cls.__module__.startswith("tscope_callbacks."):  # a user's subclass: its own hooks raise as they would
            return
        for name in HOOKS:
            fn = cls.__dict__.get(name)
            if callable(fn) and not getattr(fn, "_tscope_guarded", False):
                setattr(cls, name, _guard_hook(name, fn))

    def coordinator(self, trainer: Any) -> Coordinator:
        """What the tscope callbacks of ``trainer`` share (its running capture, sinks, clocks, the NaN guard): one
        :class:`~tscope_callbacks.callbacks.coordinator.Coordinator` per trainer, found through its callbacks."""
        c = self._coordinator
        if c is None or not c.serves(trainer):
            c = self._coordinator = coordinator_of(trainer)
        return c

    def release_coordinator(self) -> None:
        """At teardown: stop what the trainer's coordinator still runs, forget it (a callback outliving its fit keeps
        no trainer state alive; the next fit finds or makes one again)."""
        c, self._coordinator = self._coordinator, None
        if c is not None:
            c.close()

    @property
    def faults(self) -> Faults:
        """This callback's internal errors, by part (made on first use, with the callback's ``raise_errors``)."""
        f = self.__dict__.get("_faults")
        if f is None:
            f = self.__dict__["_faults"] = Faults(type(self).__name__, raise_errors=bool(self.raise_errors))
        return f
