"""Running a model once for analysis (``api.analyze_model``) the way the target device would run it.

On ``meta`` nothing is computed, but the dispatcher still picks kernels by device: SDPA would take the CPU path (its
math decomposition, or the CPU flash op), GQA would ``repeat_interleave`` K and V, and the counts would describe a CPU
run rather than the GPU the report is for. :class:`SdpaAs` routes ``scaled_dot_product_attention`` to the fused op of
the target's backend (these ops have meta kernels, forward and backward), choosing as PyTorch's CUDA dispatcher does:

- cuDNN attention on Hopper (H100/H200/H800/GH200: what torch 2.11 runs for a causal bf16 GPT-2 step, see the
  recorded kernel names), flash elsewhere, for 16-bit inputs without a mask, head dim <= 256;
- flash for grouped-query attention (``enable_gqa=True`` or fewer K/V heads): flash reads the shared K/V heads
  directly, no repeat;
- memory-efficient attention for fp32 inputs or an explicit mask (boolean masks become the additive bias the kernel
  takes); K/V heads are repeated for GQA, as the real dispatch does for this backend.

:class:`SdpaAs` also runs ``nn.LSTM``/``GRU``/``RNN`` as the target does, one fused op instead of the per-time-step
decomposition meta would otherwise run: oneDNN's ``mkldnn_rnn_layer`` per layer and direction for CPU roofs (an
LSTM; torch's CPU GRU/RNN are unfused there too), cuDNN's ``_cudnn_rnn`` for GPUs (its backward, which has no meta
kernel, gets its gradients' shapes in :class:`GroupedMmAs`). Meta knows no workspace sizes: oneDNN's workspace and
cuDNN's reserve are empty there, so their bytes are not counted.

:class:`AutocastAs` does for ``precision="bf16-mixed"`` what ``torch.autocast("cuda")`` does on a GPU, on any device
(autocast has no meta backend): matrix ops cast their floating inputs to the low precision (weights once per region,
as autocast caches them), the ops CUDA autocast runs in fp32 (``pow``, ``layer_norm``, ``softmax``, losses, ...) cast
theirs to fp32, and multi-input ops promote to the widest type. The casts are real ops, counted like the
``_to_copy`` kernels of a real autocast step.

:class:`GroupedMmAs` lets fp32 and fp16 grouped GEMMs (MoE experts) run on meta, as eager CUDA runs them.

:func:`preserved` undoes what the run did to a model that is analysed in place: modes, gradients, buffers and, after
an optimizer step, the weights.

Also here: which inputs are token ids (:func:`token_input`), the labels that give an HF causal LM its real loss
(:func:`lm_labels`), and the loss a backward pass starts from (:func:`loss_from`).
"""

from __future__ import annotations

import contextlib
import inspect
import re
from collections.abc import Iterator
from math import inf
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from tscope_callbacks.capture.meta_values import KnownValues

__all__ = ["SdpaAs", "AutocastAs", "GroupedMmAs", "preserved", "AUTOCAST_LOW", "AUTOCAST_FP32", "BACKENDS", "backend_for", "token_input", "lm_labels", "loss_from"]

BACKENDS = ("cudnn", "flash", "efficient", "cpu")
_HOPPER = re.compile(r"\b(h100|h200|h800|h20|gh200)\b", re.I)
_GROUPED_MM = getattr(torch.ops.aten, "_grouped_mm", None)
_GROUPED_MM = getattr(_GROUPED_MM, "default", None)
_CUDNN_RNN_BACKWARD = getattr(getattr(torch.ops.aten, "_cudnn_rnn_backward", None), "default", None)
_TOKEN_ARGS = ("input_ids", "idx", "ids", "tokens", "token_ids", "input_tokens")


def backend_for(spec: Any) -> str:
    """The SDPA backend a target device runs by default: "cpu" for CPU roofs, "cudnn" on Hopper, else "flash"."""
    name = str(getattr(spec, "name", spec) or "")
    if getattr(spec, "measured", False) or name.lower().startswith("cpu") or "cpu" == name.lower():
        return "cpu"
    return "cudnn" if _HOPPER.search(name) else "flash"


def _args(args: tuple, kwargs: dict) -> dict[str, Any]:
    names = ["query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa"]
    kw = dict(zip(names, args))
    kw.update(kwargs)
    return kw


class SdpaAs(torch.overrides.TorchFunctionMode):
    """Route ``F.scaled_dot_product_attention`` on meta tensors to the fused op ``backend`` runs (see module doc);
    ``backend="cpu"`` (``gpu="auto"`` on a CPU machine) does what torch's CPU dispatch does: the CPU flash op, which
    reads grouped K/V heads directly and takes a boolean mask as ``where(mask, 0, -inf)``, or the math path where that
    kernel does not apply (dropout, a mask that requires grad), so meta counts the CPU step."""

    def __init__(self, backend: str) -> None:
        super().__init__()
        if backend not in BACKENDS:
            raise ValueError(f"attention backend must be one of {BACKENDS}, got {backend!r}")
        self.backend = backend
        self.used: dict[str, int] = {}  #: backend -> calls routed
        self.rnn_used: dict[str, int] = {}  #: "lstm:cpu" / "<rnn>:cudnn" -> recurrent layers routed

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _RNN_FUNCS:
            out = self._rnn(_RNN_FUNCS[func], args, kwargs)
            return func(*args, **kwargs) if out is None else out
        if func is not torch.nn.functional.scaled_dot_product_attention:
            return func(*args, **kwargs)
        a = _args(args, kwargs)
        q, k, v = a["query"], a["key"], a["value"]
        if q.device.type != "meta" or q.dim() != 4 or k.dim() != 4:
            return func(*args, **kwargs)
        out = self._route(q, k, v, a.get("attn_mask"), float(a.get("dropout_p") or 0.0), bool(a.get("is_causal")),
                          a.get("scale"), bool(a.get("enable_gqa")))
        return func(*args, **kwargs) if out is None else out

    def _route(self, q, k, v, mask, dropout, causal, scale, gqa):
        hq, hk = q.shape[1], k.shape[1]
        grouped = hq != hk
        if grouped and (not gqa or hq % hk):
            return None  # torch raises for these; let it
        lse = q.requires_grad or k.requires_grad or v.requires_grad
        half = q.dtype in (torch.float16, torch.bfloat16) and q.shape[-1] <= 256
        if self.backend == "cpu":
            if dropout > 0 or mask is not None and (mask.requires_grad or mask.dtype == torch.bool
                                                    and mask.dim() != 4):
                return None  # the CPU kernel has no dropout and no mask gradient (T5's position bias): the math
                # path, as torch's CPU dispatch takes (sdp_utils_cpp: check_for_dropout; the mask's autograd)
            self.used["cpu"] = self.used.get("cpu", 0) + 1
            if mask is not None and mask.dtype == torch.bool:  # as SDPA's CPU dispatch converts it: kept 0, else -inf
                zero, ninf = (torch.ops.aten.scalar_tensor(v, dtype=q.dtype, device=q.device) for v in (0.0, -inf))
                mask = torch.where(mask, zero, ninf)
            return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
                q, k, v, dropout, causal, attn_mask=mask, scale=scale)[0]
        if mask is None and half and (grouped or self.backend == "flash"):
            self.used["flash"] = self.used.get("flash", 0) + 1
            return torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, dropout, causal, False,
                                                                      scale=scale)[0]
        if mask is None and half:
            self.used["cudnn"] = self.used.get("cudnn", 0) + 1
            return torch.ops.aten._scaled_dot_product_cudnn_attention(q, k, v, None, lse, dropout, causal, False,
                                                                      scale=scale)[0]
        if grouped:
            k = k.repeat_interleave(hq // hk, dim=1)
            v = v.repeat_interleave(hq // hk, dim=1)
        bias = None
        if mask is not None:
            bias = mask
            if mask.dtype == torch.bool:
                bias = torch.zeros(mask.shape, dtype=q.dtype, device=q.device).masked_fill(~mask, float("-inf"))
            bias = bias.to(q.dtype).expand(q.shape[0], hq, q.shape[2], k.shape[2])
        self.used["efficient"] = self.used.get("efficient", 0) + 1
        return torch.ops.aten._scaled_dot_product_efficient_attention(q, k, v, bias, lse, dropout, causal,
                                                                      scale=scale)[0]


    def _rnn(self, name: str, args: tuple, kwargs: dict):
        """An ``nn.LSTM``/``GRU``/``RNN`` on meta (``torch._VF.lstm`` ...) as the target runs it: the fused kernel.
        On meta torch would decompose it per time step (a mm, sigmoid/tanh and mul per gate and step: about 50
        small ops for 24 steps), which neither a CPU nor a GPU step runs. None: let torch run it as it would."""
        if kwargs or len(args) < 9 or not isinstance(args[2], (list, tuple)):  # packed sequences: torch's own path
            return None
        x, hx, params, has_biases, num_layers, dropout, train, bidirectional, batch_first = args[:9]
        lstm = name == "lstm"
        h, c = (hx[0], hx[1]) if lstm else (hx, None)
        if not isinstance(x, torch.Tensor) or x.device.type != "meta" or x.dim() != 3 or not x.numel():
            return None
        if lstm and h.shape[-1] != c.shape[-1]:
            return None  # projections (proj_size): the unfused path on CPU; left to torch
        if self.backend == "cpu":
            return self._rnn_cpu(x, h, c, list(params), has_biases, num_layers, dropout, train, bidirectional,
                                 batch_first) if lstm and _mkldnn_lstm(x) else None
        if x.dtype not in (torch.float32, torch.float16, torch.bfloat16, torch.float64):
            return None
        # cuDNN, as at::native::_cudnn_impl calls it (aten/src/ATen/native/cudnn/RNN.cpp): one op for all layers
        # and directions; the weights are the module's flattened buffer on a GPU (no copy, not read twice here)
        self.rnn_used[f"{name}:cudnn"] = self.rnn_used.get(f"{name}:cudnn", 0) + 1
        buf = torch.empty(0, dtype=x.dtype, device=x.device)
        out = torch.ops.aten._cudnn_rnn(x, list(params), 4 if has_biases else 2, buf, h, c, _CUDNN_MODE[name],
                                        h.shape[-1], 0, num_layers, batch_first, float(dropout), bool(train),
                                        bool(bidirectional), [], None)
        return (out[0], out[1], out[2]) if lstm else (out[0], out[1])

    def _rnn_cpu(self, x, h, c, params, has_biases, num_layers, dropout, train, bidirectional, batch_first):
        """The CPU step's LSTM: oneDNN, one ``mkldnn_rnn_layer`` per layer and direction, as at::native's
        mkldnn_impl runs it (aten/src/ATen/native/mkldnn/RNN.cpp): transpose to time-major, contiguous, one layer
        after another (directions concatenated, dropout between layers), stacked final states."""
        self.rnn_used["lstm:cpu"] = self.rnn_used.get("lstm:cpu", 0) + 1
        x = (x.transpose(0, 1) if batch_first else x).contiguous()
        h, c = h.contiguous(), c.contiguous()
        dirs = 2 if bidirectional else 1
        stride = 4 if has_biases else 2
        hidden = h.shape[-1]
        hy, cy = [], []
        for layer in range(num_layers):
            outs = []
            for d in range(dirs):
                i = layer * dirs + d
                w = params[i * stride:(i + 1) * stride]
                b0, b1 = (w[2], w[3]) if has_biases else (torch.zeros(w[0].shape, dtype=w[0].dtype, device=x.device),
                                                          torch.zeros(w[1].shape, dtype=w[1].dtype, device=x.device))
                y, hh, cc, _ = torch.ops.aten.mkldnn_rnn_layer(x, w[0], w[1], b0, b1, h[i], c[i], d > 0, [], 2, hidden,
                                                               num_layers, has_biases, bidirectional, batch_first,
                                                               bool(train))
                outs.append(y)
                hy.append(hh)
                cy.append(cc)
            x = outs[0] if dirs == 1 else torch.cat(outs, -1)
            if dropout and train and layer < num_layers - 1:
                x = torch.dropout(x, float(dropout), True)
        hy_t, cy_t = torch.stack(hy, 0), torch.stack(cy, 0)
        return (x.transpose(0, 1) if batch_first else x), hy_t, cy_t


def _mkldnn_lstm(x: torch.Tensor) -> bool:
    """Whether torch's CPU dispatch runs this LSTM with oneDNN (at::native ``use_mkldnn``): oneDNN built and
    enabled, fp32, or bf16 / fp16 (inference only) where the CPU supports it."""
    if not (torch.backends.mkldnn.is_available() and torch._C._get_mkldnn_enabled()):
        return False
    if x.dtype == torch.float32:
        return True
    ok = getattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported" if x.dtype == torch.bfloat16
                 else "_is_mkldnn_fp16_supported", None)
    if x.dtype == torch.float16 and torch.is_grad_enabled():
        return False
    try:
        return x.dtype in (torch.bfloat16, torch.float16) and ok is not None and bool(ok())
    except RuntimeError:
        return False


_RNN_FUNCS = {getattr(torch._C._VariableFunctions, n): n for n in ("lstm", "gru", "rnn_tanh", "rnn_relu")}
_CUDNN_MODE = {"rnn_relu": 0, "rnn_tanh": 1, "lstm": 2, "gru": 3}  #: cudnnRNNMode_t


#: CUDA autocast's lower-precision ops (torch/csrc/autograd/autocast_mode.cpp), by function name
AUTOCAST_LOW = frozenset({
    "conv1d", "conv2d", "conv3d", "conv_tbc", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d", "prelu",
    "addmm", "addmv", "addr", "matmul", "__matmul__", "__rmatmul__", "einsum", "mm", "mv", "linear", "addbmm",
    "baddbmm", "bmm", "chain_matmul", "multi_dot", "lstm_cell", "gru_cell", "rnn_tanh_cell", "rnn_relu_cell",
    "scaled_dot_product_attention"})
#: ops CUDA autocast runs in fp32 (incl. the fp32_set_opt_dtype ones: softmax, sums ... without an explicit dtype)
AUTOCAST_FP32 = frozenset({
    "acos", "asin", "cosh", "erfinv", "exp", "expm1", "log", "log10", "log2", "log1p", "reciprocal", "rsqrt", "sinh",
    "tan", "pow", "__pow__", "__rpow__", "__rtruediv__", "softplus", "layer_norm", "group_norm", "norm",
    "cosine_similarity", "poisson_nll_loss", "cosine_embedding_loss", "nll_loss", "hinge_embedding_loss", "kl_div",
    "l1_loss", "smooth_l1_loss", "huber_loss", "mse_loss", "margin_ranking_loss", "multilabel_margin_loss",
    "soft_margin_loss", "triplet_margin_loss", "multi_margin_loss", "binary_cross_entropy_with_logits", "dist",
    "pdist", "cdist", "renorm", "logsumexp", "softmax", "log_softmax", "cross_entropy", "cumsum", "cumprod", "prod",
    "sum", "vector_norm", "matrix_norm"})
_FP32_OPT_DTYPE = frozenset({"softmax", "log_softmax", "cumsum", "cumprod", "prod", "sum", "vector_norm",
                             "matrix_norm"})
_PROMOTE = frozenset({"addcdiv", "addcmul", "atan2", "bilinear", "cross", "dot", "grid_sample", "index_put",
                      "scatter_add", "tensordot", "cat", "stack"})


class AutocastAs(torch.overrides.TorchFunctionMode):
    """Emulate CUDA autocast to ``dtype`` (bf16/fp16) at the torch-function level, on any device (see module doc).
    Casts of leaf tensors that require grad (weights) are cached for the mode's lifetime, like autocast's cache."""

    def __init__(self, dtype: torch.dtype) -> None:
        super().__init__()
        self.dtype = dtype
        self._cache: dict[int, torch.Tensor] = {}

    def _cast(self, x: Any, to: torch.dtype) -> Any:
        if isinstance(x, (list, tuple)):
            return type(x)(self._cast(v, to) for v in x)
        if not isinstance(x, torch.Tensor) or not x.is_floating_point() or x.dtype == to or x.dtype == torch.float64:
            return x
        if x.is_leaf and x.requires_grad and to == self.dtype:
            hit = self._cache.get(id(x))
            if hit is None:
                hit = self._cache[id(x)] = x.to(to)
            return hit
        return x.to(to)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if name in AUTOCAST_LOW:
            to: torch.dtype | None = self.dtype
        elif name in AUTOCAST_FP32 and not (name in _FP32_OPT_DTYPE and kwargs.get("dtype") is not None):
            to = torch.float32
        elif name in _PROMOTE:
            flat = [t for a in args for t in (a if isinstance(a, (list, tuple)) else [a])
                    if isinstance(t, torch.Tensor) and t.is_floating_point()]
            to = max((t.dtype for t in flat), key=lambda d: torch.finfo(d).bits, default=None)
            if to is not None and all(t.dtype == to for t in flat):
                to = None
        else:
            to = None
        if to is not None:
            args = tuple(self._cast(a, to) for a in args)
            kwargs = {k: self._cast(v, to) for k, v in kwargs.items()}
        return func(*args, **kwargs)


class GroupedMmAs(TorchDispatchMode):
    """The dispatch side of a meta run: the values it can know (``capture.meta_values.KnownValues``: the masks a
    model builds from constants, ``.item()`` on them) and grouped GEMMs in every dtype.

    torch's meta kernel of ``aten._grouped_mm`` takes bf16 only (what Inductor supports), while eager CUDA also
    runs fp32 and fp16 grouped GEMMs (HF's MoE experts in fp32, or under bf16-mixed, where HF casts the tokens to
    the fp32 weights): on meta those would raise. Here the output's shape comes from the meta kernel on bf16
    stand-ins and takes the inputs' dtype (or ``out_dtype``); the op itself is recorded above this mode, as called."""

    def __init__(self) -> None:
        super().__init__()
        self.values = KnownValues()

    def __exit__(self, *exc: Any) -> Any:
        self.values.clear()
        return super().__exit__(*exc)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        a = args[0] if args else None
        if func is _CUDNN_RNN_BACKWARD and isinstance(a, torch.Tensor) and a.device.type == "meta":
            return _cudnn_rnn_backward_meta(args, kwargs)
        if (func is not _GROUPED_MM or not isinstance(a, torch.Tensor) or a.device.type != "meta"
                or a.dtype == torch.bfloat16):
            return self.values.run(func, args, kwargs)
        args, kwargs = list(args), dict(kwargs)
        want = (args.pop(4) if len(args) > 4 else kwargs.pop("out_dtype", None)) or a.dtype
        bf = lambda t: t.to(torch.bfloat16) if isinstance(t, torch.Tensor) and t.is_floating_point() else t  # noqa: E731
        out = func(*[bf(x) for x in args], **{k: bf(v) for k, v in kwargs.items()})
        return torch.empty(out.shape, dtype=want, device="meta")


def _cudnn_rnn_backward_meta(args: tuple, kwargs: dict) -> Any:
    """``_cudnn_rnn_backward`` has no meta kernel: its gradients take the shapes of what they are the gradients of
    (input, hx, cx, each weight), those ``output_mask`` asks for."""
    names = ("input", "weight", "weight_stride0", "weight_buf", "hx", "cx")
    a = dict(zip(names, args))
    a.update({k: v for k, v in kwargs.items() if k in names})
    mask = kwargs.get("output_mask", args[-1] if args and isinstance(args[-1], (list, tuple)) else None)
    mask = list(mask) if mask is not None and len(mask) == 4 else [True] * 4
    like = lambda t, m: torch.empty_like(t) if m and isinstance(t, torch.Tensor) else None  # noqa: E731
    return (like(a["input"], mask[0]), like(a["hx"], mask[1]), like(a.get("cx"), mask[2]),
            [torch.empty_like(w) for w in a["weight"]] if mask[3] else [])


@contextlib.contextmanager
def preserved(model: torch.nn.Module, *, weights: bool) -> Iterator[None]:
    """Run an analysis on ``model`` itself and leave it as it was: each module's train/eval mode, each parameter's
    ``.grad`` (the analysis's backward would otherwise leave or add to them, and the next analysis or training step
    would count or apply them), buffers (a train-mode forward moves BatchNorm's running statistics) and, with
    ``weights`` (an optimizer step ran), the parameters' values. Real tensors are copied; meta ones hold no values."""
    modes = [(m, m.training) for m in model.modules()]
    params = list(model.parameters())
    grads = [p.grad for p in params]
    real = lambda t: t.device.type != "meta"  # noqa: E731
    bufs = [(b, b.detach().clone()) for b in model.buffers() if real(b)]
    vals = [(p, p.detach().clone()) for p in params if real(p)] if weights else []
    try:
        yield
    finally:
        with torch.no_grad():
            for t, saved in bufs + vals:
                t.copy_(saved)
        for p, g in zip(params, grads):
            p.grad = g
        for m, mode in modes:
            m.training = mode


def _forward_params(model: torch.nn.Module) -> list[str]:
    try:
        return [p for p in inspect.signature(model.forward).parameters if p not in ("self",)]
    except (TypeError, ValueError):
        return []


def token_input(model: torch.nn.Module) -> int | None:
    """The vocabulary size when the model's first input is token ids (its forward's first argument is named like
    ``input_ids``, or its first module with parameters is an ``nn.Embedding``); None otherwise."""
    first = next((m for m in model.modules() if any(True for _ in m.parameters(recurse=False))), None)
    params = _forward_params(model)
    named = bool(params) and params[0] in _TOKEN_ARGS
    if isinstance(first, torch.nn.Embedding):
        return int(first.num_embeddings)
    if named:
        emb = next((m for m in model.modules() if isinstance(m, torch.nn.Embedding)), None)
        return int(emb.num_embeddings) if emb is not None else 2
    return None


def lm_labels(model: torch.nn.Module, inputs: list[Any]) -> dict[str, Any]:
    """``{"labels": input_ids}`` for a model whose forward takes ``labels`` and whose first input is token ids (HF
    causal LMs: the backward then starts from the real cross-entropy loss, not a sum over the logits)."""
    params = _forward_params(model)
    if "labels" in params and inputs and isinstance(inputs[0], torch.Tensor) and not inputs[0].is_floating_point():
        return {"labels": inputs[0]}
    return {}


def loss_from(out: Any) -> tuple[torch.Tensor, str]:
    """The loss a backward pass starts from: the output's ``loss`` (HF outputs, dicts), else the float sum of the
    first tensor output; and which ("loss" or "sum"). The caller drops ``out`` before the backward, as a training
    step keeps only its loss (HF logits held through the backward would count in the step's memory)."""
    loss = getattr(out, "loss", None)
    if loss is None and isinstance(out, dict):
        loss = out.get("loss")
    if loss is not None:
        return loss, "loss"
    if isinstance(out, dict):
        out = next(v for v in out.values() if isinstance(v, torch.Tensor))
    elif isinstance(out, (tuple, list)):
        out = out[0]
    elif hasattr(out, "logits"):
        out = out.logits
    return out.float().sum(), "sum"
