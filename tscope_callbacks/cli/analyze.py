"""``tscope analyze MODULE:NAME``: estimate a training step of a model on a named device without running it."""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import sys
from typing import Any

from tscope_callbacks.api import analyze_model
from tscope_callbacks.cli.args import analysis_device, int_at_least, json_object, output_file, positive_int, shape

__all__ = ["add_arguments", "run"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("target", help="the model class or factory as MODULE:NAME (e.g. mypkg.models:ResNet18; the current "
                                  "directory is importable) or FILE.py:NAME (e.g. models.py:build); or a Hugging Face "
                                  "config: hf:MODEL_TYPE (hf:llama, its default config), hf:DIR or hf:config.json "
                                  "(local), hf:ORG/NAME (the Hub's config.json only, never weights); --kwargs then "
                                  "override config fields")
    p.add_argument("--input-shape", action="append", required=True, type=shape,
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
    p.add_argument("--kwargs", default={}, type=json_object, help="JSON keyword arguments for the model constructor (hf: targets: "
                                                  "config fields, e.g. '{\"num_hidden_layers\": 32}')")
    p.add_argument("--backward", action="store_true", help="also count the backward pass")
    p.add_argument("--optimizer", default=None, choices=["adamw", "adam", "sgd", "adamw-fused", "adam-fused",
                                                         "sgd-fused"],
                   help="with --backward: add one optimizer update, so the estimate is a whole training step "
                        "(foreach, PyTorch's GPU default; -fused: the fused kernel)")
    p.add_argument("--fsdp", type=int_at_least(2), default=None, metavar="N",
                   help="with --backward: also what FSDP2 over N GPUs would do to this step, per GPU (memory, "
                        "collectives, exposed communication, step time)")
    p.add_argument("--fsdp-shard", type=positive_int, default=None, metavar="S",
                   help="with --fsdp N: HSDP instead, sharded over S GPUs (e.g. 8: one node) and replicated N/S times")
    p.add_argument("--fsdp-units", default=None,
                   help="the modules fully_shard wraps: a class name (e.g. GPT2Block) or comma-separated module paths "
                        "(default: the repeated blocks)")
    p.add_argument("--device", default="meta", type=analysis_device, help="meta (estimate only, default), cpu or cuda (also measure)")
    p.add_argument("--top", type=positive_int, default=20, help="rows in the table (default 20)")
    p.add_argument("--plot", default=None, type=output_file, help="write the roofline plot PNG here")
    p.add_argument("--json", default=None, type=output_file, help="write the report JSON here")
    p.add_argument("--print", "--markdown", dest="print_markdown", action="store_true",
                   help="print the markdown report too when writing files (printed by default only when no "
                        "--plot/--json is given; with them, one line per file written)")


def load_target(target: str) -> Any:
    """The object ``MODULE:NAME`` or ``path/to/file.py:NAME`` names (NAME may be dotted: ``Class.small``). The
    current directory is importable, as with ``python -m``: a console script's ``sys.path`` lacks it."""
    mod_name, _, attr = target.rpartition(":") if target.count(":") > 1 else target.partition(":")
    if not mod_name or not attr:
        raise ValueError(f"expected MODULE:NAME or FILE.py:NAME, got {target!r}")
    if mod_name.endswith(".py") or os.sep in mod_name or "/" in mod_name:
        path = os.path.abspath(mod_name)
        if not os.path.isfile(path):
            raise ImportError(f"no file {mod_name!r} (from {target!r})")
        spec = importlib.util.spec_from_file_location(os.path.splitext(os.path.basename(path))[0], path)
        if spec is None or spec.loader is None:
            raise ImportError(f"cannot load {mod_name!r} as a Python module")
        module = importlib.util.module_from_spec(spec)
        sys.path.insert(0, os.path.dirname(path))  # its sibling imports resolve, as `python FILE` would
        try:
            spec.loader.exec_module(module)
        finally:
            sys.path.remove(os.path.dirname(path))
    else:
        if os.getcwd() not in sys.path and "" not in sys.path:
            sys.path.insert(0, os.getcwd())
        try:
            module = importlib.import_module(mod_name)
        except ModuleNotFoundError as e:
            raise ImportError(f"{e} (searched the current directory and PYTHONPATH; a file can be given as "
                              f"path/to/models.py:NAME)") from None
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise AttributeError(f"{mod_name!r} has no {attr!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise TypeError(f"{target!r} is not a model class or factory (it is of type {type(obj).__name__})")
    return obj


#: the one line a Hub id without a network says
NO_NETWORK = "no network: give a local config path or hf:NAME with a cached config"


def _hub_reachable(timeout_s: float = 3.0) -> bool:
    """Whether the Hub's host answers a TCP connection within ``timeout_s`` (no name, no route: False at once; a
    network that drops packets: False after ``timeout_s``, instead of the Hub client's retries, about a minute)."""
    import socket
    import urllib.parse

    host = urllib.parse.urlparse(os.environ.get("HF_ENDPOINT") or "https://huggingface.co").hostname or ""
    try:
        with socket.create_connection((host, 443), timeout=timeout_s):
            return True
    except OSError:
        return False


def _hub_config(tf: Any, ref: str, overrides: dict[str, Any]) -> Any:
    """The config of Hub id ``ref``: from the local cache when it is there (the network untouched), else from the Hub;
    with no network (``HF_HUB_OFFLINE``, or the Hub unreachable) one line at once."""
    from huggingface_hub import constants, try_to_load_from_cache

    cache = constants.HF_HUB_CACHE
    if isinstance(try_to_load_from_cache(ref, "config.json", cache_dir=cache), str):
        return tf.AutoConfig.from_pretrained(ref, local_files_only=True, cache_dir=cache, **overrides)
    if constants.HF_HUB_OFFLINE or not _hub_reachable():
        raise ImportError(f"{NO_NETWORK} (hf:{ref} is not in the cache {cache})")
    return tf.AutoConfig.from_pretrained(ref, cache_dir=cache, **overrides)


def hf_head(tf: Any, cfg: Any) -> tuple[Any, str]:
    """The model class ``hf:`` builds for ``cfg``, and why: the class its config names (``architectures``, as
    published on the Hub), else by the model's kind: the seq2seq LM of an encoder-decoder, the masked LM of an encoder
    (a BERT-like config that is not a decoder: its causal-LM class is the decoder variant, which needs
    ``is_decoder=True``), the causal LM of a decoder, else the bare model."""
    from transformers.models.auto import modeling_auto as auto

    named = [a for a in (getattr(cfg, "architectures", None) or []) if isinstance(getattr(tf, a, None), type)]
    if named:
        return getattr(tf, named[0]), "the class its config names"
    kind = getattr(cfg, "model_type", "")
    encoder = (not getattr(cfg, "is_decoder", False) and kind in auto.MODEL_FOR_MASKED_LM_MAPPING_NAMES
               and not getattr(cfg, "is_encoder_decoder", False))
    heads = [(tf.AutoModelForCausalLM, "a decoder: its causal-LM head"), (tf.AutoModelForMaskedLM, "its masked-LM head"),
             (tf.AutoModel, "the bare model: transformers has no LM head for it")]
    if getattr(cfg, "is_encoder_decoder", False):
        heads.insert(0, (tf.AutoModelForSeq2SeqLM, "an encoder-decoder: its seq2seq-LM head"))
    if encoder:
        why = ("an encoder (is_decoder is false): its masked-LM head"
               + ("; --kwargs '{\"is_decoder\": true}' analyses the causal-LM decoder variant"
                  if kind in auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES else ""))
        heads.insert(0, (tf.AutoModelForMaskedLM, why))
    for head, why in heads:
        try:
            return head._model_mapping[type(cfg)], why
        except KeyError:  # no class of this kind for the config
            continue
    raise ValueError(f"transformers has no model class for {type(cfg).__name__}")


def hf_factory(ref: str) -> Any:
    """A factory for ``hf:REF`` (see the ``target`` help): ``factory(**config_overrides)`` builds the model from its
    config alone, with the class :func:`hf_head` picks (``factory.choice`` says which and why, once it ran)."""
    try:
        import transformers as tf
    except ImportError:
        raise ImportError("hf: targets need transformers (pip install transformers)") from None
    if not ref:
        raise ValueError("hf: needs a model type (hf:llama), a local config (hf:path/to/config.json) or a Hub id")
    local = os.path.exists(ref)
    if not local and ref not in tf.CONFIG_MAPPING and "/" not in ref:
        import difflib

        close = difflib.get_close_matches(ref, list(tf.CONFIG_MAPPING.keys()), n=4)
        raise ValueError(f"{ref!r} is not a transformers model type" + (f" (close: {', '.join(close)})" if close else "")
                         + ", nor a local path; a Hub config is hf:ORG/NAME")

    def factory(**overrides: Any) -> Any:
        try:
            if local:
                cfg = tf.AutoConfig.from_pretrained(ref, **overrides)
            elif ref in tf.CONFIG_MAPPING:
                cfg = tf.AutoConfig.for_model(ref, **overrides)
            else:
                cfg = _hub_config(tf, ref, overrides)
        except OSError as e:  # no such Hub repo
            raise ImportError(f"no config for hf:{ref}: {str(e).strip().splitlines()[0]}") from None
        cls, why = hf_head(tf, cfg)
        factory.choice = f"{cls.__name__} ({why})"  # type: ignore[attr-defined]
        return cls._from_config(cfg)

    factory.__name__ = f"hf:{ref}"
    factory.choice = ""  # type: ignore[attr-defined]
    return factory


def build_model(factory: Any, kwargs: dict, device: str) -> Any:
    """``factory(**kwargs)``; for a meta analysis built on the meta device (no memory, no init compute: a 70B model
    analyses on a laptop), else, or when the factory cannot build there (one that loads weights), as given."""
    if device == "meta":
        import torch

        try:
            with torch.device("meta"):
                return factory(**kwargs)
        except ImportError:  # no config to be had (hf: with no network): the host has none either
            raise
        except Exception:  # a factory that needs real tensors: built on the host, analysis still on meta
            pass
    return factory(**kwargs)


#: the API's argument names in messages -> the CLI's options
_OPTIONS = {"input_shape": "--input-shape", "input_dtypes": "--input-dtype", "precision": "--precision",
            "fsdp_shard": "--fsdp-shard", "fsdp_units": "--fsdp-units", "fsdp": "--fsdp", "optimizer": "--optimizer",
            "attention_backend": "--attention-backend", "gpu": "--gpu", "device": "--device"}


def _cli_words(msg: str) -> str:
    """An analysis message in the CLI's words: ``fsdp=N`` -> ``--fsdp N``, ``backward=True`` -> ``--backward``,
    ``input_shape`` -> ``--input-shape``."""
    import re

    msg = msg.replace("backward=True", "--backward")
    msg = re.sub(r"\b([a-z_]+)=(\S?)", lambda m: (_OPTIONS[m.group(1)] + (" " + m.group(2) if m.group(2) else "")
                                                   if m.group(1) in _OPTIONS else m.group(0)), msg)
    return re.sub(r"\b([a-z]+_[a-z_]+)\b", lambda m: _OPTIONS.get(m.group(1), m.group(1)), msg)


def _units(text: str | None) -> Any:
    """``--fsdp-units``: a class name, or comma-separated module paths."""
    if not text:
        return None
    parts = [t.strip() for t in text.split(",") if t.strip()]
    return parts[0] if len(parts) == 1 and "." not in parts[0] and not parts[0].isdigit() else parts


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0]}" if text else type(e).__name__


def run(args: argparse.Namespace) -> int:
    from tscope_callbacks.analysis.report import step_file
    from tscope_callbacks.devices.resolve import get_device_spec
    from tscope_callbacks.devices.spec import UnknownDeviceError
    from tscope_callbacks.inputs import ModelRunError, user_frame_of

    def fail(msg: str) -> int:
        print(f"tscope analyze: {msg}", file=sys.stderr)
        return 2

    try:
        factory = hf_factory(args.target[3:]) if args.target.startswith("hf:") else load_target(args.target)
    except (ImportError, AttributeError, ValueError, TypeError) as e:
        return fail(f"{args.target}: {e}")
    except Exception as e:  # the user's module raised while it was imported
        where = user_frame_of(e)
        return fail(f"importing {args.target} raised {_first_line(e)}{f' at {where}' if where else ''}; fix that "
                    "module (it runs as `python FILE` would), then run again")
    try:
        model = build_model(factory, args.kwargs, args.device)
    except ImportError as e:  # an hf: config that cannot be had (no network, no such repo)
        return fail(f"{args.target}: {e}")
    except Exception as e:
        where = user_frame_of(e)
        return fail(f"building the model {args.target}(**--kwargs {json.dumps(args.kwargs)}) raised {_first_line(e)}"
                    f"{f' at {where}' if where else ''}; check --kwargs against its arguments")
    if getattr(factory, "choice", ""):
        print(f"tscope analyze: {args.target} is {factory.choice}", file=sys.stderr)
    dtypes = [None if d in (None, "float") else d for d in (args.input_dtype or [])]
    try:
        spec = get_device_spec(args.gpu)
        report = analyze_model(model, args.input_shape, spec, args.precision, input_dtypes=dtypes,
                               backward=args.backward, device=args.device,
                               attention_backend=args.attention_backend, optimizer=args.optimizer,
                               fsdp=args.fsdp, fsdp_units=_units(args.fsdp_units), fsdp_shard=args.fsdp_shard)
    except UnknownDeviceError as e:
        return fail(f"--gpu {args.gpu}: {e}")
    except ModelRunError as e:
        return fail(e.message(cli=True))
    except (ValueError, TypeError) as e:  # an option the analysis refused; its message names the argument
        return fail(_cli_words(str(e)))
    if args.print_markdown or not (args.plot or args.json):
        print(report.to_markdown(top=args.top))
    if args.plot:
        report.plot(args.plot)
        print(f"plot written to {args.plot}")
    if args.json:
        with open(args.json, "w") as f:
            # the analysed device travels with the profile: `tscope report` re-rates it on that device, not this host
            # the step file the callbacks write (its report in the current schema: ts.load_step_file reads it)
            json.dump(step_file(report.profile, spec.to_dict(), report), f)
        from tscope_callbacks.cli.hints import command  # the hint works without an activated venv

        print(f"JSON written to {args.json} (`{command('tscope', 'tscope_callbacks.cli')} report {args.json}` "
              f"re-renders it for {spec.name})")
    return 0
