"""Keep ``torch.compile`` out of tscope's way while tscope's hooks are installed (profiles and NaN replays), and note
which ops a ``torch.compile``'d *function* ran eagerly meanwhile (:class:`CompiledFrames`)."""

from __future__ import annotations

import logging
import sys
import threading
from dataclasses import dataclass, field
from typing import Any

import torch
from torch._C._autograd import _get_sequence_nr

__all__ = ["EagerStance", "CompiledFrames"]

log = logging.getLogger("tscope_callbacks")


def _fn_name(fn: Any) -> str:
    """A compiled callable's name as the user wrote it: a module's class, else the function's qualified name."""
    owner = getattr(fn, "__self__", None)
    if isinstance(owner, torch.nn.Module):
        return type(owner).__name__
    fn = getattr(fn, "__wrapped__", fn)
    return str(getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or type(fn).__name__)


@dataclass(slots=True, eq=False)
class CompiledFrames:
    """The ``torch.compile``'d functions entered while a capture holds Dynamo in ``force_eager``, and the ops they ran.

    Under the capture a compiled function runs eagerly: its ops are recorded one by one, as they would run without
    ``torch.compile``, while the user's real run executes the compiled (fused) code. So the advice must not tell the
    user to fuse or compile them. ``active``: the compiled functions running now, innermost last, each
    ``[wrapper frame, name, first autograd sequence nr, set_eval_frame calls seen]``; ``seqs``: the autograd nodes
    each made ``(first, end, name)`` (their backward ops are the function's too); ``marked``: op index -> name.
    Only the capture's own thread is followed (the dispatch mode that records ops is thread-local too)."""

    thread: int = field(default_factory=threading.get_ident)
    active: list[list[Any]] = field(default_factory=list)
    seqs: list[tuple[int, int, str]] = field(default_factory=list)
    marked: dict[int, str] = field(default_factory=dict)

    def entered(self, frame: Any) -> None:
        """A compile wrapper asked for its callback (``frame``: the wrapper's frame, its ``fn`` the user's)."""
        if threading.get_ident() != self.thread:
            return
        name = _fn_name(frame.f_locals.get("fn"))
        self.active.append([frame, name, _get_sequence_nr(), 0])

    def set_frame(self, frame: Any) -> None:
        """The wrapper set its eval-frame callback: the first time on entry (before ``fn`` runs), the second on exit."""
        a = self.active
        if not a or a[-1][0] is not frame:
            return
        top = a[-1]
        top[3] += 1
        if top[3] >= 2:
            a.pop()
            end = _get_sequence_nr()
            if end > top[2]:
                self.seqs.append((top[2], end, top[1]))

    def mark(self, i: int, node: Any) -> None:
        """Op ``i`` (a pending index): the innermost active compiled function's, or, in a backward, the function's
        that made its autograd node."""
        a = self.active
        if a:
            self.marked[i] = a[-1][1]
            return
        if node is not None and self.seqs:
            try:
                s = node._sequence_nr()
            except Exception:
                return
            for lo, hi, name in self.seqs:
                if lo <= s < hi:
                    self.marked[i] = name
                    return

    def ranges(self) -> dict[str, list[list[int]]] | None:
        """name -> ``[[first, last], ...]`` runs of consecutive op indices the function ran; None when none."""
        out: dict[str, list[list[int]]] = {}
        for i in sorted(self.marked):
            runs = out.setdefault(self.marked[i], [])
            if runs and runs[-1][1] == i - 1:
                runs[-1][1] = i
            else:
                runs.append([i, i])
        return out or None


class _Hooks:
    """Dynamo's eval-frame entry points wrapped to tell a :class:`CompiledFrames` which compiled function runs (the
    compile wrapper calls ``_callback_from_stance`` once on entry, ``_maybe_set_eval_frame`` on entry and exit)."""

    def __init__(self, frames: CompiledFrames) -> None:
        import torch._dynamo.eval_frame as ef

        self.ef = ef
        self.frames = frames
        self.orig_stance = ef._callback_from_stance
        self.orig_set = ef._maybe_set_eval_frame
        orig_stance, orig_set = self.orig_stance, self.orig_set

        def callback_from_stance(callback: Any) -> Any:
            if callback not in (False, None):
                try:
                    f = sys._getframe(1)
                    if f.f_code.co_name == "compile_wrapper":
                        frames.entered(f)
                except Exception as e:  # never in the user's way
                    log.debug("tscope: compiled-function tracking: %s", e)
            return orig_stance(callback)

        def maybe_set_eval_frame(callback: Any) -> Any:
            if frames.active:
                try:
                    frames.set_frame(sys._getframe(1))
                except Exception as e:
                    log.debug("tscope: compiled-function tracking: %s", e)
            return orig_set(callback)

        self.stance_fn, self.set_fn = callback_from_stance, maybe_set_eval_frame
        ef._callback_from_stance = callback_from_stance
        ef._maybe_set_eval_frame = maybe_set_eval_frame

    def remove(self) -> None:
        ef = self.ef
        if ef._callback_from_stance is self.stance_fn:
            ef._callback_from_stance = self.orig_stance
        if ef._maybe_set_eval_frame is self.set_fn:
            ef._maybe_set_eval_frame = self.orig_set


class EagerStance:
    """Hold Dynamo in its ``force_eager`` stance while tscope's hooks are installed: nothing is compiled, so none of
    tscope's own code (module/tensor hooks, finite checks run with the dispatch mode popped) is ever traced into a
    user's compiled graph, and the graphs compiled before the region are reused unchanged after it (no recompiles,
    no graph breaks). ``enter()``/``exit()`` are idempotent and never raise (a Dynamo-less torch: no-op).

    ``enter(frames)``: also note in ``frames`` the ops that ``torch.compile``'d functions run eagerly meanwhile."""

    def __init__(self) -> None:
        self._ctx: Any = None
        self._hooks: _Hooks | None = None

    def enter(self, frames: CompiledFrames | None = None) -> None:
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
        if self._ctx is not None and frames is not None and set_stance is not None:
            try:
                self._hooks = _Hooks(frames)
            except Exception as e:  # another torch's internals: compiled functions go unmarked
                log.debug("tscope: cannot follow compiled functions run eagerly: %s", e)

    def exit(self) -> None:
        hooks, self._hooks = self._hooks, None
        if hooks is not None:
            hooks.remove()
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
