"""``WatchCallback``: ``wandb.watch`` done on the device, for any logger, with the non-finite values counted.

What ``wandb.watch(model, log="gradients")`` does, and where this differs:

- it builds each histogram inside backward with several host reads per parameter (min, max, the counts), so a GPU
  run stalls once per parameter on every logged step; here every tensor's histogram is computed on the device
  (``analysis.histograms``) and the whole batch is copied to the host once, without waiting: the histograms are
  logged at the first batch end after the copy landed, under the step they describe;
- it drops NaN and Inf from its histograms and skips tensors that hold only those: on the step a NaN reached the
  gradients most were not logged. Here every tensor is logged; ``nan`` and ``inf`` are counted beside the bins, and
  the scalar ``tscope/watch/nonfinite_grads`` counts them all;
- it logs to W&B only; here TensorBoard (``add_histogram_raw``), W&B (``wandb.Histogram``) and CSV / plain files
  (one CSV per logged step, a row per tensor: edges, counts, min, max, mean, std, NaN and Inf counts);
- FSDP2 shards: each rank bins its shard over the range reduced across ranks, and the counts are summed, so the
  histogram is the whole parameter's (a replicated or partial layout is histogrammed per rank, said once);
- ``update_ratio=True`` adds what divergence hunts look at first: per layer, the size of the optimizer's update
  relative to the weights, ``||w_after - w_before|| / ||w_after||`` (healthy training sits around 1e-3; far above,
  the learning rate is too high for that layer), and the share of each layer's weights the update left exactly as
  they were. That share is ~0 in fp32; with weights stored in bf16 (``precision="bf16-true"``), an update smaller
  than half a bf16 step of the weight is rounded away, and a layer whose share nears 1 has stopped learning. A
  step the GradScaler skipped reads 1 everywhere. It costs one copy of the parameters on the logged steps only.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import lightning.pytorch as pl
import torch
from typing_extensions import override

from tscope_callbacks.analysis import histograms as H
from tscope_callbacks.analysis.grad_history import global_norm, layer_norms, layer_sums
from tscope_callbacks.callbacks.guarded import GuardedCallback
from tscope_callbacks.callbacks.sinks import METRIC_ROOT, metric_key
from tscope_callbacks.capture.paths import named_parameters
from tscope_callbacks.capture.profile import paused
from tscope_callbacks.capture.step_memory import local_tensor

__all__ = ["WatchCallback"]

log = logging.getLogger("tscope_callbacks")

_LOGS = ("gradients", "parameters", "all")
_AREA = {"gradients": "grad_hist", "parameters": "param_hist"}


class WatchCallback(GuardedCallback):
    """Histograms of gradients and/or parameters every ``every_n_steps`` optimizer steps, computed on the device.

    Args:
        log: ``"gradients"`` (default), ``"parameters"`` or ``"all"`` (as ``wandb.watch``).
        every_n_steps: log at optimizer steps 0, n, 2n, ... (``wandb.watch``'s ``log_freq``).
        bins: bins per histogram (``wandb.watch`` uses 64).
        update_ratio: also log ``||update|| / ||weights||`` per layer at those steps (one copy of the parameters
            while the optimizer steps).
        raise_errors: raise tscope's own errors instead of logging them (training is never affected otherwise).

    Keys: histograms ``tscope/grad_hist/<parameter>`` and ``tscope/param_hist/<parameter>`` (gradients as the
    optimizer sees them, after AMP unscaling; parameters before the update); scalars
    ``tscope/watch/nonfinite_grads`` (NaN + Inf gradient elements), ``tscope/watch/nonfinite/<parameter>`` (only for
    gradients that hold any: a histogram of nothing finite cannot be drawn), ``tscope/update_ratio/<layer>`` and
    ``tscope/update_ratio/total``, ``tscope/update_unchanged/<layer>`` and ``.../total`` (the share of weights the
    update left unchanged). Attributes: ``last`` (the last logged step: ``{"step", "gradients", "parameters",
    "update_ratio", "update_unchanged"}``, histograms as lists of ``Histogram``; on rank zero only, unless parameters are sharded:
    then every rank takes part), ``host_waits`` (reads that had to wait for the
    device: only at the end of training).
    """

    def __init__(self, log: str = "gradients", *, every_n_steps: int = 100, bins: int = 64,
                 update_ratio: bool = False, raise_errors: bool = False) -> None:
        if log not in _LOGS:
            raise ValueError(f"WatchCallback: log must be one of {_LOGS}, got {log!r}")
        for name, v, lo in (("every_n_steps", every_n_steps, 1), ("bins", bins, 1)):
            if isinstance(v, bool) or not isinstance(v, int) or v < lo:
                raise ValueError(f"WatchCallback: {name} must be an int >= {lo}, got {v!r}")
        for name, v in (("update_ratio", update_ratio), ("raise_errors", raise_errors)):
            if not isinstance(v, bool):
                raise TypeError(f"WatchCallback: {name} must be a bool, got {v!r}")
        self.log_kind, self.every_n_steps, self.bins = log, every_n_steps, bins
        self.update_ratio, self.raise_errors = update_ratio, raise_errors
        self.last: dict[str, Any] | None = None
        self.host_waits = 0
        self._names: dict[int, str] = {}
        self._pending: list[dict] = []
        self._snap: tuple | None = None
        self._warned: set[str] = set()

    # ---------------------------------------------------------------- hooks (never raise unless asked)
    @override
    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._names = {id(p): n for n, p in named_parameters(pl_module)}
        self._pending, self._snap, self.last = [], None, None

    @override
    def on_before_optimizer_step(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                                 optimizer: torch.optim.Optimizer) -> None:
        if trainer.global_step % self.every_n_steps:
            return
        self._guard("the histograms", self._launch, trainer, optimizer)
        # tscope's own work in this step: no step-time basis nor automatic-MFU window
        self.coordinator(trainer).dirty_clocks()

    @override
    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        if self._snap is not None:
            self._guard("the update ratios", self._ratios, trainer)
        if self._pending:
            self._guard("logging the histograms", self._poll, trainer, False)

    @override
    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._snap = None
        if self._pending:
            self._guard("logging the histograms", self._poll, trainer, True)

    @override
    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._snap, self._pending = None, []  # an interrupted fit: free the copies
        self.release_coordinator()

    def _guard(self, what: str, fn: Any, *args: Any) -> None:
        try:
            with paused():  # inside a profiled step this is not the user's work
                fn(*args)
        except Exception as e:
            self.faults.report(what, e)

    def _warn_once(self, what: str, why: str) -> None:
        if what not in self._warned:
            self._warned.add(what)
            log.warning("tscope WatchCallback: %s failed or was limited (%s); training continues", what, why)

    # ---------------------------------------------------------------- device work
    def _params(self, trainer: Any, optimizer: Any) -> list[tuple[str, torch.Tensor]]:
        if any(id(p) not in self._names for g in optimizer.param_groups for p in g["params"]):
            module = trainer.lightning_module  # parameters replaced after fit start (sharding): read the names again
            self._names = {id(p): n for n, p in named_parameters(module)} if module is not None else self._names
        out = []
        for g in optimizer.param_groups:
            for p in g["params"]:
                out.append((self._names.get(id(p), f"param{len(out)}"), p))
        return out

    def _reducer(self, trainer: Any, tensors: list[torch.Tensor]) -> Any:
        """``all_reduce(t, op)`` over the ranks when ``tensors`` are shards of whole tensors (FSDP2: DTensors
        sharded on every mesh dimension, the mesh spanning the world); None otherwise."""
        dts = [t for t in tensors if local_tensor(t) is not t]
        if not dts:
            return None
        import torch.distributed as dist

        world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
        ok = all(all(p.is_shard() for p in t.placements) and t.device_mesh.size() == world for t in dts)
        if world == 1 or not ok:
            self._warn_once("summing shards across ranks", "a replicated or partial layout: per-rank histograms")
            return None
        ops = {"min": dist.ReduceOp.MIN, "max": dist.ReduceOp.MAX, "sum": dist.ReduceOp.SUM}
        return lambda t, op: dist.all_reduce(t, op=ops[op])

    def _launch(self, trainer: Any, optimizer: Any) -> None:
        named = self._params(trainer, optimizer)
        if not trainer.is_global_zero and all(local_tensor(p) is p for _, p in named):
            return  # replicated (DDP): rank zero's histograms are every rank's; no work, no copy elsewhere
        # gradients and optimizer state are laid out as their parameters: one reduction rule for all of them
        reduce = self._reducer(trainer, [p for _, p in named])
        if self.update_ratio:
            self._snap = ([p for _, p in named], [local_tensor(p).detach().clone() for _, p in named],
                          [n for n, _ in named], trainer.global_step, reduce)
        kinds = ["gradients", "parameters"] if self.log_kind == "all" else [self.log_kind]
        parts, layout = [], []
        for kind in kinds:
            sel = [(n, p.grad if kind == "gradients" else p) for n, p in named]
            sel = [(n, t) for n, t in sel if t is not None]
            if any(t.layout != torch.strided for _, t in sel):  # sparse gradients (sparse embeddings): left out
                self._warn_once(f"{kind} histograms of sparse tensors", "not strided: left out")
                sel = [(n, t) for n, t in sel if t.layout == torch.strided]
            if not sel:
                continue
            ts = [t.detach() for _, t in sel]
            local = [local_tensor(t) for t in ts]
            stats = H.device_stats(local)
            if reduce is not None:
                stats = H.reduce_stats(stats, reduce)
            counts = H.device_counts(local, stats, self.bins)
            if reduce is not None:
                reduce(counts, "sum")
            parts += [stats.flatten(), counts.flatten()]
            layout.append((kind, [n for n, _ in sel]))
        if parts:
            self._pending.append({"step": trainer.global_step, "layout": layout, **self._copy(torch.cat(parts))})

    @staticmethod
    def _copy(vec: torch.Tensor) -> dict:
        """Start the one device-to-host copy (pinned, non-blocking, an event to poll on CUDA)."""
        if vec.device.type != "cuda":
            return {"host": vec.cpu(), "event": None}
        host = torch.empty(vec.shape, dtype=vec.dtype, pin_memory=True)
        host.copy_(vec, non_blocking=True)
        ev = torch.cuda.Event()
        ev.record()
        return {"host": host, "event": ev, "device": vec}  # the device copy lives until the copy is done

    def _ratios(self, trainer: Any) -> None:
        params, before, names, step, reduce = self._snap  # type: ignore[misc]
        self._snap = None
        after = [local_tensor(p).detach() for p in params]
        diff = torch.stack(torch._foreach_norm(torch._foreach_sub(after, before), 2)).double().square()
        wsq = torch.stack(torch._foreach_norm(after, 2)).double().square()
        same = torch.stack([(a == b).sum() for a, b in zip(after, before)]).double()  # elements the update left
        vec = torch.cat([diff, wsq, same])
        if reduce is not None:
            reduce(vec, "sum")
        del before
        self._pending.append({"step": step, "layout": [("update_ratio", names)], "numel": [p.numel() for p in params],
                              **self._copy(vec)})

    # ---------------------------------------------------------------- read-out and logging
    def _poll(self, trainer: Any, wait: bool) -> None:
        keep = []
        for item in self._pending:
            ev = item["event"]
            if ev is not None and not ev.query():
                if not wait:
                    keep.append(item)
                    continue
                ev.synchronize()
                self.host_waits += 1
            self._log(trainer, item)
            self.coordinator(trainer).dirty_clocks()  # the read-out and the loggers' writes ran in this step
        self._pending = keep

    def _log(self, trainer: Any, item: dict) -> None:
        host, step = item["host"].tolist(), item["step"]
        sinks = self.coordinator(trainer).sinks(trainer, self.raise_errors)
        last = self.last if self.last is not None and self.last["step"] == step else {"step": step}
        scalars: dict[str, float] = {}
        off = 0
        for kind, names in item["layout"]:
            n = len(names)
            if kind == "update_ratio":
                ratios = _layer_ratios(names, host[off:off + n], host[off + n:off + 2 * n])
                same = _layer_shares(names, host[off + 2 * n:off + 3 * n], item["numel"])
                off += 3 * n
                last["update_ratio"], last["update_unchanged"] = ratios, same
                scalars.update({metric_key("update_ratio", k or "root"): v for k, v in ratios.items()})
                scalars.update({metric_key("update_unchanged", k or "root"): v for k, v in same.items()})
                continue
            stats, counts = host[off:off + n * H.NSTAT], host[off + n * H.NSTAT:off + n * (H.NSTAT + self.bins)]
            off += n * (H.NSTAT + self.bins)
            hists = H.read_histograms(names, stats, counts, self.bins)
            last[kind] = hists
            if kind == "gradients":  # the total, and which tensors hold them (only those: bad steps only)
                scalars[metric_key("watch", "nonfinite_grads")] = float(sum(h.nonfinite for h in hists))
                scalars.update({metric_key("watch", f"nonfinite/{h.name}"): float(h.nonfinite) for h in hists
                                if h.nonfinite})
            if trainer.is_global_zero:
                sinks.log_histograms(f"{METRIC_ROOT}/{_AREA[kind]}", hists, step)
        self.last = last
        if scalars and trainer.is_global_zero:
            sinks.log_scalars(scalars, step)


def _layer_shares(names: list[str], same: list[float], numel: list[int]) -> dict[str, float]:
    """Per layer (the module owning the parameters) and in ``total``: unchanged elements / elements."""
    s, n = layer_sums(names, same), layer_sums(names, numel)
    out = {k: s[k] / n[k] for k in s if n[k]}
    total = sum(numel)
    out["total"] = sum(same) / total if total else 0.0
    return out


def _layer_ratios(names: list[str], diff_sq: list[float], w_sq: list[float]) -> dict[str, float]:
    """``||update|| / ||weights||`` per layer (the NaN guard's grouping: the module owning the parameters), and over
    all parameters as ``total``."""
    d_norms, w_norms = [math.sqrt(v) for v in diff_sq], [math.sqrt(v) for v in w_sq]
    d, w = layer_norms(names, d_norms), layer_norms(names, w_norms)
    out = {k: d[k] / w[k] if w[k] > 0 else math.inf for k in d}
    tw = global_norm(w_norms)
    out["total"] = global_norm(d_norms) / tw if tw > 0 else math.inf
    return out
