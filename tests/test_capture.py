"""Capture engine: attribution to layers in forward/backward/recompute, phases, exact matmul counts, cleanup."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import _get_current_dispatch_mode_stack
from torch.utils.checkpoint import checkpoint

import tscope_callbacks as ts
from tscope_callbacks.capture.profile import NestedProfileError, active_profile


class Head(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(16, 4)

    def forward(self, x):
        return self.proj(x)


class Net(nn.Module):
    """fc1 (8->16) -> act -> head.proj (16->4). Expected matmul FLOPs carried by the model (fvcore style)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.act = nn.ReLU()
        self.head = Head()

    def forward(self, x):
        return self.head(self.act(self.fc1(x)))

    # batch 4. forward: fc1 2*4*8*16 = 1024; head.proj 2*4*16*4 = 512.
    # backward (x has no grad): fc1 weight grad only: 2*16*4*8 = 1024;
    #   head.proj weight grad 2*4*4*16 = 512 + input grad 2*4*4*16 = 512 -> 1024.
    matmul_flops = {("fc1", "forward"): 1024, ("head.proj", "forward"): 512,
                    ("fc1", "backward"): 1024, ("head.proj", "backward"): 1024}


def _hooks_left(model: nn.Module) -> int:
    n = 0
    for m in model.modules():
        n += len(m._forward_hooks) + len(m._forward_pre_hooks) + len(m._backward_hooks)
    from torch.nn.modules import module as mm

    n += len(mm._global_forward_hooks) + len(mm._global_forward_pre_hooks) + len(mm._global_backward_hooks)
    return n


def _matmul_by(prof, key=lambda r: (r.layer, r.phase)):
    out: dict = {}
    for r in prof.ops:
        if r.category == "matmul":
            out[key(r)] = out.get(key(r), 0) + r.flops
    return out


def test_forward_backward_attribution_exact():
    torch.manual_seed(0)
    model = Net()
    x = torch.randn(4, 8)
    with ts.profile(model) as prof:
        model(x).sum().backward()
    assert _matmul_by(prof) == Net.matmul_flops
    # ReLU backward runs in the layer whose forward created its node
    tb = [r for r in prof.ops if r.op == "aten.threshold_backward"]
    assert tb and all(r.layer == "act" and r.phase == "backward" for r in tb)
    # the bias gradient of fc1 and the AccumulateGrad of its params belong to fc1
    assert all(r.layer in ("fc1", "act", "head.proj", "") for r in prof.ops)
    L = prof.layers
    assert L["head"].flops_fwd == L["head.proj"].flops_fwd  # inclusive: parent includes child
    assert L["head"].self_flops_fwd == 0
    assert L[""].flops_fwd == sum(r.flops for r in prof.ops if r.phase == "forward")
    assert L[""].flops_bwd == sum(r.flops for r in prof.ops if r.phase == "backward")
    assert L["fc1"].calls == 1 and L["fc1"].type == "Linear" and L["fc1"].num_parameters == 8 * 16 + 16


def test_ops_in_order_and_timed_on_cpu():
    model = Net()
    with ts.profile(model) as prof:
        model(torch.randn(4, 8)).sum().backward()
    assert [r.index for r in prof.ops] == list(range(len(prof.ops)))
    assert all(r.time_s is not None and r.time_s >= 0 for r in prof.ops)
    assert prof.info.timing == "cpu-wall"
    # op times are inside the region: they cannot exceed its wall time
    assert 0 < prof.result.op_time_s() <= prof.wall_time_s
    assert 0.0 <= prof.result.uncovered_time_share() < 1.0


def test_shared_module_calls_accumulate():
    class Loop(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(8, 8)

        def forward(self, x):
            for _ in range(3):
                x = self.fc(x)
            return x

    model = Loop()
    with ts.profile(model) as prof:
        model(torch.randn(2, 8, requires_grad=True)).sum().backward()
    assert prof.layers["fc"].calls == 3
    # 3 calls x 2*2*8*8 = 768 forward FLOPs
    assert prof.layers["fc"].flops_fwd == 3 * 2 * 2 * 8 * 8
    # backward: per call weight grad 2*8*2*8=256 + input grad 2*2*8*8=256 -> 3*512
    assert _matmul_by(prof)[("fc", "backward")] == 3 * 512


def test_activation_checkpointing_is_recompute():
    class Ckpt(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.block = nn.Sequential(nn.Linear(8, 8), nn.GELU())
            self.out = nn.Linear(8, 1)

        def forward(self, x):
            return self.out(checkpoint(self.block, x, use_reentrant=False))

    model = Ckpt()
    with ts.profile(model) as prof:
        model(torch.randn(4, 8, requires_grad=True)).sum().backward()
    rec = [r for r in prof.ops if r.phase == "recompute"]
    assert rec, "the checkpointed forward re-run must be visible"
    assert {r.layer for r in rec if r.category == "matmul"} == {"block.0"}
    # recompute FLOPs equal the forward FLOPs of the block's matmul (2*4*8*8 = 512)
    assert sum(r.flops for r in rec if r.category == "matmul") == 512
    # the block's backward matmuls are attributed to block.0, not to the root
    assert _matmul_by(prof)[("block.0", "backward")] == 2 * 512
    assert prof.layers["block.0"].calls == 1  # the recompute is not a new call
    assert prof.layers["block.0"].flops_recompute == prof.layers["block.0"].flops_fwd


def test_optimizer_phase():
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    with ts.profile(model) as prof:
        model(torch.randn(4, 8)).sum().backward()
        with prof.phase("optimizer"):
            opt.step()
    opt_ops = [r for r in prof.ops if r.phase == "optimizer"]
    assert opt_ops and all(r.layer == "" for r in opt_ops)


def test_no_grad_forward_only():
    model = Net()
    with torch.no_grad(), ts.profile(model) as prof:
        model(torch.randn(4, 8))
    assert {r.phase for r in prof.ops} == {"forward"}
    with torch.inference_mode(), ts.profile(model) as prof2:
        model(torch.randn(4, 8))
    assert _matmul_by(prof2, key=lambda r: r.layer) == {"fc1": 1024, "head.proj": 512}


def test_autocast_bf16_halves_matmul_bytes():
    model = nn.Linear(64, 64, bias=False)
    x = torch.randn(32, 64)
    with ts.profile(model) as p32:
        model(x)
    with torch.autocast("cpu", dtype=torch.bfloat16), ts.profile(model) as p16:
        model(x)
    mm32 = [r for r in p32.ops if r.category == "matmul"][0]
    mm16 = [r for r in p16.ops if r.category == "matmul"][0]
    assert mm16.dtype == "bfloat16" and mm32.dtype == "float32"
    # fp32: read x 32*64*4 + W 64*64*4 = 24576, write 32*64*4 = 8192; bf16: exactly half of each
    assert (mm32.bytes_read, mm32.bytes_written) == (24576, 8192)
    assert (mm16.bytes_read, mm16.bytes_written) == (12288, 4096)
    assert mm16.flops == mm32.flops == 2 * 32 * 64 * 64


def test_cleanup_when_region_raises():
    model = Net()
    with pytest.raises(RuntimeError, match="boom"):
        with ts.profile(model):
            model(torch.randn(4, 8))
            raise RuntimeError("boom")
    assert _hooks_left(model) == 0
    assert not _get_current_dispatch_mode_stack()
    assert active_profile() is None
    # and when the model itself raises mid-forward
    bad = nn.Sequential(nn.Linear(8, 8), nn.Linear(7, 2))
    with pytest.raises(RuntimeError):
        with ts.profile(bad):
            bad(torch.randn(2, 8))
    assert _hooks_left(bad) == 0 and not _get_current_dispatch_mode_stack()


def test_nested_profile_raises_clearly():
    model = Net()
    with ts.profile(model):
        with pytest.raises(NestedProfileError, match="already running"):
            ts.profile(model).start()
    assert active_profile() is None and _hooks_left(model) == 0


def test_start_stop_idempotent():
    model = Net()
    prof = ts.profile(model).start()
    model(torch.randn(4, 8))
    res = prof.stop()
    assert prof.stop() is res and res.ops


def test_kwargs_and_dict_outputs():
    class KW(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.enc = nn.Linear(8, 8)

        def forward(self, x, *, scale=1.0):
            return {"hidden": self.enc(x) * scale, "aux": [x.sum()]}

    model = KW()
    with ts.profile(model, layer_details=True) as prof:
        out = model(torch.randn(2, 8, requires_grad=True), scale=2.0)
        out["hidden"].sum().backward()
    assert prof.layers["enc"].output_shapes == [[2, 8]]
    assert prof.layers[""].output_shapes == [[2, 8], []]


def test_layer_details_shapes_grads_memory_nonfinite():
    model = Net()
    x = torch.randn(4, 8, requires_grad=True)
    with ts.profile(model, layer_details=True, check_finite=True) as prof:
        model(x).sum().backward()
    fc1 = prof.layers["fc1"]
    assert fc1.input_shapes == [[4, 8]] and fc1.output_shapes == [[4, 16]]
    assert fc1.grad_output_shapes == [[4, 16]] and fc1.grad_input_shapes == [[4, 8]]
    assert fc1.output_bytes == 4 * 16 * 4
    assert fc1.param_bytes == (8 * 16 + 16) * 4 and fc1.grad_bytes == fc1.param_bytes
    assert fc1.memory_fwd_bytes >= 4 * 16 * 4  # at least its output was allocated
    assert prof.layers[""].memory_fwd_bytes >= fc1.memory_fwd_bytes  # inclusive
    assert not any(L.nonfinite_output or L.nonfinite_grad_output for L in prof.layers.values())

    # inject a NaN in act's output: act and everything after it is flagged, fc1 is not
    h = model.act.register_forward_hook(lambda m, i, o: o * float("nan"))
    try:
        with ts.profile(model, layer_details=True, check_finite=True) as prof:
            model(x).sum().backward()
    finally:
        h.remove()
    assert prof.layers["act"].nonfinite_output and prof.layers["head.proj"].nonfinite_output
    assert not prof.layers["fc1"].nonfinite_output
    assert prof.layers["fc1"].nonfinite_grad_output  # the NaN flows back into fc1's output grad


def test_paths_and_depth_selection():
    model = Net()
    with ts.profile(model, depth=1) as prof:
        model(torch.randn(4, 8)).sum().backward()
    assert "head.proj" not in prof.layers and "head" in prof.layers
    assert {r.layer for r in prof.ops} <= {"", "fc1", "act", "head"}
    assert prof.layers["head"].calls == 1  # head.proj's call is aggregated into head's ops, not its calls
    assert _matmul_by(prof)[("head", "forward")] == 512
    with ts.profile(model, paths=["fc*"]) as prof:
        model(torch.randn(4, 8)).sum().backward()
    assert {r.layer for r in prof.ops} <= {"", "fc1"}
    assert _matmul_by(prof)[("", "forward")] == 512  # head.proj aggregated into the root
    assert prof.layers["fc1"].calls == 1 and prof.layers[""].calls == 1


def test_user_formula_override_and_uncounted():
    model = Net()

    def fake_mm(*a, out=None, **k):
        return 7

    with ts.profile(model, formulas={torch.ops.aten.addmm: fake_mm}) as prof:
        model(torch.randn(4, 8))
    assert [r.flops for r in prof.ops if r.op == "aten.addmm"] == [7, 7]
    assert prof.coverage() <= 1.0 and isinstance(prof.uncounted_ops(), dict)


def test_internal_error_never_breaks_the_op(monkeypatch):
    from tscope_callbacks.formulas.memo import CountCache

    def broken(*a, **k):
        raise ValueError("formula bug")

    monkeypatch.setattr(CountCache, "count", broken)
    model = Net()
    x = torch.randn(4, 8)
    ref = model(x)
    with ts.profile(model) as prof:
        y = model(x)
    assert torch.equal(ref, y)
    assert prof.result.info.internal_errors and "formula bug" in prof.result.info.internal_errors[0]
    with pytest.raises(ValueError, match="formula bug"):
        with ts.profile(model, raise_errors=True):
            model(x)
    assert active_profile() is None


def test_bad_arguments():
    with pytest.raises(TypeError, match="nn.Module"):
        ts.profile("not a model")
    with pytest.raises(ValueError, match="timing"):
        ts.profile(Net(), timing="gpu")
    with pytest.raises(ValueError, match="depth"):
        ts.profile(Net(), depth=-1)


def test_step_profile_round_trip():
    model = Net()
    with ts.profile(model, layer_details=True) as prof:
        model(torch.randn(4, 8)).sum().backward()
    import json

    d = json.loads(json.dumps(prof.result.to_dict()))
    back = ts.StepProfile.from_dict(d)
    assert len(back.ops) == len(prof.ops) and back.total_flops == prof.result.total_flops
    assert back.layers["fc1"].output_shapes == [[4, 16]]


def test_a_step_profile_is_typed():
    """What the capture knows is typed (``StepProfile.info``, a frozen ``CaptureInfo``), the caller's facts about the
    step are typed too (``info=``, ``label``), its own data is free (``user``); a saved profile reads back the same,
    and a field that does not exist is refused."""
    import json

    model = Net()
    with ts.profile(model, info=ts.CaptureInfo(step=7), user={"run_name": "a"}) as prof:
        model(torch.randn(4, 8)).sum().backward()
        prof.label(reason="mine")
    res = prof.result
    info = res.info
    assert (info.device, info.device_name, info.timing, info.model) == ("cpu", "cpu", "cpu-wall", "Net")
    assert info.step == 7 and info.reason == "mine" and res.user == {"run_name": "a"}
    # a bare CPU capture's step basis: the ops' summed times (never the region's wall time)
    assert info.step_time_basis == "op-time" and info.step_time_s == pytest.approx(sum(r.time_s for r in res.ops))
    assert info.float32_matmul_precision == torch.get_float32_matmul_precision()
    assert set(info.capture_cost) >= {"start_s", "region_s", "build_s", "ops"}
    assert info.compiled_capture is None and info.device_busy_s is None  # never set on the CPU
    with pytest.raises(dataclasses.FrozenInstanceError):
        info.step = 8  # type: ignore[misc]
    with pytest.raises(TypeError):
        prof.label(run_name="b")  # not a CaptureInfo field: the caller's own data goes to user=
    with pytest.raises(TypeError, match="takes a CaptureInfo"):
        ts.profile(model, info={"step": 7})
    d = json.loads(json.dumps(res.to_dict()))
    assert d["version"] == 2 and d["info"]["step"] == 7 and "device_busy_s" not in d["info"]  # known fields only
    back = ts.StepProfile.from_dict(d)
    assert back.info == res.info and back.user == res.user and back.to_dict() == d
    with pytest.raises(ValueError, match="format version 1"):
        ts.StepProfile.from_dict({**d, "version": 1})


def test_model_tree_walks_as_torch_does():
    """``ModelTree`` (one stack walk per capture) lists what ``named_modules()``/``named_parameters()`` list, in their
    order: a submodule and a parameter shared twice appear once, under their first path; a compile wrapper's path
    names the wrapped module; a class overriding ``named_parameters`` gets torch's own walk."""
    from tscope_callbacks.capture.paths import ModelTree

    block = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
    model = torch.nn.Sequential(block, torch.nn.Linear(4, 4), block)
    model[1].weight = model[0][0].weight  # a tied parameter
    compiled = torch.compile(model)

    class Renamed(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = torch.nn.Linear(2, 2)

        def named_parameters(self, *a, **k):
            return ((f"renamed.{n}", p) for n, p in super().named_parameters(*a, **k))

    for m in (model, compiled, Renamed()):
        tree = ModelTree(m)
        assert [(p, id(x)) for p, x in tree.modules] == [(p, id(x)) for p, x in m.named_modules()]
        assert [(n, id(x)) for n, x in tree.parameters] == [(n, id(x)) for n, x in m.named_parameters()]
    assert [p for p, _ in ModelTree(compiled).clean_modules()] == ["", "0", "0.0", "0.1", "1"]
    assert ModelTree(compiled).clean_modules()[0][1] is model  # the user's module, not the wrapper
    assert ModelTree(Renamed()).parameters[0][0] == "renamed.inner.weight"

    # buffers, each once (a shared BatchNorm twice in the model), as model.buffers() lists them
    bn = torch.nn.BatchNorm1d(4)
    with_bn = torch.nn.Sequential(bn, torch.nn.Sequential(bn, torch.nn.Linear(4, 4)))
    with_bn.register_buffer("scale", torch.ones(3))
    assert [id(b) for b in ModelTree(with_bn).buffers()] == [id(b) for b in with_bn.buffers()]

    class OwnBuffers(torch.nn.Module):  # a class overriding named_buffers gets torch's own walk
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("kept", torch.zeros(2))
            self.register_buffer("hidden", torch.zeros(5))

        def named_buffers(self, *a, **k):
            return ((n, b) for n, b in super().named_buffers(*a, **k) if n != "hidden")

    assert [b.numel() for b in ModelTree(OwnBuffers()).buffers()] == [2]


def test_a_tensor_seen_by_several_layers_gets_one_gradient_hook():
    """Layer details watch each tensor's gradient once for every layer it is an input or output of (a Sequential's
    output is its last child's, the next layer's input is the same tensor): one hook per tensor, each layer's
    gradient shapes as before. A leaf (the input) gets a tensor hook; a tensor an autograd node made, a pre-hook on
    that node reading its output."""
    from tscope_callbacks.capture.layers import LayerDetails

    inner = nn.Sequential(nn.Linear(8, 16), nn.ReLU())
    model = nn.Sequential(inner, nn.Linear(16, 4))
    tensor_hooks, made = [], []
    orig, orig_make = torch.Tensor.register_hook, LayerDetails._grad_hook

    def counting(self, fn):
        tensor_hooks.append(self)  # held: no id reused by a later tensor
        return orig(self, fn)

    def making(self, targets, output_nr=None):
        made.append(list(targets))  # the hook's own list: the layers it serves, filled in as they see the tensor
        return orig_make(self, targets, output_nr)

    x = torch.randn(3, 8, requires_grad=True)
    torch.Tensor.register_hook, LayerDetails._grad_hook = counting, making
    try:
        with ts.profile(model, layer_details=True) as prof:
            model(x).sum().backward()
    finally:
        torch.Tensor.register_hook, LayerDetails._grad_hook = orig, orig_make
    # x (root, inner, inner.0 inputs), inner.0's output (inner.1's input), the ReLU's output (inner's and inner.1's
    # output, "1"'s input), the model's output (root's and "1"'s output): 4 tensors, 4 hooks; x's is a tensor hook
    assert len(made) == 4
    assert tensor_hooks == [x]
    L = prof.layers
    assert L[""].grad_input_shapes == L["0"].grad_input_shapes == L["0.0"].grad_input_shapes == [[3, 8]]
    assert L["0.0"].grad_output_shapes == L["0.1"].grad_input_shapes == [[3, 16]]
    assert L["0"].grad_output_shapes == L["0.1"].grad_output_shapes == L["1"].grad_input_shapes == [[3, 16]]
    assert L[""].grad_output_shapes == L["1"].grad_output_shapes == [[3, 4]]


def test_gradient_hooks_on_nodes_see_what_tensor_hooks_saw():
    """The node pre-hooks give each layer the gradients tensor hooks gave: a multi-output node (``chunk``) whose one
    output backward never reaches, an output modified in place by the next layer, a non-finite gradient."""

    class Split(nn.Module):
        def forward(self, x):
            a, b = x.chunk(2, dim=-1)
            return a, b

    class UseFirst(nn.Module):
        def forward(self, ab):
            return ab[0] * 2

    model = nn.Sequential(nn.Linear(4, 8), Split(), UseFirst(), nn.Linear(4, 4), nn.ReLU(inplace=True))
    x = torch.randn(2, 4)
    with ts.profile(model, layer_details=True, check_finite=True) as prof:
        (model(x) * float("inf")).sum().backward()
    L = prof.layers
    assert L["1"].grad_output_shapes == [[2, 4]]  # only the chunk that reached the loss: b's gradient never came
    assert L["2"].grad_input_shapes == [[2, 4]]
    assert L["3"].grad_output_shapes == L["4"].grad_input_shapes == [[2, 4]]  # before the in-place ReLU
    assert L["4"].nonfinite_grad_output and L["3"].nonfinite_grad_output


class _Router(nn.Module):
    """Mixtral's router normalisation: an in-place division whose backward needs the input it overwrites."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = nn.Linear(16, 8)

    def forward(self, x):
        w, _ = torch.topk(self.gate(x).softmax(-1), 2, dim=-1)
        w /= w.sum(dim=-1, keepdim=True)
        return w


def test_an_in_place_op_that_saves_a_copy_keeps_its_layer():
    # autograd makes div_'s node (DivBackward0) before it clones the input div_ overwrites, so the node number is
    # not the op's sequence counter - 1: its backward was charged to the root "" and its saved tensors missed.
    # The router's backward division: 5 ops of 48 FLOPs (x: 4*6*2 = 48 elements) + the sum of the grad, 48;
    # saved by it: the clone of w (48 * 4 B = 192) and w.sum(-1) (24 * 4 B = 96): 288 B more than before
    m = nn.Sequential()
    m.add_module("router", _Router())
    with ts.profile(m, layer_details=True) as p:
        m(torch.randn(4, 6, 16)).sum().backward()
    div = [r for r in p.ops if r.phase == "backward" and r.op in ("aten.div", "aten.neg", "aten.mul")]
    assert [r.layer for r in div] == ["router"] * 5 and sum(r.flops for r in div) == 5 * 48
    assert not [r for r in p.ops if r.phase == "backward" and r.layer == "" and r.flops]
    assert p.layers["router"].saved_bytes - p.layers["router.gate"].saved_bytes == 1152 + 288  # was 1152


class _Scaled(nn.Module):
    """Python numbers in the forward: ``y * 0.5`` and ``/ 3.0`` save them in their autograd nodes (0-dim double
    "wrapped numbers"); ``* s`` saves a real 0-dim double tensor."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.register_buffer("s", torch.tensor(0.25, dtype=torch.float64))

    def forward(self, x):
        return (self.fc(x) * 0.5).pow(2) / 3.0 * self.s


def test_python_scalars_are_not_saved_activations():
    # x (2, 4) fp32 = 32 B, saved by fc's addmm; (fc(x) * 0.5) 32 B, saved by pow; the real 0-dim double s (8 B),
    # saved by the mul by s (its fp32 input is not: s needs no gradient). The mul by 0.5 and the division by 3.0
    # save their Python number as a 0-dim double (MulBackward0._saved_other, DivBackward0._saved_other): 8 B each,
    # no activation and no allocation of the step. Saved by "m": 32 + 32 + 8 = 72 B (was 88: the two numbers)
    m = nn.Sequential()
    m.add_module("m", _Scaled())
    with ts.profile(m, layer_details=True) as p:
        m(torch.randn(2, 4)).sum().backward()
    assert p.layers["m.fc"].saved_bytes == 32
    assert p.layers["m"].saved_bytes == 72
    assert p.layers[""].saved_bytes == 72


def test_no_garbage_collection_inside_a_captured_region():
    """tscope's own objects (a few per op) do not make the cyclic collector walk the step's live graph mid-step:
    its first threshold is raised while the region runs, the young generation is collected once at stop, and the
    user's thresholds come back; a collector the user turned off stays off."""
    import gc

    from tscope_callbacks.capture.collector import DEFERRED_THRESHOLD

    model = nn.Sequential(*[nn.Linear(8, 8) for _ in range(40)])
    x = torch.randn(4, 8)
    before = gc.get_threshold()
    runs = []

    def count(phase, info):
        if phase == "start":
            runs.append(info["generation"])

    seen = []
    gc.callbacks.append(count)
    try:
        with ts.profile(model, layer_details=True):
            seen.append(gc.get_threshold())
            for _ in range(5):  # ~1,000 ops: more than the 700 allocations that trigger a young collection
                model(x).sum().backward()
            inside = list(runs)
        after = list(runs)
    finally:
        gc.callbacks.remove(count)
    assert seen == [(DEFERRED_THRESHOLD, *before[1:])] and inside == []
    assert gc.get_threshold() == before and after.count(0) <= 1 and gc.get_count()[0] < before[0]
    gc.disable()
    try:
        with ts.profile(model):
            assert gc.get_threshold() == before and not gc.isenabled()
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_the_capture_reads_the_convolutions_weight_layout_from_its_walk_of_the_model():
    """``info.conv_channels_last`` (the channels-last advice's witness): the model's 3x3 convolutions' weights in
    channels-last or not, from the capture's one walk of the model; a model without such a convolution says None."""
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Sequential(nn.Conv2d(8, 8, 3), nn.Conv2d(8, 4, 1)))
    x = torch.randn(2, 3, 12, 12)
    with ts.profile(model) as prof:
        model(x)
    assert prof.info.conv_channels_last is False
    model = model.to(memory_format=torch.channels_last)
    with ts.profile(model) as prof:
        model(x.to(memory_format=torch.channels_last))
    assert prof.info.conv_channels_last is True
    model[2][0].weight.data = model[2][0].weight.data.contiguous()  # one nested 3x3 convolution back to NCHW
    with ts.profile(model) as prof:
        model(x)
    assert prof.info.conv_channels_last is False
    lin = nn.Linear(4, 4)
    with ts.profile(lin) as prof:
        lin(torch.randn(2, 4))
    assert prof.info.conv_channels_last is None
