"""The NaN guard's per-step work: the deferred (sync-free) and immediate flag paths, the bad-step analysis across
ranks and the parameter check. Functions of the guard (:class:`~.nan_guard.NaNGuardCallback`); see its module
docstring for what each path guarantees."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import torch

from tscope_callbacks.analysis import nonfinite as nl
from tscope_callbacks.analysis.grad_history import owner, step_loss
from tscope_callbacks.analysis.nonfinite import NonFiniteEvent
from tscope_callbacks.callbacks.session import gather_floats, gather_objects
from tscope_callbacks.capture import locate as nl_locate
from tscope_callbacks.capture.paths import named_parameters

if TYPE_CHECKING:
    from tscope_callbacks.callbacks.nan_guard import NaNGuardCallback

__all__ = ["push_deferred", "check_now", "deferred_event", "check_params", "learning_rate"]


def learning_rate(optimizer: Any) -> float | None:
    """The learning rate of ``optimizer``'s first param group, read without a host sync: a Python number, or a
    tensor on the CPU (a ``capturable`` optimizer's CUDA-tensor rate is not read: None)."""
    try:
        lr = optimizer.param_groups[0].get("lr")
    except (AttributeError, IndexError, TypeError):
        return None
    if isinstance(lr, torch.Tensor):
        return float(lr) if lr.device.type == "cpu" and lr.numel() == 1 else None
    return float(lr) if isinstance(lr, (int, float)) and not isinstance(lr, bool) else None


def _loss_scalars(losses: list, device: Any) -> list[torch.Tensor]:
    """Each loss summed to one float32 scalar on ``device``, without a sync (they ride in the flag vector read for the
    step: the history's losses). A float32 scalar there already (the usual loss) is taken as it is: no op."""
    return [(x.detach() if x.requires_grad else x) if x.dtype == torch.float32 and x.dim() == 0 and x.device == device
            else x.detach().float().sum().to(device) for x in losses]


def _loss_values(losses: list, device: Any) -> torch.Tensor | None:
    """:func:`_loss_scalars` stacked; None without losses."""
    return torch.stack(_loss_scalars(losses, device)) if losses else None


def _all_reduce_max(trainer: Any, t: torch.Tensor) -> None:
    """In place, on the device (NCCL: stream-ordered, no host sync), so every rank masks and reads the same flag."""
    dist = torch.distributed
    if trainer.world_size > 1 and dist.is_available() and dist.is_initialized():
        dist.all_reduce(t, op=dist.ReduceOp.MAX)


def push_deferred(guard: NaNGuardCallback, trainer: Any, optimizer: Any, params: list, losses: list,
                  snaps: list) -> None:
    """Flag the step on the device, mask the update there when the action drops it, queue the flag for a late read.

    Queued vector: [any rank bad (0/1), this rank's total norm, per-gradient norms..., per-loss values...]."""
    # local shards under FSDP2/TP (the flag is all-reduced below), and their names for the payload, in one pass
    grads, names = _grads_and_names(guard, trainer.lightning_module, params)
    norms = nl.per_tensor_norms(grads)
    dev = norms.device if norms is not None else (losses[0].device if losses else trainer.strategy.root_device)
    loss_vals = _loss_values(losses, dev)
    parts = [t for t in (norms, loss_vals) if t is not None]
    local = torch.cat(parts).sum().reshape(1) if parts else torch.zeros(1, device=dev)
    bad = (~torch.isfinite(local)).float()
    _all_reduce_max(trainer, bad)
    if guard.action != "warn":
        if guard.action in ("stop", "raise"):  # sticky: from the bad step on, no update applies until the stop
            guard._sticky = bad.clone() if guard._sticky is None else torch.maximum(guard._sticky, bad)
            optimizer.found_inf = guard._sticky.reshape(())
        else:
            optimizer.found_inf = bad.reshape(())
    vec = torch.cat([bad, local] + parts)
    payload = {"snaps": snaps, "grad_names": names,
               "n_losses": len(losses), "epoch": trainer.current_epoch, "lr": guard._lr,
               "batch_idx": trainer.fit_loop.epoch_loop.batch_idx}
    guard._channel.push(trainer.global_step, vec, payload)


def _grads_and_names(guard: NaNGuardCallback, module: Any, params: list) -> tuple[list, list[str]]:
    """The local gradients of ``params`` that exist (``nl.grads_of``) and their parameters' names, in one pass that
    reads each ``.grad`` once; the name map is rebuilt only when the parameters change."""
    key = tuple(map(id, params))
    cached = guard._names
    if cached is None or cached[0] != key:
        by_id = {id(p): n for n, p in named_parameters(module)}
        cached = guard._names = (key, [by_id.get(id(p), "?") for p in params])
    grads, names = [], []
    for p, n in zip(params, cached[1]):
        g = p.grad
        if g is not None:
            grads.append(g if type(g) is torch.Tensor else nl.local(g))
            names.append(n)
    return grads, names


def _locate(guard: NaNGuardCallback, trainer: Any, pl_module: Any, snaps: list, scaler: Any) -> tuple[Any, str]:
    """(LocateResult or None, note) for this rank."""
    if guard._streak > 0:
        return None, "not located again: same streak of non-finite steps as the previous event"
    if guard._replay_blocker is not None:
        return None, f"no replay to locate the layer: {guard._replay_blocker}"
    if not snaps:
        return None, "no replay to locate the layer: the step's batch was not captured"
    from lightning.pytorch.utilities.signature_utils import is_param_in_hook_signature

    ts = pl_module.training_step
    with_idx = is_param_in_hook_signature(ts, "batch_idx", min_args=2)
    res, n = nl_locate.locate_step(pl_module, (lambda b, i: ts(b, i)) if with_idx else (lambda b, i: ts(b)), snaps,
                                   autocast=trainer.precision_plugin.train_step_context,
                                   scale=scaler.scale if scaler is not None else None)
    guard.replays += n
    return res, ""


def _merge(guard: NaNGuardCallback, trainer: Any, info: nl.RankInfo, step: int, epoch: int,
           batch_idx: int) -> NonFiniteEvent | None:
    try:
        infos = gather_objects(trainer, info)
    except Exception as e:
        guard.faults.report("event all_gather", e)
        infos = [info]
    bad = [i for i in infos if i is not None and i.bad]
    if not bad:  # the norm overflowed on finite values: not an event
        guard._streak = guard._skips_in_row = 0
        return None
    guard._streak += 1
    fields = nl.merge_infos(bad, trainer.world_size)
    if fields["batch_idx"] is None:
        fields["batch_idx"] = batch_idx
    return NonFiniteEvent(step=step, epoch=epoch, **fields)


def deferred_event(guard: NaNGuardCallback, trainer: Any, pl_module: Any, step: int, values: list[float],
                   payload: dict) -> NonFiniteEvent | None:
    """The event of a bad step whose flag was read late. Every rank calls it at the same step (collectives)."""
    names = payload["grad_names"]
    norms = values[2:2 + len(names)]
    loss_vals = values[2 + len(names):]
    local_bad = not math.isfinite(values[1])
    info = nl.RankInfo(trainer.global_rank, bad=local_bad)
    if local_bad:
        info.parameters = {n: -1 for n, v in zip(names, norms) if not math.isfinite(v)}
        bad_losses = [v for v in loss_vals if not math.isfinite(v)]
        info.loss_bad = bool(bad_losses)
        info.loss = bad_losses[0] if bad_losses else (loss_vals[-1] if loss_vals else None)
        if guard.locate:
            try:
                info.located, info.note = _locate(guard, trainer, pl_module, payload["snaps"], None)
            except Exception as e:
                guard.faults.report("locate", e)
                info.note = f"analysis failed: {e}"
            loc = info.located
            if loc is not None and loc.reproduced and loc.parameters:
                info.parameters = dict(loc.parameters)  # exact counts from the replayed gradients
        if guard.action in ("skip", "warn"):
            info.note = (info.note + " Read late: a later update may have applied before the replay.").strip()
    return _merge(guard, trainer, info, step, payload["epoch"], payload["batch_idx"])


def check_now(guard: NaNGuardCallback, trainer: Any, pl_module: Any, params: list, losses: list, snaps: list,
              scaler: Any) -> None:
    """The immediate path: read the flag at the step (one host sync) and act on it."""
    vec = norms = None
    names: list[str] = []
    try:
        grads, names = _grads_and_names(guard, pl_module, params)
        loss_ts = [nl.local(x) for x in losses]
        if guard.grad_norms and scaler is None and grads:  # per-gradient norms and the losses: one fused norm, one
            norms = nl.tensor_norms(grads)                   # stack, one read
            vec = torch.stack(norms + _loss_scalars(loss_ts, norms[0].device))
        else:
            vec = nl.nonfinite_total(grads + loss_ts)
    except Exception as e:
        guard.faults.report("check", e)
    values = nl.read_now(vec) if vec is not None else [0.0]  # the one read of this step, norms included
    guard.host_syncs += 1
    # the flag: the sum on the host (NaN or inf iff some norm or loss is; float64, so finite norms do not overflow)
    flags = [row[0] for row in gather_floats(trainer, [sum(values)])]
    if all(math.isfinite(v) for v in flags):
        guard._streak = guard._skips_in_row = guard._amp_streak = 0
        if norms is not None:  # [per-gradient norms..., per-loss values...], read together
            guard._healthy(trainer, trainer.global_step, names, values[:len(names)], step_loss(values[len(names):]),
                           guard._lr)
        return
    try:
        event = _bad_step(guard, trainer, pl_module, params, flags, losses, snaps, scaler)
        if event is not None:
            guard._act(trainer, params, event)
    except nl.NonFiniteError:
        raise
    except Exception as e:
        guard.faults.report("bad-step handling", e)


def _bad_step(guard: NaNGuardCallback, trainer: Any, pl_module: Any, params: list, flags: list[float],
              losses: list, snaps: list, scaler: Any) -> NonFiniteEvent | None:
    rank = trainer.global_rank
    flagged = [r for r, v in enumerate(flags) if not math.isfinite(v)]
    loss_bad = any(not bool(torch.isfinite(x).all()) for x in losses)
    if scaler is not None and not any(row[0] for row in gather_floats(trainer, [float(loss_bad)])):
        if all(bool(torch.isfinite(g).all()) for g in nl.grads_of(params)):
            return None  # the norm overflowed on finite values (identical grads on all ranks under DDP)
        return _amp_overflow(guard, trainer, scaler, flagged)
    try:
        names = {id(p): n for n, p in named_parameters(pl_module)}
        unscale = float(scaler.get_scale()) if scaler is not None else 1.0  # on_before_backward saw the scaled loss
        info = nl.rank_info(rank, [(names.get(id(p), f"param{i}"), p) for i, p in enumerate(params)],
                            rank in flagged, losses, unscale)
        if info.bad and guard.locate:
            info.located, note = _locate(guard, trainer, pl_module, snaps, scaler)
            info.note = note or info.note
    except Exception as e:
        guard.faults.report("locate", e)
        info = nl.RankInfo(rank, bad=rank in flagged, note=f"analysis failed: {e}")
    return _merge(guard, trainer, info, trainer.global_step, trainer.current_epoch,
                  trainer.fit_loop.epoch_loop.batch_idx)


def _amp_overflow(guard: NaNGuardCallback, trainer: Any, scaler: Any, flagged: list[int]) -> NonFiniteEvent | None:
    guard._amp_streak += 1
    scale = float(scaler.get_scale())
    backoff = float(scaler.get_backoff_factor()) if hasattr(scaler, "get_backoff_factor") else 0.5
    if scale * backoff >= guard.amp_min_scale and guard._amp_streak < guard.amp_max_overflows:
        return None  # an ordinary overflow: the GradScaler skips the step
    guard._streak += 1
    return NonFiniteEvent(step=trainer.global_step, epoch=trainer.current_epoch,
                          batch_idx=trainer.fit_loop.epoch_loop.batch_idx, kind="gradient",
                          ranks=flagged or [trainer.global_rank],
                          note=f"AMP loss scale collapsed: {guard._amp_streak} overflowing step(s) in a row, "
                               f"scale {scale:g} -> {scale * backoff:g} (amp_min_scale={guard.amp_min_scale:g}, "
                               f"amp_max_overflows={guard.amp_max_overflows}); the GradScaler skips every step.")


def check_params(guard: NaNGuardCallback, trainer: Any, pl_module: Any, batch_idx: int) -> None:
    """After the update (``check_params=True``): non-finite parameters, read at the step (it cannot be undone)."""
    step = trainer.global_step - 1  # the update that just ran
    if not guard._due(step):
        return
    named = [(n, nl.local(p.detach())) for n, p in named_parameters(pl_module)]
    total = None
    try:
        total = nl.nonfinite_total([p for _, p in named])
    except Exception as e:
        guard.faults.report("parameter check", e)
    value = nl.read_now(total)[0] if total is not None else 0.0
    guard.host_syncs += 1
    if all(math.isfinite(row[0]) for row in gather_floats(trainer, [value])):
        return
    try:
        counts = nl.count_nonfinite(named)
        if not counts:
            return
        first = next(iter(counts))
        event = NonFiniteEvent(step=step, epoch=trainer.current_epoch, batch_idx=batch_idx, kind="parameter",
                               layer=owner(first), parameters=counts,
                               num_nonfinite=sum(counts.values()), ranks=list(range(trainer.world_size)),
                               max_abs_grad=nl.max_abs_finite([p for _, p in named]), counts="parameters",
                               note="found after the optimizer step (check_params); layer owns the first "
                                    "non-finite parameter in definition order")
        guard._act(trainer, [], event, after_update=True)
    except nl.NonFiniteError:
        raise
    except Exception as e:
        guard.faults.report("parameter event", e)
