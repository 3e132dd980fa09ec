"""Which sinks a trainer gets (:func:`build_sinks`) and where its files go (:func:`resolve_log_dir`)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from tscope_callbacks.callbacks.sinks import (
    CSVSink,
    FileSink,
    MetricsSink,
    Sink,
    SinkGroup,
    TensorBoardSink,
    WandbSink,
)

__all__ = ["build_sinks", "resolve_log_dir"]

log = logging.getLogger("tscope_callbacks")


def resolve_log_dir(trainer: Any) -> Path:
    """Where this run's files go, without ``trainer.log_dir``'s collective ``broadcast`` (safe on one rank only):
    TensorBoard/CSV: their versioned ``log_dir``; W&B: the run's own files folder (``run.dir``), so two runs never
    share a folder and W&B uploads the files with the run; else the first logger's ``save_dir`` or the trainer's
    ``default_root_dir``. The files land in ``<that>/tscope/``."""
    from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger, WandbLogger

    loggers = list(getattr(trainer, "loggers", []) or [])
    d: Any = None
    if loggers:
        first = loggers[0]
        if isinstance(first, (TensorBoardLogger, CSVLogger)):
            d = first.log_dir
        elif isinstance(first, WandbLogger):
            d = getattr(first.experiment, "dir", None) or first.save_dir
        else:
            d = getattr(first, "save_dir", None)
    return Path(d if d is not None else trainer.default_root_dir)


def build_sinks(trainer: Any, *, raise_errors: bool = False) -> SinkGroup:
    """A :class:`SinkGroup` for ``trainer.loggers`` (call on rank zero only)."""
    from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger, WandbLogger

    sinks: list[Sink] = []
    has_files = False
    for lg in getattr(trainer, "loggers", []) or []:
        try:
            if isinstance(lg, TensorBoardLogger):
                sinks.append(TensorBoardSink(lg))
                has_files = True
            elif isinstance(lg, WandbLogger):
                sinks.append(WandbSink(lg))
                has_files = True
            elif isinstance(lg, CSVLogger):
                sinks.append(CSVSink(lg))
                has_files = True
            else:
                sinks.append(MetricsSink(lg))
        except Exception as e:
            if raise_errors:
                raise
            log.warning("tscope: cannot log to %s (%s: %s); it is skipped", type(lg).__name__, type(e).__name__, e)
    try:
        log_dir = resolve_log_dir(trainer)
    except Exception as e:
        if raise_errors:
            raise
        log.warning("tscope: cannot resolve the log directory (%s); using default_root_dir", e)
        log_dir = Path(trainer.default_root_dir)
    if not has_files:
        # no logger (or only ones without text/figure support): scalars too when no logger at all
        sinks.append(FileSink(log_dir / "tscope", scalars=not sinks))
    return SinkGroup(sinks, log_dir, raise_errors=raise_errors)
