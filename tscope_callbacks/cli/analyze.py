"""``tscope analyze MODULE:NAME``: Tensorscope-style analysis of a model on a named device, no training."""

from __future__ import annotations

import argparse
import importlib
import json
import sys

from tscope_callbacks.api import analyze_model

__all__ = ["add_arguments", "run"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("target", help="the model class or factory as MODULE:NAME (e.g. mypkg.models:ResNet18)")
    p.add_argument("--input-shape", action="append", required=True,
                   help="comma-separated shape of one input, e.g. 32,3,224,224 (repeat for several inputs)")
    p.add_argument("--input-dtype", action="append", default=None, help="per input, in order: float (default; the --precision dtype), long/int64 or int/int32 (token ids)")
    p.add_argument("--gpu", default="auto", help="device name or alias from `tscope specs` (e.g. h100), a JSON spec path, or auto "
                        "(default: this machine's GPU, else a measured CPU roof)")
    p.add_argument("--precision", default="fp32", help="fp32, tf32, bf16, fp16, fp64 (the model cast to it); bf16-mixed / 16-mixed (fp32 weights under "
                        "autocast, as Lightning's mixed precision trains); fp8/int8 are estimated from a bf16 run "
                        "(default fp32)")
    p.add_argument("--attention-backend", default=None, choices=["cudnn", "flash", "efficient", "cpu"],
                   help="on meta, the fused SDPA op to count (default: what the --gpu runs: cudnn on Hopper, flash "
                        "on other GPUs)")
    p.add_argument("--kwargs", default="{}", help="JSON keyword arguments for the model constructor")
    p.add_argument("--backward", action="store_true", help="also count the backward pass")
    p.add_argument("--optimizer", default=None, choices=["adamw", "adam", "sgd", "adamw-fused", "adam-fused",
                                                         "sgd-fused"],
                   help="with --backward: add one optimizer update, so the estimate is a whole training step "
                        "(foreach, PyTorch's GPU default; -fused: the fused kernel)")
    p.add_argument("--device", default="meta", help="meta (estimate only, default), cpu or cuda (also measure)")
    p.add_argument("--top", type=int, default=20, help="rows in the table (default 20)")
    p.add_argument("--plot", default=None, help="write the roofline plot PNG here")
    p.add_argument("--json", default=None, help="write the report JSON here")


def run(args: argparse.Namespace) -> int:
    from tscope_callbacks.devices.spec import UnknownDeviceError

    mod_name, _, attr = args.target.partition(":")
    if not attr:
        print(f"tscope analyze: expected MODULE:NAME, got {args.target!r}", file=sys.stderr)
        return 2
    try:
        factory = getattr(importlib.import_module(mod_name), attr)
        model = factory(**json.loads(args.kwargs))
        shapes = [[int(s) for s in shp.split(",")] for shp in args.input_shape]
        dtypes = [None if d in (None, "float") else d for d in (args.input_dtype or [])]
        report = analyze_model(model, shapes, args.gpu, args.precision, input_dtypes=dtypes,
                               backward=args.backward, device=args.device,
                               attention_backend=args.attention_backend, optimizer=args.optimizer)
    except UnknownDeviceError as e:
        print(f"tscope analyze: {e}", file=sys.stderr)
        return 2
    except (ImportError, AttributeError, ValueError, TypeError) as e:
        print(f"tscope analyze: {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    print(report.to_markdown(top=args.top))
    if args.plot:
        report.plot(args.plot)
        print(f"plot written to {args.plot}")
    if args.json:
        with open(args.json, "w") as f:
            # the analysed device travels with the profile: `tscope report` re-rates it on that device, not this host
            json.dump({"profile": report.profile.to_dict(), "device": report.spec.to_dict(),
                       "report": report.to_dict()}, f)
        print(f"JSON written to {args.json} (`tscope report {args.json}` re-renders it for {report.spec.name})")
    return 0
