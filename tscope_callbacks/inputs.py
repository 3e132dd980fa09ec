"""The inputs of an analysed model and what its run raised: ``input_shape`` checked and turned into random tensors
(``build_inputs``), and the model's own exception turned into one message that says what to change
(:class:`ModelRunError`), in the API's words or the CLI's options."""

from __future__ import annotations

import operator
import os
from collections.abc import Sequence
from typing import Any

import torch

from tscope_callbacks.capture.op_origin import is_library_file

__all__ = ["ModelRunError", "build_inputs", "input_shapes", "model_errors", "user_frame_of"]

_INT_DTYPES = {"long": torch.long, "int64": torch.long, "int": torch.int32, "int32": torch.int32}


def input_shapes(input_shape: Any) -> list[tuple[int, ...]]:
    """``input_shape`` as one tuple per model input (a single shape may be given bare); a clear error otherwise."""
    example = "e.g. input_shape=[(32, 3, 224, 224)] or [(8, 1024)] for token ids"
    if isinstance(input_shape, (str, bytes)) or not isinstance(input_shape, Sequence) or not input_shape:
        raise ValueError(f"input_shape must be a list of shapes, one per model input ({example}); got {input_shape!r}")
    shapes = [input_shape] if isinstance(input_shape[0], int) else list(input_shape)
    out = []
    for i, shp in enumerate(shapes):
        if isinstance(shp, (str, bytes)) or not isinstance(shp, Sequence) or not shp:
            raise ValueError(f"input_shape[{i}] = {shp!r} is not a shape ({example})")
        try:
            dims = tuple(operator.index(d) for d in shp if not isinstance(d, bool))
        except TypeError:
            dims = ()
        if len(dims) != len(shp) or min(dims) < 1:
            raise ValueError(f"input_shape[{i}] = {tuple(shp)!r}: every dimension must be a whole number >= 1")
        out.append(dims)
    return out


class ModelRunError(ValueError):
    """The analysed model raised while running: what it raised, where in the user's code, with which inputs, and
    the one change most likely to help (``hint``: "input_shape", "precision" or "device"), in the API's words or
    (``message(cli=True)``) the CLI's options. ``error`` is the model's own exception, with its traceback."""

    def __init__(self, error: BaseException, *, input_shape: Any, device: str, precision: str) -> None:
        self.error, self.input_shape, self.device, self.precision = error, input_shape, str(device), precision
        text = str(error).strip()
        self.first = f"{type(error).__name__}: {text.splitlines()[0].rstrip('.') if text else ''}".rstrip(": ")
        self.where = user_frame_of(error)
        low = text.lower()
        if self.device == "meta" and (isinstance(error, NotImplementedError) or "meta" in low or ".item()" in low
                                      or "data-dependent" in low):
            self.hint = "device"
        elif any(w in low for w in ("dtype", "scalar type", "half", "bfloat16", "bf16", "fp16", "float16")):
            self.hint = "precision"
        elif any(w in low for w in ("shape", "size", "dim", "mismatch", "cannot be multiplied", "index",
                                    "out of range")):
            self.hint = "input_shape"
        else:
            self.hint = ""
        super().__init__(self.message())

    def message(self, *, cli: bool = False) -> str:
        shapes = (" ".join("--input-shape " + ",".join(map(str, s)) for s in input_shapes(self.input_shape))
                  if cli else f"input_shape={self.input_shape!r}") if self.input_shape is not None else "the inputs given"
        where = f" at {self.where}" if self.where else ""
        head = (f"the model raised {self.first}{where}, run on {self.device} with {shapes} at "
                f"{'--precision ' if cli else 'precision '}{self.precision}.")
        opt = {"input_shape": "--input-shape" if cli else "input_shape",
               "precision": "--precision" if cli else "precision",
               "device": "--device cpu" if cli else "device='cpu'"}
        advice = {
            "input_shape": f"Check {opt['input_shape']}: one shape per argument of the model's forward, in order "
                           "(e.g. 32,3,224,224 for images, 8,1024 for token ids)." if cli else
                           "Check input_shape: one shape per argument of the model's forward, in order (e.g. "
                           "[(32, 3, 224, 224)] for images, [(8, 1024)] for token ids).",
            "precision": f"Try another {opt['precision']} (e.g. bf16: weights cast; bf16-mixed: autocast).",
            "device": f"This model cannot run on the meta device; {opt['device']} runs it for real (slower, exact).",
        }
        tail = advice[self.hint] if self.hint else (f"Check {opt['input_shape']}, try another {opt['precision']}, or "
                                                    f"{opt['device']} to run it for real.")
        return f"{head} {tail}"


class _ModelErrors:
    """Around the model's own forward, backward or update (reusable): an exception becomes a
    :class:`ModelRunError` that says what to change, not 20 frames of torch."""

    def __init__(self, input_shape: Any, device: str, precision: str) -> None:
        self.input_shape, self.device, self.precision = input_shape, device, precision

    def __enter__(self) -> None:
        return None

    def __exit__(self, typ: Any, e: BaseException | None, tb: Any) -> bool:
        if isinstance(e, Exception):
            raise ModelRunError(e, input_shape=self.input_shape, device=self.device, precision=self.precision) from None
        return False


def user_frame_of(error: BaseException) -> str:
    """``file:line in function`` of the innermost frame of ``error``'s traceback outside torch and tscope."""
    import traceback

    frames = [f for f in traceback.extract_tb(error.__traceback__) if not is_library_file(f.filename)]
    if not frames:
        return ""
    f = frames[-1]
    return f"{os.path.basename(f.filename)}:{f.lineno} in {f.name}"


def build_inputs(
    input_shape: Sequence[Sequence[int]] | Sequence[int],
    *,
    dtype: torch.dtype = torch.float32,
    input_dtypes: Sequence[str | torch.dtype | None] | None = None,
    device: str | torch.device = "meta",
    high: int = 2,
) -> list[torch.Tensor]:
    """Random inputs of the given shapes. ``input_dtypes`` per input: "long" for token ids (values < ``high``)."""
    shapes = input_shapes(input_shape)
    out = []
    for i, shp in enumerate(shapes):
        want = (input_dtypes[i] if input_dtypes and i < len(input_dtypes) else None) or dtype
        if isinstance(want, str):
            if want not in _INT_DTYPES:
                raise ValueError(f"input dtype {want!r} not understood; use one of {sorted(_INT_DTYPES)} or a torch dtype")
            want = _INT_DTYPES[want]
        if want.is_floating_point:
            out.append(torch.randn(shp, dtype=want, device=device))
        else:
            out.append(torch.randint(0, high, shp, dtype=want, device=device))
    return out


def model_errors(input_shape: Any, device: str, precision: str) -> _ModelErrors:
    """A reusable context around the model's own forward, backward or update (see :class:`ModelRunError`)."""
    return _ModelErrors(input_shape, device, precision)
