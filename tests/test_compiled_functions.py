"""A ``torch.compile``'d *function* (a loss, an optimizer step) under the capture: the capture holds Dynamo in
``force_eager`` (its hooks must never be traced into a graph), so the function runs eagerly and its ops are recorded
unfused, while the user's real run executes the compiled, fused code. The capture marks those ops
(``CaptureInfo.compiled_functions_run_eagerly``) and the advice gives them no fusion finding."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch._dynamo.eval_frame as eval_frame
import torch.nn as nn
import torch.nn.functional as F

import tscope_callbacks as ts
from tscope_callbacks import StepProfile


def _ce(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits, y)


def _model() -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    # a small body under large logits (1,280 x 4,096): the loss's log_softmax / nll chain is most of the step's bytes
    m = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4096))
    return m, torch.randn(1280, 32), torch.randint(0, 4096, (1280,))


def _capture(loss_fn) -> StepProfile:
    m, x, y = _model()
    with ts.profile(m) as p:
        loss_fn(m(x), y).backward()
    return p.result


def _scripted(prof: StepProfile) -> StepProfile:
    """The capture's ops at scripted times, as an H100's kernels would take them (their bytes at 1 TB/s + 3 us), so
    the findings depend on the records only, never on this machine's speed or load (and the loss finding is a GPU
    one: on CPU a compiled loss is not advised); the step is their sum."""
    ops = [dataclasses.replace(r, time_s=(r.bytes_read + r.bytes_written) / 1e12 + 3e-6) for r in prof.ops]
    step = sum(r.time_s for r in ops)
    return StepProfile(ops=ops, layers=prof.layers, info=dataclasses.replace(
        prof.info, device="cuda", device_name="NVIDIA H100 SXM", timing="cuda-kernels", step_time_s=step,
        step_time_basis="unprofiled-median"))


def _loss_findings(prof: StepProfile) -> list:
    rep = ts.roofline(_scripted(prof), "h100")
    return [o for o in rep.opportunities if o.kind == "fusion" and (o.evidence or {}).get("chain") == "loss"]


def test_the_ops_of_a_compiled_function_are_marked_forward_and_backward():
    compiled = torch.compile(_ce)
    prof = _capture(compiled)
    runs = prof.info.compiled_functions_run_eagerly
    assert list(runs) == ["_ce"]
    marked = {i for first, last in runs["_ce"] for i in range(first, last + 1)}
    by_index = {r.index: r for r in prof.ops}
    names = {(by_index[i].op, by_index[i].phase) for i in marked}
    # F.cross_entropy = log_softmax + nll_loss, and their backward (autograd's sequence numbers)
    assert {("aten._log_softmax", "forward"), ("aten.nll_loss_forward", "forward"),
            ("aten.nll_loss_backward", "backward"), ("aten._log_softmax_backward_data", "backward")} <= names
    # nothing of the model's own layers, forward or backward
    assert all(by_index[i].layer == "" for i in marked)
    assert not any(r.op in ("aten.addmm", "aten.mm", "aten.relu", "aten.threshold_backward")
                   for i, r in by_index.items() if i in marked)
    # Dynamo's entry points are restored after the region
    assert eval_frame._callback_from_stance.__name__ == "_callback_from_stance"
    assert eval_frame._maybe_set_eval_frame.__module__ in (None, "torch._dynamo.eval_frame", "torch._C._dynamo.eval_frame")


def test_no_loss_fusion_advice_for_a_compiled_loss_function_and_the_finding_without_compile():
    plain = _loss_findings(_capture(_ce))
    assert len(plain) == 1 and plain[0].saving_s > 0  # the witness: the same model, loss not compiled
    compiled = _capture(torch.compile(_ce))
    assert compiled.info.compiled_functions_run_eagerly
    assert _loss_findings(compiled) == []
    # the row's time is said to be the eager time of a compiled function, where a row is listed below its roof
    rep = ts.roofline(_scripted(compiled), "h100")
    loss_rows = [b for b in rep.below_roof if b.layer == ""]
    assert loss_rows and all("already compiled in the real run" in b.cause for b in loss_rows)
    assert all("already compiled" not in b.cause for b in rep.below_roof if b.layer != "")


def test_a_compiled_function_called_before_the_capture_and_one_that_raises():
    """Compiled (and cached) before the region; a call that raises inside the region leaves nothing active; ops
    after it are not marked; nothing outside the region is."""
    compiled = torch.compile(_ce, backend="eager")  # Dynamo's tracing only: quick
    m, x, y = _model()
    compiled(m(x), y)

    def bad(logits, y):
        raise ValueError("user error")

    cbad = torch.compile(bad, backend="eager")
    with ts.profile(m) as p:
        with pytest.raises(ValueError):
            cbad(m(x), y)
        loss = compiled(m(x), y)
        (loss * 2).backward()
    info = p.result.info
    assert list(info.compiled_functions_run_eagerly) == ["_ce"]
    marked = {i for a, b in info.compiled_functions_run_eagerly["_ce"] for i in range(a, b + 1)}
    ops = {r.index: r for r in p.result.ops}
    assert not any(ops[i].op == "aten.mul" for i in marked)  # loss * 2 and its backward: the user's eager code
    assert any(ops[i].op == "aten.nll_loss_backward" for i in marked)


def test_without_compiled_functions_the_field_is_absent():
    prof = _capture(_ce)
    assert prof.info.compiled_functions_run_eagerly is None
    assert "compiled_functions_run_eagerly" not in prof.info.to_dict()
