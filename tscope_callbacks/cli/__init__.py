"""``tscope`` console script. Each subcommand lives beside the feature it drives; this file only routes."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import warnings

# subcommand -> (module, help). Each module defines ``add_arguments(parser)`` and ``run(args) -> int``.
_COMMANDS = {
    "demo": ("tscope_callbacks.cli.demo", "train a small transformer with all callbacks and print the roofline"),
    "analyze": ("tscope_callbacks.cli.analyze", "estimate a training step of a model on a named GPU without running it (meta device)"),
    "specs": ("tscope_callbacks.cli.specs", "list the device roof table, or show one device"),
    "calibrate": ("tscope_callbacks.cli.calibrate", "measure this machine's achievable roofs (FLOP/s, bandwidth)"),
    "report": ("tscope_callbacks.cli.report", "render a saved profiled-step JSON as the roofline table / plot"),
    "diff": ("tscope_callbacks.cli.diff", "compare two saved profiled steps: step time, MFU, memory, per layer"),
    "view": ("tscope_callbacks.cli.view", "the dashboard of a log dir as one self-contained HTML file, or served (--serve)"),
}


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The ``tscope`` parser. Only the subcommand being run (``only``) is imported, so ``--help`` is instant."""
    p = argparse.ArgumentParser(prog="tscope", description="tscope_callbacks: roofline profiling for PyTorch training")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    for name, (mod, help_) in _COMMANDS.items():
        sp = sub.add_parser(name, help=help_, description=help_, add_help=name == only or only is None)
        sp.set_defaults(_module=mod)
        if only is not None and name != only:
            continue
        try:
            importlib.import_module(mod).add_arguments(sp)
        except ModuleNotFoundError as e:  # a feature not built yet must not break the other commands
            if e.name != mod:
                raise
            sp.set_defaults(_missing=mod)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    only = next((a for a in argv if not a.startswith("-")), None)
    parser = build_parser(only if only in _COMMANDS else "")
    args = parser.parse_args(argv)
    if not getattr(args, "command", None):
        parser.print_help()
        return 2
    if getattr(args, "_missing", None):
        print(f"tscope {args.command}: not available in this build", file=sys.stderr)
        return 2
    fmt = warnings.formatwarning

    def note(message: Warning | str, category: type[Warning], filename: str, lineno: int,
             line: str | None = None) -> str:
        """A warning as the command's own one-line note, not Python's "file:line: UserWarning" and a source line."""
        text = str(message)
        text = text.removeprefix("tscope: ").removeprefix(f"tscope {args.command}: ")
        return f"tscope {args.command}: {text}\n"

    warnings.formatwarning = note
    try:
        return int(importlib.import_module(args._module).run(args) or 0)
    except BrokenPipeError:  # `tscope report X | head`: the reader left; not an error of ours
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())  # no second BrokenPipeError when Python flushes stdout at exit
        except OSError:
            pass
        return 0
    finally:
        warnings.formatwarning = fmt


if __name__ == "__main__":
    sys.exit(main())
