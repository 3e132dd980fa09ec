"""Each module's forward host time over one step: what a layer costs on the host, Python included.

Op records time the ops; a layer can also be slow between its ops (Python work, a host sync, a ``time.sleep``, a
data-dependent branch). :class:`ModuleClock` puts a forward pre-hook and a forward hook on every module for one
step and keeps, per module path, its inclusive time (pre-hook to hook, every call summed) and its self time
(inclusive minus its child modules' inclusive time). On a GPU these are launch times, not kernel times.

No hook goes inside a compiled module: Dynamo traces the hooks of the modules it inlines (``time.perf_counter`` is a
graph break) and guards on them (adding or removing one recompiles), so profiling would change the user's compiled
graphs. A ``torch.compile(module)`` wrapper is timed as one layer (its hooks run outside the compiled frame, under
its clean path: the user's name), nothing below it; a module compiled in place (``module.compile()``, or Lightning's
``_compiler_ctx``) and its submodules get no hook. A module called from a compiled function that is not found here
(``torch.compile(fn)``) has its hooks traced as no-ops (``torch.compiler.is_compiling()``): no graph break.
"""

from __future__ import annotations

from typing import Any

import torch

from tscope_callbacks.capture.compiled import is_compiled_wrapper
from tscope_callbacks.capture.paths import clean_path
from tscope_callbacks.hostclock import host_time

__all__ = ["ModuleClock", "timed_modules"]

_is_compiling = torch.compiler.is_compiling


def _compiled_in_place(mod: torch.nn.Module) -> bool:
    """``module.compile()`` (its ``_call_impl``, hooks included, runs compiled) or Lightning's in-place compile."""
    return getattr(mod, "_compiled_call_impl", None) is not None or isinstance(getattr(mod, "_compiler_ctx", None),
                                                                               dict)


def timed_modules(model: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    """``(clean path, module)`` of the modules whose hooks run outside any compiled frame, in ``named_modules``
    order: a compile wrapper but not the module it wraps, no module compiled in place, nothing below either."""
    out: list[tuple[str, torch.nn.Module]] = []
    seen: set[int] = set()
    stack: list[tuple[str, torch.nn.Module]] = [("", model)]
    while stack:
        path, mod = stack.pop()
        if id(mod) in seen:
            continue
        seen.add(id(mod))
        if _compiled_in_place(mod):
            continue
        out.append((clean_path(path), mod))
        if is_compiled_wrapper(mod):
            continue  # the compiled graph: hooks below would be traced
        pre = f"{path}." if path else ""
        stack.extend(reversed([(pre + name, m) for name, m in mod._modules.items() if m is not None]))
    return out


class ModuleClock:
    """``start()`` installs the hooks, ``stop()`` removes them and returns ``{path: self seconds}``."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self._handles: list[Any] = []
        self._stack: list[list[float]] = []  #: per running module: [start, children's inclusive time]
        self.inclusive: dict[str, float] = {}
        self.self_s: dict[str, float] = {}

    def start(self) -> None:
        for path, mod in timed_modules(self.model):
            self._handles.append(mod.register_forward_pre_hook(self._pre))
            self._handles.append(mod.register_forward_hook(self._post(path)))

    def _pre(self, *_: Any) -> None:
        if _is_compiling():
            return  # traced inside a compiled function: a no-op there, no graph break
        self._stack.append([host_time(), 0.0])

    def _post(self, path: str) -> Any:
        def hook(*_: Any) -> None:
            if _is_compiling() or not self._stack:
                return
            t0, children = self._stack.pop()
            inc = host_time() - t0
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
