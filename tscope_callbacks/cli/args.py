"""Argument types of the ``tscope`` subcommands: a bad value is refused by argparse itself, in one line that names the
option and says what it takes (``tscope report: error: argument --top: -3 is not a whole number >= 1``; exit 2),
before any work starts."""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

__all__ = ["positive_int", "int_at_least", "shape", "json_object", "output_file", "output_dir", "analysis_device"]


def int_at_least(minimum: int) -> Any:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{value} is not a whole number >= {minimum}")
        return value

    parse.__name__ = f"int>={minimum}"
    return parse


positive_int = int_at_least(1)


def shape(text: str) -> list[int]:
    """``32,3,224,224`` -> ``[32, 3, 224, 224]``: positive whole numbers only."""
    parts = [p.strip() for p in text.split(",")]
    try:
        dims = [int(p) for p in parts]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a shape: give comma-separated whole numbers, e.g. "
                                         "8,1024 or 32,3,224,224") from None
    if not dims or any(d < 1 for d in dims):
        raise argparse.ArgumentTypeError(f"{text!r}: every dimension must be 1 or more")
    return dims


def json_object(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"not valid JSON ({e.msg} at character {e.pos}); give an object such as "
                                         "'{\"num_hidden_layers\": 2}' (single quotes around it in a shell)") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"a JSON object ({{...}}) is needed, got {type(value).__name__}")
    return value


def _writable_dir(folder: str) -> str | None:
    """Why files cannot be written into ``folder`` (its nearest existing ancestor for a folder to be made)."""
    probe = os.path.abspath(folder or ".")
    while not os.path.exists(probe):
        parent = os.path.dirname(probe)
        if parent == probe:
            break
        probe = parent
    if not os.path.isdir(probe):
        return f"{probe} is a file, not a folder"
    if not os.access(probe, os.W_OK | os.X_OK):
        return f"no permission to write in {probe}"
    return None


def output_file(text: str) -> str:
    """A file to write: its folder exists (or can be made) and is writable, and it is not a folder itself."""
    if os.path.isdir(text):
        raise argparse.ArgumentTypeError(f"{text} is a folder; give a file name")
    folder = os.path.dirname(os.path.abspath(text))
    if not os.path.isdir(folder):
        why = "is a file, not a folder" if os.path.exists(folder) else "does not exist"
        raise argparse.ArgumentTypeError(f"cannot write {text}: {folder} {why}")
    why = _writable_dir(folder)
    if why:
        raise argparse.ArgumentTypeError(f"cannot write {text}: {why}")
    if os.path.exists(text) and not os.access(text, os.W_OK):
        raise argparse.ArgumentTypeError(f"cannot write {text}: no permission to overwrite it")
    return text


def output_dir(text: str) -> str:
    """A folder to write into (made when missing)."""
    if os.path.exists(text) and not os.path.isdir(text):
        raise argparse.ArgumentTypeError(f"{text} is a file; give a folder")
    why = _writable_dir(text)
    if why:
        raise argparse.ArgumentTypeError(f"cannot write logs under {text}: {why}")
    return text


def analysis_device(text: str) -> str:
    """meta, cpu, or cuda[:N] when this torch sees a GPU."""
    import torch

    t = text.strip().lower()
    if t in ("meta", "cpu"):
        return t
    if t == "cuda" or t.startswith("cuda:"):
        if not torch.cuda.is_available():
            raise argparse.ArgumentTypeError(f"{text}: this torch sees no CUDA GPU (a CPU-only build, or none "
                                             "visible); use meta (estimate only) or cpu")
        return t
    raise argparse.ArgumentTypeError(f"{text!r} is not meta, cpu or cuda[:N]")
