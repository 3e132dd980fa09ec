"""``tscope demo``: train a small transformer LM on synthetic tokens with all three callbacks.

Lightning is imported only when the demo runs, so ``tscope --help`` stays fast.
"""

from __future__ import annotations

import argparse
import logging
import os
import shlex
import sys
import time
import warnings
from pathlib import Path

from tscope_callbacks.analysis.fmt import pct_text, time_text
from tscope_callbacks.cli.args import int_at_least, output_dir, positive_int
from tscope_callbacks.cli.hints import command

__all__ = ["add_arguments", "run"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--steps", type=positive_int, default=300, help="optimizer steps to train (default 300)")
    p.add_argument("--logger", choices=["tensorboard", "wandb", "csv"], default="tensorboard",
                   help="where the metrics go (default tensorboard; wandb runs offline)")
    p.add_argument("--nan-at", type=int_at_least(0), default=None, metavar="STEP",
                   help="make model.blocks.1.mlp.fc output NaN at optimizer step STEP; the NaN guard names that "
                        "layer and stops the run")
    p.add_argument("--every", type=positive_int, default=100, metavar="N",
                   help="roofline profile at step 10, then every N steps (default 100); profiled steps are the "
                        "slow ones")
    p.add_argument("--out", default="demo_logs", type=output_dir, metavar="DIR", help="log directory (default ./demo_logs)")
    p.add_argument("--top", type=positive_int, default=12, metavar="ROWS", help="rows of the printed roofline table (default 12)")
    p.add_argument("--size", choices=["auto", "cpu", "gpu"], default="auto",
                   help="model size: cpu (a 2-block TinyGPT, under a minute), gpu (GPT-2-124M-shaped, 8x1024 tokens, "
                        "bf16, fused AdamW); auto (default): gpu on a CUDA device, else cpu")
    p.add_argument("--threads", type=positive_int, default=None, metavar="N",
                   help="CPU threads for torch (default: torch's default, lowered to the idle cores when the "
                        "machine is busy: oversubscribed threads make CPU training several times slower)")


def _cpu_threads(requested: int | None) -> int:
    """``requested``, else torch's default capped by the idle cores (1-minute load average)."""
    import torch

    if requested is not None:
        return max(1, requested)
    n = torch.get_num_threads()
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):  # not on every platform
        return n
    idle = int((os.cpu_count() or n) - load + 0.5)
    return max(1, min(n, idle))


def _logger(kind: str, out: str):
    if kind == "wandb":
        os.environ.setdefault("WANDB_MODE", "offline")
        from lightning.pytorch.loggers import WandbLogger

        return WandbLogger(project="tscope-demo", save_dir=out, offline=True)
    if kind == "csv":
        from lightning.pytorch.loggers import CSVLogger

        return CSVLogger(out, name="tscope_demo")
    from lightning.pytorch.loggers import TensorBoardLogger

    # no placeholder hp_metric = -1 chart: Lightning writes one when it logs DemoLM's hyperparameters without a metric
    return TensorBoardLogger(out, name="tscope_demo", default_hp_metric=False)


class _NoTips(logging.Filter):
    """Drops Lightning's advertisement lines ("Tip: ... litlogger") from the demo's output."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "litlogger" not in str(record.getMessage()).lower()


def _quiet_lightning_tips() -> None:
    for name in ("lightning.pytorch.utilities.rank_zero", "lightning.fabric.utilities.rank_zero"):
        lg = logging.getLogger(name)
        if not any(isinstance(f, _NoTips) for f in lg.filters):
            lg.addFilter(_NoTips())


def run(args: argparse.Namespace) -> int:
    import lightning.pytorch as pl
    import torch

    import tscope_callbacks as ts
    from tscope_callbacks.demo.lightning import CPU_DEMO, GPU_DEMO, DemoLM, NaNInjector, RandomTokenData

    # the demo changes process-wide torch settings; put them back so an in-process caller is unaffected
    saved = (torch.get_num_threads(), torch.get_float32_matmul_precision())
    try:
        pl.seed_everything(0, verbose=False)
        torch.set_float32_matmul_precision("high")
        if not torch.cuda.is_available():
            torch.set_num_threads(_cpu_threads(args.threads))
        gpu = args.size == "gpu" or (args.size == "auto" and torch.cuda.is_available())
        if gpu and not torch.cuda.is_available():
            print("tscope demo: --size gpu needs a CUDA device (use --size cpu)", file=sys.stderr)
            return 2
        size = GPU_DEMO if gpu else CPU_DEMO
        data = RandomTokenData(**size["data"])
        model = DemoLM(**size["model"])
        roof = ts.RooflineCallback(gpu="auto", start_step=10, every_n_steps=args.every)
        layers = ts.LayerProfilerCallback(start_step=10, every_n_steps=max(args.every, args.steps), depth=3)
        guard = ts.NaNGuardCallback(action="stop" if args.nan_at is not None else "warn")
        watch = ts.WatchCallback("all", every_n_steps=50, update_ratio=True)  # histograms in TensorBoard
        callbacks: list[pl.Callback] = [roof, layers, guard, watch]
        if args.nan_at is not None:
            callbacks.append(NaNInjector(args.nan_at))
        logger = _logger(args.logger, args.out)
        _quiet_lightning_tips()
        trainer = pl.Trainer(max_steps=args.steps, accelerator="auto", devices=1, logger=logger, callbacks=callbacks,
                             precision=size["precision"],
                             log_every_n_steps=10, enable_checkpointing=False, enable_model_summary=False,
                             limit_val_batches=0, enable_progress_bar=sys.stdout.isatty())
        t0 = time.perf_counter()
        with warnings.catch_warnings():  # Lightning's own deprecation noise, not the demo's business
            warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\)")
            trainer.fit(model, datamodule=data)
        took = time.perf_counter() - t0
        _print_summary(trainer, roof, guard, logger, args, took)
    finally:
        torch.set_num_threads(saved[0])
        torch.set_float32_matmul_precision(saved[1])
    return 0


def _print_summary(trainer, roof, guard, logger, args, took: float) -> None:
    import torch

    dev = trainer.strategy.root_device
    n = torch.get_num_threads()
    where = f"{dev} ({n} thread{'s' if n != 1 else ''})" if dev.type == "cpu" else str(dev)
    bar = "=" * 100
    print(f"\n{bar}\ntscope demo: {trainer.global_step} steps in {time_text(took)} on {where}\n{bar}")
    report = getattr(roof, "last_report", None)
    if report is not None:
        print(report.to_markdown(top=args.top))
    else:
        print("(no roofline report: no step was profiled; raise --steps above 10)")
    mfu = getattr(roof, "last_mfu", None)
    if mfu is not None:
        print("\n" + _auto_mfu_line(report, roof, mfu))
    else:
        print("\nAutomatic MFU: not logged (it needs a logging step after the first profiled step and a device roof)")
    if guard.events:
        first = str(guard.events[0]).replace("\n", "\n  ")
        print(f"\nNaN guard: {len(guard.events)} event(s). First:\n  {first}")
    log_dir = Path(getattr(logger, "log_dir", None) or getattr(logger, "save_dir", None) or args.out).resolve()
    print(f"\nLogs: {log_dir}")
    if args.logger == "tensorboard":
        tensorboard = command("tensorboard", "tensorboard.main")
        print(f"View them:  {tensorboard} --logdir {shlex.quote(str(Path(args.out).resolve()))}")
    elif args.logger == "wandb":
        wandb = command("wandb", "wandb")
        print(f"W&B offline run; sync with:  {wandb} sync {shlex.quote(str(Path(args.out).resolve()))}/wandb/offline-run-*")
    saved = _train_step_files(log_dir / "tscope")
    if saved:
        tscope = command("tscope", "tscope_callbacks.cli")
        out = shlex.quote(str(Path(args.out).resolve()))
        print(f"The dashboard:  {tscope} view {out}   (one HTML page of every profiled step"
              + ("; also the TSCOPE tab in TensorBoard)" if args.logger == "tensorboard" else ")"))
        print(f"Re-render a profiled step:  {tscope} report {shlex.quote(str(saved[-1]))} --plot roofline.png")


def _auto_mfu_line(report, roof, mfu: float) -> str:
    """The automatic MFU, with why it differs from the profiled step's (``analysis.throughput.mfu_bases``)."""
    from tscope_callbacks.analysis.throughput import mfu_bases

    tp = roof.auto.throughput  # the windows the automatic MFU was computed over
    line = mfu_bases(report, tp.windows[-1], tp.peak_flops) if report and tp.windows else None
    return line or f"Automatic MFU (unprofiled steps of the last logging window, FLOPs from the profile): {pct_text(mfu)}"


def _train_step_files(folder: Path) -> list[Path]:
    """The training step files in ``folder``, in step order (``analysis.report.parse_step_file_name``)."""
    from tscope_callbacks.analysis.report import parse_step_file_name

    named = [(parse_step_file_name(p.name), p) for p in folder.glob("*.json")]
    return [p for k, p in sorted((k, p) for k, p in named if k is not None and k[:2] == ("step", "train"))]
