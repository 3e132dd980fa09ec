"""The step's memory by category (``capture.step_memory``) against torch's MemTracker and hand arithmetic, the
device-memory check (``analysis.memory_fit``) and its report line."""

from __future__ import annotations

import os

import pytest
import torch

import tscope_callbacks as ts
from tscope_callbacks.analysis.memory_fit import memory_fit
from tscope_callbacks.demo.model import TinyGPT, random_tokens

MemTracker = pytest.importorskip("torch.distributed._tools.mem_tracker").MemTracker


def _mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))


def _memtracker_peak(model, opt, step) -> int:
    mt = MemTracker()
    mt.track_external(model, opt)
    with mt:
        step()
    return mt.get_tracker_snapshot("peak")[torch.device("cpu")]["Total"]


@pytest.mark.parametrize("foreach", [False, True])
def test_a_training_step_by_category_equals_memtracker(foreach):
    m = _mlp()
    opt = torch.optim.AdamW(m.parameters(), foreach=foreach)
    x, y = torch.randn(32, 64), torch.randint(0, 10, (32,))

    def step():
        torch.nn.functional.cross_entropy(m(x), y).backward()
        opt.step()
        opt.zero_grad()

    step()  # the optimizer's state exists: a steady-state step
    ref = _memtracker_peak(m, opt, step)
    with ts.profile(m, layer_details=True) as p:
        step()
    c = p.info.memory_categories
    params = (64 * 256 + 256 + 256 * 10 + 10) * 4  # 19,210 fp32 parameters = 76,840 B
    assert c["params"] == params == 76_840 and c["buffers"] == 0
    assert c["grads"] == 0  # zero_grad() set them to None at the end of the step
    # AdamW: exp_avg and exp_avg_sq per parameter, plus a 4-byte fp32 step counter per parameter tensor (4 tensors)
    assert c["optimizer_state"] == 2 * params + 4 * 4
    # what the forward saved: fc1's input x (32x64) and fc2's input relu(h) (32x256, which ReLU's backward reads
    # too: one storage), the logits' log-softmax (32x10) for cross_entropy's backward, nll_loss's targets (32
    # int64) and its total_weight (one fp32 scalar)
    assert c["activations_saved"] == (32 * 64 + 32 * 256 + 32 * 10) * 4 + 32 * 8 + 4
    assert c["step_peak"] == ref  # torch's MemTracker, an independent accounting of the same step


def test_gradients_freed_inside_the_step_leave_its_peak():
    # Lightning's order: forward, zero_grad(set_to_none=True), backward, step. Last step's gradients count until
    # zero_grad frees them; the peak (in the backward) comes after, so they are not in it, as MemTracker finds.
    m = TinyGPT()
    x, y = random_tokens(m.cfg, batch=4)
    opt = torch.optim.AdamW(m.parameters(), foreach=True)

    def step():
        loss = m.loss(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    step()  # gradients and optimizer state exist when the measured step starts
    ref = _memtracker_peak(m, opt, step)
    with ts.profile(m, layer_details=True) as p:
        step()
    c = p.info.memory_categories
    assert c["grads"] == sum(q.numel() for q in m.parameters()) * 4
    assert c["step_peak"] == ref


def test_gradients_held_from_before_the_step_count_in_its_peak():
    m = TinyGPT()
    x, y = random_tokens(m.cfg, batch=4)
    opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
    m.loss(x, y).backward()
    opt.step()  # momentum buffers; the gradients stay (accumulation: no zero_grad before the next backward)

    def step():
        m.loss(x, y).backward()
        opt.step()

    ref = _memtracker_peak(m, opt, step)
    with ts.profile(m, layer_details=True) as p:
        step()
    c = p.info.memory_categories
    n = sum(q.numel() for q in m.parameters()) * 4
    assert c["grads"] == n and c["optimizer_state"] == n  # one momentum buffer per parameter
    assert c["step_peak"] == ref


def test_tinygpt_step_equals_memtracker_and_saved_activations_are_the_roots():
    m = TinyGPT()
    x, y = random_tokens(m.cfg, batch=8)
    opt = torch.optim.AdamW(m.parameters(), foreach=True)

    def step():
        m.loss(x, y).backward()
        opt.step()
        opt.zero_grad()

    step()
    ref = _memtracker_peak(m, opt, step)
    with ts.profile(m, layer_details=True) as p:
        step()
    c = p.info.memory_categories
    assert c["step_peak"] == ref
    # the root's saved bytes include every layer's, each storage once (not a sum over the nested layers)
    assert c["activations_saved"] == p.layers[""].saved_bytes
    assert c["activations_saved"] < sum(L.saved_bytes or 0 for L in p.layers.values())


def test_meta_analysis_estimates_the_same_step_memory_as_a_real_step():
    # analyze_model on meta (nothing allocated) against the same steady-state step run for real on the CPU
    torch.manual_seed(0)
    real = TinyGPT()
    x, _ = random_tokens(real.cfg, batch=8)
    opt = torch.optim.AdamW(real.parameters(), foreach=True)

    def step():
        real(x).float().sum().backward()  # what analyze_model backpropagates from for a plain output
        opt.step()
        opt.zero_grad()

    step()
    ref = _memtracker_peak(real, opt, step)
    with torch.device("meta"):
        model = TinyGPT()
    # the CPU's attention kernel, to compare with the CPU run (for an H100, meta runs its fused kernel, whose
    # saved tensors differ)
    rep = ts.analyze_model(model, input_shape=[(8, real.cfg.seq_len)], gpu="h100", backward=True,
                           optimizer="adamw", attention_backend="cpu")
    c = rep.profile.info.memory_categories
    assert c["optimizer_state"] == 2 * c["params"] + 4 * len(list(real.parameters()))
    assert c["step_peak"] == ref
    md = rep.to_markdown()
    assert "- **Memory** (this rank, MiB):" in md and "of the 80 GiB of NVIDIA H100 SXM" in md
    assert "does not fit" not in md


def test_memory_fit_verdicts_and_the_gpus_to_shard_over():
    gib = 2**30
    mc = {"params": 10 * gib, "grads": 10 * gib, "optimizer_state": 20 * gib, "step_tracked_peak": 30 * gib,
          "step_peak": 60 * gib}
    assert memory_fit(mc, 80 * gib)["verdict"] == "fits"  # 60 of 80 GiB, under 90%
    assert memory_fit(mc, 64 * gib)["verdict"] == "tight"  # 60 of 64 GiB: 94%
    fit = memory_fit(mc, 40 * gib)
    assert fit["verdict"] == "does not fit" and fit["share"] == 1.5
    # states 40 GiB over n GPUs beside the 30 GiB the step allocates, within 90% of 40 GiB = 36 GiB:
    # 40 / (36 - 30) = 6.7 -> 7 GPUs
    assert fit["states"] == 40 * gib and fit["rest"] == 30 * gib and fit["shard_over"] == 7
    # the step's own allocations alone exceed the device: sharding the states cannot help
    assert memory_fit({**mc, "step_tracked_peak": 37 * gib}, 40 * gib)["shard_over"] is None
    assert memory_fit(mc, None)["verdict"] is None and memory_fit({"params": 1}, 80 * gib) is None


def test_a_step_that_does_not_fit_says_what_to_change():
    with torch.device("meta"):
        model = TinyGPT()
    spec = ts.DeviceSpec("Small GPU", flops={"bf16": 1e14, "fp32": 2e13}, bandwidth=1e12, memory_bytes=2**20)
    rep = ts.analyze_model(model, input_shape=[(8, 64)], gpu=spec, backward=True, optimizer="adamw")
    line = next(ln for ln in rep.to_markdown().splitlines() if ln.startswith("- **Memory**"))
    assert "of the 1 MiB of Small GPU -- **does not fit**" in line
    assert "checkpoint activations" in line and "smaller micro-batch" in line


def test_device_memory_in_the_spec_table():
    assert ts.get_device_spec("h100").memory_bytes == 80 * 2**30
    assert ts.get_device_spec("h200").memory_bytes == 141 * 2**30
    assert ts.get_device_spec("a100-40gb").memory_bytes == 40 * 2**30
    assert ts.get_device_spec("v100").memory_bytes is None  # the row stands for 16 and 32 GB cards
    if hasattr(os, "sysconf") and not torch.cuda.is_available():  # the host's RAM for a CPU roof
        assert ts.get_device_spec("auto").memory_bytes == os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    spec = ts.get_device_spec("h100")
    assert ts.DeviceSpec.from_dict(spec.to_dict()).memory_bytes == spec.memory_bytes
    from tscope_callbacks.devices.spec import SpecFileError

    with pytest.raises(SpecFileError, match="memory_bytes"):
        ts.DeviceSpec.from_dict({"name": "X", "flops": {"fp32": 1e12}, "bandwidth": 1e11, "memory_bytes": -1})


class _TiedLM(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(100, 16)
        self.head = torch.nn.Linear(16, 100, bias=False)
        self.head.weight = self.emb.weight  # tied, as GPT-2's wte and lm_head

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.emb(ids))


def test_a_model_analysed_from_the_cpu_keeps_its_tied_weights():
    # .to("meta") makes a new Parameter per module: the tie became two 100x16 weights (twice the parameters,
    # gradients and optimizer state; the tie's gradient sum lost)
    rep = ts.analyze_model(_TiedLM(), input_shape=[(2, 8)], gpu="h100", backward=True, optimizer="adamw")
    c = rep.profile.info.memory_categories
    assert c["params"] == 100 * 16 * 4  # one fp32 100x16 weight
    assert c["optimizer_state"] == 2 * 100 * 16 * 4 + 4  # exp_avg, exp_avg_sq and one step counter
    assert "0.0016 M parameters" in rep.to_markdown()
    # backward: the embedding's and the head's weight gradients are summed into the one weight's gradient
    bwd = [r.op for r in rep.profile.ops if r.phase == "backward"]
    assert "aten.embedding_dense_backward" in bwd and "aten.add" in bwd[bwd.index("aten.embedding_dense_backward"):]


def test_on_cuda_the_peak_starts_from_the_allocators_reading(monkeypatch):
    # the CUDA basis without a GPU: an allocator that reads 1 GiB already allocated (weights, optimizer state,
    # cached workspaces, other models) when the step starts; the peak adds what the step allocates on top
    import tscope_callbacks.capture.memory as memory

    monkeypatch.setattr(memory, "allocator_reader", lambda device: (lambda: 2**30))
    m = _mlp()
    x, y = torch.randn(32, 64), torch.randint(0, 10, (32,))
    with ts.profile(m, layer_details=True) as p:
        torch.nn.functional.cross_entropy(m(x), y).backward()
    c = p.info.memory_categories
    assert c["step_peak"] == 2**30 + c["step_tracked_peak"] and c["step_tracked_peak"] > 0
    assert c["step_peak_basis"].startswith("the allocator's bytes at the step's start")
    assert c["optimizer_state"] is None  # no optimizer stepped in the region


def test_optimizer_state_offloaded_to_another_device_is_not_this_devices_memory():
    with torch.device("meta"):
        m = torch.nn.Linear(64, 64)
    opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
    for p in m.parameters():
        opt.state[p]["momentum_buffer"] = torch.zeros(p.shape)  # on the host, as an offloading optimizer keeps it
    with ts.profile(m, layer_details=True) as prof:
        prof.add_optimizer(opt)
        m(torch.randn(4, 64, device="meta")).sum().backward()
    assert prof.info.memory_categories["optimizer_state"] == 0
