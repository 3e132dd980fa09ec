"""NaNGuardCallback: an always-on check for non-finite losses and gradients that names where they started.

Every ``every_n_steps`` optimizer steps, in ``on_before_optimizer_step`` (after backward, before the update; with
gradient accumulation after the last micro-batch), the step's loss(es) and all gradients of the optimizer's parameters
are reduced on the device (one fused ``_foreach_norm``) into a flag. How the flag reaches the host:

- **Deferred (default on a GPU): no host sync.** The flag is copied to pinned memory without blocking and read at
  the start of the step ``lag`` (2) steps later, when the GPU has long passed it; under DDP every rank reads it at
  the same step (an on-device all-reduce agrees the flag first). Actions that drop an update do so on the device:
  fused optimizers (``fused=True`` Adam/AdamW/SGD/Adagrad) skip a step whose ``found_inf`` flag is set -- weights,
  moments and step counters exactly as if it never happened. ``"stop"``/``"raise"`` keep that mask set from the bad
  step on (sticky), so the weights stay those before it until the run stops, ``lag`` steps later; ``"skip"`` masks
  only the bad step; ``"warn"`` masks nothing. An optimizer without a ``found_inf`` path (foreach / for-loop
  implementations) cannot skip on the device: for ``"skip"``/``"stop"``/``"raise"`` its flag is read at the step
  (one host sync per checked step, documented fallback; ``"warn"`` stays deferred).
- **Immediate (default on CPU, where reading costs nothing; ``sync=True`` anywhere): the flag is read at the step**
  and the actions act on that step: ``"skip"``/``"stop"`` drop the update by setting every ``.grad`` of the optimizer
  to ``None`` (torch optimizers then skip those parameters). Also used with a GradScaler (fp16), whose own step
  already syncs.

A raised flag is **located** once per streak of bad steps by replaying ``training_step`` with hooks on every module
(:mod:`tscope_callbacks.analysis.locate`); read deferred with ``"stop"``/``"raise"`` the weights are unchanged since
the bad step, so the replay is exact; with ``"skip"``/``"warn"`` a later update may have applied (the note says so).

Actions: ``"warn"`` logs (the update is applied). ``"skip"`` drops the bad update, and stops after ``options.max_skips``
skipped steps in a row. ``"stop"`` (default) drops it too and sets ``trainer.should_stop`` (subject to
``min_steps``/``min_epochs``): a checkpoint written at the end holds the last finite weights. ``"raise"`` raises
:class:`NonFiniteError` out of ``fit``. A ``check_params`` event comes after the update, which cannot be skipped:
``"skip"`` stops then.

AMP: with a GradScaler (fp16) a step whose gradients overflow while the loss is finite is the scaler's business (it
skips the step, halves the scale): no event unless the scale collapses (the next scale < ``options.amp_min_scale``,
or ``options.amp_max_overflows`` overflows in a row). ``bf16-mixed`` has no scaler: normal checks.

Alerts (rank zero, through the sinks): ``logging`` warning on logger ``"tscope_callbacks"``, TensorBoard text
``tscope/nan``, W&B ``run.alert``; the first event, then at most one per ``options.alert_every_s`` seconds or
``options.alert_every_n`` events (saying how many were not alerted), and a summary at the end. Scalar ``tscope/nan/events``
(cumulative) at each event. Errors inside the callback are logged and never break training (only
:class:`NonFiniteError`).
"""

from __future__ import annotations

import logging
import math
from typing import Any

import lightning.pytorch as pl
import torch
from typing_extensions import override

from tscope_callbacks.analysis import nonfinite as nl
from tscope_callbacks.analysis.grad_history import GradHistory, spike_text, step_loss
from tscope_callbacks.analysis.nonfinite import NonFiniteError, NonFiniteEvent
from tscope_callbacks.callbacks import nan_steps
from tscope_callbacks.callbacks.guarded import GuardedCallback
from tscope_callbacks.callbacks.options import NaNGuardOptions, check_option
from tscope_callbacks.callbacks.sinks import METRIC_ROOT, alert_or_log, metric_key
from tscope_callbacks.capture import active as _active
from tscope_callbacks.capture import locate as nl_locate
from tscope_callbacks.capture.active import paused

__all__ = ["NaNGuardCallback", "NonFiniteError", "NonFiniteEvent"]

_log = logging.getLogger("tscope_callbacks")
ACTIONS = ("warn", "skip", "stop", "raise")
HISTORY_BATCH = 16  #: healthy steps queued before they enter the history together (see ``_healthy``)


def _checked(name: str, v: Any, minimum: float, typ: type = int) -> Any:
    if isinstance(v, bool) or not isinstance(v, (int, float) if typ is float else typ) or v != v:
        raise TypeError(f"NaNGuardCallback: {name} must be {'a number' if typ is float else 'an int'}, got {v!r}")
    if v < minimum:
        raise ValueError(f"NaNGuardCallback: {name} must be >= {minimum}, got {v}")
    return typ(v)


class NaNGuardCallback(GuardedCallback):
    """Detect, locate and act on non-finite losses/gradients at ~no cost per healthy step (see module docstring).

    Args (keyword-only):
        action: "warn" | "skip" | "stop" (default: ends the run cleanly, keeping the last finite weights) | "raise".
        every_n_steps: check every n-th optimizer step (1 = all). Unchecked steps are not guarded.
        check_loss: include the loss(es) from ``on_before_backward`` in the check.
        check_params: also check the parameters after each checked update (one more reduction per step).
        locate: replay the first bad step of each streak to name the layer (costs nothing on healthy steps).
        sync: None (default): flags are read without a host sync on a GPU (``lag`` steps late, bad updates masked on
            the device), immediately on CPU; True: read at each checked step (one host sync per step); False: deferred
            everywhere.
        grad_norms: keep the checked steps' gradient norms (the per-tensor norms the check computes anyway: no extra
            device work, no sync): scalars ``tscope/grad_norm/total`` (global L2 norm) and one per layer
            (``tscope/grad_norm/<module path>``) at Lightning's ``log_every_n_steps``; every checked step enters the
            history with the step's loss (read with the norms) and learning rate, and a non-finite event says how
            they moved before it (``event.trend``) and whether it built up or came suddenly (``event.onset``). Off
            with a GradScaler (scaled gradients).
        options: thresholds and limits (:class:`~tscope_callbacks.NaNGuardOptions`: ``max_skips`` with action
            "skip", alert rate ``alert_every_s``/``alert_every_n``, GradScaler collapse ``amp_min_scale``/
            ``amp_max_overflows``, ``max_events`` kept, gradient ``spike_factor``, norms ``history``). None: its
            defaults. Those names given here raise one line saying so.

    Attributes: ``events`` (list[NonFiniteEvent]), ``num_events``, ``skipped_steps``, ``alerts`` (alerts emitted on
    this rank), ``replays`` (replays run), ``mode`` ("deferred"/"immediate", decided at fit start), ``host_syncs``
    (flag reads that synchronized the host), ``spikes`` (gradient spikes: step, norm, median, ratio, layer, loss,
    learning rate; a spike is there at the end of its own step, or within ``HISTORY_BATCH`` steps in the rare case
    the quick bound misses it, and all of them after ``fit``), ``grad_history`` (the checked steps' norms, losses and learning rates: a
    :class:`~tscope_callbacks.analysis.grad_history.GradHistory`), ``replay_blocker`` (why this fit's bad steps are
    not replayed, or None). Keys: text ``tscope/nan``, scalars ``tscope/nan/events``, ``tscope/grad_norm/*``.
    """

    _passthrough = (NonFiniteError,)  #: action="raise" ends the fit on purpose

    _moved = {k: f"options=ts.NaNGuardOptions({k}=...)" for k in (
        "max_skips", "alert_every_s", "alert_every_n", "amp_min_scale", "amp_max_overflows", "max_events",
        "spike_factor", "history")}

    def __init__(self, *, action: str = "stop", every_n_steps: int = 1, check_loss: bool = True,
                 check_params: bool = False, locate: bool = True, sync: bool | None = None, grad_norms: bool = True,
                 options: NaNGuardOptions | None = None) -> None:
        if action not in ACTIONS:
            raise ValueError(f"NaNGuardCallback: action must be one of {ACTIONS}, got {action!r}")
        for name, v in (("check_loss", check_loss), ("check_params", check_params), ("locate", locate),
                        ("grad_norms", grad_norms)):
            if not isinstance(v, bool):
                raise TypeError(f"NaNGuardCallback: {name} must be a bool, got {v!r}")
        if sync is not None and not isinstance(sync, bool):
            raise TypeError(f"NaNGuardCallback: sync must be None, True or False, got {sync!r}")
        self.action, self.check_loss, self.check_params, self.locate = action, check_loss, check_params, locate
        self.sync = sync
        self.every_n_steps = _checked("every_n_steps", every_n_steps, 1)
        self.grad_norms = grad_norms
        self.options: NaNGuardOptions = check_option("NaNGuardCallback", "options", options, NaNGuardOptions)
        self._reset()

    def _reset(self) -> None:
        self.events: list[NonFiniteEvent] = []
        self.num_events = self.skipped_steps = self.alerts = 0
        self.spikes: list[dict[str, Any]] = []
        self._state = nan_steps.GuardState(GradHistory(self.options.history, self.options.spike_factor))
        self._limiter = nl.AlertLimiter(self.options.alert_every_s, self.options.alert_every_n)
        self._spike_limiter = nl.AlertLimiter(self.options.alert_every_s, self.options.alert_every_n)

    @property
    def mode(self) -> str:
        """How this fit's flags reach the host: "deferred" or "immediate" (decided at fit start)."""
        return self._state.mode

    @property
    def replays(self) -> int:
        """Replays run to locate bad steps (this fit)."""
        return self._state.replays

    @property
    def host_syncs(self) -> int:
        """Flag reads that synchronized the host (this fit)."""
        return self._state.host_syncs

    @property
    def replay_blocker(self) -> str | None:
        """Why this fit's bad steps are not replayed to name the layer (None: they are)."""
        return self._state.replay_blocker

    @property
    def grad_history(self) -> GradHistory:
        """The checked steps' gradient norms, losses and learning rates (this fit, up to the last checked step)."""
        st = self._state
        if st.pending:
            self._flush_history(st.trainer)
        return st.history

    # ---------------------------------------------------------------- hooks (each delegates, never raises)
    @override
    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._reset()
        self._state = nan_steps.fit_state(self, trainer, pl_module)
        # the trainer's other tscope callbacks read this guard's gradient spikes through their coordinator
        self.coordinator(trainer).guard = self

    def _due_now(self, trainer: pl.Trainer) -> bool:
        """Whether this optimizer step is checked (every step by default: no ``trainer.global_step`` read)."""
        return self.every_n_steps == 1 or self._state.step.completed % self.every_n_steps == 0

    # The four hooks of every step guard themselves (the same try/except GuardedCallback wraps around a hook, written
    # in place: no wrapper call per hook; ``_tscope_guarded`` tells GuardedCallback not to wrap them again).
    @override
    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any,
                             batch_idx: int) -> None:
        try:
            st = self._state
            st.batch_idx = batch_idx
            if st.channel.pending:
                with paused():
                    self._poll(trainer, pl_module, st.step.completed)
            if st.snapshot and (self.every_n_steps == 1 or self._due_now(trainer)):
                snaps = st.snaps
                try:
                    if _active._ACTIVE is None:
                        snaps.append(nl_locate.StepSnapshot.take(batch, batch_idx))
                    else:
                        with paused():
                            snaps.append(nl_locate.StepSnapshot.take(batch, batch_idx))
                    if len(snaps) > 256:
                        del snaps[:-256]
                except Exception as e:
                    self.faults.report("snapshot", e)
        except self._passthrough:
            raise
        except Exception as e:
            self.faults.report("its on_train_batch_start hook", e)

    on_train_batch_start._tscope_guarded = True  # type: ignore[attr-defined]

    @override
    def on_before_backward(self, trainer: pl.Trainer, pl_module: pl.LightningModule, loss: torch.Tensor) -> None:
        """Keeps the loss tensor itself (no op: the check reads it with the norms, under no-grad)."""
        try:
            st = self._state
            snaps = st.snaps
            if snaps and snaps[-1].loss is None:
                snaps[-1].loss = loss
            if self.check_loss and isinstance(loss, torch.Tensor) and (self.every_n_steps == 1
                                                                        or self._due_now(trainer)):
                st.losses.append(loss)
        except Exception as e:
            self.faults.report("its on_before_backward hook", e)

    on_before_backward._tscope_guarded = True  # type: ignore[attr-defined]

    @override
    def on_before_optimizer_step(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                                 optimizer: torch.optim.Optimizer) -> None:
        try:
            if _active._ACTIVE is None:
                self._check_step(trainer, pl_module, optimizer)
            else:
                with paused():  # check and replay inside a profiled step are not the user's work
                    self._check_step(trainer, pl_module, optimizer)
        except self._passthrough:
            raise
        except Exception as e:
            self.faults.report("its on_before_optimizer_step hook", e)

    on_before_optimizer_step._tscope_guarded = True  # type: ignore[attr-defined]

    @override
    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        try:
            st = self._state
            if st.masked:  # a found_inf mask set for one step never outlives it
                for opt in st.masked:
                    opt.__dict__.pop("found_inf", None)
                st.masked.clear()
            if not (self.check_params and st.stepped):
                return
            st.stepped = False
            with paused():
                event = nan_steps.check_params(self, st, trainer, pl_module, batch_idx)
                if event is not None:
                    self._act(trainer, [], event, after_update=True)
        except self._passthrough:
            raise
        except Exception as e:
            self.faults.report("its on_train_batch_end hook", e)

    on_train_batch_end._tscope_guarded = True  # type: ignore[attr-defined]

    @override
    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._state.channel.pending:  # the last steps' flags: read now (the one wait of a deferred run)
            with paused():
                self._poll(trainer, pl_module, None)
        if self._state.pending:
            self._flush_history(trainer)
        if self._limiter.suppressed:
            self._alert(trainer, "NaN guard summary", f"NaN guard: {self._limiter.suppressed} non-finite event(s) "
                        f"since the last alert were not alerted; {self.num_events} event(s) in total this run.")

    @override
    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if self._state.pending:  # a fit that ended without on_train_end (an exception): its last healthy steps
            self._flush_history(trainer)
        for opt in trainer.optimizers:
            opt.__dict__.pop("found_inf", None)
        self._state.masked.clear()
        self._state.trainer = None  # the guard outlives the fit: it keeps no trainer (nor its model) alive
        self.release_coordinator()

    # ---------------------------------------------------------------- the check
    def _check_step(self, trainer: pl.Trainer, pl_module: pl.LightningModule, optimizer: Any) -> None:
        st = self._state
        losses, snaps, st.losses, st.snaps = st.losses, st.snaps, [], []
        st.stepped = True
        if self.every_n_steps != 1 and not self._due_now(trainer):
            return
        params = nan_steps.step_params(st, optimizer)
        scaler = st.scaler
        if st.mode == "deferred" and scaler is None and (
                self.action == "warn" or getattr(optimizer, "_step_supports_amp_scaling", False)):
            try:
                nan_steps.push_deferred(self, st, trainer, pl_module, optimizer, params, losses, snaps)
                return
            except Exception as e:
                self.faults.report("deferred check", e)
        try:
            out = nan_steps.check_now(self, st, trainer, pl_module, params, losses, snaps, scaler)
        except NonFiniteError:
            raise
        except Exception as e:  # our check must never break the user's step
            self.faults.report("check", e)
            return
        if type(out) is nan_steps.Healthy:
            self._healthy(trainer, *out)
        elif out is not None:
            self._act(trainer, params, out)

    def _poll(self, trainer: pl.Trainer, pl_module: pl.LightningModule, step: int | None) -> None:
        """Act on the deferred flags due at ``step`` (all of them at the end of training)."""
        st = self._state
        for s, values, payload in st.channel.due(step):
            try:
                if values[0] == 0.0:
                    st.streak = st.skips_in_row = 0
                    if self.grad_norms:
                        names = payload["grad_names"]
                        self._healthy(trainer, s, names, values[2:2 + len(names)], step_loss(values[2 + len(names):]),
                                      payload.get("lr"))
                    continue
                event = nan_steps.deferred_event(self, st, trainer, pl_module, s, values, payload)
                if event is not None:
                    self._act(trainer, [], event, masked=self.action != "warn")
            except NonFiniteError:
                raise
            except Exception as e:
                self.faults.report("deferred bad-step handling", e)

    # ---------------------------------------------------------------- actions and alerts
    def _act(self, trainer: pl.Trainer, params: list, event: NonFiniteEvent, after_update: bool = False,
             masked: bool = False) -> None:
        action = self.action
        if action == "skip" and after_update:
            action, event.note = "stop", (event.note + " An applied update cannot be skipped: stopping.").strip()
        if action in ("skip", "stop") and not masked:
            for p in params:
                p.grad = None
        late = (f" (flag read {trainer.global_step - event.step} step(s) later, without a host sync; the update was "
                "masked on the device" + (" and every later one until the run stopped)" if action in ("stop", "raise")
                                          else ")")) if masked and self.mode == "deferred" else ""
        if action == "skip":
            self.skipped_steps += 1
            st = self._state
            st.skips_in_row += 1
            event.action = f"update skipped ({st.skips_in_row} in a row, max_skips={self.options.max_skips}){late}"
            if st.skips_in_row >= self.options.max_skips:
                trainer.should_stop = True
                event.action += "; max_skips reached: stopping the run"
        elif action == "stop":
            trainer.should_stop = True
            event.action = "stopping the run" + ("" if after_update else " (this update was dropped)") + late
        elif action == "raise":
            event.action = "raising NonFiniteError" + late
        else:
            event.action = "warn only (the update is applied)"
        self._record(trainer, event)
        if action == "raise":
            raise NonFiniteError(event)

    def _healthy(self, trainer: pl.Trainer, step: int, names: list[str], norms: list[float],
                 loss: float | None = None, lr: float | None = None) -> None:
        """A healthy checked step's gradient norms, loss and learning rate, queued for the history. The queue enters
        it (:meth:`_flush_history`: spikes found and alerted, norms logged) when it holds ``HISTORY_BATCH`` steps, at
        a logged step, and at once when the step's global norm clears the quick spike bound (over ``spike_factor``
        x the smallest norm in the history): a spike is alerted at its own step; only a spike hidden by that bound's
        staleness waits, at most ``HISTORY_BATCH`` steps. Every reader of the history (``grad_history``, an event's
        trend, the end of training) flushes it first."""
        st = self._state
        pending = st.pending
        pending.append((step, names, norms, loss, lr))
        if (len(pending) >= HISTORY_BATCH or (st.log_norms and step % st.log_every == 0)
                or (self.options.spike_factor is not None and math.hypot(*norms) > self.options.spike_factor * st.history.floor)):
            self._flush_history(trainer)

    def _flush_history(self, trainer: pl.Trainer | None) -> None:
        """The queued healthy steps into the history, in order: spikes alerted, norms logged at Lightning's cadence
        (rank zero, to the run's loggers only)."""
        st = self._state
        rows, st.pending = st.pending, []
        for step, names, norms, loss, lr in rows:
            try:
                spike = st.history.add(step, names, norms, loss, lr)
                if trainer is None:  # no fit to log or alert through (not expected: the fit's end flushes)
                    if spike is not None:
                        self.spikes.append(spike)
                    continue
                if st.log_norms and step % st.log_every == 0 and st.history.steps:
                    s, total, layers = st.history.steps[-1]
                    if s == step:
                        scalars = {metric_key("grad_norm", "total"): total}
                        scalars.update({metric_key("grad_norm", k or "root"): v for k, v in layers.items()})
                        self.coordinator(trainer).sinks(trainer, False).log_scalars(scalars, step)
                if spike is not None:
                    self._spike(trainer, step, spike)
            except Exception as e:
                self.faults.report("gradient norms", e)

    def _spike(self, trainer: pl.Trainer, step: int, spike: dict[str, Any]) -> None:
        self.spikes.append(spike)
        del self.spikes[:-self.options.max_events or None]
        if self._spike_limiter.admit()[0]:
            self._alert(trainer, f"Gradient spike at step {step}", spike_text(spike, len(self._state.history.steps) - 1))

    def _record(self, trainer: pl.Trainer, event: NonFiniteEvent) -> None:
        if self._state.pending:  # the steps before it, complete
            self._flush_history(trainer)
        if not event.trend:
            try:
                history = self._state.history
                event.onset, why = history.onset(event.step, self.every_n_steps)
                # the layer whose gradient grew most leads only where nothing better is known: never after a sudden
                # onset, and as secondary evidence once the replay found the op that made the first non-finite value
                pointer = ("off" if event.onset == "sudden" else "secondary" if event.origin or event.layer is not None
                           else "lead")
                event.trend = " ".join(p for p in (history.trend(pointer), why) if p)
            except Exception as e:
                self.faults.report("gradient trend", e)
        self.num_events += 1
        if len(self.events) < self.options.max_events:
            self.events.append(event)
        sinks = self.coordinator(trainer).sinks(trainer, False)
        sinks.log_scalars({metric_key("nan", "events"): float(self.num_events)}, trainer.global_step)
        # the event that stops the run is always said, whatever the alert rate (a max_skips stop was only in events)
        alert, missed = self._limiter.admit(force=trainer.should_stop and "stop" in event.action)
        if not alert:
            _log.debug("%s", event)
            return
        text = str(event)
        if missed:
            text += f" ({missed} event(s) since the last alert were not alerted; {self.num_events} in total.)"
        self._alert(trainer, f"Non-finite {event.kind} at step {event.step}", text)

    def _alert(self, trainer: pl.Trainer, title: str, text: str) -> None:
        if not trainer.is_global_zero:
            return
        self.alerts += 1
        alert_or_log(self.coordinator(trainer).sinks(trainer, False), f"{METRIC_ROOT}/nan", title, text,
                     trainer.global_step, wait_s=self.options.alert_every_s)
