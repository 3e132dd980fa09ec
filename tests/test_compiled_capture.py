"""Profiling a ``torch.compile``'d model records its compiled execution (Inductor's C++ backend on CPU): the fused
kernels that really run, with layers, FLOPs within 1% of the eager count (GEMMs and attention exact), no recompile,
kernels restored after the profile, and the compiled-vs-eager comparison in a Lightning fit."""

from __future__ import annotations

from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
from torch._dynamo.utils import counters

import tscope_callbacks as ts
from tests.cb_utils import FAST, test_spec
from tests.models import TinyLM
from tscope_callbacks.capture.compiled import code_modules
from tscope_callbacks.capture.state import CaptureState
from tscope_callbacks.demo.model import GPTConfig, TinyGPT, random_tokens
from tscope_callbacks.formulas.fused import kernel_count, members


# ---------------- kernel names and counts (no compile) ----------------
@pytest.mark.parametrize("name,expected", [
    ("cpp_fused_add_native_layer_norm_native_layer_norm_backward_sum_view_5",
     ("add", "native_layer_norm", "native_layer_norm_backward", "sum", "view")),
    ("triton_poi_fused__to_copy_add_mul_0", ("_to_copy", "add", "mul")),
    ("triton_red_fused__log_softmax_backward_data_nll_loss_backward_3",
     ("_log_softmax_backward_data", "nll_loss_backward")),
    ("triton_tem_fused_addmm_relu_1", ("addmm", "relu")),
    ("triton_per_fused_native_layer_norm_0", ("native_layer_norm",)),
    ("cpp_fused_gelu_gelu_backward_sum_view_6", ("gelu", "gelu_backward", "sum", "view")),
])
def test_members_from_kernel_names(name, expected):
    assert members(name) == expected


def test_kernel_counts_from_roles_and_shapes():
    x, y = torch.empty(128, 256), torch.empty(128, 256)
    c = kernel_count("cpp_fused_gelu_view_1", (x, y), ["in", "out"])
    # gelu 5 FLOPs per element over 32768 elements; 128 KiB read, 128 KiB written
    assert (c.flops, c.bytes_read, c.bytes_written, c.category) == (5 * 32768, 32768 * 4, 32768 * 4, "pointwise")
    # a LayerNorm fused with a residual add, inside a kernel that also reads a 4x wider tensor: the norm runs over
    # d = 64 (the 1-D weight's size): add 1 x 32768 + layer norm (4 + weight + bias = 6) x 8192
    h, w, b, out, wide = (torch.empty(8, 16, 64), torch.empty(64), torch.empty(64), torch.empty(8, 16, 64),
                          torch.empty(8, 16, 256))
    c = kernel_count("cpp_fused_add_native_layer_norm_view_2", (h, w, b, out, wide), ["in", "in", "in", "out", "in"])
    assert c.flops == 32768 + 6 * 8192 and c.category == "norm"
    # in a forward kernel a *_backward member is a saved statistic; in a backward kernel, the forward op beside its
    # own backward is a recompute: hardware FLOPs, not model FLOPs (gelu 5 + gelu_backward 10 per element)
    g = torch.empty(1000)
    fwd = kernel_count("cpp_fused_gelu_gelu_backward_0", (g, g.clone()), ["in", "out"], "forward")
    bwd = kernel_count("cpp_fused_gelu_gelu_backward_0", (g, g.clone()), ["in", "out"], "backward")
    assert (fwd.flops, fwd.flops_model) == (5000, None)
    assert (bwd.flops, bwd.flops_model) == (15000, 10000)
    # a Triton GEMM template: 2 M N K from its operands (64x32 @ 32x16)
    a, bm, o = torch.empty(64, 32), torch.empty(32, 16), torch.empty(64, 16)
    assert kernel_count("triton_tem_fused_mm_0", (a, bm, o), ["in", "in", "out"]).flops == 2 * 64 * 16 * 32
    # in_out buffers are read and written; unknown roles: every tensor read once
    c = kernel_count("cpp_fused_add_0", (x,), ["in_out"])
    assert (c.bytes_read, c.bytes_written) == (131072, 131072)
    assert kernel_count("cpp_fused_add_0", (x, y), None).bytes_read == 2 * 131072


# ---------------- a compiled TinyGPT step, profiled ----------------
def _dynamo() -> dict[str, int]:
    return {"graphs": counters["stats"].get("unique_graphs", 0),
            "breaks": sum(counters["graph_break"].values()),
            "recompiles": sum(counters["recompiles"].values()) if "recompiles" in counters else 0}


@pytest.fixture(scope="module")
def compiled_step():
    torch._dynamo.reset()
    counters.clear()
    torch.manual_seed(0)
    m = TinyGPT(GPTConfig(vocab_size=256, seq_len=64, d_model=128, n_layer=2, n_head=4))
    cm = torch.compile(m)
    x, y = random_tokens(m.cfg, batch=8)
    opt = torch.optim.SGD(m.parameters(), lr=1e-3)

    def step(mod):
        torch.nn.functional.cross_entropy(mod(x).flatten(0, 1), y.flatten()).backward()
        opt.step()
        opt.zero_grad()

    for _ in range(3):
        step(cm)
    before = _dynamo()
    kernels = {id(mod): dict(vars(mod)) for mod in code_modules()}
    with ts.profile(cm) as pc:
        step(cm)
    after = _dynamo()
    restored = all(vars(mod).get(k) is v for mod in code_modules() if id(mod) in kernels
                   for k, v in kernels[id(mod)].items() if k.startswith("cpp_fused"))
    with ts.profile(m) as pe:
        step(m)
    _AGAIN["profile"] = lambda: _profiled(cm, step)
    return pc, pe, before, after, restored


_AGAIN: dict = {}  #: the compiled step profiled once more, for checks that time it (see the coverage test)


def _profiled(cm, step):
    with ts.profile(cm) as p:
        step(cm)
    return p


def test_compiled_execution_is_recorded_without_recompiling(compiled_step):
    pc, _, before, after, restored = compiled_step
    assert after == before and before["graphs"] >= 1  # nothing recompiled, no new graph break
    assert restored  # every kernel global is the compiled one again
    cc = pc.info.compiled_capture
    assert cc["mode"] == "kernels" and cc["kernels_wrapped"] > 0 and cc["kernel_records"] > 0
    assert pc.info.compiled_modules_run_eagerly == []
    kernels = [r for r in pc.ops if r.op.startswith("inductor.")]
    assert kernels and all(r.fused_ops for r in kernels if "fused_" in r.op and not r.op.endswith("fused_0"))
    assert {r.phase for r in kernels} == {"forward", "backward"}
    # every fused kernel has a layer, and it is one of the model's modules
    paths = set(pc.layers)
    assert all(r.layer and r.layer in paths for r in kernels), [(r.op, r.layer) for r in kernels]


def test_compiled_flops_match_the_eager_count(compiled_step):
    pc, pe, *_ = compiled_step

    def model_flops(p, cats=None):
        return sum(r.flops if r.flops_model is None else r.flops_model for r in p.ops
                   if cats is None or r.category in cats)

    # GEMMs (extern kernels) and attention (a fallback op) go through the dispatcher: exact
    assert model_flops(pc, {"matmul"}) == model_flops(pe, {"matmul"})
    assert model_flops(pc, {"attention"}) == model_flops(pe, {"attention"}) > 0
    # the fused kernels' share is estimated from their names: the whole step within 1%
    assert model_flops(pc) == pytest.approx(model_flops(pe), rel=0.01)


def test_compiled_step_time_coverage(compiled_step):
    pc, *_ = compiled_step
    # kernels and extern ops timed: most of the captured region's wall time is in them (the rest is the Python
    # wrapper and our recording); the report's step basis is their sum (CPU)
    timed = sum(r.time_s or 0.0 for r in pc.ops)
    assert pc.info.step_time_basis == "op-time" and pc.info.step_time_s == pytest.approx(timed)
    # a timing: the best of up to three profiled steps, since a shared machine's pause inside one region (CI once
    # saw 14 ms of op time in a 394 ms region; here 12 of 16-19 ms) is not the capture's cost
    shares = [timed / pc.wall_time_s]
    while max(shares) <= 0.3 and len(shares) < 3:
        p = _AGAIN["profile"]()
        shares.append(sum(r.time_s or 0.0 for r in p.ops) / p.wall_time_s)
    assert max(shares) > 0.3, shares


def test_report_says_compiled_and_gives_no_fusion_advice(compiled_step):
    pc, pe, *_ = compiled_step
    rep = ts.roofline(pc.result, test_spec())
    md = rep.to_markdown()
    assert "**Compiled**: the compiled execution was recorded" in md
    assert all(o.kind != "fusion" for o in rep.opportunities[:10])
    eager = ts.roofline(pe.result, test_spec())
    rows = ts.analyze(pc.result, test_spec(), ts.AnalyzeOptions(eager=eager)).compiled_vs_eager
    assert rows[-1]["layer"] == "(total)"
    assert rows[-1]["speedup"] == pytest.approx(eager.totals.measured_s / rep.totals.measured_s)
    assert any(r["layer"].startswith("blocks.") and r["compiled_ms"] and r["eager_ms"] for r in rows)


def test_compiled_option():
    with pytest.raises(ValueError, match="compiled must be"):
        ts.profile(torch.nn.Linear(2, 2), compiled="fast")


# ---------------- in a Lightning fit ----------------
def _fit(tmp_path: Path, callbacks: list, steps: int = 14) -> dict[str, int]:
    torch._dynamo.reset()
    counters.clear()
    torch.manual_seed(0)
    module = TinyLM(n_batches=steps)
    module.model = torch.compile(module.model)
    trainer = pl.Trainer(max_steps=steps, default_root_dir=tmp_path, logger=pl.loggers.CSVLogger(tmp_path),
                         callbacks=callbacks, **FAST)
    trainer.fit(module)
    return _dynamo()


def test_fit_profiles_compiled_kernels_and_compares_with_eager(tmp_path: Path):
    plain = _fit(tmp_path / "plain", [])
    cb = ts.RooflineCallback(gpu=test_spec(), every_n_steps=6, start_step=3, max_profiles=2,
                             outputs=ts.RooflineOutputs(plot=False), capture=ts.CaptureOptions(wait_for_warmup=False))  # exactly on schedule (compiling makes the first steps slow)
    profiled = _fit(tmp_path / "profiled", [cb])
    assert profiled == plain  # two kernels-mode profiles and an eager reference: no recompile, no graph break
    assert [h["step"] for h in cb.history] == [3, 6]  # the eager reference (step 4) is not a profile of its own
    assert cb.last_profile.info.compiled_capture["mode"] == "kernels"
    assert cb.eager_report is not None and cb.eager_report.step == 4
    assert cb.eager_report.profile.info.compiled_modules_run_eagerly == ["model"]
    texts = list((tmp_path / "profiled").rglob("*compiled_vs_eager*"))
    assert texts, sorted(p.name for p in (tmp_path / "profiled").rglob("*"))
    body = texts[0].read_text()
    assert "compiled ms" in body and "eager ms" in body and "**total**" in body


def test_triton_kernels_are_recorded_through_their_run_method(tmp_path, monkeypatch):
    # a GPU code module as Inductor writes it: kernels are objects whose .run(...) the wrapper calls
    import types

    from tscope_callbacks.capture import compiled as cc

    src = tmp_path / "cfake.py"
    src.write_text("triton_poi_fused_add_mul_0 = async_compile.triton('triton_poi_fused_add_mul_0', '''\n"
                   "def triton_poi_fused_add_mul_0(in_ptr0, in_ptr1, out_ptr0, xnumel, XBLOCK : tl.constexpr):\n"
                   "    pass\n''')\n")

    class FakeKernel:
        fn = "the Triton JIT function"

        def __init__(self):
            self.calls = 0

        def run(self, *args, stream=None):
            self.calls += 1
            args[2].copy_(args[0] * args[1] + args[0])

    kern = FakeKernel()
    mod = types.ModuleType("cfake")
    mod.__file__ = str(src)
    mod.triton_poi_fused_add_mul_0 = kern
    monkeypatch.setattr(cc, "code_modules", lambda: [mod])
    def raise_it(e, part):
        raise e

    p = CaptureState(collapse=str, collapsing=False, timed=True, counter=None, error=raise_it, running=True,
                     stack=[("blk", False)])
    state = cc.CompiledState()
    state.wrap(cc.kernel_recorder(p, state))
    proxy = mod.triton_poi_fused_add_mul_0
    assert isinstance(proxy, cc.TritonProxy) and proxy.fn == kern.fn  # other attributes pass through
    a, b, out = torch.ones(1024), torch.full((1024,), 2.0), torch.empty(1024)
    proxy.run(a, b, out, 1024, stream=0)
    assert kern.calls == 1 and torch.equal(out, torch.full((1024,), 3.0))  # the kernel really ran
    (func, c, layer, phase, dt), = p.pending
    assert str(func) == "inductor.triton_poi_fused_add_mul_0" and (layer, phase) == ("blk", "forward")
    # add + mul, 1 FLOP each per element; two inputs read, one output written (roles from the signature)
    assert (c.flops, c.bytes_read, c.bytes_written) == (2 * 1024, 2 * 4096, 4096)
    assert p.fused[0] == ("add", "mul") and dt is not None
    state.restore()
    assert mod.triton_poi_fused_add_mul_0 is kern
