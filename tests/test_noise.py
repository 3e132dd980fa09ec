"""Times from several steps (``analysis.noise``): per-op medians over k profiled steps with their spread; rows whose
times disagree across the steps, or with identical blocks, are named as noise and get no advice; an opportunity is
shown only when its saving exceeds the measured noise. Deterministic fake times throughout (no timing assertion)."""

from __future__ import annotations

import dataclasses
import json

import pytest
from profiles import a100, make_profile, matmul, pointwise

from tscope_callbacks import api
from tscope_callbacks.analysis.noise import NOISY_SPREAD, block_pattern, merge_steps
from tscope_callbacks.records import LayerRecord

N = 1 << 22  # elements of each activation


def _step(step: int, act_ms: tuple[float, float], fc_ms: float = 4.0):
    """Two identical blocks (fc: a bf16 GEMM, act: a GELU on N fp32 elements), forward and backward."""
    ops = []
    for b in (0, 1):
        ops += [matmul(4096, 1024, 1024, layer=f"blocks.{b}.fc", time_s=fc_ms * 1e-3),
                pointwise(N, name="aten.gelu", layer=f"blocks.{b}.mlp.act", time_s=act_ms[b] * 1e-3)]
    for b in (1, 0):
        ops += [pointwise(N, name="aten.gelu_backward", layer=f"blocks.{b}.mlp.act", phase="backward",
                          time_s=0.9e-3),
                matmul(4096, 1024, 1024, layer=f"blocks.{b}.fc", phase="backward", time_s=2 * fc_ms * 1e-3)]
    layers = {p: LayerRecord(path=p, type=t) for p, t in (("", "Toy"), ("blocks.0.fc", "Linear"),
                                                          ("blocks.1.fc", "Linear"), ("blocks.0.mlp.act", "GELU"),
                                                          ("blocks.1.mlp.act", "GELU"))}
    return make_profile(ops, layers=layers, step=step, step_time_s=40e-3, step_time_basis="unprofiled-median")


def test_merge_takes_each_ops_median_and_keeps_its_times():
    steps = [_step(10, (0.63, 0.63)), _step(11, (5.13, 0.62)), _step(12, (0.61, 0.64))]  # a 4.5 ms spike in step 11
    m = merge_steps(steps)
    gelu0 = next(r for r in m.ops if r.layer == "blocks.0.mlp.act" and r.phase == "forward")
    assert gelu0.time_samples == pytest.approx([0.63e-3, 5.13e-3, 0.61e-3])
    assert gelu0.time_s == pytest.approx(0.63e-3)  # the median: the spike does not move it
    assert m.info.merged_steps == [10, 11, 12] and m.info.matched_ops == len(m.ops)
    assert [r.op for r in m.ops] == [r.op for r in steps[0].ops]  # the first step's records, in order
    assert merge_steps(steps[:1]) is steps[0]


def test_merge_puts_the_regions_idle_on_its_walls_basis():
    # an H200 GPT-2 profile of steps 100-102 printed "GPU idle 116.8 ms during the capture; captured region 57.23 ms
    # wall": the idle was the first step's (a full capture: a 171 ms region), the wall the median of the three
    steps = [_step(100, (0.63, 0.63)), _step(101, (0.62, 0.62)), _step(102, (0.64, 0.64))]
    for p, wall, busy in zip(steps, (0.1714, 0.05723, 0.0571), (0.0546, 0.0546, 0.0547)):
        p.wall_time_s = wall
        p.info = dataclasses.replace(p.info, device_busy_s=busy, device_idle_s=wall - busy)
    m = merge_steps(steps)
    # medians: wall 57.23 ms; idle of 116.8, 2.63 and 2.4 ms: 2.63 ms (not the first step's 116.8)
    assert m.wall_time_s == pytest.approx(0.05723) and m.info.device_idle_s == pytest.approx(0.05723 - 0.0546)
    assert m.info.device_busy_s == pytest.approx(0.0546) and m.info.device_idle_s <= m.wall_time_s


def test_a_spike_in_one_of_k_steps_is_marked_noise_and_gets_no_advice():
    # the measured example: block 0's GELU took 5.13 ms in one step, block 1's identical GELU 0.63 ms
    steps = [_step(10, (0.63, 0.63)), _step(11, (5.13, 0.62)), _step(12, (0.61, 0.64))]
    rep = api.roofline(merge_steps(steps), a100())
    mark = rep.noise.mark("blocks.0.mlp.act", "forward")
    # spread = 5.13 - 0.61 = 4.52 ms > 50% of its 0.63 ms median
    assert mark.kind == "spread" and mark.spread_s == pytest.approx(4.52e-3) and 4.52 > NOISY_SPREAD * 0.63
    assert {(m.layer, m.phase) for m in rep.noise.marks} == {("blocks.0.mlp.act", "forward")}  # the other rows agree across the steps
    # no advice on it (its backward row, which agrees across the steps, is judged on its own)
    assert all((o.layer, o.phase) not in (("blocks.0.mlp.act", "forward"), ("blocks.0.mlp.act", "all"))
               for o in rep.opportunities[:20])
    md = rep.to_markdown()
    noise = md.split("### Noise")[1]
    assert "`blocks.0.mlp.act` forward" in noise and "5.13 ms" in noise and "noise, no advice" in noise
    assert "0.63 (noise)" in md  # the table marks the row
    assert "median of 3 profiled steps (10, 11, 12)" in md
    assert json.loads(json.dumps(rep.to_dict()))["noise"]["marks"][0]["layer"] == "blocks.0.mlp.act"


def test_an_outlier_block_is_named_noise_not_a_finding():
    # one step where block 0's GELU is 5.13 ms every time and block 1's identical one 0.63 ms: no spread to see,
    # but the same ops on the same shapes: block 0 is the outlier (5.13 > 1.5 x 0.63)
    rep = api.roofline(_step(200, (5.13, 0.63)), a100())
    mark = rep.noise.mark("blocks.0.mlp.act", "forward")
    assert mark.kind == "outlier" and mark.typical_s == pytest.approx(0.63e-3) and mark.siblings == ("blocks.1.mlp.act",)
    assert not rep.noise.is_marked("blocks.1.mlp.act", "forward")
    assert all((o.layer, o.phase) not in (("blocks.0.mlp.act", "forward"), ("blocks.0.mlp.act", "all"))
               for o in rep.opportunities[:20])
    assert "identical block(s)" in rep.to_markdown().split("### Noise")[1]
    assert block_pattern("model.blocks.12.mlp.act") == "model.blocks.*.mlp.act"


def _below(rep) -> set[tuple[str, str]]:
    return {(r.layer, r.phase) for r in rep.below_roof}


def test_a_row_is_called_below_its_roof_only_when_its_excess_exceeds_the_measured_noise():
    # block fc GEMMs: 4096x1024x1024 bf16 = 8.59 GFLOP at 312 TFLOP/s = 0.0275 ms expected, measured ~4 ms fwd.
    # Steady (4.0, 4.0, 4.0 ms): recoverable ~3.97 ms > spread 0: below its roof (no change known: not an
    # opportunity)
    steady = api.roofline(merge_steps([_step(s, (0.63, 0.63)) for s in (1, 2, 3)]), a100())
    assert ("blocks.0.fc", "forward") in _below(steady)
    assert all(o.layer != "blocks.0.fc" for o in steady.opportunities[:20])
    # the same rows measured 2, 4 and 14 ms: median 4 ms, recoverable ~3.97 ms, but spread 12 ms: not called so
    # (spread 12 ms > 50% of 4 ms, so the row is also marked noise)
    noisy = api.roofline(merge_steps([_step(1, (0.63, 0.63), 2.0), _step(2, (0.63, 0.63), 4.0),
                                      _step(3, (0.63, 0.63), 14.0)]), a100())
    assert not _below(noisy) & {("blocks.0.fc", "forward"), ("blocks.1.fc", "forward")}
    assert noisy.noise.spread_of("blocks.0.fc", "forward") == pytest.approx(12e-3)


def test_a_row_within_its_noise_is_not_called_below_its_roof():
    # spread 1.2 ms on a 4 ms row (30% < 50%: not marked noise) while the row's recoverable time is ~1.0 ms:
    # below the measured spread, so it is not called below its roof
    def step(s, fc):
        p = _step(s, (0.63, 0.63), 4.0)
        for r in p.ops:
            if r.layer == "blocks.0.fc" and r.phase == "forward":
                r.time_s = fc * 1e-3
                r.flops *= 110  # expected 110 x 0.0275 = 3.03 ms: recoverable ~1 ms
        return p

    rep = api.roofline(merge_steps([step(1, 3.6), step(2, 4.0), step(3, 4.8)]), a100())
    assert not rep.noise.is_marked("blocks.0.fc", "forward")
    assert ("blocks.0.fc", "forward") not in _below(rep)
    # steady at 4.8 ms: 1.8 ms over the expected 3.03 ms (1.6x), no spread: below its roof
    steady = api.roofline(merge_steps([step(1, 4.8), step(2, 4.8), step(3, 4.8)]), a100())
    assert ("blocks.0.fc", "forward") in _below(steady)


def test_single_step_reports_are_unchanged_without_identical_blocks():
    p = _step(1, (0.63, 0.63))
    rep = api.roofline(p, a100())
    assert rep.noise.steps == 1 and not rep.noise.marks and "### Noise" not in rep.to_markdown()


def _chain_steps(bwd_ms: tuple[float, ...], tanh_ms: tuple[float, ...] = (4.0, 4.0, 4.0)):
    """Layer h.act: a forward chain of 3 fp32 pointwise ops on N elements (mul and add 4 ms each, tanh as
    ``tanh_ms`` over the steps) and one backward op whose time varies over the steps as ``bwd_ms``."""
    out = []
    for s, (b, t) in enumerate(zip(bwd_ms, tanh_ms)):
        ops = [pointwise(N, name=n, layer="h.act", time_s=ms * 1e-3)
               for n, ms in (("aten.mul", 4.0), ("aten.add", 4.0), ("aten.tanh", t))]
        ops.append(pointwise(N, name="aten.tanh_backward", layer="h.act", phase="backward", time_s=b * 1e-3))
        out.append(make_profile(ops, layers={"h.act": LayerRecord(path="h.act", type="Act")}, step=s,
                                step_time_s=100e-3, step_time_basis="unprofiled-median"))
    return merge_steps(out)


def test_a_layer_finding_is_weighed_against_the_spread_of_its_own_phase():
    # the chain moves 3 x 2 x 16.8 MB = 100.7 MB in 12 ms; fused (first input, last output: 33.6 MB) at 2.039 TB/s
    # about 0.016 ms: a ~12 ms saving. A backward row that spreads 20 ms (1 to 21 ms) is another phase: kept
    rep = api.roofline(_chain_steps((1.0, 21.0, 1.5)), a100())
    assert rep.noise.is_marked("h.act", "backward")
    assert any(o.kind == "fusion" and o.layer == "h.act" for o in rep.opportunities[:20])
    # the chain's own tanh at 4, 30 and 4 ms: median 4 ms (saving still ~12 ms) but its forward spreads 26 ms
    rep = api.roofline(_chain_steps((1.0, 1.0, 1.0), (4.0, 30.0, 4.0)), a100())
    assert not any(o.kind == "fusion" for o in rep.opportunities[:20])
    assert any(o.kind == "fusion" and o.evidence["noise_s"] == pytest.approx(26e-3) for o in rep.noise.suppressed)


def test_on_a_busy_machine_a_saving_must_exceed_the_steps_typical_deviation():
    # steady rows (no spread over the steps); the fc forward rows' recoverable time is ~3.97 ms (4 ms measured,
    # 0.0275 ms expected). Idle: a finding. Busy, the unprofiled steps deviating 5 ms from their median: held back
    steps = [_step(s, (0.63, 0.63)) for s in (1, 2, 3)]
    idle = api.roofline(merge_steps(steps), a100())
    assert ("blocks.0.fc", "forward") in _below(idle) and idle.noise.floor_s == 0.0
    for p in steps:
        p.info = dataclasses.replace(p.info, host_busy=True, step_time_spread_s=5e-3)
    busy = api.roofline(merge_steps(steps), a100())
    assert busy.noise.floor_s == 5e-3
    shown = _below(busy)
    assert ("blocks.0.fc", "forward") not in shown and ("blocks.1.fc", "forward") not in shown
    assert ("blocks.0.fc", "backward") in shown  # 8 ms measured, ~7.95 ms recoverable > 5 ms: still called so
    for p in steps:
        p.info = dataclasses.replace(p.info, step_time_spread_s=30e-3)  # more than every row's excess: nothing to say
    md = api.roofline(merge_steps(steps), a100()).to_markdown()
    assert "typical deviation on this busy machine, 30 ms" in md and "every layer is at its roof" not in md


def test_a_repeated_block_resting_on_a_noisy_row_leaves_its_group():
    # three identical blocks h.{0,1,2}.act, each a forward chain of 3 fp32 pointwise ops (4 ms each: a ~12 ms fusion
    # saving a block, as above); block 0's tanh takes 4, 30 and 4 ms over the steps: same median as its siblings (no
    # outlier) but its row spreads 26 ms, > 50% of 12 ms: noise. The finding is the two other blocks'
    steps = []
    for s, t0 in enumerate((4.0, 30.0, 4.0)):
        ops = [pointwise(N, name=n, layer=f"h.{b}.act", time_s=(t0 if (b, n) == (0, "aten.tanh") else 4.0) * 1e-3)
               for b in range(3) for n in ("aten.mul", "aten.add", "aten.tanh")]
        layers = {f"h.{b}.act": LayerRecord(path=f"h.{b}.act", type="Act") for b in range(3)}
        steps.append(make_profile(ops, layers=layers, step=s, step_time_s=100e-3, step_time_basis="unprofiled-median"))
    rep = api.roofline(merge_steps(steps), a100())
    assert rep.noise.is_marked("h.0.act", "forward") and not rep.noise.is_marked("h.1.act", "forward")
    (o,) = [o for o in rep.opportunities if o.kind == "fusion"]
    assert o.layer == "h.*.act" and o.evidence["layers"] == ["h.1.act", "h.2.act"]
    assert ("h.0.act", "forward") not in o.rows
    row = next(line for line in rep.to_markdown().splitlines() if line.startswith("| `h.0.act` |"))
    assert "(noise)" in row and "#" not in row
