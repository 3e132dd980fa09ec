"""Keep ``ts.roofline(...)`` / ``ts.calibrate(...)`` working once their submodules are imported.

``tscope_callbacks`` exports the functions ``roofline`` and ``calibrate`` lazily, but their modules have the same
names: as soon as anything imports ``tscope_callbacks.roofline`` (the callbacks do), Python binds the package
attribute ``tscope_callbacks.roofline`` to the *module*, and ``ts.roofline(prof, spec)`` would fail with "'module'
object is not callable". Such a module is made callable: calling it calls the function of the same name (looked up
at call time, so monkeypatching the function still works).
"""

from __future__ import annotations

import sys
import types
from typing import Any

__all__ = ["make_module_callable"]


class _CallableModule(types.ModuleType):
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return getattr(self, self.__name__.rpartition(".")[2])(*args, **kwargs)


def make_module_callable(module_name: str) -> None:
    """Make ``sys.modules[module_name]`` callable as its function named like the module's last path segment."""
    sys.modules[module_name].__class__ = _CallableModule
