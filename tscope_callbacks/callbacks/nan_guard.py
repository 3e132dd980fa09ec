"""NaNGuardCallback: an always-on check for non-finite losses and gradients that names where they started.

Every ``every_n_steps`` optimizer steps, in ``on_before_optimizer_step`` (after backward, before the update; with
gradient accumulation after the last micro-batch), the step's loss(es) and all gradients of the optimizer's parameters
are reduced into one flag: one host sync per step (under DDP one tiny ``all_gather`` instead, so every rank acts on
the same step). Healthy steps cost that plus keeping a batch reference and the RNG states
(``benchmarks/results/nan_guard_overhead.md``). A raised flag is **located** once per streak of bad steps by
replaying ``training_step`` with hooks on every module; :mod:`.nan_locate` documents what ``kind``/``layer`` mean and
when the replay cannot locate (``note`` then says why). ``parameters`` always lists the real gradients' non-finite
element counts.

Actions: ``"warn"`` logs (the update is applied). ``"skip"`` drops the update by setting every ``.grad`` of the
optimizer to ``None`` (torch optimizers then skip those parameters, so momentum and weight decay do not move them;
``global_step`` still advances), and stops after ``max_skips`` skipped steps in a row. ``"stop"`` drops the update
too (a checkpoint written at the end holds the last finite weights) and sets ``trainer.should_stop`` (subject to
``min_steps``/``min_epochs``). ``"raise"`` raises :class:`NonFiniteError` out of ``fit``. A ``check_params`` event
comes after the update, which cannot be skipped: ``"skip"`` stops then.

AMP: with a GradScaler (fp16) a step whose gradients overflow while the loss is finite is the scaler's business (it
skips the step, halves the scale): no event unless the scale collapses (the next scale < ``amp_min_scale``, or
``amp_max_overflows`` overflows in a row). ``bf16-mixed`` has no scaler: normal checks.

Alerts (rank zero): ``logging`` warning on logger ``"tscope_callbacks"``, TensorBoard text ``tscope/nan``, W&B
``run.alert``; the first event, then at most one per ``alert_every_s`` seconds or ``alert_every_n`` events (saying
how many were not alerted), and a summary at the end. Scalar ``tscope/nan/events`` (cumulative) goes to every logger
at each event. Errors inside the callback are logged and never break training (only :class:`NonFiniteError`).
"""

from __future__ import annotations

import logging
import math
import time
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback
from typing_extensions import override

from tscope_callbacks.analysis import locate as nl_locate
from tscope_callbacks.analysis import nonfinite as nl
from tscope_callbacks.analysis.nonfinite import NonFiniteError, NonFiniteEvent
from tscope_callbacks.capture.paths import named_parameters
from tscope_callbacks.capture.profile import paused

__all__ = ["NaNGuardCallback", "NonFiniteError", "NonFiniteEvent"]

_log = logging.getLogger("tscope_callbacks")
ACTIONS = ("warn", "skip", "stop", "raise")


def _checked(name: str, v: Any, minimum: float, typ: type = int) -> Any:
    if isinstance(v, bool) or not isinstance(v, (int, float) if typ is float else typ) or v != v:
        raise TypeError(f"NaNGuardCallback: {name} must be {'a number' if typ is float else 'an int'}, got {v!r}")
    if v < minimum:
        raise ValueError(f"NaNGuardCallback: {name} must be >= {minimum}, got {v}")
    return typ(v)


class NaNGuardCallback(Callback):
    """Detect, locate and act on non-finite losses/gradients at ~no cost per healthy step (see module docstring).

    Args (keyword-only):
        action: "warn" | "skip" | "stop" (default: ends the run cleanly, keeping the last finite weights) | "raise".
        every_n_steps: check every n-th optimizer step (1 = all). Unchecked steps are not guarded.
        check_loss: include the loss(es) from ``on_before_backward`` in the check.
        check_params: also check the parameters after each checked update (one more reduction and sync per step).
        locate: replay the first bad step of each streak to name the layer (costs nothing on healthy steps).
        max_skips: with action "skip", stop after this many skipped steps in a row.
        alert_every_s, alert_every_n: after the first alert, at most one summary alert per this many seconds or
            this many events.
        amp_min_scale, amp_max_overflows: GradScaler collapse thresholds (see module docstring).
        max_events: how many events ``events`` keeps (the first ones); ``num_events`` counts all.

    Attributes: ``events`` (list[NonFiniteEvent]), ``num_events``, ``skipped_steps``, ``alerts`` (alerts emitted on
    this rank), ``replays`` (replays run). Keys: text ``tscope/nan``, scalar ``tscope/nan/events``.
    """

    def __init__(self, *, action: str = "stop", every_n_steps: int = 1, check_loss: bool = True,
                 check_params: bool = False, locate: bool = True, max_skips: int = 10, alert_every_s: float = 300.0,
                 alert_every_n: int = 100, amp_min_scale: float = 1e-4, amp_max_overflows: int = 16,
                 max_events: int = 1000) -> None:
        if action not in ACTIONS:
            raise ValueError(f"NaNGuardCallback: action must be one of {ACTIONS}, got {action!r}")
        for name, v in (("check_loss", check_loss), ("check_params", check_params), ("locate", locate)):
            if not isinstance(v, bool):
                raise TypeError(f"NaNGuardCallback: {name} must be a bool, got {v!r}")
        self.action, self.check_loss, self.check_params, self.locate = action, check_loss, check_params, locate
        self.every_n_steps = _checked("every_n_steps", every_n_steps, 1)
        self.max_skips = _checked("max_skips", max_skips, 1)
        self.alert_every_s = _checked("alert_every_s", alert_every_s, 0.0, float)
        self.alert_every_n = _checked("alert_every_n", alert_every_n, 1)
        self.amp_min_scale = _checked("amp_min_scale", amp_min_scale, 0.0, float)
        self.amp_max_overflows = _checked("amp_max_overflows", amp_max_overflows, 1)
        self.max_events = _checked("max_events", max_events, 0)
        self._reset()

    def _reset(self) -> None:
        self.events: list[NonFiniteEvent] = []
        self.num_events = self.skipped_steps = self.alerts = self.replays = 0
        self._snaps: list[nl_locate.StepSnapshot] = []
        self._losses: list[torch.Tensor] = []
        self._streak = self._skips_in_row = self._amp_streak = self._suppressed = 0
        self._last_alert = -math.inf
        self._stepped = False
        self._replay_blocker: str | None = None

    # ---------------------------------------------------------------- hooks (each delegates, never raises)
    @override
    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._reset()
        strategy = type(trainer.strategy).__name__
        if not pl_module.automatic_optimization:
            self._replay_blocker = "manual optimization (training_step steps the optimizers itself)"
        elif not (strategy.startswith("SingleDevice") or strategy in ("DDPStrategy", "DDPSpawnStrategy")):
            self._replay_blocker = f"strategy {strategy} (parameters may be sharded)"
        elif trainer.world_size > 1 and any(isinstance(m, torch.nn.SyncBatchNorm) for m in pl_module.modules()):
            self._replay_blocker = "SyncBatchNorm (its forward runs collectives, which a per-rank replay must not)"

    def _due(self, step: int) -> bool:
        return step % self.every_n_steps == 0

    @override
    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any,
                             batch_idx: int) -> None:
        if self.locate and self._replay_blocker is None and self._due(trainer.global_step):
            try:
                with paused():
                    self._snaps.append(nl_locate.StepSnapshot.take(batch, batch_idx))
                del self._snaps[:-256]
            except Exception as e:
                self._internal_error("snapshot", e)

    @override
    def on_before_backward(self, trainer: pl.Trainer, pl_module: pl.LightningModule, loss: torch.Tensor) -> None:
        with paused():  # in a profiled step the guard's own ops are not recorded as the user's
            self._keep_loss(trainer, loss)

    def _keep_loss(self, trainer: pl.Trainer, loss: torch.Tensor) -> None:
        if self._snaps and self._snaps[-1].loss is None:
            self._snaps[-1].loss = loss.detach()
        if self.check_loss and isinstance(loss, torch.Tensor) and self._due(trainer.global_step):
            self._losses.append(loss.detach())

    @override
    def on_before_optimizer_step(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                                 optimizer: torch.optim.Optimizer) -> None:
        with paused():  # check and replay inside a profiled step are not the user's work
            self._check_step(trainer, pl_module, optimizer)

    def _check_step(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                    optimizer: torch.optim.Optimizer) -> None:
        losses, snaps, self._losses, self._snaps = self._losses, self._snaps, [], []
        self._stepped = True
        if not self._due(trainer.global_step):
            return
        params = [p for g in optimizer.param_groups for p in g["params"]]
        total = None
        try:
            total = nl.nonfinite_total([p.grad for p in params if p.grad is not None] + losses)
        except Exception as e:
            self._internal_error("check", e)
        flags = self._gather(trainer, total)  # the step's only host sync
        if all(math.isfinite(v) for v in flags):
            self._streak = self._skips_in_row = self._amp_streak = 0
            return
        try:
            event = self._bad_step(trainer, pl_module, params, flags, losses, snaps)
            if event is not None:
                self._act(trainer, params, event)
        except NonFiniteError:
            raise
        except Exception as e:
            self._internal_error("bad-step handling", e)

    @override
    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        if not (self.check_params and self._stepped):
            return
        self._stepped = False
        with paused():
            self._check_params(trainer, pl_module, batch_idx)

    def _check_params(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch_idx: int) -> None:
        step = trainer.global_step - 1  # the update that just ran
        if not self._due(step):
            return
        named = [(n, p.detach()) for n, p in named_parameters(pl_module)]
        total = None
        try:
            total = nl.nonfinite_total([p for _, p in named])
        except Exception as e:
            self._internal_error("parameter check", e)
        if all(math.isfinite(v) for v in self._gather(trainer, total)):
            return
        try:
            counts = nl.count_nonfinite(named)
            if not counts:
                return
            first = next(iter(counts))
            event = NonFiniteEvent(step=step, epoch=trainer.current_epoch, batch_idx=batch_idx, kind="parameter",
                                   layer=first.rsplit(".", 1)[0] if "." in first else "", parameters=counts,
                                   num_nonfinite=sum(counts.values()), ranks=list(range(trainer.world_size)),
                                   max_abs_grad=nl.max_abs_finite([p for _, p in named]),
                                   note="found after the optimizer step (check_params); layer owns the first "
                                        "non-finite parameter in definition order")
            self._act(trainer, [], event, after_update=True)
        except NonFiniteError:
            raise
        except Exception as e:
            self._internal_error("parameter event", e)

    @override
    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._suppressed:
            self._alert(trainer, "NaN guard summary", f"NaN guard: {self._suppressed} non-finite event(s) since the "
                        f"last alert were not alerted; {self.num_events} event(s) in total this run.")

    # ---------------------------------------------------------------- logic
    def _gather(self, trainer: pl.Trainer, value: torch.Tensor | None) -> list[float]:
        """One float per rank (one sync). Every rank calls this on the same steps (no early return before it), so
        the collective cannot hang."""
        if value is None:
            value = torch.zeros(1, device=trainer.strategy.root_device)
        try:
            dist = torch.distributed
            if trainer.world_size > 1 and dist.is_available() and dist.is_initialized():
                out = [torch.empty_like(value) for _ in range(dist.get_world_size())]
                dist.all_gather(out, value)
                return torch.cat(out).tolist()
            return value.tolist()
        except Exception as e:
            self._internal_error("flag all_gather", e)
            return [0.0]

    def _bad_step(self, trainer: pl.Trainer, pl_module: pl.LightningModule, params: list, flags: list[float],
                  losses: list[torch.Tensor], snaps: list[nl_locate.StepSnapshot]) -> NonFiniteEvent | None:
        rank = trainer.global_rank
        flagged = [r for r, v in enumerate(flags) if not math.isfinite(v)]
        loss_bad = any(not bool(torch.isfinite(x).all()) for x in losses)
        dev = losses[0].device if losses else trainer.strategy.root_device
        scaler = getattr(trainer.precision_plugin, "scaler", None)
        if scaler is not None and not any(self._gather(trainer, torch.tensor([float(loss_bad)], device=dev))):
            if all(bool(torch.isfinite(p.grad).all()) for p in params if p.grad is not None):
                return None  # the norm overflowed on finite values (identical grads on all ranks under DDP)
            return self._amp_overflow(trainer, scaler, flagged)
        try:
            info = self._local_info(trainer, pl_module, params, rank in flagged, losses, snaps, scaler)
        except Exception as e:
            self._internal_error("locate", e)
            info = nl.RankInfo(rank, bad=rank in flagged, note=f"analysis failed: {e}")
        infos = [info]
        if trainer.world_size > 1:
            try:
                infos = [None] * trainer.world_size
                torch.distributed.all_gather_object(infos, info)
            except Exception as e:
                self._internal_error("event all_gather", e)
                infos = [info]
        bad = [i for i in infos if i is not None and i.bad]
        if not bad:  # the sum overflowed on finite values: not an event
            self._streak = self._skips_in_row = 0
            return None
        self._streak += 1
        fields = nl.merge_infos(bad, trainer.world_size)
        if fields["batch_idx"] is None:
            fields["batch_idx"] = trainer.fit_loop.epoch_loop.batch_idx
        return NonFiniteEvent(step=trainer.global_step, epoch=trainer.current_epoch, **fields)

    def _local_info(self, trainer, pl_module, params, flagged, losses, snaps, scaler) -> nl.RankInfo:
        names = {id(p): n for n, p in named_parameters(pl_module)}
        unscale = float(scaler.get_scale()) if scaler is not None else 1.0  # on_before_backward sees the scaled loss
        info = nl.rank_info(trainer.global_rank, [(names.get(id(p), f"param{i}"), p) for i, p in enumerate(params)],
                            flagged, losses, unscale)
        if not (info.bad and self.locate):
            return info
        if self._streak > 0:
            info.note = "not located again: same streak of non-finite steps as the previous event"
        elif self._replay_blocker is not None:
            info.note = f"no replay to locate the layer: {self._replay_blocker}"
        elif not snaps:
            info.note = "no replay to locate the layer: the step's batch was not captured"
        else:
            from lightning.pytorch.utilities.signature_utils import is_param_in_hook_signature

            ts = pl_module.training_step
            with_idx = is_param_in_hook_signature(ts, "batch_idx", min_args=2)
            info.located, n = nl_locate.locate_step(pl_module, (lambda b, i: ts(b, i)) if with_idx else (lambda b, i: ts(b)),
                                          snaps, autocast=trainer.precision_plugin.train_step_context,
                                          scale=scaler.scale if scaler is not None else None)
            self.replays += n
        return info

    def _amp_overflow(self, trainer: pl.Trainer, scaler: Any, flagged: list[int]) -> NonFiniteEvent | None:
        self._amp_streak += 1
        scale = float(scaler.get_scale())
        backoff = float(scaler.get_backoff_factor()) if hasattr(scaler, "get_backoff_factor") else 0.5
        if scale * backoff >= self.amp_min_scale and self._amp_streak < self.amp_max_overflows:
            return None  # an ordinary overflow: the GradScaler skips the step
        self._streak += 1
        return NonFiniteEvent(step=trainer.global_step, epoch=trainer.current_epoch,
                              batch_idx=trainer.fit_loop.epoch_loop.batch_idx, kind="gradient",
                              ranks=flagged or [trainer.global_rank],
                              note=f"AMP loss scale collapsed: {self._amp_streak} overflowing step(s) in a row, "
                                   f"scale {scale:g} -> {scale * backoff:g} (amp_min_scale={self.amp_min_scale:g}, "
                                   f"amp_max_overflows={self.amp_max_overflows}); the GradScaler skips every step.")

    def _act(self, trainer: pl.Trainer, params: list, event: NonFiniteEvent, after_update: bool = False) -> None:
        action = self.action
        if action == "skip" and after_update:
            action, event.note = "stop", (event.note + " An applied update cannot be skipped: stopping.").strip()
        if action in ("skip", "stop"):
            for p in params:
                p.grad = None
        if action == "skip":
            self.skipped_steps += 1
            self._skips_in_row += 1
            event.action = f"update skipped ({self._skips_in_row} in a row, max_skips={self.max_skips})"
            if self._skips_in_row >= self.max_skips:
                trainer.should_stop = True
                event.action += "; max_skips reached: stopping the run"
        elif action == "stop":
            trainer.should_stop = True
            event.action = "stopping the run" + ("" if after_update else " (this update was dropped)")
        elif action == "raise":
            event.action = "raising NonFiniteError"
        else:
            event.action = "warn only (the update is applied)"
        self._record(trainer, event)
        if action == "raise":
            raise NonFiniteError(event)

    def _record(self, trainer: pl.Trainer, event: NonFiniteEvent) -> None:
        self.num_events += 1
        if len(self.events) < self.max_events:
            self.events.append(event)
        if trainer.is_global_zero:
            for lg in trainer.loggers:
                try:
                    lg.log_metrics({"tscope/nan/events": float(self.num_events)}, step=trainer.global_step)
                except Exception as e:
                    self._internal_error("metric", e)
        now = time.monotonic()
        if self.num_events > 1 and self._suppressed + 1 < self.alert_every_n and now - self._last_alert < \
                self.alert_every_s:
            self._suppressed += 1
            _log.debug("%s", event)
            return
        text = str(event)
        if self._suppressed:
            text += f" ({self._suppressed} event(s) since the last alert were not alerted; {self.num_events} in total.)"
        self._suppressed, self._last_alert = 0, now
        self._alert(trainer, f"Non-finite {event.kind} at step {event.step}", text)

    def _alert(self, trainer: pl.Trainer, title: str, text: str) -> None:
        if not trainer.is_global_zero:
            return
        self.alerts += 1
        _log.warning("%s", text)
        from lightning.pytorch.loggers import TensorBoardLogger, WandbLogger
        for lg in trainer.loggers:
            try:
                if isinstance(lg, TensorBoardLogger):
                    lg.experiment.add_text("tscope/nan", text, global_step=trainer.global_step)
                elif isinstance(lg, WandbLogger):
                    import wandb

                    lg.experiment.alert(title=title, text=text, level=wandb.AlertLevel.WARN,
                                        wait_duration=self.alert_every_s)
            except Exception as e:  # W&B offline runs may not support alerts
                self._internal_error(f"alert to {type(lg).__name__}", e)

    def _internal_error(self, where: str, e: BaseException) -> None:
        _log.warning("NaN guard: internal error in %s (training continues): %s: %s", where, type(e).__name__, e)
