"""The analysis helpers' typed boundary (``analysis.view``): the FSDP what-if and the memory check read the report's
typed ``options.what_if``, never a string key of ``meta``."""

from __future__ import annotations

import dataclasses

import torch

import tscope_callbacks as ts
from tscope_callbacks.analysis.fsdp import fsdp_whatif
from tscope_callbacks.analysis.memory_fit import report_capacity, report_memory_fit
from tscope_callbacks.demo.model import GPTConfig, TinyGPT
from tscope_callbacks.render.report import RooflineReport

TINY = GPTConfig(vocab_size=64, seq_len=16, d_model=32, n_layer=2, n_head=2)


def test_report_capacity_is_the_roofs_device_unless_a_what_if():
    h100 = ts.get_device_spec("h100")
    assert h100.memory_bytes
    assert report_capacity(h100) == h100.memory_bytes
    assert report_capacity(h100, "this machine's CPU") is None


def test_fsdp_whatif_reads_the_typed_what_if():
    torch.manual_seed(0)
    m = TinyGPT(TINY)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    x = torch.randint(0, TINY.vocab_size, (2, TINY.seq_len), generator=torch.Generator().manual_seed(0))
    with ts.profile(m, layer_details=True) as p:
        m(x).float().sum().backward()
        opt.step()
    h100 = ts.get_device_spec("h100")
    what_if = ts.roofline(p.result, h100)  # CPU times on H100 roofs: a what-if
    assert what_if.options.what_if and "what_if" in what_if.meta
    same = RooflineReport(what_if.analysis, dataclasses.replace(what_if.options, what_if=None))
    assert "what_if" not in same.meta
    a, b = fsdp_whatif(what_if, m, 4), fsdp_whatif(same, m, 4)
    # a what-if: no capacity to check against (the step ran on another device), the device's expected op times
    assert a["memory"]["capacity"] is None and a["memory"]["verdict"] is None
    assert a["time"]["basis"] == "expected op times"
    # the same analysis, not a what-if: the H100's memory and the measured op times
    assert b["memory"]["capacity"] == h100.memory_bytes and b["memory"]["verdict"] == "fits"
    assert b["time"]["basis"] == "measured op times"
    assert report_memory_fit(what_if)["capacity"] is None
    assert report_memory_fit(same)["capacity"] == h100.memory_bytes
