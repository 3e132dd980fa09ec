"""Module-path rules, each defined once: clean paths (no ``torch.compile`` wrapper segment), ancestors, and the
``paths=``/``depth=`` selection that decides which layer an op is reported under."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from fnmatch import fnmatchcase

import torch

__all__ = ["clean_path", "named_parameters", "owner", "ancestors", "Selection", "ModelTree"]

_WRAPPER = "_orig_mod"  #: the attribute under which ``torch.compile``'s OptimizedModule keeps the user's module


def clean_path(path: str) -> str:
    """Module or parameter path without ``torch.compile``'s ``_orig_mod`` segment (the user's own names)."""
    if _WRAPPER not in path:
        return path
    return ".".join(p for p in path.split(".") if p != _WRAPPER)


def named_parameters(model: torch.nn.Module) -> list[tuple[str, torch.nn.Parameter]]:
    """``model.named_parameters()`` with clean paths."""
    return [(clean_path(n), p) for n, p in model.named_parameters()]


_Module = torch.nn.Module


class ModelTree:
    """One walk of a model, shared by everything a capture does with its structure (install, layer records, memory
    categories): the modules in ``named_modules()`` order, each once, and the parameters, each once.

    ``named_modules``/``named_parameters`` build a chain of generators per level (a profile's start and stop walked
    GPT-2's tree 6 times: ~1 ms a step); this is one stack walk over ``_modules`` and ``_parameters``. A module class
    that overrides ``named_modules`` or ``named_parameters`` gets torch's own walk."""

    __slots__ = ("modules", "parameters")

    def __init__(self, model: torch.nn.Module) -> None:
        #: (path as ``named_modules()`` gives it, module)
        self.modules: list[tuple[str, torch.nn.Module]] = []
        #: (path as ``named_parameters()`` gives it, parameter)
        self.parameters: list[tuple[str, torch.nn.Parameter]] = []
        if not self._walk(model):
            self.modules = list(model.named_modules())
            self.parameters = list(model.named_parameters())

    def _walk(self, model: torch.nn.Module) -> bool:
        base_nm, base_np = _Module.named_modules, _Module.named_parameters
        checked: set[type] = set()
        seen: set[int] = set()
        seen_p: set[int] = set()
        mods, prms = self.modules, self.parameters
        stack: list[tuple[str, torch.nn.Module]] = [("", model)]
        while stack:
            path, mod = stack.pop()
            if id(mod) in seen:
                continue
            t = type(mod)
            if t not in checked:
                if t.named_modules is not base_nm or t.named_parameters is not base_np:
                    return False
                checked.add(t)
            seen.add(id(mod))
            mods.append((path, mod))
            pre = f"{path}." if path else ""
            for name, prm in mod._parameters.items():
                if prm is not None and id(prm) not in seen_p:
                    seen_p.add(id(prm))
                    prms.append((pre + name, prm))
            children = [(pre + name, m) for name, m in mod._modules.items() if m is not None]
            stack.extend(reversed(children))
        return True

    def clean_modules(self) -> list[tuple[str, torch.nn.Module]]:
        """``(clean path, module)`` for every module once; a compile wrapper and the module it wraps share a path,
        which names the wrapped (the user's) module."""
        seen: dict[str, torch.nn.Module] = {}
        for path, mod in self.modules:
            key = clean_path(path)
            if key not in seen or type(seen[key]).__name__ == "OptimizedModule":
                seen[key] = mod
        return list(seen.items())

    def buffers(self) -> list[torch.Tensor]:
        """The modules' buffers, each once (``model.buffers()`` without its generator walk; a module class that
        overrides ``named_buffers`` gets torch's own)."""
        seen: set[int] = set()
        out = []
        base = _Module.named_buffers
        if any(type(m).named_buffers is not base for _, m in self.modules):
            return list(self.modules[0][1].buffers()) if self.modules else []
        for _, mod in self.modules:
            for b in mod._buffers.values():
                if b is not None and id(b) not in seen:
                    seen.add(id(b))
                    out.append(b)
        return out

    def device(self) -> torch.device:
        """The device of the first parameter (CPU for a model without parameters)."""
        return self.parameters[0][1].device if self.parameters else torch.device("cpu")


def owner(name: str) -> str:
    """The module owning a parameter: its name without the last part ("" for the root's own)."""
    return name.rpartition(".")[0]


def ancestors(path: str) -> list[str]:
    """``"a.b.c"`` -> ``["a.b.c", "a.b", "a", ""]``; ``""`` -> ``[""]``."""
    out = [path]
    while path:
        path = path.rpartition(".")[0]
        out.append(path)
    return out


class Selection:
    """Which module paths are reported as layers: at most ``depth`` path segments deep, and (when ``paths`` is given)
    matching one of ``paths`` (exact paths or fnmatch globs). The root ``""`` is always a layer. Every other module's
    ops are reported under its nearest selected ancestor (:meth:`collapse`)."""

    def __init__(self, paths: str | Sequence[str] | None = None, depth: int | None = None) -> None:
        if isinstance(paths, str):
            paths = [paths]
        if depth is not None and (isinstance(depth, bool) or not isinstance(depth, int) or depth < 0):
            raise ValueError(f"depth must be None or an int >= 0 (path segments), got {depth!r}")
        if paths is not None:
            paths = list(paths)
            if not paths or not all(isinstance(p, str) for p in paths):
                raise TypeError(f"paths must be None, a module path/glob or a non-empty list of them, got {paths!r}")
        self.paths: list[str] | None = paths
        self.depth = depth
        self._cache: dict[str, str] = {}

    @property
    def everything(self) -> bool:
        """True when every module is a layer (no ``paths``, no ``depth``)."""
        return self.paths is None and self.depth is None

    def collapse(self, path: str) -> str:
        """The layer ``path``'s ops are reported under: itself when selected, else its nearest selected ancestor."""
        if self.everything:
            return path
        hit = self._cache.get(path)
        if hit is not None:
            return hit
        p = path
        if self.depth is not None and p:
            p = ".".join(p.split(".")[: self.depth])
        if self.paths is not None:
            while p and not any(p == pat or fnmatchcase(p, pat) for pat in self.paths):
                p = p.rpartition(".")[0]
        self._cache[path] = p
        return p

    def selected(self, path: str) -> bool:
        return self.collapse(path) == path

    def filter(self, paths: Iterable[str]) -> list[str]:
        return [p for p in paths if self.selected(p)]

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Selection) and (self.paths, self.depth) == (other.paths, other.depth)

    def __hash__(self) -> int:
        return hash((tuple(self.paths) if self.paths is not None else None, self.depth))

    def __repr__(self) -> str:
        return f"Selection(paths={self.paths!r}, depth={self.depth!r})"
