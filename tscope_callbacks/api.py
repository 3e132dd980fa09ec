"""The public entry points that drive the layers below: ``analyze`` and ``roofline`` (resolve the device, then analyse
a profiled step into the one report, ``tscope_callbacks.StepReport``) and ``analyze_model`` (Tensorscope parity: count a model's ops on a named device without training).

The model runs on the ``meta`` device by default: shapes and dtypes flow through every op but nothing is
computed, so ``analyze_model(big_model, input_shape=[(512, 3, 224, 224)], gpu="H100")`` takes seconds on a laptop
and the report is a pure estimate (Tensorscope's "estimated forward pass time", but per op and with backward).
``device="cpu"`` (or "cuda") runs for real and the report also shows measured times.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import warnings
from collections.abc import Sequence
from typing import Any

import torch

from tscope_callbacks.analysis.analyze import AnalyzeOptions
from tscope_callbacks.analysis.analyze import analyze as _analyze
from tscope_callbacks.capture.meta_run import (
    AutocastAs,
    GroupedMmAs,
    SdpaAs,
    backend_for,
    lm_labels,
    loss_from,
    preserved,
    token_input,
)
from tscope_callbacks.capture.optim_step import optimizer_step
from tscope_callbacks.capture.profile import Profile, profile
from tscope_callbacks.capture.replay import ReplayProfile
from tscope_callbacks.devices.efficiency import KernelModel
from tscope_callbacks.devices.precision import TORCH_DTYPES, normalize_precision
from tscope_callbacks.devices.resolve import get_device_spec
from tscope_callbacks.devices.spec import DeviceSpec
from tscope_callbacks.inputs import ModelRunError, build_inputs, input_shapes
from tscope_callbacks.inputs import model_errors as _model_errors
from tscope_callbacks.records import CaptureInfo, ProfileFormatError, StepProfile
from tscope_callbacks.report import StepReport
from tscope_callbacks.rng import rng_preserving

__all__ = ["ModelRunError", "analyze", "analyze_model", "build_inputs", "input_shapes", "load_profile_file",
           "profile_model", "roofline"]



def _resolve(gpu: DeviceSpec | str | torch.device | None, default: str) -> DeviceSpec:
    """A DeviceSpec from a spec, a name, a path or a torch.device; ``"cpu"`` (a CPU profile's recorded device name)
    -> this machine's measured CPU roof."""
    if gpu is None or isinstance(gpu, str):
        gpu = gpu or default
        if gpu.strip().lower() == "cpu":
            return get_device_spec(torch.device("cpu"))
    return get_device_spec(gpu)


def _profile_of(prof: Any) -> StepProfile:
    """The StepProfile of ``prof``: itself, or a stopped ``ts.profile`` (its ``result``)."""
    res = prof if isinstance(prof, StepProfile) else getattr(prof, "result", None)
    if not isinstance(res, StepProfile):
        raise TypeError(f"needs a profiled step: the `prof` of `with ts.profile(model) as prof:` (after the "
                        f"with-block), or a StepProfile; got {type(prof).__name__}")
    if getattr(prof, "running", False):
        raise ValueError("the profile is still running: analyse it after its `with` block (or after prof.stop())")
    return res


def analyze(prof: StepProfile | Profile | ReplayProfile, gpu: DeviceSpec | str | torch.device | None = None,
            options: AnalyzeOptions | None = None) -> StepReport:
    """The report of ``prof`` (a ``ts.profile`` after its block, or a StepProfile) on ``gpu``'s roofs.

    ``gpu``: a name or alias from ``tscope specs`` ("h100"), a JSON spec path, a ``DeviceSpec``, a torch.device or
    "auto"; None: the device the profile ran on (``info.device_name``), else "auto". ``options``: how to analyse
    (:class:`~tscope_callbacks.analysis.analyze.AnalyzeOptions`: achievable roofs, a precision what-if, row
    grouping, the kernel model...). Times measured on another device than ``gpu`` are labelled a what-if (warned
    once)."""
    return _report(prof, gpu, options)


def _report(prof: Any, gpu: DeviceSpec | str | torch.device | None, options: AnalyzeOptions | None) -> StepReport:
    """:func:`analyze`, called by the public entry points (its warning names their caller's line)."""
    res = _profile_of(prof)
    spec = _resolve(gpu, res.info.device_name or "auto")
    o = options or AnalyzeOptions()
    other = timing_device_mismatch(res.info, spec) if any(r.time_s is not None for r in res.ops) else None
    if other is not None and (other, spec.name) not in _WARNED_WHAT_IF:
        _WARNED_WHAT_IF.add((other, spec.name))
        warnings.warn(f"tscope: times were measured on {other} but placed on the roofs of {spec.name}: % of roof, "
                      "MFU and recoverable time compare two devices (a what-if, labelled so in the report and a diff). "
                      "Leave the device out (gpu=None, no --gpu) to analyse on the device that ran them.", UserWarning, stacklevel=3)
    if other is not None and o.what_if is None:
        o = dataclasses.replace(o, what_if=other)
    return _analyze(res, spec, o, report_type=StepReport)


def roofline(prof: StepProfile | Profile | ReplayProfile, gpu: DeviceSpec | str | torch.device | None = None, *,
             achievable: DeviceSpec | str | None = None, precision: str | None = None, group_small: float = 0.01,
             kernel_model: bool | KernelModel | None = True) -> StepReport:
    """Place every op of ``prof`` on the roofline: :func:`analyze` with its options as arguments.

    ``gpu``: as :func:`analyze`'s. ``achievable``: measured roofs (DeviceSpec or name) shown beside the datasheet
    ones; default ``gpu.achievable``. ``precision``: force the roof precision of matrix-class ops (e.g. "fp8" for an
    fp8 what-if on a bf16 run); other ops always use their own dtype. ``group_small``: rows under this share of
    measured time (estimated when untimed) AND of FLOPs are grouped into one "(other N ...)" row in tables; totals
    always include them. ``kernel_model``: predict shape-aware kernel times from the device's measured efficiency
    (default), or False for pure roofline bounds.
    """
    ach = _resolve(achievable, "") if achievable is not None else None
    return _report(prof, gpu, AnalyzeOptions(achievable=ach, precision=precision, group_small=group_small,
                                             kernel_model=kernel_model))


_WARNED_WHAT_IF: set[tuple[str, str]] = set()


def load_profile_file(path: str, data: dict[str, Any] | None = None) -> tuple[StepProfile, DeviceSpec | str | None]:
    """(profile, device) from a saved JSON: ``StepProfile.to_dict()`` alone, or a step file's ``{"profile",
    "device"}`` (the device as a ``gpu_specs.json`` row, a name, or None). ``data``: the file's JSON, when already
    read with :func:`~tscope_callbacks.analysis.report.read_step_json`. Raises ValueError (a ``StepFileError`` for
    the file itself) with one line that names the file and what is wrong."""
    from tscope_callbacks.analysis.report import not_a_step_file, read_step_json

    if data is None:
        data = read_step_json(path)
    prof = data.get("profile", data)
    if not isinstance(prof, dict) or not isinstance(prof.get("ops"), list):
        raise ValueError(not_a_step_file(path, data))
    try:
        profile = StepProfile.from_dict(prof)
    except ProfileFormatError as e:
        raise ValueError(f"{path}: {e}") from None
    except (TypeError, AttributeError, KeyError) as e:
        raise ValueError(f"{path}: malformed profile ({e})") from None
    dev = data.get("device") if "profile" in data else None
    if isinstance(dev, dict):
        have = [k for k in ("flops", "bandwidth") if k in dev]
        if len(have) == 1:  # a roof row with half its roofs: say which field, not "unknown device"
            need = "bandwidth (bytes/s)" if have == ["flops"] else "flops (peak FLOP/s per precision)"
            raise ValueError(f"{path}: the device row {dev.get('name', '')!r} has no {need}; add it to the file, or "
                             "pass --gpu NAME (`tscope specs` lists the known devices)")
        try:
            dev = (DeviceSpec.from_dict(dev, where="the profile's device") if "flops" in dev and "bandwidth" in dev
                   else dev.get("name"))
        except (TypeError, ValueError) as e:
            raise ValueError(f"{path}: malformed device ({e})") from None
    return profile, dev


def timing_device_mismatch(info: CaptureInfo, spec: DeviceSpec) -> str | None:
    """The device the times were measured on when it is not ``spec``'s (None when they match or are unknown)."""
    dev, name = info.device, info.device_name
    if dev == "cpu":
        return None if getattr(spec, "vendor", "") == "cpu" and getattr(spec, "measured", False) else (
            "this machine's CPU")
    if dev == "cuda" and name:
        if name == spec.name:  # a spec named as the device reports itself (before resolving to a table row)
            return None
        try:
            return None if get_device_spec(name).name == spec.name else name
        except Exception:
            return None if name == spec.name else name
    return None


def _moved(model: torch.nn.Module, device: str, dtype: torch.dtype | None) -> torch.nn.Module:
    """``model.to(device).to(dtype)`` keeping shared parameters shared. A move across device types (CPU -> meta)
    makes a new Parameter per module, so a tied embedding and LM head (GPT-2, T5, Llama 3.2) would become two
    weights: their parameters, gradients and optimizer state counted twice, the gradient sum of the tie lost."""
    shared: dict[int, list[tuple[torch.nn.Module, str, bool]]] = {}
    for mod in model.modules():
        for store, is_param in ((mod._parameters, True), (mod._buffers, False)):
            for name, t in store.items():
                if t is not None:
                    shared.setdefault(id(t), []).append((mod, name, is_param))
    model = model.to(device=device)
    if dtype is not None:
        model = model.to(dtype)
    for refs in shared.values():
        if len(refs) > 1:
            mod0, name0, is_param0 = refs[0]
            first = (mod0._parameters if is_param0 else mod0._buffers)[name0]
            for mod, name, is_param in refs[1:]:
                (mod._parameters if is_param else mod._buffers)[name] = first
    return model


def analyze_model(
    model: torch.nn.Module,
    input_shape: Sequence[Sequence[int]] | Sequence[int] | None = None,
    gpu: DeviceSpec | str | torch.device = "auto",
    precision: str = "fp32",
    *,
    inputs: Sequence[Any] | None = None,
    input_dtypes: Sequence[str | torch.dtype | None] | None = None,
    backward: bool = False,
    device: str = "meta",
    print_report: bool = False,
    top: int = 20,
    attention_backend: str | None = None,
    optimizer: Any = None,
    fsdp: int | None = None,
    fsdp_units: Any = None,
    fsdp_shard: int | None = None,
) -> StepReport:
    """Count FLOPs/bytes of ``model`` on ``input_shape`` and place every op on ``gpu``'s roofline.

    Returns the report (``.to_markdown()``, ``.plot()``, ``summary.estimated_step_s``); ``report.profile`` is the
    underlying :class:`StepProfile`. ``backward=True`` also runs the backward, from the output's ``loss`` (HF
    outputs; HF causal LMs are given ``labels=input_ids``) or else from ``output.float().sum()``. ``precision`` in
    ("fp32", "tf32", "fp16", "bf16", "fp64"; "fp8"/"int8" are estimated from a bf16 run against the fp8/int8 roof):
    the model is cast to it; "bf16-mixed"/"16-mixed" keep fp32 weights and run under autocast, as Lightning's mixed
    precision trains (weight casts, fp32 norms/softmax/losses/pow included).

    Correct by default: token-id inputs are inferred for models that start with an embedding (``input_shape=[(4,
    64)]`` on GPT-2 builds int64 ids); on meta, attention runs the fused op the target device would
    (``attention_backend``: "cudnn" on Hopper, "flash" on other GPUs, "cpu" for CPU roofs; "efficient" for fp32 or
    masked attention), never the math path.

    ``optimizer`` (with ``backward=True``) adds one steady-state update, phase "optimizer", so the estimate is a whole
    training step: "adamw", "adam", "sgd" (PyTorch's foreach path, its GPU default), "adamw-fused", "adam-fused",
    "sgd-fused", or a factory ``lambda params: torch.optim.AdamW(params, ...)`` (run as given: on meta PyTorch's
    defaults pick the per-tensor loop, so pass ``foreach=True`` for what a GPU runs).

    ``fsdp=N``: also what FSDP2 over N GPUs would do to this step, per GPU (``analysis.fsdp.fsdp_whatif``: memory,
    collectives, exposed communication, step time), in ``report.fsdp_whatif`` and the report's FSDP section.
    Units: ``fsdp_units`` (module paths or a class name; default the repeated blocks). Under "-mixed" precision the
    parameters are gathered at the low dtype and gradients reduced in fp32 (torchtitan's policy). ``fsdp_shard=S``
    (S divides N): HSDP instead, sharded over S GPUs and replicated N/S times (e.g. ``fsdp=64, fsdp_shard=8``).
    """
    if fsdp is not None and (not isinstance(fsdp, int) or isinstance(fsdp, bool) or fsdp < 2):
        raise ValueError(f"fsdp= is the number of GPUs to shard over (2 or more), got {fsdp!r}")
    if fsdp is not None and not backward:
        raise ValueError("fsdp= needs backward=True: the what-if is a training step (gradients are reduce-scattered)")
    if fsdp_shard is not None and fsdp is None:
        raise ValueError("fsdp_shard= needs fsdp=N, the number of GPUs (HSDP: N = replicas x fsdp_shard)")
    prec = normalize_precision(precision)
    mixed = str(precision).strip().lower().endswith("-mixed")
    spec = get_device_spec(gpu)
    prof = profile_model(
        model, input_shape, precision=prec, inputs=inputs, input_dtypes=input_dtypes, backward=backward, device=device,
        attention_backend=attention_backend or backend_for(spec), mixed=mixed, optimizer=optimizer,
    )
    if str(device) == "meta":  # an estimate for the target: the profile says which device it is for
        prof.info = dataclasses.replace(prof.info, device_name=spec.name)
    opts = AnalyzeOptions(precision=prec)
    report = analyze(prof, spec, opts)
    if fsdp is not None:
        from tscope_callbacks.analysis.fsdp import fsdp_whatif, mixed_policy

        low, reduce = mixed_policy(precision)
        w = fsdp_whatif(report, model, fsdp, units=fsdp_units, param_dtype=low, reduce_dtype=reduce,
                        shard_size=fsdp_shard)
        report = analyze(prof, spec, dataclasses.replace(opts, fsdp_whatif=w))
    if print_report:
        print(report.to_markdown(top=top))
    return report


@rng_preserving  # random inputs and dropout: the user's seeded streams stay where they were
def profile_model(
    model: torch.nn.Module,
    input_shape: Any = None,
    *,
    precision: str = "fp32",
    inputs: Sequence[Any] | None = None,
    input_dtypes: Sequence[Any] | None = None,
    backward: bool = False,
    device: str = "meta",
    attention_backend: str = "flash",
    mixed: bool = False,
    optimizer: Any = None,
) -> StepProfile:
    """Run ``model`` once under :func:`profile` on ``device`` at ``precision``; returns the StepProfile.

    ``mixed``: keep the weights in fp32 and run under autocast to ``precision`` (``torch.autocast`` on a real
    device; on meta ``capture.meta_run.AutocastAs``, CUDA autocast's op lists), as ``precision="bf16-mixed"``
    training does; otherwise the model is cast to ``precision``.

    ``attention_backend``: on meta, the fused SDPA op to count ("cudnn", "flash", "efficient"-only cases, "cpu"; see
    ``capture.meta_run.SdpaAs``); real devices run their own dispatch. ``optimizer``: see :func:`analyze_model`."""
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"analyze_model needs a torch.nn.Module, got {type(model).__name__}")
    if optimizer is not None and not backward:
        raise ValueError("optimizer= needs backward=True: an update needs the gradients")
    if inputs is None and input_shape is None:
        raise ValueError("give input_shape=[(batch, ...), ...] or inputs=[tensor, ...]")
    low = TORCH_DTYPES.get(precision, torch.float32)
    if mixed and low not in (torch.bfloat16, torch.float16):
        raise ValueError(f"mixed precision needs bf16 or fp16, got {precision!r}")
    dtype = torch.float32 if mixed else low
    work = model
    on_target = all(p.device.type == torch.device(device).type for p in model.parameters())
    if not on_target or dtype != torch.float32:
        work = _moved(copy.deepcopy(model), device, None if dtype == torch.float32 else dtype)
    # analysed in place (already on the device, at its dtype): left as it was afterwards (capture.meta_run.preserved)
    keep = preserved(model, weights=optimizer is not None) if work is model else contextlib.nullcontext()
    if inputs is None:
        vocab = token_input(model) if not input_dtypes else None
        if vocab is not None:  # token ids first (an embedding cannot take bf16 "indices")
            shapes = input_shapes(input_shape)
            if len(shapes[0]) > 2:  # (batch, seq, hidden) given for ids: every id becomes a row of embeddings
                warnings.warn(f"tscope: {type(model).__name__} takes token ids first (it starts with an embedding), "
                              f"so input shape {tuple(shapes[0])} is taken as {len(shapes[0])}-D ids and each id "
                              "gets its own embedding row; token ids are usually (batch, seq), e.g. "
                              f"{shapes[0][0]},{shapes[0][1]} (--input-shape / input_shape)", stacklevel=2)
            inputs = build_inputs(shapes[:1], dtype=torch.long, device=device, high=max(vocab, 1))
            inputs += build_inputs(shapes[1:], dtype=dtype, device=device) if shapes[1:] else []
        else:
            inputs = build_inputs(input_shape, dtype=dtype, input_dtypes=input_dtypes, device=device)
    else:
        inputs = [i.to(device) if isinstance(i, torch.Tensor) else i for i in inputs]
    extra = lm_labels(work, inputs) if backward else {}
    timing = None if device == "meta" else "auto"
    prev = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high" if precision == "tf32" else prev)
    try:
        meta = str(device) == "meta"
        sdpa = SdpaAs(attention_backend) if meta else contextlib.nullcontext()
        amp: Any = contextlib.nullcontext()
        if mixed:  # entered after SdpaAs: casts first, so SDPA is routed on the low-precision inputs
            amp = AutocastAs(low) if meta else torch.autocast(torch.device(device).type, dtype=low)
        # on meta, layer details: saved activations and the step's memory by category (nothing runs, so they cost
        # little; on a real device they would slow the measured step, and compiled modules would run eagerly)
        # GroupedMmAs under the capture's mode: the capture records the grouped GEMMs as called
        with keep, GroupedMmAs() if meta else contextlib.nullcontext(), \
                profile(work, timing=timing, layer_details=meta) as prof:
            work.train(backward)
            model_errors = _model_errors(input_shape, str(device), precision + ("-mixed" if mixed else ""))
            with torch.set_grad_enabled(backward), sdpa, amp, model_errors:
                out = work(*inputs, **extra)
                how = None
                if backward:
                    loss, how = loss_from(out)
                    del out  # a training step keeps only its loss through the backward
                    loss.backward()
                    del loss
            if optimizer is not None:
                prof.pause()  # building the optimizer and its first, state-creating step: a one-time cost
                try:
                    opt, step = optimizer_step([p for p in work.parameters() if p.grad is not None], optimizer,
                                               str(device))
                    prof.add_optimizer(opt)  # its state is part of the step's memory
                finally:
                    prof.resume()
                with prof.phase("optimizer"), model_errors:
                    step()
    finally:
        torch.set_float32_matmul_precision(prev)
    res = prof.result
    res.info = dataclasses.replace(
        res.info, analysis_precision=precision + ("-mixed" if mixed else ""), analysis_device=str(device),
        backward=backward, backward_from=("loss (labels = input ids)" if extra else how) if backward else None,
        attention_backend=attention_backend if str(device) == "meta" else "device dispatch",
        optimizer=optimizer if optimizer is None or isinstance(optimizer, str) else "custom",
        attention_calls=dict(getattr(sdpa, "used", {})))
    return res


