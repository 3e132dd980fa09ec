"""``tscope demo``: train a small transformer LM on synthetic tokens with all three callbacks.

Lightning is imported only when the demo runs, so ``tscope --help`` stays fast.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

__all__ = ["add_arguments", "run"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--steps", type=int, default=300, help="optimizer steps to train (default 300)")
    p.add_argument("--logger", choices=["tensorboard", "wandb", "csv"], default="tensorboard")
    p.add_argument("--nan-at", type=int, default=None, metavar="STEP",
                   help="inject a NaN into blocks.1.mlp.fc at STEP to show the NaN guard naming the layer")
    p.add_argument("--every", type=int, default=100, help="profile every N steps (default 100)")
    p.add_argument("--out", default="demo_logs", help="log directory (default ./demo_logs)")
    p.add_argument("--top", type=int, default=12, help="rows of the roofline table to print")


def _logger(kind: str, out: str):
    if kind == "wandb":
        os.environ.setdefault("WANDB_MODE", "offline")
        from lightning.pytorch.loggers import WandbLogger

        return WandbLogger(project="tscope-demo", save_dir=out, offline=True)
    if kind == "csv":
        from lightning.pytorch.loggers import CSVLogger

        return CSVLogger(out, name="tscope_demo")
    from lightning.pytorch.loggers import TensorBoardLogger

    return TensorBoardLogger(out, name="tscope_demo")


def run(args: argparse.Namespace) -> int:
    import lightning.pytorch as pl
    import torch

    import tscope_callbacks as ts
    from tscope_callbacks.demo_lightning import DemoLM, NaNInjector, RandomTokenData

    pl.seed_everything(0, verbose=False)
    torch.set_float32_matmul_precision("high")
    data = RandomTokenData()
    model = DemoLM()
    roof = ts.RooflineCallback(gpu="auto", start_step=10, every_n_steps=args.every)
    layers = ts.LayerProfilerCallback(start_step=10, every_n_steps=max(args.every, args.steps), depth=3)
    guard = ts.NaNGuardCallback(action="stop" if args.nan_at is not None else "warn")
    callbacks: list[pl.Callback] = [roof, layers, guard]
    if args.nan_at is not None:
        callbacks.append(NaNInjector(args.nan_at))
    logger = _logger(args.logger, args.out)
    trainer = pl.Trainer(max_steps=args.steps, accelerator="auto", devices=1, logger=logger, callbacks=callbacks,
                         log_every_n_steps=10, enable_checkpointing=False, enable_model_summary=False,
                         limit_val_batches=0, enable_progress_bar=sys.stdout.isatty())
    t0 = time.perf_counter()
    trainer.fit(model, datamodule=data)
    took = time.perf_counter() - t0
    _print_summary(trainer, roof, guard, logger, args, took)
    return 0


def _print_summary(trainer, roof, guard, logger, args, took: float) -> None:
    bar = "=" * 100
    print(f"\n{bar}\ntscope demo: {trainer.global_step} steps in {took:.1f} s on {trainer.strategy.root_device}\n{bar}")
    report = getattr(roof, "last_report", None)
    if report is not None:
        print(report.to_markdown(top=args.top))
    else:
        print("(no roofline report: no step was profiled; raise --steps above 10)")
    mfu = getattr(roof, "last_mfu", None)
    if mfu is not None:
        print(f"\nAutomatic MFU (every step, from the counted FLOPs): {mfu:.2%}")
    if guard.events:
        print(f"\nNaN guard: {len(guard.events)} event(s). First:\n  {guard.events[0]}")
    log_dir = Path(getattr(logger, "log_dir", None) or getattr(logger, "save_dir", None) or args.out).resolve()
    print(f"\nLogs: {log_dir}")
    if args.logger == "tensorboard":
        print(f"View them:  tensorboard --logdir {Path(args.out).resolve()}")
    elif args.logger == "wandb":
        print(f"W&B offline run; sync with:  wandb sync {Path(args.out).resolve()}/wandb/offline-run-*")
    saved = sorted(log_dir.glob("tscope/step_*.json"))
    if saved:
        print(f"Re-render a profiled step:  tscope report {saved[-1]} --plot roofline.png")
