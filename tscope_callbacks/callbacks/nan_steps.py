"""The NaN guard's per-fit state (:class:`GuardState`) and its per-step work: the deferred (sync-free) and immediate
flag paths, the bad-step analysis across ranks and the parameter check. The functions take the guard's options
(:class:`GuardOptions`: what they read of the ``NaNGuardCallback``, its public options and ``faults``) and its state;
they return what the guard acts on (a :class:`~tscope_callbacks.analysis.nonfinite.NonFiniteEvent`, or a healthy step's norms) and never
touch the guard's own members. See the guard's module docstring for what each path guarantees."""

from __future__ import annotations

import itertools
import math
import operator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

import torch

from tscope_callbacks.analysis import nonfinite as nl
from tscope_callbacks.analysis.grad_history import GradHistory, owner, step_loss
from tscope_callbacks.analysis.nonfinite import NonFiniteEvent
from tscope_callbacks.callbacks.context import gather_floats, gather_objects
from tscope_callbacks.capture import locate as nl_locate
from tscope_callbacks.capture.faults import Faults
from tscope_callbacks.capture.paths import named_parameters

if TYPE_CHECKING:
    from tscope_callbacks.callbacks.options import NaNGuardOptions

__all__ = ["GuardOptions", "GuardState", "Healthy", "push_deferred", "check_now", "deferred_event", "check_params", "learning_rate",
           "params_of", "step_params", "fit_state", "progress_trackers"]


class GuardOptions(Protocol):
    """What the steps read of the guard (``NaNGuardCallback``'s public options, see its docstring, and its fault
    log): the guard module imports this one, never the other way round."""

    action: str
    locate: bool
    sync: bool | None
    grad_norms: bool
    options: NaNGuardOptions  #: thresholds and limits (amp_min_scale, amp_max_overflows, spike_factor, history...)
    every_n_steps: int
    faults: Faults


@dataclass(eq=False, slots=True)
class GuardState:
    """Everything the NaN guard keeps over one fit (a new one at each fit's start). The per-fit caches are read from
    the trainer once, in ``on_fit_start``: a healthy step reads no Lightning property but ``global_step``."""

    history: GradHistory
    channel: nl.FlagChannel = field(default_factory=lambda: nl.FlagChannel(lag=2))
    mode: str = "immediate"  #: "deferred" | "immediate"
    snaps: list[nl_locate.StepSnapshot] = field(default_factory=list)  #: this step's micro-batches, for a replay
    losses: list[torch.Tensor] = field(default_factory=list)  #: this step's losses (detached), for the check
    lr: float | None = None  #: the checked step's learning rate (first param group), for the history
    streak: int = 0  #: bad steps in a row (the first of a streak is located)
    skips_in_row: int = 0
    amp_streak: int = 0  #: GradScaler overflows in a row
    stepped: bool = False  #: an optimizer step ran in this batch (the parameter check follows it)
    replay_blocker: str | None = None  #: why a bad step cannot be replayed in this fit (None: it can)
    sticky: torch.Tensor | None = None  #: the deferred "stop"/"raise" mask, set from the bad step on
    replays: int = 0
    host_syncs: int = 0
    # ---- per-fit caches
    snapshot: bool = True  #: take a step snapshot (locate on and nothing blocks a replay)
    scaler: Any = None  #: the precision plugin's GradScaler (fp16), or None
    world_size: int = 1
    log_every: int = 50  #: Lightning's log_every_n_steps
    log_norms: bool = False  #: the norms go to the run's loggers (rank zero, with loggers)
    masked: list[Any] = field(default_factory=list)  #: optimizers given a ``found_inf`` mask (removed at batch end)
    #: ``.completed`` is ``trainer.global_step`` / ``trainer.current_epoch`` (:func:`progress_trackers`)
    step: Any = None
    epoch: Any = None
    batch_idx: int = 0  #: the batch's index in its epoch (from on_train_batch_start)
    #: (the optimizer, its param_groups' lists and their lengths), its flat parameter list and their names
    params: list[torch.nn.Parameter] = field(default_factory=list)  #: the optimizer's, in group order
    names: list[str] = field(default_factory=list)  #: their names (clean paths; "?" for one the module lacks)
    plain_grads: bool = False  #: ``params``' gradients were plain tensors (no DTensor shards to take)
    #: one param group: the optimizer's own list (the same object at every step, read live) and the steps until its
    #: parameters are next compared one by one with ``params`` (:func:`step_params`)
    source: list | None = None
    recheck: int = 0
    #: healthy steps (step, names, norms, loss, lr) not yet in ``history`` (the guard's ``_healthy``)
    pending: list[tuple] = field(default_factory=list)
    trainer: Any = None  #: this fit's trainer (a read of the history flushes ``pending`` through its sinks)


def fit_state(guard: GuardOptions, trainer: Any, pl_module: Any) -> GuardState:
    """A fit's state: how flags reach the host, whether a bad step can be replayed, and the trainer's settings a
    healthy step needs, read once here (a healthy step then reads no Lightning property)."""
    st = GuardState(GradHistory(guard.options.history, guard.options.spike_factor))
    cuda = trainer.strategy.root_device.type == "cuda"
    st.mode = "deferred" if (guard.sync is False or (guard.sync is None and cuda)) else "immediate"
    st.channel.lag = 2 if cuda else 1
    st.scaler = getattr(trainer.precision_plugin, "scaler", None)
    st.world_size = trainer.world_size
    st.log_every = max(1, int(getattr(trainer, "log_every_n_steps", 50) or 1))
    st.log_norms = bool(trainer.is_global_zero and trainer.loggers)
    st.step, st.epoch = progress_trackers(trainer, pl_module)
    strategy = type(trainer.strategy).__name__
    if not pl_module.automatic_optimization:
        st.replay_blocker = "manual optimization (training_step steps the optimizers itself)"
    elif "FSDP" in strategy or "ModelParallel" in strategy or "DeepSpeed" in strategy:
        st.replay_blocker = (f"{strategy}: parameters are sharded, so a replay's forward runs all-gathers that "
                             "every rank would have to join; the event names the gradients and ranks instead")
    elif not (strategy.startswith("SingleDevice") or strategy in ("DDPStrategy", "DDPSpawnStrategy")):
        st.replay_blocker = f"strategy {strategy} (parameters may be sharded)"
    elif st.world_size > 1 and any(isinstance(m, torch.nn.SyncBatchNorm) for m in pl_module.modules()):
        st.replay_blocker = "SyncBatchNorm (its forward runs collectives, which a per-rank replay must not)"
    st.snapshot = guard.locate and st.replay_blocker is None
    st.trainer = trainer
    return st


class Healthy(NamedTuple):
    """A healthy checked step, for the history: its gradients' names and norms, loss and learning rate."""

    step: int
    names: list[str]
    norms: list[float]
    loss: float | None
    lr: float | None


def learning_rate(optimizer: Any) -> float | None:
    """The learning rate of ``optimizer``'s first param group, read without a host sync: a Python number, or a
    tensor on the CPU (a ``capturable`` optimizer's CUDA-tensor rate is not read: None)."""
    try:
        lr = optimizer.param_groups[0].get("lr")
    except (AttributeError, IndexError, TypeError):
        return None
    if type(lr) is float:
        return lr
    if isinstance(lr, torch.Tensor):
        return float(lr) if lr.device.type == "cpu" and lr.numel() == 1 else None
    return float(lr) if isinstance(lr, (int, float)) and not isinstance(lr, bool) else None


_PLAIN = {torch.Tensor}
_GRAD = operator.attrgetter("grad")
_NONES = itertools.repeat(None)


class TrainerCounter:
    """Where Lightning keeps a counter elsewhere: ``completed`` reads the trainer's property."""

    __slots__ = ("trainer", "name")

    def __init__(self, trainer: Any, name: str) -> None:
        self.trainer, self.name = trainer, name

    @property
    def completed(self) -> int:
        return getattr(self.trainer, self.name)


def progress_trackers(trainer: Any, pl_module: Any) -> tuple[Any, Any]:
    """Two objects whose ``completed`` is ``trainer.global_step`` and ``trainer.current_epoch``: Lightning's progress
    trackers those properties end at (updated in place, also when a checkpoint is restored), read in one attribute
    load instead of a chain of about ten properties and attributes per read. Checked against the properties here;
    where they disagree (another Lightning version), adapters that read the properties."""
    step: Any = TrainerCounter(trainer, "global_step")
    epoch: Any = TrainerCounter(trainer, "current_epoch")
    try:
        loop = trainer.fit_loop.epoch_loop
        total = (loop.automatic_optimization.optim_progress.optimizer.step.total if pl_module.automatic_optimization
                 else loop.manual_optimization.optim_step_progress.total)
        if type(total.completed) is int and total.completed == trainer.global_step:
            step = total
        current = trainer.fit_loop.epoch_progress.current
        if type(current.completed) is int and current.completed == trainer.current_epoch:
            epoch = current
    except Exception:  # the adapters read the properties
        pass
    return step, epoch


def params_of(st: GuardState, optimizer: Any) -> list[torch.nn.Parameter]:
    """The optimizer's parameters in group order (read every step: a group added, or a parameter replaced, is
    seen); the list of the step before when they are the same objects (its names stay valid)."""
    groups = optimizer.param_groups
    # one group (the usual case): its list compared in place, no new list unless it changed
    params = groups[0]["params"] if len(groups) == 1 else [p for g in groups for p in g["params"]]
    if len(params) == len(st.params) and all(map(operator.is_, params, st.params)):
        return st.params
    params = list(params)
    st.params, st.names, st.plain_grads, st.recheck = params, [], False, 0
    return params


IDENTITY_EVERY = 16  #: the optimizer's parameters are compared one by one with the cached list every this many steps


def step_params(st: GuardState, optimizer: Any) -> list[torch.nn.Parameter]:
    """:func:`params_of`, with the first group's learning rate put in ``st.lr`` (:func:`learning_rate`): the param
    groups read once per checked step. With one param group whose list is the same object as at the last step and as
    long, that list is returned as it is (the gradients are read from the optimizer's own list, so a parameter
    replaced in it is checked at once) and compared one by one with the cached one only every
    :data:`IDENTITY_EVERY` steps (until then a replaced parameter's norm may be logged under the old name)."""
    try:
        groups = optimizer.param_groups
        g0 = groups[0]
        lr = g0["lr"]
        params = g0["params"] if len(groups) == 1 else [p for g in groups for p in g["params"]]
    except (AttributeError, IndexError, KeyError, TypeError):  # no groups, or no rate: the general readers
        st.lr = learning_rate(optimizer)
        return params_of(st, optimizer)
    st.lr = lr if type(lr) is float else learning_rate(optimizer)
    if params is st.source and len(params) == len(st.params):
        st.recheck -= 1
        if st.recheck > 0:
            return params
    cached = st.params
    if len(params) == len(cached) and all(map(operator.is_, params, cached)):
        st.source, st.recheck = (params if len(groups) == 1 else None), IDENTITY_EVERY
        return params if len(groups) == 1 else cached
    return params_of(st, optimizer)


def _loss_scalars(losses: list, device: Any) -> list[torch.Tensor]:
    """Each loss as one float32 scalar on ``device`` (``nonfinite.loss_scalar``, detached: this path runs outside
    no-grad), without a sync (they ride in the flag vector read for the step: the history's losses)."""
    return [nl.loss_scalar(x, device, detach=True) for x in losses]


def _loss_values(losses: list, device: Any) -> torch.Tensor | None:
    """:func:`_loss_scalars` stacked; None without losses."""
    return torch.stack(_loss_scalars(losses, device)) if losses else None


def _all_reduce_max(st: GuardState, t: torch.Tensor) -> None:
    """In place, on the device (NCCL: stream-ordered, no host sync), so every rank masks and reads the same flag."""
    dist = torch.distributed
    if st.world_size > 1 and dist.is_available() and dist.is_initialized():
        dist.all_reduce(t, op=dist.ReduceOp.MAX)


def push_deferred(guard: GuardOptions, st: GuardState, trainer: Any, pl_module: Any, optimizer: Any,
                  params: list, losses: list, snaps: list) -> None:
    """Flag the step on the device, mask the update there when the action drops it, queue the flag for a late read.

    Queued vector: [any rank bad (0/1), this rank's total norm, per-gradient norms..., per-loss values...]."""
    # local shards under FSDP2/TP (the flag is all-reduced below), and their names for the payload, in one pass
    grads, names = _grads_and_names(st, pl_module, params)
    norms = nl.per_tensor_norms(grads)
    dev = norms.device if norms is not None else (losses[0].device if losses else trainer.strategy.root_device)
    loss_vals = _loss_values(losses, dev)
    parts = [t for t in (norms, loss_vals) if t is not None]
    local = torch.cat(parts).sum().reshape(1) if parts else torch.zeros(1, device=dev)
    bad = (~torch.isfinite(local)).float()
    _all_reduce_max(st, bad)
    if guard.action != "warn":
        if guard.action in ("stop", "raise"):  # sticky: from the bad step on, no update applies until the stop
            st.sticky = bad.clone() if st.sticky is None else torch.maximum(st.sticky, bad)
            optimizer.found_inf = st.sticky.reshape(())
        else:
            optimizer.found_inf = bad.reshape(())
        st.masked.append(optimizer)
    vec = torch.cat([bad, local] + parts)
    payload = {"snaps": snaps, "grad_names": names,
               "n_losses": len(losses), "epoch": st.epoch.completed, "lr": st.lr, "batch_idx": st.batch_idx}
    st.channel.push(st.step.completed, vec, payload)


def _grads_and_names(st: GuardState, module: Any, params: list) -> tuple[list, list[str]]:
    """The local gradients of ``params`` that exist (``nl.grads_of``) and their parameters' names, in one pass that
    reads each ``.grad`` once; the names are looked up once per parameter list (:func:`params_of`)."""
    cached = params is st.params or params is st.source  # the source: the same parameters (step_params)
    if not cached or len(st.names) != len(params):
        by_id = {id(p): n for n, p in named_parameters(module)}
        names = [by_id.get(id(p), "?") for p in params]
        if cached:
            st.names = names
    else:
        names = st.names
    grads = [g for p in params if (g := p.grad) is not None]
    if len(grads) != len(params):  # some parameters have no gradient: their names go too
        names = [n for p, n in zip(params, names) if p.grad is not None]
    if set(map(type, grads)) <= _PLAIN:  # DTensor gradients (FSDP2/TP) are a subclass: their local shards
        # this parameter list's gradients are plain tensors (a parameter's gradient type does not change)
        st.plain_grads = bool(grads) and cached
        return grads, names
    st.plain_grads = False
    return [nl.local(g) for g in grads], names


def _locate(guard: GuardOptions, st: GuardState, trainer: Any, pl_module: Any, snaps: list,
            scaler: Any) -> tuple[Any, str]:
    """(LocateResult or None, note) for this rank."""
    if st.streak > 0:
        return None, "not located again: same streak of non-finite steps as the previous event"
    if st.replay_blocker is not None:
        return None, f"no replay to locate the layer: {st.replay_blocker}"
    if not snaps:
        return None, "no replay to locate the layer: the step's batch was not captured"
    from lightning.pytorch.utilities.signature_utils import is_param_in_hook_signature

    ts = pl_module.training_step
    with_idx = is_param_in_hook_signature(ts, "batch_idx", min_args=2)
    res, n = nl_locate.locate_step(pl_module, (lambda b, i: ts(b, i)) if with_idx else (lambda b, i: ts(b)), snaps,
                                   autocast=trainer.precision_plugin.train_step_context,
                                   scale=scaler.scale if scaler is not None else None)
    st.replays += n
    return res, ""


def _merge(guard: GuardOptions, st: GuardState, trainer: Any, info: nl.RankInfo, step: int, epoch: int,
           batch_idx: int) -> NonFiniteEvent | None:
    try:
        infos = gather_objects(trainer, info)
    except Exception as e:
        guard.faults.report("event all_gather", e)
        infos = [info]
    bad = [i for i in infos if i is not None and i.bad]
    if not bad:  # the norm overflowed on finite values: not an event
        st.streak = st.skips_in_row = 0
        return None
    st.streak += 1
    fields = nl.merge_infos(bad, trainer.world_size)
    if fields["batch_idx"] is None:
        fields["batch_idx"] = batch_idx
    return NonFiniteEvent(step=step, epoch=epoch, **fields)


def deferred_event(guard: GuardOptions, st: GuardState, trainer: Any, pl_module: Any, step: int,
                   values: list[float], payload: dict) -> NonFiniteEvent | None:
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
                info.located, info.note = _locate(guard, st, trainer, pl_module, payload["snaps"], None)
            except Exception as e:
                guard.faults.report("locate", e)
                info.note = f"analysis failed: {e}"
            loc = info.located
            if loc is not None and loc.reproduced and loc.parameters:
                info.parameters = dict(loc.parameters)  # exact counts from the replayed gradients
        if guard.action in ("skip", "warn"):
            info.note = (info.note + " Read late: a later update may have applied before the replay.").strip()
    return _merge(guard, st, trainer, info, step, payload["epoch"], payload["batch_idx"])


def check_now(guard: GuardOptions, st: GuardState, trainer: Any, pl_module: Any, params: list, losses: list,
              snaps: list, scaler: Any) -> Healthy | NonFiniteEvent | None:
    """The immediate path: read the flag at the step (one host sync). Returns the healthy step's norms (with
    ``grad_norms``), the bad step's event, or None (nothing to record)."""
    vec = None
    names: list[str] = []
    with_norms = False
    try:
        if ((params is st.params or params is st.source) and st.plain_grads
                and len(st.names) == len(params)):  # the usual step: plain tensors
            names = st.names
            grads = list(map(_GRAD, params))  # each .grad read once, in C
            if any(map(operator.is_, grads, _NONES)):  # some parameters have no gradient: they and their names go
                names = [n for g, n in zip(grads, names) if g is not None]
                grads = [g for g in grads if g is not None]
        else:
            grads, names = _grads_and_names(st, pl_module, params)
        # the losses as on_before_backward handed them (not detached there: no op), read under no-grad (a torch
        # optimizer runs this hook inside its closure's enable_grad)
        loss_ts = (losses if not losses or (len(losses) == 1 and type(losses[0]) is torch.Tensor)
                   else [nl.local(x) for x in losses])
        grad_mode = torch.is_grad_enabled()
        if grad_mode:
            torch._C._set_grad_enabled(False)
        try:
            if guard.grad_norms and scaler is None and grads:  # the per-gradient norms and the losses: one fused
                vec = nl.norm_vector(grads, loss_ts)             # norm (one _foreach_norm, one stack), one read
                with_norms = True
            else:
                vec = nl.nonfinite_total(grads + loss_ts)
        finally:
            if grad_mode:
                torch._C._set_grad_enabled(True)
    except Exception as e:
        guard.faults.report("check", e)
    values = nl.read_now(vec) if vec is not None else [0.0]  # the one read of this step, norms included
    st.host_syncs += 1
    # the flag: the sum on the host (NaN or inf iff some norm or loss is; float64, so finite norms do not overflow)
    total = sum(values)
    flags = [total] if st.world_size == 1 else [row[0] for row in gather_floats(trainer, [total])]
    if math.isfinite(total) if st.world_size == 1 else all(math.isfinite(v) for v in flags):
        st.streak = st.skips_in_row = st.amp_streak = 0
        if with_norms:  # [per-gradient norms..., per-loss values...], read together
            n = len(names)
            k = len(values) - n  # the losses' values follow the norms (one: taken off in place, no copies)
            if k == 1:
                loss = values.pop()
                return Healthy(st.step.completed, names, values, loss, st.lr)
            if k == 0:
                return Healthy(st.step.completed, names, values, None, st.lr)
            return Healthy(st.step.completed, names, values[:n], step_loss(values[n:]), st.lr)
        return None
    try:
        return _bad_step(guard, st, trainer, pl_module, params, flags, losses, snaps, scaler)
    except Exception as e:
        guard.faults.report("bad-step handling", e)
        return None


def _bad_step(guard: GuardOptions, st: GuardState, trainer: Any, pl_module: Any, params: list,
              flags: list[float], losses: list, snaps: list, scaler: Any) -> NonFiniteEvent | None:
    rank = trainer.global_rank
    flagged = [r for r, v in enumerate(flags) if not math.isfinite(v)]
    loss_bad = any(not bool(torch.isfinite(x).all()) for x in losses)
    if scaler is not None and not any(row[0] for row in gather_floats(trainer, [float(loss_bad)])):
        if all(bool(torch.isfinite(g).all()) for g in nl.grads_of(params)):
            return None  # the norm overflowed on finite values (identical grads on all ranks under DDP)
        return _amp_overflow(guard, st, trainer, scaler, flagged)
    try:
        names = {id(p): n for n, p in named_parameters(pl_module)}
        unscale = float(scaler.get_scale()) if scaler is not None else 1.0  # on_before_backward saw the scaled loss
        info = nl.rank_info(rank, [(names.get(id(p), f"param{i}"), p) for i, p in enumerate(params)],
                            rank in flagged, losses, unscale)
        if info.bad and guard.locate:
            info.located, note = _locate(guard, st, trainer, pl_module, snaps, scaler)
            info.note = note or info.note
    except Exception as e:
        guard.faults.report("locate", e)
        info = nl.RankInfo(rank, bad=rank in flagged, note=f"analysis failed: {e}")
    return _merge(guard, st, trainer, info, trainer.global_step, trainer.current_epoch,
                  trainer.fit_loop.epoch_loop.batch_idx)


def _amp_overflow(guard: GuardOptions, st: GuardState, trainer: Any, scaler: Any,
                  flagged: list[int]) -> NonFiniteEvent | None:
    st.amp_streak += 1
    scale = float(scaler.get_scale())
    backoff = float(scaler.get_backoff_factor()) if hasattr(scaler, "get_backoff_factor") else 0.5
    if scale * backoff >= guard.options.amp_min_scale and st.amp_streak < guard.options.amp_max_overflows:
        return None  # an ordinary overflow: the GradScaler skips the step
    st.streak += 1
    return NonFiniteEvent(step=trainer.global_step, epoch=trainer.current_epoch,
                          batch_idx=trainer.fit_loop.epoch_loop.batch_idx, kind="gradient",
                          ranks=flagged or [trainer.global_rank],
                          note=f"AMP loss scale collapsed: {st.amp_streak} overflowing step(s) in a row, "
                               f"scale {scale:g} -> {scale * backoff:g} (amp_min_scale={guard.options.amp_min_scale:g}, "
                               f"amp_max_overflows={guard.options.amp_max_overflows}); the GradScaler skips every step.")


def check_params(guard: GuardOptions, st: GuardState, trainer: Any, pl_module: Any,
                 batch_idx: int) -> NonFiniteEvent | None:
    """After the update (``check_params=True``): non-finite parameters, read at the step (it cannot be undone).
    Returns the event (to act on after the update), or None."""
    step = trainer.global_step - 1  # the update that just ran
    if step % guard.every_n_steps:
        return None
    named = [(n, nl.local(p.detach())) for n, p in named_parameters(pl_module)]
    total = None
    try:
        total = nl.nonfinite_total([p for _, p in named])
    except Exception as e:
        guard.faults.report("parameter check", e)
    value = nl.read_now(total)[0] if total is not None else 0.0
    st.host_syncs += 1
    if all(math.isfinite(row[0]) for row in gather_floats(trainer, [value])):
        return None
    try:
        counts = nl.count_nonfinite(named)
        if not counts:
            return None
        first = next(iter(counts))
        return NonFiniteEvent(step=step, epoch=trainer.current_epoch, batch_idx=batch_idx, kind="parameter",
                              layer=owner(first), parameters=counts,
                              num_nonfinite=sum(counts.values()), ranks=list(range(trainer.world_size)),
                              max_abs_grad=nl.max_abs_finite([p for _, p in named]), counts="parameters",
                              note="found after the optimizer step (check_params); layer owns the first "
                                   "non-finite parameter in definition order")
    except Exception as e:
        guard.faults.report("parameter event", e)
        return None
