"""The user's random streams are theirs: tscope code that draws random numbers runs inside ``preserved_rng()``.

A measurement of a roof (random matrices), the random inputs of ``analyze_model`` and a real step it runs (dropout)
would otherwise advance the global generators, so a seeded fit would shuffle and drop out differently with the
callbacks than without them. ``preserved_rng`` saves torch's CPU generator, the CUDA generators, Python's ``random``
and numpy's global state, and puts them back on exit, whatever happened inside.

CUDA is never initialised to save its state (that would make a context on a CPU fit's GPU). A block that initialises
it leaves each device's generator as lazy initialisation made it: its initial seed (the user's queued
``torch.manual_seed``, or torch's default) at offset 0, the state the user's first CUDA draw would have seen.
"""

from __future__ import annotations

import functools
import random
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import torch

__all__ = ["RngState", "preserved_rng", "rng_preserving"]

F = TypeVar("F", bound=Callable[..., Any])
_CPU_GENERATOR = torch.default_generator  #: what torch.get_rng_state() reads
_CUDA_BUILT = torch.cuda._is_compiled()  #: a CPU-only torch never initialises CUDA


class RngState:
    """A snapshot of every global random stream a training step may draw from. ``host=False``: torch's generators
    only (about 1 us; Python's and numpy's states cost 10 and 35 us to copy), for a per-step snapshot."""

    __slots__ = ("cpu", "cuda", "numpy", "python")

    def __init__(self, *, host: bool = True) -> None:
        self.cpu = torch.get_rng_state()
        self.cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None
        self.python = random.getstate() if host else None
        np_mod = sys.modules.get("numpy") if host else None  # never imported for this
        self.numpy = np_mod.random.get_state() if np_mod is not None else None

    @classmethod
    def torch_only(cls) -> RngState:
        """``RngState(host=False)`` without the keyword handling: the NaN guard takes one before every checked step
        (torch's CPU generator state, a 5 KB copy, and the CUDA generators' when CUDA is initialised)."""
        s = object.__new__(cls)
        s.cpu = _CPU_GENERATOR.get_state()  # torch.get_rng_state()
        s.cuda = torch.cuda.get_rng_state_all() if _CUDA_BUILT and torch.cuda.is_initialized() else None
        s.python = s.numpy = None
        return s

    def restore(self) -> None:
        torch.set_rng_state(self.cpu)
        if self.cuda is not None:
            torch.cuda.set_rng_state_all(self.cuda)
        elif torch.cuda.is_initialized():  # initialised inside the block: back to the state lazy init made
            for gen in torch.cuda.default_generators:
                gen.manual_seed(gen.initial_seed())
        if self.python is not None:
            random.setstate(self.python)
        if self.numpy is not None:
            sys.modules["numpy"].random.set_state(self.numpy)


@contextmanager
def preserved_rng() -> Iterator[RngState]:
    """Run a block without leaving a trace in the global random streams."""
    state = RngState()
    try:
        yield state
    finally:
        state.restore()


def rng_preserving(func: F) -> F:
    """Decorator: ``func`` runs inside ``preserved_rng()``."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with preserved_rng():
            return func(*args, **kwargs)

    return wrapper  # type: ignore[return-value]
