"""Each module's forward host time over one step: what a layer costs on the host, Python included.

Op records time the ops; a layer can also be slow between its ops (Python work, a host sync, a ``time.sleep``, a
data-dependent branch). :class:`ModuleClock` puts a forward pre-hook and a forward hook on every module for one
step and keeps, per module path, its inclusive time (pre-hook to hook, every call summed) and its self time
(inclusive minus its child modules' inclusive time). On a GPU these are launch times, not kernel times.
"""

from __future__ import annotations

import time
from typing import Any

import torch

__all__ = ["ModuleClock"]


class ModuleClock:
    """``start()`` installs the hooks, ``stop()`` removes them and returns ``{path: self seconds}``."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self._handles: list[Any] = []
        self._stack: list[list[float]] = []  #: per running module: [start, children's inclusive time]
        self.inclusive: dict[str, float] = {}
        self.self_s: dict[str, float] = {}

    def start(self) -> None:
        for path, mod in self.model.named_modules():
            self._handles.append(mod.register_forward_pre_hook(self._pre))
            self._handles.append(mod.register_forward_hook(self._post(path)))

    def _pre(self, *_: Any) -> None:
        self._stack.append([time.perf_counter(), 0.0])

    def _post(self, path: str) -> Any:
        def hook(*_: Any) -> None:
            if not self._stack:
                return
            t0, children = self._stack.pop()
            inc = time.perf_counter() - t0
            self.inclusive[path] = self.inclusive.get(path, 0.0) + inc
            self.self_s[path] = self.self_s.get(path, 0.0) + inc - children
            if self._stack:
                self._stack[-1][1] += inc

        return hook

    def stop(self) -> dict[str, float]:
        for h in self._handles:
            h.remove()
        self._handles.clear()
        self._stack.clear()
        return dict(self.self_s)
