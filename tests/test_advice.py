"""Opportunities (``analysis.advice``): each names the cause, the fix in the user's terms and the predicted saving,
computed by re-estimating the ops after the fix with the device's kernel model. Times are the H100's measured ones
(``../shared/gpu/h100/gemm_bf16.txt``) where a finding rests on them."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from profiles import make_profile, matmul, op, pointwise

import tscope_callbacks as ts
from tscope_callbacks import api
from tscope_callbacks.analysis.advice import GRAPH_GAP_S, LAUNCH_BOUND_S, pad_to
from tscope_callbacks.devices.efficiency import model_for
from tscope_callbacks.records import LayerRecord

H100 = ts.get_device_spec("h100")


def _mm(m, k, n, layer, phase, ms, dtype="bfloat16"):
    r = matmul(m, n, k, layer=layer, phase=phase, time_s=ms * 1e-3, dtype=dtype)
    return r


def _report(ops, spec=H100, layers=None, **meta):
    meta.setdefault("device_name", spec.name)
    meta.setdefault("step_time_s", 68.5e-3)
    meta.setdefault("step_time_basis", "unprofiled-median")
    return api.roofline(make_profile(ops, layers=layers, **meta), spec)


def lm_head_ops():
    # GPT-2 lm_head in its training step on the H100: forward 8192x768 @ 768x50257 took 6.651 ms, backward 8.585 ms
    # over its two GEMMs (dX: 8192x50257 @ 50257x768, dW: 50257x8192 @ 8192x768), split in proportion here
    return [_mm(8192, 768, 50257, "lm_head", "forward", 6.651),
            _mm(8192, 50257, 768, "lm_head", "backward", 4.3),
            _mm(50257, 8192, 768, "lm_head", "backward", 4.285)]


def test_pad_to():
    assert pad_to(50257) == 50304 and pad_to(4095) == 4096 and pad_to(64) == 64


def test_misaligned_vocabulary_names_the_padding_and_its_saving():
    rep = _report(lm_head_ops())
    o = rep.opportunities[:3][0]
    assert (o.kind, o.layer) == ("misaligned", "lm_head")
    assert "pad 50257 to 50304" in o.change and "resize_token_embeddings(50304)" in o.change
    assert o.evidence["dim"] == 50257 and o.evidence["padded"] == 50304 and o.evidence["n_gemms"] == 3
    # predicted saving = measured now (6.651 + 8.585 = 15.236 ms) - the three GEMMs re-estimated at N = 50304
    model = model_for(H100)
    after = (model.gemm_s(8192, 50304, 768) + model.gemm_s(8192, 768, 50304) + model.gemm_s(50304, 768, 8192))
    assert o.saving_s == pytest.approx(15.236e-3 - after)
    # the H100 measured at 50304: fwd 0.928 + bwd 1.992 = 2.92 ms, so the real saving is 12.3 ms: within 1.3x
    assert 12.3e-3 / 1.3 < o.saving_s < 12.3e-3 * 1.3
    assert "Saves about" in o.cause and "% of the step" in o.cause


def test_misalignment_is_read_from_the_stored_layout():
    # 8191 tokens through Linear(4096 -> 4096), bf16, on meta: the weight gradient dW = dY.t() @ x has logical
    # (M, N, K) = (4096, 4096, 8191), but its operands are stored with leading dimensions 4096 (dY.t() is dY
    # [8191, 4096] row-major, read transposed), 4096 and 4096: every one 16-byte aligned, so no GEMM takes the slow
    # path and there is nothing to pad (read as row-major operands, K = 8191 would be, and padding it would "save"
    # several ms). The vocabulary case is the opposite: lm_head's dW reads dY [8192, 50257] transposed, at 50257.
    import torch

    with torch.device("meta"):
        lin = torch.nn.Linear(4096, 4096)
    rep = ts.analyze_model(lin, input_shape=[(8191, 4096)], gpu="h100", precision="bf16", backward=True)
    mms = [o for o in rep.profile.ops if o.category == "matmul"]
    assert any(8191 in (r.input_shapes[0] + r.input_shapes[-1]) for r in mms)
    assert all(ld % 8 == 0 for r in mms for ld in r.leading_dims)
    assert not [o for o in rep.opportunities[:10] if o.kind == "misaligned"]


def test_fp32_matmul_without_tf32():
    # fp32 4096^3 on the A100-like H100 spec at the fp32 roof; TF32 off (meta: highest) -> re-estimated at TF32
    ops = [_mm(4096, 4096, 4096, "fc", "forward", 2.6, dtype="float32")]
    rep = _report(ops, float32_matmul_precision="highest")
    o = next(o for o in rep.opportunities if o.kind == "fp32_matmul")
    assert "set_float32_matmul_precision('high')" in o.change and "bf16-mixed" in o.change
    assert o.saving_s == pytest.approx(2.6e-3 - model_for(H100).gemm_s(4096, 4096, 4096, "tf32"))
    # with TF32 on, the GEMM already runs at TF32: no finding
    on = _report([_mm(4096, 4096, 4096, "fc", "forward", 2.6, dtype="float32")], float32_matmul_precision="high")
    assert all(o.kind != "fp32_matmul" for o in on.opportunities)


def _chain(layer, phase="forward", t=60e-6):
    # GELU(tanh) written out: 4 pointwise ops on 8x1024x3072 bf16 (25.2 MB in, 25.2 MB out each)
    n = 8 * 1024 * 3072
    return [pointwise(n, name=f"aten.{name}", dtype="bfloat16", layer=layer, phase=phase, time_s=t)
            for name in ("pow", "mul", "add", "tanh")]


def test_fusion_counts_the_bytes_fusion_removes():
    ops = _chain("h.0.act")
    rep = _report(ops, step_time_s=10e-3)  # findings under 0.5% of the step are not reported
    o = next(o for o in rep.opportunities if o.kind == "fusion")
    # before: 4 ops x (50.33 + 50.33) MB = 402.7 MB (384 MiB); fused: first input + last output = 100.7 MB (96 MiB)
    n = 8 * 1024 * 3072 * 2
    assert o.evidence["mb_before"] == pytest.approx(8 * n / 1e6)
    assert o.evidence["mb_after"] == pytest.approx(2 * n / 1e6)
    assert 'gelu(x, approximate="tanh")' in o.change and 'activation_function="gelu_pytorch_tanh"' in o.change
    # the fused kernel's bytes at the rate the 4 ops ran (240 us for 8 n B: 60 us for 2 n B), never under the
    # kernel model's time for them (about 17 us on the H100)
    roof = model_for(H100).memory_s("pointwise", 2 * n)
    assert roof < 60e-6 and o.saving_s == pytest.approx(4 * 60e-6 - 60e-6)
    assert o.predicted_by == "fused_bytes" and "the 4 ops took 240 µs for 384 MiB; 96 MiB at their rate: 60 µs" == o.predicted_text
    # ops at 20 us each ran faster than the kernel model's rate: a quarter of their 80 us (20 us) is under what the
    # fused kernel's 100.7 MB take on the H100 (about 34 us), so that bounds it
    fast = next(o for o in _report(_chain("h.0.act", t=20e-6), step_time_s=1e-3).opportunities
                if o.kind == "fusion")
    assert 20e-6 < roof and fast.saving_s == pytest.approx(80e-6 - roof)


def test_repeated_blocks_are_one_opportunity_with_summed_saving():
    ops = [*_chain("h.0.act"), *_chain("h.1.act"), *_chain("h.2.act")]
    layers = {f"h.{i}.act": LayerRecord(path=f"h.{i}.act", type="NewGELUActivation") for i in range(3)}
    opps = [o for o in _report(ops, layers=layers).opportunities if o.kind == "fusion"]
    assert len(opps) == 1
    o = opps[0]
    one = 4 * 60e-6 - 60e-6  # the fused bytes (a quarter) at the ops' own rate
    assert o.layer == "h.*.act" and o.evidence["layers"] == ["h.0.act", "h.1.act", "h.2.act"]
    assert o.saving_s == pytest.approx(3 * one) and "in each of 3 layers" in o.cause
    # per layer, as counted: 402.7 MB before (evidence mb_before), 100.7 MB fused
    assert "move 384 MiB, each writing what the next reads back; fused, about 96 MiB" in o.cause
    # a chain 25x as large: 25 x 384 MiB = 9,600 MiB = 9.38 GiB, written without an exponent (an H200 GPT-2 step's
    # loss chain read "1.235e+04 MB"); fused 25 x 96 MiB = 2.34 GiB
    n = 25 * 8 * 1024 * 3072
    big = [pointwise(n, name=f"aten.{x}", dtype="bfloat16", layer="h.0.act", time_s=25 * 60e-6)
           for x in ("pow", "mul", "add", "tanh")]
    b = next(o for o in _report(big, step_time_s=10e-3).opportunities if o.kind == "fusion")
    assert "move 9.38 GiB, each writing" in b.cause and "about 2.34 GiB" in b.cause and "e+" not in b.cause


def test_no_fusion_advice_for_compiled_modules():
    assert any(o.kind == "fusion" for o in _report(_chain("h.0.act"), step_time_s=10e-3).opportunities)
    rep = _report(_chain("h.0.act"), step_time_s=10e-3, compiled_modules_run_eagerly=["h"])
    assert all(o.kind != "fusion" for o in rep.opportunities)


def _launch_step(kernel_ns=3_000, **meta):
    # 400 kernels of 3 us on a GPU (1.2 ms busy) in an unprofiled step of 5 ms
    ops = [op("aten.add", "emb", flops=1024, read=8192, written=4096, time_s=kernel_ns * 1e-9) for _ in range(400)]
    kernels = [["void at::vectorized_elementwise_kernel", 10_000 * i, kernel_ns, 7, i] for i in range(400)]
    meta = {"device": "cuda", "timing": "cuda-kernels", "kernels": kernels, "device_busy_s": 1.2e-3,
            "step_time_s": 5e-3, **meta}
    return _report(ops, **meta)


def test_launch_overhead_is_the_idle_device_between_short_kernels():
    assert 3e-6 < LAUNCH_BOUND_S
    o = next(o for o in _launch_step().opportunities if o.kind == "launch")
    assert "reduce-overhead" in o.change and o.evidence["kernels"] == 400 and o.predicted_by == "idle"
    # idle 5 - 1.2 = 3.8 ms of the unprofiled step; a graph keeps about 1 us per kernel: 3.8 - 0.4 = 3.4 ms
    assert o.saving_s == pytest.approx(3.8e-3 - 400 * GRAPH_GAP_S) and o.layer == ""
    # the step monitor's data wait is not launch overhead: taken off the idle
    wait = {"step_breakdown": {"parts_ms": {"fetch": 0.9, "transfer": 0.1}, "input_bound": True, "fetch_share": 0.2}}
    o = next(o for o in _launch_step(**wait).opportunities if o.kind == "launch")
    assert o.saving_s == pytest.approx(2.8e-3 - 400 * GRAPH_GAP_S)


def test_no_launch_finding_where_it_does_not_apply():
    kinds = lambda rep: {o.kind for o in rep.opportunities[:20]}  # noqa: E731
    assert "launch" not in kinds(_launch_step(device_busy_s=4.8e-3))  # the device is busy: not launch-bound
    assert "launch" not in kinds(_launch_step(step_time_basis="device-busy"))  # no unprofiled step to compare
    assert "launch" not in kinds(_launch_step(device="cpu", timing="cpu-wall"))  # a CPU has no launches to graph
    graphs = {"mode": "kernels", "cudagraphs": True}
    assert "launch" not in kinds(_launch_step(compiled_capture=graphs))  # already CUDA graphs
    assert "launch" not in kinds(_launch_step(kernel_ns=50_000))  # 50 us kernels: the idle is not their launches


def test_gemm_off_tensor_cores_is_said_of_its_row_not_an_opportunity():
    r = _mm(4096, 4096, 4096, "fc", "forward", 1.5)
    r.tensor_core = False  # the kernel names said so (capture.cuda_timing); no change is known
    rep = _report([r], step_time_s=5e-3)
    assert not rep.opportunities
    (row,) = rep.below_roof
    assert row.layer == "fc" and "GEMMs ran on CUDA cores, not tensor cores" in row.cause
    assert "no change known" in row.cause


def test_small_m():
    # 16 tokens x 4096 @ 4096 x 4096 ran at 15 TFLOP/s on the H100 (0.036 ms)
    ops = [_mm(16, 4096, 4096, f"blocks.{i}.fc", "forward", 0.036) for i in range(32)]
    o = next(o for o in _report(ops, step_time_s=5e-3).opportunities if o.kind == "small_m")
    assert o.evidence["m"] == 16 and "batch" in o.change
    # 1024 rows fill the GPU; and a CPU has no GEMM tables to predict from
    full = [_mm(1024, 4096, 4096, f"blocks.{i}.fc", "forward", 0.4) for i in range(32)]
    assert not [o for o in _report(full, step_time_s=20e-3).opportunities[:20] if o.kind == "small_m"]
    cpu = ts.DeviceSpec("CPU (test)", {"bf16": 1e12}, 20e9, vendor="cpu", source="tests")
    assert not [o for o in _report(ops, spec=cpu, device="cpu", step_time_s=5e-3).opportunities[:20]
                if o.kind == "small_m"]


def test_time_without_a_formula_is_said_of_its_row_not_an_opportunity():
    ops = [*lm_head_ops(), op("aten.my_op", "blocks.0", read=1 << 20, counted=False, category="other",
                              time_s=2e-3)]
    rep = _report(ops)
    assert [o.kind for o in rep.opportunities[:5]] == ["misaligned"]
    cause = {(r.layer, r.phase): r.cause for r in rep.below_roof}[("blocks.0", "forward")]
    assert "no FLOP formula for aten.my_op" in cause and 'formulas={"aten.my_op": fn}' in cause


def test_markdown_lists_findings_with_their_fix():
    md = _report(lm_head_ops()).to_markdown()
    assert "**misaligned**" in md and "Fix: pad 50257 to 50304" in md
    assert "| roof ms | expected ms |" in md and "expected" in md and "roofline bound" in md


def test_an_unfused_optimizer_update_is_its_own_finding():
    # a for-loop AdamW on 2 tensors of 1M fp32 parameters: mul_, add_, addcmul_, sqrt, div, addcdiv_ per tensor
    n = 1 << 20
    ops = [pointwise(n, name=f"aten.{name}", layer="", phase="optimizer", time_s=400e-6)
           for _ in range(2) for name in ("mul_", "add_", "mul_", "addcmul_", "sqrt", "div", "addcdiv_")]
    layers = {"": LayerRecord(path="", type="Net", param_bytes=2 * n * 4)}
    (o,) = [o for o in _report(ops, layers=layers, step_time_s=20e-3).opportunities if o.kind == "fusion"]
    assert o.evidence["chain"] == "optimizer" and "torch.optim.AdamW(params, ..., fused=True)" in o.change
    # fused: params, grads and both moments read, params and moments written = 7 x 8 MiB = 58.7 MB; the 14 ops
    # moved 14 x 8 MiB = 117.4 MB in 5.6 ms: the fused update at their rate takes half of it, 2.8 ms
    assert o.evidence["mb_after"] == pytest.approx(7 * 2 * n * 4 / 1e6)
    assert o.saving_s == pytest.approx(14 * 400e-6 * (1 - 7 / 14))
    # an SGD update (mul_ and add_ only: momentum) is told to use SGD's fused kernel
    sgd = [pointwise(n, name=f"aten.{name}", layer="", phase="optimizer", time_s=400e-6)
           for _ in range(2) for name in ("mul_", "add_", "add_")]
    (o,) = [o for o in _report(sgd, layers=layers, step_time_s=20e-3).opportunities if o.kind == "fusion"]
    assert "torch.optim.SGD(params, ..., fused=True)" in o.change


class _RMSNorm(torch.nn.Module):
    def __init__(self, d):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(d))

    def forward(self, x):
        var = x.pow(2).mean(-1, keepdim=True)
        return self.weight * (x * torch.rsqrt(var + 1e-6))


class _Rotary(torch.nn.Module):
    def forward(self, q, cos, sin):
        half = q.shape[-1] // 2
        rot = torch.cat((-q[..., half:], q[..., :half]), dim=-1)
        return q * cos + rot * sin


class _SwiGLU(torch.nn.Module):
    def __init__(self, d):
        super().__init__()
        self.gate, self.up = torch.nn.Linear(d, 4 * d, bias=False), torch.nn.Linear(d, 4 * d, bias=False)
        self.down = torch.nn.Linear(4 * d, d, bias=False)

    def forward(self, x):
        return self.down(torch.nn.functional.silu(self.gate(x)) * self.up(x))


class _LlamaStyleBlock(torch.nn.Module):
    """A Llama block's memory-bound parts as Hugging Face writes them out: RMSNorm (pow/mean/rsqrt/mul), rotary
    embedding (rotate_half: neg/cat, then mul/add) and the SwiGLU MLP (silu * up)."""

    def __init__(self, d=256):
        super().__init__()
        self.norm, self.rotary, self.mlp = _RMSNorm(d), _Rotary(), _SwiGLU(d)

    def forward(self, x):
        h = self.norm(x)
        cos, sin = torch.cos(h), torch.sin(h)
        return self.mlp(self.rotary(h, cos, sin))


def test_llama_style_chains_name_their_fused_kernel():
    with torch.device("meta"):
        block = _LlamaStyleBlock()
    rep = ts.analyze_model(block, input_shape=[(8, 2048, 256)], gpu="h100", precision="bf16", backward=True)
    fusions = [o for o in rep.opportunities[:50] if o.kind == "fusion"]
    found = {o.evidence.get("chain"): o for o in fusions}
    assert found["rmsnorm"].layer == "norm" and "`LigerRMSNorm`" in found["rmsnorm"].change
    assert "of the RMSNorm" in found["rmsnorm"].cause
    assert found["rope"].layer == "rotary" and "`liger_rotary_pos_emb`" in found["rope"].change
    # SwiGLU: silu, the gating product, and in backward silu_backward and two products, apart from one another by
    # the GEMMs (no consecutive chain). One activation n = 8 x 2048 x 1024 bf16 = 33.55 MB: forward silu (n in, n
    # out) + mul (2n in, n out) = 5n, fused 3n; backward 2 muls (6n) + silu_backward (3n) = 9n, fused 5n
    sw = found["swiglu"]
    n = 8 * 2048 * 1024 * 2
    assert sw.layer == "mlp" and "`LigerSwiGLUMLP`" in sw.change and sw.evidence["ops"] == 5
    assert sw.evidence["mb_before"] == pytest.approx(14 * n / 1e6) and sw.evidence["mb_after"] == pytest.approx(8 * n / 1e6)
    assert [o.layer for o in fusions].count("mlp") == 1  # its ops are not found again as a generic chain
    # the StepReport's (and the dashboard's) titles name the chain: several fusion findings tell apart at a glance
    titles = {o.evidence.get("chain"): o.title for o in rep.opportunities if o.kind == "fusion"}
    assert titles["rmsnorm"] == "fusion (RMSNorm)" and titles["rope"] == "fusion (rotary embedding)"
    assert titles["swiglu"] == "fusion (SwiGLU)"


def test_alignment_is_advised_only_for_a_dimension_off_the_dtypes_tile():
    # the CNN classifier on an H100: 64x4096 @ 4096x256 and its backward GEMMs, every dimension a multiple of
    # 64: nothing to pad, in fp32 or bf16
    for dtype in ("float32", "bfloat16"):
        ops = [_mm(64, 4096, 256, "classifier.1", "forward", 0.05, dtype=dtype),
               _mm(64, 256, 4096, "classifier.1", "backward", 0.05, dtype=dtype),
               _mm(4096, 64, 256, "classifier.1", "backward", 0.05, dtype=dtype)]
        assert not [o for o in _report(ops, step_time_s=1e-3).opportunities[:20] if o.kind == "misaligned"]
    # fp32 rows are 16-byte aligned at multiples of 4: 1000 classes are, 1001 are not (named, padded to 1024)
    ok = [_mm(4096, 512, 1000, "head", "forward", 0.5, dtype="float32")]
    assert not [o for o in _report(ok, step_time_s=2e-3).opportunities if o.kind == "misaligned"]
    bad = [_mm(4096, 512, 1001, "head", "forward", 0.5, dtype="float32")]
    (o,) = [o for o in _report(bad, step_time_s=2e-3).opportunities if o.kind == "misaligned"]
    assert o.evidence["dim"] == 1001 and o.evidence["padded"] == 1024 and "not a multiple of 4 (fp32" in o.cause
    # a CPU has no GEMM tables to say what padding buys: no advice there
    cpu = ts.DeviceSpec("CPU (test)", {"fp32": 1e12}, 20e9, vendor="cpu", source="tests")
    assert not [o for o in _report(bad, spec=cpu, device="cpu", step_time_s=2e-3).opportunities
                if o.kind == "misaligned"]


def test_tf32_is_advised_only_for_fp32_on_a_gpu_with_tensor_cores():
    ops = [_mm(4096, 4096, 4096, "fc", "forward", 2.6, dtype="float32")]
    cpu = ts.DeviceSpec("CPU (test)", {"fp32": 1e12, "tf32": 1e12}, 20e9, vendor="cpu", source="tests")
    assert not [o for o in _report(ops, spec=cpu, device="cpu").opportunities if o.kind == "fp32_matmul"]
    bf16 = [_mm(4096, 4096, 4096, "fc", "forward", 0.3)]
    assert not [o for o in _report(bf16).opportunities if o.kind == "fp32_matmul"]


def test_savings_found_in_cpu_op_times_are_scaled_to_the_unprofiled_step():
    # a chain whose ops took 4 x 10 ms during the capture, in a step measured at 20 ms unprofiled: a busy host
    # stretched each op's wall time, so the saving found in op times (30 ms: a quarter of the bytes fused, at the
    # ops' own rate) is scaled by 20 / 40
    cpu = ts.DeviceSpec("CPU (test)", {"fp32": 1e12}, 20e9, vendor="cpu", source="tests")
    ops = [pointwise(1 << 20, name=f"aten.{n}", layer="act", time_s=10e-3) for n in ("pow", "mul", "add", "tanh")]
    o = next(o for o in _report(ops, spec=cpu, device="cpu", step_time_s=20e-3).opportunities
             if o.kind == "fusion")
    assert o.saving_s == pytest.approx(30e-3 * 20 / 40) and "x0.5, the unprofiled step (20 ms)" in o.predicted_text
    # not on a GPU (kernel times are not stretched by the host), nor when the ops add up to less than the step
    gpu = next(o for o in _report(ops, step_time_s=20e-3).opportunities if o.kind == "fusion")
    assert gpu.saving_s > 20e-3
    calm = next(o for o in _report(ops, spec=cpu, device="cpu", step_time_s=50e-3).opportunities
                if o.kind == "fusion")
    assert calm.saving_s == pytest.approx(30e-3)


def test_a_busy_hosts_stretch_is_taken_out_of_the_long_ops_only():
    # a 30 ms GEMM and a chain of four 0.5 ms ops (each shorter than a scheduler slice: the merged profile keeps
    # their unpreempted time), in a step measured at 17 ms unprofiled: the ops' 15 ms excess is the GEMM's
    # (k_long = (17 - 2) / 30 = 0.5), and the chain's saving (1.5 ms: a quarter of the bytes at the ops' own rate) is
    # not scaled; the uniform scale (17 / 32) would have cut it to 0.8 ms
    cpu = ts.DeviceSpec("CPU (test)", {"fp32": 1e12}, 20e9, vendor="cpu", source="tests")
    chain = [pointwise(1 << 20, name=f"aten.{n}", layer="act", time_s=0.5e-3) for n in ("pow", "mul", "add", "tanh")]
    ops = [matmul(2048, 2048, 2048, layer="fc", phase="forward", time_s=30e-3, dtype="float32"), *chain]
    o = next(o for o in _report(ops, spec=cpu, device="cpu", step_time_s=17e-3).opportunities if o.kind == "fusion")
    assert o.saving_s == pytest.approx(1.5e-3)
    assert "over the profiled ops" not in o.predicted_text
    # the same chain at 2 ms an op (long): stretched like the GEMM, (17 - 0) / 38 each
    slow = [pointwise(1 << 20, name=f"aten.{n}", layer="act", time_s=2e-3) for n in ("pow", "mul", "add", "tanh")]
    o = next(o for o in _report([ops[0], *slow], spec=cpu, device="cpu", step_time_s=17e-3).opportunities
             if o.kind == "fusion")
    assert o.saving_s == pytest.approx(6e-3 * 17 / 38)
    assert "taken out of the longer ones" not in o.predicted_text  # every op long: the uniform scale
    # short ops whose merged time (the row's median step) is a preempted one: their least disturbed step's time,
    # 0.5 ms of the 2 ms each -> the chain's 6 ms saving x 0.25
    pre = [dataclasses.replace(o, time_samples=[0.5e-3, 2e-3, 2.2e-3]) for o in slow]
    rep = _report([ops[0], *pre], spec=cpu, device="cpu", step_time_s=17e-3)
    # (held back as within its rows' spread over the steps, which these samples make wide)
    o = next(o for o in [*rep.opportunities, *rep.noise.suppressed] if o.kind == "fusion")
    assert o.saving_s == pytest.approx(6e-3 * 0.25)
    assert "x0.25, the ops under 1 ms at their least preempted step's time" in o.predicted_text


def _loss_chain(rows: int, vocab: int, ms: float) -> list:
    """Cross-entropy written as ops: log_softmax and nll_loss forward, their backward (fp32 logits rows x vocab)."""
    n = rows * vocab * 4
    return [op("aten._log_softmax", read=n, written=n, time_s=ms * 0.4e-3, category="softmax"),
            op("aten.nll_loss_forward", read=n, written=4, time_s=ms * 0.1e-3, category="loss"),
            op("aten.nll_loss_backward", phase="backward", read=n, written=n, time_s=ms * 0.2e-3, category="loss"),
            op("aten._log_softmax_backward_data", phase="backward", read=2 * n, written=n, time_s=ms * 0.3e-3,
               category="softmax")]


def test_the_loss_finding_on_a_gpu_and_not_on_a_cpu():
    cpu = ts.DeviceSpec("CPU (test)", {"fp32": 1e12}, 20e9, vendor="cpu", source="tests")

    def loss_kinds(rows, vocab, ms, spec, **kw):
        rep = _report(_loss_chain(rows, vocab, ms), spec=spec, step_time_s=10 * ms * 1e-3, **kw)
        return [o for o in rep.opportunities if o.kind == "fusion" and o.evidence.get("chain") == "loss"]

    # 700 x 10,000 fp32 logits (28 MB): the LSTM's, where a compiled loss on CPU measured -2.0 ms without page
    # faults; on a GPU a fused loss pays at any size
    assert not loss_kinds(700, 10000, 26.0, cpu, device="cpu")
    assert loss_kinds(700, 10000, 0.5, H100, device="cuda")
    assert loss_kinds(1024, 512, 0.05, H100, device="cuda")


def test_the_step_monitors_findings_are_opportunities_with_its_figures():
    bd = {"parts_ms": {"fetch": 11.0, "transfer": 1.0, "forward": 9.0}, "fetch_share": 0.3, "input_bound": True,
          "input_fixes": ["num_workers=0: set num_workers (e.g. 4-8 per GPU)"],
          "loop_findings": [{"cause": "log_every_n_steps=1 logs every step", "change": "log_every_n_steps=50",
                             "saving_s": 3e-3, "basis": "the loggers' measured 3 ms a step"}]}
    rep = _report(lm_head_ops(), step_breakdown=bd, step_time_s=40e-3)
    by = {o.kind: o for o in rep.opportunities[:10]}
    assert by["input"].saving_s == pytest.approx(12e-3) and "num_workers" in by["input"].change
    assert by["input"].predicted_by == "data_wait" and by["input"].rows == ()
    assert by["loop"].saving_s == pytest.approx(3e-3) and by["loop"].change == "log_every_n_steps=50"
    md = rep.to_markdown()
    assert "the input pipeline — **input**" in md and "the training loop — **loop**" in md
    # not input-bound: no finding
    quiet = _report(lm_head_ops(), step_breakdown={**bd, "input_bound": False, "loop_findings": []})
    assert not {"input", "loop"} & {o.kind for o in quiet.opportunities[:10]}


def test_an_opportunity_carries_the_closed_loops_measured_ratio_for_its_kind_and_device(monkeypatch):
    from tscope_callbacks.analysis import finding

    table = {"effects": {"cuda": {"misaligned": {"ratio": 0.8, "models": ["HF GPT-2"]}},
                         "cpu": {"fusion:optimizer": {"ratio": 1.1, "models": ["demo transformer"]}}}}
    monkeypatch.setattr(finding, "_effects", lambda: table)
    (o,) = [o for o in _report(lm_head_ops(), device="cuda").opportunities if o.kind == "misaligned"]
    assert o.measured_ratio == 0.8 and "HF GPT-2" in o.measured_on and "0.800x the predicted one" in o.measured_on
    md = _report(lm_head_ops(), device="cuda").to_markdown()
    assert "Checked: applied in tscope's closed loop on CUDA, the measured saving was 0.800x the predicted one (HF GPT-2)" in md
    # several models: the median, and each model's ratio
    table["effects"]["cuda"]["misaligned"]["cases"] = [{"model": "A", "ratio": 0.7}, {"model": "B", "ratio": 1.3}]
    assert finding.measured_effect("misaligned", "", "cuda").text.endswith("(median; A: 0.700x; B: 1.300x)")
    # a CPU's ratio is never given to a GPU's finding, nor one kind's to another
    assert finding.measured_effect("fusion", "optimizer", "cuda") is None
    assert finding.measured_effect("fusion", "loss", "cpu") is None
    assert finding.measured_effect("fusion", "optimizer", "cpu").ratio == 1.1
    # what the package ships reads
    monkeypatch.undo()
    finding._effects.cache_clear()
    assert isinstance(finding._effects(), dict)


def _other_chains(t_s: float, layers: int = 3) -> list:
    # per layer 4 written-out element-wise ops (add, mul, div, sub: the "other" chain) on 1,048,576 fp32 elements,
    # each reading and writing 4.19 MB: 33.6 MB moved, fused 8.39 MB (the first input and the last output)
    n = 1 << 20
    return [pointwise(n, name=f"aten.{name}", layer=f"h.{i}.ln", time_s=t_s)
            for i in range(layers) for name in ("add", "mul", "div", "sub")]


def test_per_layer_compile_advice_on_cuda_is_net_of_a_compiled_layers_cost():
    from tscope_callbacks.analysis.advice import COMPILED_LAYER_S

    cuda = {"device": "cuda", "timing": "cuda-kernels", "step_time_s": 100e-3}
    cpu_spec = ts.DeviceSpec("CPU (test)", {"fp32": 1e12}, 20e9, vendor="cpu", source="tests")
    other = lambda rep: [o for o in rep.opportunities[:20] if o.kind == "fusion"]  # noqa: E731
    # 1 ms an op: 4 ms a layer; fused, 8.39 of the 33.6 MB at their rate: 1 ms (the H100's roof for 8.39 MB is a few
    # us): 3 ms a layer saved, 9 ms over 3 layers, less 0.8 ms for each layer compiled on its own: 6.6 ms
    (o,) = other(_report(_other_chains(1e-3), **cuda))
    assert o.evidence["chain"] == "other" and o.saving_s == pytest.approx(9e-3 - 3 * COMPILED_LAYER_S)
    assert "a compiled layer a step" in o.predicted_text
    # 0.2 ms an op: 0.6 ms a layer saved, under what compiling the layer costs: no advice on CUDA (an H200 measured
    # -2.4 to -9.2 ms for 12 such layers compiled one by one, for +0.4 to +1.6 ms predicted)
    assert not other(_report(_other_chains(0.2e-3), **cuda))
    # on CPU unchanged: 0.8 ms a layer; fused, 8.39 MB at the CPU kernel model's pointwise time for it (its curve
    # over the 20 GB/s roof) over the ops' rate (0.2 ms): 0.36 ms a layer, no compile cost taken off
    (c,) = other(_report(_other_chains(0.2e-3), spec=cpu_spec, device="cpu", timing="cpu-wall", step_time_s=100e-3))
    fused = model_for(cpu_spec).memory_s("pointwise", 8 * (1 << 20))
    assert 8 * (1 << 20) / 20e9 <= fused < 0.8e-3 / 1.5  # the roof, and well under the ops' time
    assert c.saving_s == pytest.approx(3 * (0.8e-3 - fused)) and "compiled layer" not in c.predicted_text
