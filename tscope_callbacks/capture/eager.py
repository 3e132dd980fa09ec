"""Keep ``torch.compile`` out of tscope's way while tscope's hooks are installed (profiles and NaN replays)."""

from __future__ import annotations

import logging
from typing import Any

import torch

__all__ = ["EagerStance"]

log = logging.getLogger("tscope_callbacks")


class EagerStance:
    """Hold Dynamo in its ``force_eager`` stance while tscope's hooks are installed: nothing is compiled, so none of
    tscope's own code (module/tensor hooks, finite checks run with the dispatch mode popped) is ever traced into a
    user's compiled graph, and the graphs compiled before the region are reused unchanged after it (no recompiles,
    no graph breaks). ``enter()``/``exit()`` are idempotent and never raise (a Dynamo-less torch: no-op)."""

    def __init__(self) -> None:
        self._ctx: Any = None

    def enter(self) -> None:
        if self._ctx is not None:
            return
        set_stance = getattr(getattr(torch, "compiler", None), "set_stance", None)
        try:
            if set_stance is not None:
                self._ctx = set_stance("force_eager")  # takes effect on construction
            else:  # torch < 2.6: the global Dynamo switch
                import torch._dynamo.config as dcfg

                self._ctx = dcfg.patch(disable=True)
                self._ctx.__enter__()
        except Exception as e:  # e.g. called from inside a compiled region: nothing we can change there
            log.debug("tscope: could not hold torch.compile in eager mode: %s", e)
            self._ctx = None

    def exit(self) -> None:
        ctx, self._ctx = self._ctx, None
        if ctx is not None:
            try:
                ctx.__exit__(None, None, None)
            except Exception as e:
                log.debug("tscope: could not restore the torch.compile stance: %s", e)

    def __enter__(self) -> EagerStance:
        self.enter()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.exit()
