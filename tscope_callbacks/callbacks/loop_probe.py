"""A Lightning training step's parts, measured where they happen (``analysis.step_parts`` says what each part is).

Lightning marks every piece of its loop for its own profilers: the data fetcher's ``next`` (``train_dataloader_next``),
each callback hook (``[Callback]<state key>.<hook>``), each LightningModule and strategy hook (``training_step``,
``backward``, ``batch_to_device``, ``optimizer_step``...), ``save_checkpoint`` -- by calling ``trainer.profiler.start``
and ``stop`` with the action's name, whatever profiler the user chose (``PassThroughProfiler`` by default). The
:class:`LoopProbe` puts its own ``start``/``stop`` on that profiler object (instance attributes, which call the
profiler's own first), so it sees the same actions at the same points as Lightning's ``SimpleProfiler``, and keeps
each step's exclusive time per part: a hook called inside ``training_step`` counts as the hook, not the forward.
Where Lightning marks nothing it wraps the method itself, on the trainer's own objects: the logger connector's
per-step metric work and each logger's ``log_metrics`` and ``save`` (logging), Lightning's per-step SIGTERM broadcast
under DDP (sync), and, under DDP, a hook on the parameter whose gradient is accumulated last, so the wait from it to
backward's end (the reducer waiting for the gradient all-reduce, that is for the other ranks) is sync, not backward.

A step runs from the start of its first fetch to the start of the next step's (or of Lightning's SIGTERM broadcast
before it): everything the loop does after a batch's end hooks (logging, checkpoints, validation) is that step's.
:meth:`LoopProbe.remove` restores every attribute it set and removes every hook; it runs at teardown and at any
exception (``StepMonitor.on_exception``), and a second install first removes the first.

Times are the host clock's (``hostclock.host_time``); the wait for a CPU is ``hostclock.cpu_wait`` (the thread's
run-queue wait, read at each step's start). Cost: two clock reads and a dict lookup per marked action (tens a step),
one ``pread`` of the thread's schedstat per step; measured at install (:attr:`LoopProbe.call_cost_s`) and counted
in the ``tscope`` part.

**On a GPU a host part costs the step only where the device idled during it.** The host runs ahead of the device:
its time in Lightning's metric bookkeeping may be the host blocked in a device sync (a logged value read back with
``.item()``) while the device still runs the step's kernels, or host work hidden behind them. So on CUDA the probe
also cuts the step into **device segments**: a CUDA event at the step's start, at the edges of the parts that queue
device work (transfer, forward, backward, optimizer) and wherever at least :data:`SEGMENT_S` of host time passed
since the last event; each segment's host time is kept per part. A segment's device time (the elapsed time between
its two events, read once the later one completed: ``query()``, never waiting) is the device's time while the host
ran it: its idle, waiting for the host, plus what the segment itself queued (for the loop's parts: little or
nothing). It is shared among the segment's parts by their host time in it (a segment holds one long piece and at
most :data:`SEGMENT_S` of short ones); where a short hook shares a segment with a part that queues device work, the
hook gets at most its own host time (it queued nothing) and the device work the rest. :func:`read_segments` gives each part's and each named
item's device seconds. Cost: one event record per segment (about a dozen a step) and one ``elapsed_time`` each.
:func:`progress_bar_reads` names the logged values Lightning reads back to the host every step (``self.log(...,
prog_bar=True)`` on a device tensor: ``.item()`` in its metric bookkeeping, with or without a progress bar): a
device sync in the loop.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterable
from typing import Any

import torch

from tscope_callbacks.analysis.step_parts import PARTS, StepTimes
from tscope_callbacks.hostclock import cpu_wait, host_time

__all__ = ["LoopProbe", "GradTail", "classify", "read_segments", "progress_bar_reads", "SEGMENT_S"]

log = logging.getLogger("tscope_callbacks")

_P = {p: i for i, p in enumerate(PARTS)}
FETCH, TRANSFER, FORWARD, BACKWARD, OPTIMIZER = (_P[p] for p in ("fetch", "transfer", "forward", "backward", "optimizer"))
SYNC, HOOKS, LOGGING, CHECKPOINT, TSCOPE, OTHER = (_P[p] for p in ("sync", "hooks", "logging", "checkpoint", "tscope",
                                                                   "other"))
_TRANSFER_HOOKS = {"on_before_batch_transfer", "transfer_batch_to_device", "on_after_batch_transfer"}
_OPTIMIZER_HOOKS = {"optimizer_step", "optimizer_zero_grad", "configure_gradient_clipping", "clip_gradients"}
_NAMED = {HOOKS, LOGGING, CHECKPOINT, TSCOPE}  #: parts whose items are kept by name (the loop's, tscope's)

#: (part index, name, starts a step) of an action; None: not a part (its time stays in the part around it)
Kind = tuple[int, str, bool]
#: CUDA: a host stretch this long since the last event gets an event of its own at the next mark (a shorter piece
#: shares its segment and can hide at most its own host time of device idle)
SEGMENT_S = 50e-6
#: the parts that queue device work: always an event at their edges (their device time is never shared)
_DEVICE_WORK = {TRANSFER, FORWARD, BACKWARD, OPTIMIZER}
#: one device segment: (start event, end event, host seconds per (part index, named key or None))
Segment = tuple[Any, Any, dict[tuple[int, "str | None"], float]]


def read_segments(segs: list[Segment]) -> tuple[tuple[float, ...], dict[str, float]] | None:
    """Each part's and each named item's device seconds over one step's segments (module doc), None while the
    device has not passed the last event (``query()``: nothing waits). A segment's device time is shared among its
    parts by their host time in it."""
    if not segs:
        return None
    if not segs[-1][1].query():
        return None
    dev = [0.0] * len(PARTS)
    named: dict[str, float] = {}

    def add(part: int, key: str | None, x: float) -> None:
        dev[part] += x
        if key is not None:
            named[key] = named.get(key, 0.0) + x

    for e0, e1, w in segs:
        span = max(e0.elapsed_time(e1) / 1e3, 0.0)
        tot = math.fsum(w.values())
        if span <= 0.0:
            continue
        if tot <= 0.0:  # (two events at once: nothing ran between them on the host)
            dev[OTHER] += span
            continue
        work = math.fsum(h for (part, _), h in w.items() if part in _DEVICE_WORK)
        if 0.0 < work < tot:
            # a short hook inside a part that queues device work (a callback's hook inside the optimizer step): the
            # device's time while the host ran it is at most its host time (it queued nothing); the rest is the
            # device work's
            left = span
            for (part, key), h in w.items():
                if part not in _DEVICE_WORK:
                    x = min(span * h / tot, h)
                    add(part, key, x)
                    left -= x
            for (part, key), h in w.items():
                if part in _DEVICE_WORK:
                    add(part, key, left * h / work)
            continue
        for (part, key), h in w.items():
            add(part, key, span * h / tot)
    return tuple(dev), named


def _on_device(t: torch.Tensor) -> bool:
    """A tensor whose read on the host waits for the device."""
    return t.device.type == "cuda"


def progress_bar_reads(trainer: Any) -> tuple[str, ...]:
    """The values logged this step with ``self.log(..., prog_bar=True)`` (on_step) that live on the device: Lightning
    turns each into a number (``.item()``) in its metric bookkeeping after every batch, progress bar or not -- a
    host-device sync every step. () where there are none or Lightning's internals differ."""
    try:
        res = trainer._results
        if res is None:
            return ()
        out = []
        for _, rm in res.valid_items():
            meta = getattr(rm, "meta", None)
            v = getattr(rm, "_forward_cache", None)
            if meta is not None and meta.prog_bar and meta.on_step and isinstance(v, torch.Tensor) and _on_device(v):
                out.append(str(meta.name))
        return tuple(out)
    except Exception:
        return ()


def classify(action: str, tscope_keys: dict[str, str], labels: dict[str, str]) -> Kind | None:
    """The part of a Lightning profiler action (module doc). ``tscope_keys``: tscope's callbacks' state keys ->
    their class names; ``labels``: the other callbacks' state keys -> their class names."""
    if action.endswith("].train_dataloader_next"):
        return (FETCH, "", True)
    if action == "save_checkpoint":
        return (CHECKPOINT, "save_checkpoint", False)
    kind, sep, rest = action.partition("]")
    if not sep or not kind.startswith("["):
        return None
    owner, _, hook = rest.rpartition(".")
    kind = kind[1:]
    if kind == "Callback":
        if owner in tscope_keys:
            return (TSCOPE, tscope_keys[owner], False)
        return (HOOKS, labels.get(owner) or owner.split("{")[0], False)
    if kind == "Strategy":
        part = {"batch_to_device": TRANSFER, "training_step": FORWARD, "backward": BACKWARD}.get(hook)
        return (part, "", False) if part is not None else (HOOKS, f"{owner}.{hook}", False)
    if kind == "LightningModule":
        if hook in _TRANSFER_HOOKS:
            return (TRANSFER, "", False)
        if hook in _OPTIMIZER_HOOKS:
            return (OPTIMIZER, "", False)
        if hook == "training_step":  # manual calls through the module hook (rare)
            return (FORWARD, "", False)
        return (HOOKS, f"{owner}.{hook}", False)
    if kind == "LightningDataModule":
        return (HOOKS, f"{owner}.{hook}", False)
    return None


class GradTail:
    """The wait at the end of a DDP backward: from the accumulation of the last parameter's gradient to backward's
    end (the reducer waiting for its last all-reduce: for the other ranks). The first backward learns which
    trainable parameter is accumulated last (a post-accumulate-grad hook on each); from then on one hook on it. On
    CUDA each hook also records an event (and backward's end another): the device's wait, read once complete."""

    def __init__(self, params: Iterable[torch.nn.Parameter], clock: Callable[[], float], cuda: bool) -> None:
        self.params = [p for p in params if p.requires_grad]
        self.clock, self.cuda = clock, cuda
        self.t: float | None = None  #: host time of the last hooked accumulation in the running backward
        self.event: Any = None
        self.last: int | None = None  #: index of the parameter accumulated last
        self._order: list[int] = []
        self._handles: list[Any] = []

    def arm(self) -> None:
        """Install the hooks (every parameter's while learning, else the last one's)."""
        if self._handles:
            return
        idx = range(len(self.params)) if self.last is None else [self.last]
        for i in idx:
            self._handles.append(self.params[i].register_post_accumulate_grad_hook(self._hook(i)))

    def _hook(self, i: int) -> Callable[[torch.Tensor], None]:
        def hook(_: torch.Tensor) -> None:
            self.t = self.clock()
            if self.last is None:
                self._order.append(i)
            if self.cuda:
                self.event = torch.cuda.Event(enable_timing=True)
                self.event.record()
        return hook

    def take(self, t0: float, t1: float) -> tuple[float, Any]:
        """(host seconds from the last accumulation to ``t1``, its CUDA event or None) for a backward running
        ``t0``..``t1``; 0 when no hooked accumulation fell in it. Ends the learning after the first backward."""
        t, ev, self.t, self.event = self.t, self.event, None, None
        if self.last is None and self._order:
            self.last = self._order[-1]
            self._order.clear()
            self.remove()
            self.arm()
        if t is None or not t0 <= t <= t1:
            return 0.0, None
        return t1 - t, ev

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()


class LoopProbe:
    """Each optimizer step's parts (module doc). :meth:`install` on a trainer, :meth:`remove` to undo;
    :meth:`end_of_step` at the end of an optimizer step's last batch (the monitor's batch-end hook), then the next
    fetch closes it; :meth:`take` hands out the closed steps. ``clock`` (seconds) and ``cpu_wait`` (the thread's
    run-queue wait so far) are ``hostclock``'s unless given."""

    def __init__(self, *, clock: Callable[[], float] = host_time, cpu_wait: Callable[[], float | None] = cpu_wait,
                 cuda: bool = False) -> None:
        self.clock, self.cuda = clock, cuda
        self._read_wait = cpu_wait
        #: action name -> (part index, "<part>:<name>" for the named parts else None, starts a step) or None
        self._cache: dict[str, tuple[int, str | None, bool] | None] = {}
        self._own: dict[str, Kind] = {}  #: the marks of the methods the probe wraps itself
        self.tscope_keys: dict[str, str] = {}
        self.labels: dict[str, str] = {}
        #: [action name, start, children's seconds, the kind it counts as] of the open actions
        self._stack: list[list[Any]] = []
        self._patches: list[tuple[Any, str, bool, Any, Any]] = []  #: (object, attribute, had its own, old, new)
        self.tail: GradTail | None = None
        self.call_cost_s = 0.0  #: the probe's own seconds per marked action (measured at install)
        self.faults = 0
        self._free: list[Any] = []  #: CUDA events read and done with (reused)
        self._reset_steps()

    @property
    def installed(self) -> bool:
        return bool(self._patches)

    def _reset_steps(self) -> None:
        self._acc = [0.0] * len(PARTS)
        self._named: dict[str, float] = {}
        self._t0: float | None = None  #: the running step's start
        self._q0: float | None = None  #: the thread's run-queue wait at that start
        self._closing = False  #: the running step's batches are done: the next fetch starts the next step
        self._dirty = True  #: the running step is no basis
        self._tail_events: list[tuple[Any, Any]] = []
        self.calls = 0  #: marked actions in the running step
        self.step = -1  #: the running step's number (the monitor sets it at batch start)
        #: closed steps, their CUDA tail events and their device segments
        self.done: list[tuple[StepTimes, list[tuple[Any, Any]], list[Segment]]] = []
        self._stack.clear()
        self._seg_ev: Any = None  #: CUDA: the running segment's start event (None: no step started)
        self._seg_w: dict[tuple[int, str | None], float] = {}  #: ... its host seconds per (part, named key)
        self._seg_host = 0.0
        self._slice_t = 0.0  #: host time of the last mark
        self._segs: list[Segment] = []  #: the running step's closed segments

    def _kind(self, name: str) -> tuple[int, str | None, bool] | None:
        k = self._own.get(name) or classify(name, self.tscope_keys, self.labels)
        if k is None:
            return None
        part, label, boundary = k
        named = part in _NAMED or bool(label)
        return (part, f"{PARTS[part]}:{label}" if named else None, boundary)

    # ------------------------------------------------------------------ the action marks
    def begin(self, name: str) -> None:
        t = self.clock()
        try:
            kind = self._cache.get(name, _MISS)
            if kind is _MISS:
                kind = self._cache[name] = self._kind(name)
            if kind is not None and kind[2] and (self._closing or self._t0 is None):
                self._boundary(t)
                t1 = self.clock()  # the boundary's own work (a schedstat read): tscope's, in the new step
                self._acc[TSCOPE] += t1 - t
                t = t1
            self.calls += 1
            if kind is None:
                return
            st = self._stack
            # an action inside one of tscope's hooks (its logger call, its profile) is tscope's work too
            as_kind = st[-1][3] if st and st[-1][3][0] == TSCOPE else kind
            if self._seg_ev is not None:  # (no cut between nested actions of one part: the transfer's hooks)
                self._device_mark(t, as_kind[0] in _DEVICE_WORK and not (st and st[-1][3][0] == as_kind[0]))
            self._stack.append([name, t, 0.0, as_kind])
        except Exception as e:  # never into the user's loop
            self._fault(e)

    def end(self, name: str) -> None:
        t = self.clock()
        try:
            st = self._stack
            if not st or st[-1][0] != name:  # (the usual case: the innermost open action)
                if self._cache.get(name, _MISS) is None or not any(e[0] == name for e in st):
                    return  # not a part, or a stop whose start was not seen
                while st[-1][0] != name:
                    st.pop()  # an action whose stop never came (an exception inside it)
            if self._seg_ev is not None:
                part = st[-1][3][0]
                self._device_mark(t, part in _DEVICE_WORK and not (len(st) > 1 and st[-2][3][0] == part))
            _, t0, children, as_kind = st.pop()
            dur = t - t0
            own = dur - children
            part, key, _ = as_kind
            if part == BACKWARD and self.tail is not None:
                own -= self._tail_wait(t0, t, own)
            self._acc[part] += own
            if key is not None:
                self._named[key] = self._named.get(key, 0.0) + own
            if st:
                st[-1][2] += dur
        except Exception as e:
            self._fault(e)

    def _tail_wait(self, t0: float, t1: float, own: float) -> float:
        """The DDP wait at the end of a backward running ``t0``..``t1``, counted as sync (and its CUDA events)."""
        wait, ev = self.tail.take(t0, t1)  # type: ignore[union-attr]
        wait = min(wait, own)
        if wait > 0:
            self.account("sync", "DDP gradient all-reduce wait", wait, nested=False)
        if ev is not None:
            end_ev = torch.cuda.Event(enable_timing=True)
            end_ev.record()
            self._tail_events.append((ev, end_ev))
        return max(wait, 0.0)

    def _event(self) -> Any:
        e = self._free.pop() if self._free else torch.cuda.Event(enable_timing=True)
        e.record()
        return e

    def _device_mark(self, t: float, cut: bool) -> None:
        """CUDA: the host time since the last mark goes to the running segment under the part running (the
        innermost open action's, else ``other``); a new segment starts here where ``cut`` or the segment is long
        enough (module doc)."""
        dt = t - self._slice_t
        self._slice_t = t
        if dt > 0.0:
            k = (self._stack[-1][3][0], self._stack[-1][3][1]) if self._stack else (OTHER, None)
            self._seg_w[k] = self._seg_w.get(k, 0.0) + dt
            self._seg_host += dt
        if cut or self._seg_host >= SEGMENT_S:
            ev = self._event()
            self._segs.append((self._seg_ev, ev, self._seg_w))
            self._seg_ev, self._seg_w, self._seg_host = ev, {}, 0.0

    def release(self, segs: list[Segment]) -> None:
        """Segments read: their events are reused (all but the last: the next step's first)."""
        self._free.extend(e0 for e0, _, _ in segs)
        if len(self._free) > 256:
            del self._free[256:]

    def account(self, part: str, name: str, seconds: float, *, nested: bool = True) -> None:
        """Count ``seconds`` of the running action (a tscope hook) as ``part`` instead (tscope's gather of the
        ranks' parts: its wait is for the other ranks)."""
        self._acc[_P[part]] += seconds
        key = f"{part}:{name}"
        self._named[key] = self._named.get(key, 0.0) + seconds
        if nested and self._stack:
            self._stack[-1][2] += seconds

    def _fault(self, e: BaseException) -> None:
        self.faults += 1
        if self.faults == 1:
            log.warning("tscope StepMonitor: the step-parts probe failed (%s: %s); the step parts may be off",
                        type(e).__name__, e)

    # ------------------------------------------------------------------ steps
    def batch_start(self, step: int) -> None:
        """A batch starts (the monitor's batch-start hook): its step's number; where no fetch was seen (a loop
        Lightning does not mark: ``dataloader_iter``), the step starts here."""
        if self._closing or self._t0 is None:
            self._boundary(self.clock())
        self.step = step

    def end_of_step(self) -> None:
        """The running step's last batch ended: its loop work goes on until the next step's first fetch."""
        self._closing = True

    def mark_dirty(self) -> None:
        self._dirty = True

    def _boundary(self, t: float) -> None:
        q = self._read_wait()
        segs: list[Segment] = []
        if self.cuda:  # the step's last segment ends here, the next step's first starts here
            try:
                if self._seg_ev is not None:
                    self._device_mark(t, True)
                    segs = self._segs
                else:
                    self._seg_ev, self._slice_t = self._event(), t
            except Exception as e:
                self._fault(e)
                self._seg_ev = None
        if self._t0 is not None and self._closing:
            host = t - self._t0
            acc = self._acc
            acc[OTHER] = 0.0
            if self.calls:  # the probe's own cost: inside the parts' times, taken out of the unmarked rest
                cost = min(self.calls * self.call_cost_s, max(host - sum(acc), 0.0))
                acc[TSCOPE] += cost
                self._named["tscope:step-parts probe"] = cost
            acc[OTHER] = max(host - sum(acc), 0.0)
            wait = q - self._q0 if q is not None and self._q0 is not None else None
            self.done.append((StepTimes(self.step, host, tuple(acc), self._named, wait, dirty=self._dirty),
                              self._tail_events, segs))
            if len(self.done) > 256:  # nobody reads them: keep the latest
                del self.done[:-64]
        # (a step that never ended its batches -- an exception, a skipped batch -- is left out)
        self._dirty = self._t0 is None  # the first step of a fit is warm-up
        self._acc = [0.0] * len(PARTS)
        self._named = {}
        self._tail_events = []
        self._segs, self._seg_w, self._seg_host = [], {}, 0.0
        self._t0, self._q0, self._closing, self.calls = t, q, False, 0

    def take(self) -> list[tuple[StepTimes, list[tuple[Any, Any]], list[Segment]]]:
        out, self.done = self.done, []
        return out

    # ------------------------------------------------------------------ install / remove
    def _patch(self, obj: Any, attr: str, fn: Any) -> None:
        own = attr in getattr(obj, "__dict__", {})
        old = obj.__dict__[attr] if own else None
        setattr(obj, attr, fn)
        self._patches.append((obj, attr, own, old, fn))

    def install(self, trainer: Any, tscope_types: tuple[type, ...] = ()) -> None:
        """Put the marks on ``trainer`` (module doc). ``tscope_types``: callback classes whose hooks are tscope's
        own (every class of the ``tscope_callbacks`` package is)."""
        self.remove()
        try:
            self._install(trainer, tscope_types)
        except BaseException:
            self.remove()
            raise
        self.call_cost_s = self._calibrate()
        self._reset_steps()

    def _install(self, trainer: Any, tscope_types: tuple[type, ...]) -> None:
        self.refresh_callbacks(trainer, tscope_types)
        self._wrap_profiler(trainer.profiler)
        conn = getattr(trainer, "_logger_connector", None)
        for attr, name in (("on_batch_start", "Lightning metrics (self.log) bookkeeping"),
                           ("on_batch_end", "Lightning metrics (self.log) bookkeeping"),
                           ("update_train_step_metrics", "Lightning logging at logging steps")):
            if conn is not None and callable(getattr(conn, attr, None)):
                self._wrap_method(conn, attr, f"<tscope>{attr}", (LOGGING, name, False))
        loop = getattr(getattr(trainer, "fit_loop", None), "epoch_loop", None)
        if loop is not None and callable(getattr(loop, "_save_loggers_on_train_batch_end", None)):
            self._wrap_method(loop, "_save_loggers_on_train_batch_end", "<tscope>save_loggers",
                              (LOGGING, "loggers' save at stop", False))
        if loop is not None and callable(getattr(loop, "_broadcast_sigterm_tensor", None)):
            self._wrap_method(loop, "_broadcast_sigterm_tensor", "<tscope>sigterm",
                              (SYNC, "Lightning's per-step SIGTERM broadcast", True))
        for lg in getattr(trainer, "loggers", None) or ():
            for attr in ("log_metrics", "save"):
                if callable(getattr(lg, attr, None)):
                    self._wrap_method(lg, attr, f"<tscope>{id(lg)}.{attr}",
                                      (LOGGING, f"{type(lg).__name__}.{attr}", False))
        from lightning.pytorch.strategies import DDPStrategy

        if getattr(trainer, "world_size", 1) > 1 and isinstance(trainer.strategy, DDPStrategy):
            self.tail = GradTail(trainer.lightning_module.parameters(), self.clock, self.cuda)
            self.tail.arm()

    def refresh_callbacks(self, trainer: Any, tscope_types: tuple[type, ...] = ()) -> None:
        """Read the trainer's callbacks' state keys again (a callback added during setup)."""
        self.tscope_keys, self.labels = {}, {}
        for cb in getattr(trainer, "callbacks", ()):
            try:
                key = cb.state_key
            except Exception:
                continue
            if isinstance(cb, tscope_types) or type(cb).__module__.startswith("tscope_callbacks."):
                self.tscope_keys[key] = type(cb).__name__
            else:
                self.labels[key] = type(cb).__name__
        self._cache.clear()

    def _wrap_method(self, obj: Any, attr: str, name: str, kind: Kind) -> None:
        fn = getattr(obj, attr)
        begin, end = self.begin, self.end
        self._own[name] = kind

        def wrapped(*args: Any, **kwargs: Any) -> Any:
            begin(name)
            try:
                return fn(*args, **kwargs)
            finally:
                end(name)

        self._patch(obj, attr, wrapped)

    def _wrap_profiler(self, prof: Any) -> None:
        from lightning.pytorch.profilers import PassThroughProfiler

        begin, end = self.begin, self.end
        if (type(prof).start is PassThroughProfiler.start and type(prof).stop is PassThroughProfiler.stop
                and "start" not in vars(prof) and "stop" not in vars(prof)):  # the default: nothing to call

            def start(action_name: str) -> None:
                begin(action_name)

            def stop(action_name: str) -> None:
                end(action_name)
        else:
            o_start, o_stop = prof.start, prof.stop

            def start(action_name: str) -> None:
                begin(action_name)
                o_start(action_name)

            def stop(action_name: str) -> None:
                try:
                    o_stop(action_name)
                finally:
                    end(action_name)

        self._patch(prof, "start", start)
        self._patch(prof, "stop", stop)

    def _calibrate(self, n: int = 300) -> float:
        """The probe's own seconds per marked action: ``n`` begin/end pairs of a hook action (median of 3 rounds;
        what they accumulate is dropped with the install's step state)."""
        name = "[Callback]<tscope calibration>.on_train_batch_start"
        rounds = []
        try:
            for _ in range(3):  # on the probe's own clock (a scripted host's: no cost)
                t = self.clock()
                for _ in range(n):
                    self.begin(name)
                    self.end(name)
                rounds.append((self.clock() - t) / n)
            return sorted(rounds)[1]
        finally:
            self._cache.pop(name, None)

    def remove(self) -> None:
        """Undo every patch and hook (idempotent; never raises)."""
        for obj, attr, had, old, new in reversed(self._patches):
            try:
                if had:
                    setattr(obj, attr, old)
                elif obj.__dict__.get(attr) is new:
                    delattr(obj, attr)
            except Exception:
                pass
        self._patches.clear()
        self._own.clear()
        if self.tail is not None:
            self.tail.remove()
            self.tail = None
        self._stack.clear()


_MISS: Any = object()
