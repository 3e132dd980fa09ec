"""The GPU-shaped capture path, checked on CPU: per-layer memory against hand arithmetic and the tracked allocations,
saved activations, non-finite checks with no host read inside the region, keyword-argument shapes, optimizer steps
detected without ``prof.phase``, and the step-time basis (never the slowed wall time)."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

import tscope_callbacks as ts

F32 = 4


class TwoLinear(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(16, 32)
        self.act = nn.ReLU()
        self.fc2 = nn.Linear(32, 8)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


def test_forward_memory_is_the_growth_across_the_module():
    torch.manual_seed(0)
    model = TwoLinear()
    x = torch.randn(64, 16)
    with ts.profile(model, layer_details=True) as prof:
        model(x).sum().backward()
    L = prof.layers
    # fc1 allocates its output 64x32 fp32 (8192 B) and keeps it (the caller holds it): growth 8192 B
    assert L["fc1"].memory_fwd_bytes == 64 * 32 * F32
    # ReLU: one more 64x32 output, kept (the caller holds both: fc1's output is saved for ReLU's backward)
    assert L["act"].memory_fwd_bytes == 64 * 32 * F32
    assert L["fc2"].memory_fwd_bytes == 64 * 8 * F32
    # the root: fc1's output dies once ReLU returned (ReLU saves its output, addmm its input: nobody keeps it);
    # ReLU's output (saved by ReLU and fc2) and fc2's output stay: (64x32 + 64x8) fp32
    assert L[""].memory_fwd_bytes == (64 * 32 + 64 * 8) * F32
    assert all(v.peak_fwd_bytes >= v.memory_fwd_bytes for v in L.values())


def test_saved_activations_per_layer():
    torch.manual_seed(0)
    model = TwoLinear()
    x = torch.randn(64, 16)
    with ts.profile(model, layer_details=True) as prof:
        model(x).sum().backward()
    L = prof.layers
    # addmm saves its input (fc1: x, created before the region but an activation all the same; fc2: ReLU's output);
    # ReLU saves its output; weights are parameters, never counted
    assert L["fc1"].saved_bytes == 64 * 16 * F32
    assert L["act"].saved_bytes == 64 * 32 * F32
    assert L["fc2"].saved_bytes == 64 * 32 * F32  # the same storage as ReLU's output
    assert L[""].saved_bytes == (64 * 16 + 64 * 32) * F32  # each storage once in the inclusive total


def test_backward_memory_from_the_tracked_allocations():
    torch.manual_seed(0)
    model = nn.Linear(16, 32)
    x = torch.randn(64, 16, requires_grad=True)
    with ts.profile(model, layer_details=True) as prof:
        model(x).sum().backward()
    L = prof.layers[""]
    # backward allocates x.grad 64x16, weight.grad 32x16 and bias.grad 32 (fp32), all kept; it frees nothing
    # (x and the weight outlive the step; sum's backward expands a scalar: a view)
    assert L.memory_bwd_bytes == (64 * 16 + 32 * 16 + 32) * F32
    assert L.peak_bwd_bytes == L.memory_bwd_bytes
    # growth can be negative: a deeper model's backward frees the activations its forward kept
    deep = TwoLinear()
    with ts.profile(deep, layer_details=True) as p2:
        deep(torch.randn(64, 16)).sum().backward()
    assert p2.layers[""].memory_bwd_bytes < p2.layers[""].peak_bwd_bytes


def test_a_container_never_called_has_no_memory_of_its_own():
    # a ModuleList is never called: no forward span, and its backward span was its children's (a row read "calls 0
    # · mem fwd 0 B · mem bwd -14.5 MiB"); both are left at 0, as its calls, while the blocks keep theirs
    class Stack(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.blocks = nn.ModuleList([nn.Linear(16, 16), nn.Linear(16, 16)])

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for b in self.blocks:
                x = torch.relu(b(x))
            return x

    model = Stack()
    with ts.profile(model, layer_details=True) as prof:
        model(torch.randn(64, 16)).sum().backward()
    L = prof.layers
    assert L["blocks"].calls == 0 and L["blocks"].memory_fwd_bytes == 0 and L["blocks"].memory_bwd_bytes == 0
    assert L["blocks.0"].memory_bwd_bytes != 0 and L[""].memory_bwd_bytes != 0  # the called ones keep theirs


class _HostReads(TorchDispatchMode):
    """Counts ops that read a value to the host (``.item()``/``bool()``/``.tolist()``: a sync on a GPU)."""

    def __init__(self) -> None:
        super().__init__()
        self.reads = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten._local_scalar_dense.default:
            self.reads += 1
        return func(*args, **(kwargs or {}))


def test_finite_checks_never_read_the_device_inside_the_region():
    model = TwoLinear()
    x = torch.randn(64, 16)
    spy = _HostReads()
    prof = ts.profile(model, layer_details=True, check_finite=True)
    with spy:  # outermost mode: sees our own (paused) checks too
        prof.start()
        model(x).sum().backward()
        inside = spy.reads
        prof.stop()
    assert inside == 0  # no host read during the step: checks stay on the device until stop
    assert not any(L.nonfinite_output or L.nonfinite_grad_output for L in prof.layers.values())

    h = model.act.register_forward_hook(lambda m, i, o: o * float("nan"))
    try:
        with ts.profile(model, layer_details=True, check_finite=True) as bad:
            model(x).sum().backward()
    finally:
        h.remove()
    assert bad.layers["act"].nonfinite_output and not bad.layers["fc1"].nonfinite_output
    # sum's gradient is ones: fc2's output gradient (and its input's, W^T @ ones) stay finite
    assert bad.layers["fc2"].nonfinite_output and not bad.layers["fc2"].nonfinite_grad_output


def test_finite_check_is_exact_for_huge_finite_values():
    # values whose sum would overflow float32 are still finite: aminmax never overflows
    model = nn.Identity()
    with ts.profile(model, layer_details=True, check_finite=True) as prof:
        model(torch.full((1000,), 3e38))
    assert not prof.layers[""].nonfinite_output


class KwModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = Inner()

    def forward(self, x):
        return self.inner(x, mask=torch.ones(4, 3), scale=2.0)


class Inner(nn.Module):
    def forward(self, x, *, mask, scale):
        return x * mask * scale


def test_keyword_tensor_inputs_are_recorded():
    with ts.profile(KwModel(), layer_details=True) as prof:
        prof.model(torch.randn(4, 3))
    assert prof.layers["inner"].input_shapes == [[4, 3], [4, 3]]


def test_optimizer_step_is_detected_without_a_phase_block():
    torch.manual_seed(0)
    model = TwoLinear()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(8, 16)
    with ts.profile(model) as prof:
        model(x).sum().backward()
        opt.step()
    phases = [r.phase for r in prof.ops]
    assert "optimizer" in phases
    assert phases.index("optimizer") > max(i for i, p in enumerate(phases) if p == "backward")
    assert sum(r.flops for r in prof.ops if r.phase == "optimizer") > 0

    def closure():
        opt.zero_grad()
        loss = model(x).sum()
        loss.backward()
        return loss

    with ts.profile(model) as prof2:  # forward and backward inside the step keep their phases
        opt.step(closure)
    ph = {r.phase for r in prof2.ops}
    assert {"forward", "backward", "optimizer"} <= ph
    assert all(r.phase != "optimizer" for r in prof2.ops if r.layer.startswith("fc"))


def test_step_time_basis_is_never_the_slowed_wall_time():
    model = TwoLinear()
    with ts.profile(model) as prof:
        model(torch.randn(64, 16)).sum().backward()
    m = prof.info
    assert m.step_time_basis == "op-time"
    assert m.step_time_s == pytest.approx(sum(r.time_s for r in prof.ops))
    assert m.step_time_s < prof.wall_time_s and m.outside_ops_s == pytest.approx(prof.wall_time_s - m.step_time_s)
    rep = ts.roofline(prof.result, ts.DeviceSpec(name="t", flops={"fp32": 1e11}, bandwidth=1e10))
    assert rep.summary.measured_step_s == pytest.approx(m.step_time_s) and rep.summary.step_time_source == "op-time"
    # a caller that timed unprofiled steps passes the real step time: it wins
    with ts.profile(model, info=ts.CaptureInfo(step_time_s=0.5, step_time_basis="unprofiled-median")) as p2:
        model(torch.randn(64, 16)).sum().backward()
    rep2 = ts.roofline(p2.result, ts.DeviceSpec(name="t", flops={"fp32": 1e11}, bandwidth=1e10))
    assert rep2.summary.measured_step_s == 0.5 and rep2.summary.step_time_source == "unprofiled-median"
    assert rep2.summary.mfu == pytest.approx(p2.result.model_flops / 0.5 / 1e11)


def test_saved_tensor_walk_survives_fresh_node_wrappers():
    """``next_functions`` hands out a fresh Python wrapper per access (as torch does for C++ nodes); a wrapper
    freed during the walk lets the next one reuse its id. Seen on an H100, the walk of GPT-2's graph stopped after 3
    nodes and every layer's saved_bytes read 0. Here a chain of 200 nodes, each saving a 4-float tensor under its
    own layer: every one is reached."""
    from tscope_callbacks.capture.memory import MemoryTracker

    saved = [torch.zeros(4) for _ in range(200)]

    class Wrapper:  # a fresh object per access, like torch's wrappers of C++ autograd nodes
        __slots__ = ("i",)

        def __init__(self, i):
            self.i = i

        @property
        def _saved_self(self):
            return saved[self.i]

        @property
        def next_functions(self):
            return ((Wrapper(self.i + 1), 0),) if self.i + 1 < len(saved) else ()

    mem = MemoryTracker(torch.device("cpu"))
    mem.walk_saved(Wrapper(0), lambda node: f"layer{node.i}")
    assert len(mem.saved) == 200
    assert sum(sum(v.values()) for v in mem.saved.values()) >= 200 * 16  # 4 float32 each (rounded up per block)


def test_saved_tensor_walk_skips_attributes_that_hold_numbers_from_then_on():
    """A node type's ``_saved_*`` attributes that held a number or an int list (a convolution's stride, a batch
    norm's eps, a matrix's sym sizes) are not read again; one that held None (an optional tensor: NLL's weight) or a
    tensor is. The saved bytes per layer are the same on every walk."""
    from tscope_callbacks.capture import memory as M

    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3, bias=False), nn.BatchNorm2d(4), nn.Flatten(), nn.Linear(4 * 6 * 6, 5))
    x = torch.randn(2, 3, 8, 8)
    walks = []
    for _ in range(3):
        with ts.profile(model, layer_details=True) as prof:
            nn.functional.cross_entropy(model(x), torch.tensor([1, 2])).backward()
        walks.append({k: v.saved_bytes for k, v in prof.layers.items()})
    assert walks[0] == walks[1] == walks[2]
    # conv saves its input x (2x3x8x8 fp32), batch norm its input (2x4x6x6) and its two per-channel results
    # (saved mean and inverse std, 4 floats each), the linear its input (a view of batch norm's 2x4x6x6 output)
    assert walks[0]["0"] == 2 * 3 * 8 * 8 * F32
    assert walks[0]["3"] == 2 * 4 * 6 * 6 * F32
    names = {cls.__name__: n for cls, n in M._SAVED_NAMES.items()}
    conv = names["ConvolutionBackward0"]
    assert "_saved_input" in conv and "_saved_weight" in conv
    assert not {"_saved_stride", "_saved_padding", "_saved_groups", "_saved_transposed"} & set(conv)
    assert "_saved_eps" not in names["NativeBatchNormBackward0"]
    assert "_saved_weight" in names["NllLossBackward0"]  # None here (no class weights): an optional tensor, kept
