"""The markdown report's text says only what holds for this step: the noise section keeps to ``top`` entries, the
HFU line names only what the step's hardware FLOPs hold beyond its model FLOPs, and a what-if report says so in its
heading. Deterministic fake profiles (tests/profiles.py), no timing assertion."""

from __future__ import annotations

import dataclasses
import warnings

from profiles import a100, make_profile, matmul, op, pointwise

from tscope_callbacks import api
from tscope_callbacks.analysis.noise import merge_steps
from tscope_callbacks.records import LayerRecord

N = 1 << 22


def _step(step: int, blocks: int, spike: bool):
    """``blocks`` identical blocks (a bf16 GEMM then a GELU); with ``spike`` every GELU takes 8x its usual 0.63 ms."""
    ops = []
    for b in range(blocks):
        ops += [matmul(4096, 1024, 1024, layer=f"blocks.{b}.fc", time_s=4e-3),
                pointwise(N, name="aten.gelu", layer=f"blocks.{b}.act", time_s=(5.04 if spike else 0.63) * 1e-3)]
    layers = {"": LayerRecord(path="", type="Toy")}
    for b in range(blocks):
        layers[f"blocks.{b}.fc"] = LayerRecord(path=f"blocks.{b}.fc", type="Linear")
        layers[f"blocks.{b}.act"] = LayerRecord(path=f"blocks.{b}.act", type="GELU")
    return make_profile(ops, layers=layers, step=step, step_time_s=80e-3, step_time_basis="unprofiled-median")


def test_the_noise_section_lists_at_most_top_entries_and_says_how_many_more():
    # 12 GELUs spike in step 11 (5.04 vs 0.63 ms): each is a noise mark, 12 entries in all
    rep = api.roofline(merge_steps([_step(10, 12, False), _step(11, 12, True), _step(12, 12, False)]), a100())
    assert len(rep.noise.marks) == 12
    noise = rep.to_markdown(top=5).split("### Noise")[1].strip().splitlines()[1:]
    entries = [ln for ln in noise if ln.startswith("- `")]
    assert len(entries) == 5, noise
    assert noise[-1].startswith("- ... and 7 more")  # 12 - 5
    full = rep.to_markdown(top=20).split("### Noise")[1]
    assert full.count("\n- `") == 12 and "more (" not in full


def _mlp(optimizer: bool):
    ops = [matmul(64, 256, 64, layer="fc", time_s=1e-4), matmul(64, 256, 64, layer="fc", phase="backward",
                                                               time_s=2e-4)]
    if optimizer:
        ops.append(op("aten._foreach_add_", phase="optimizer", flops=16384, read=65536, written=32768,
                      time_s=1e-5))
    return make_profile(ops, layers={"": LayerRecord(path="", type="MLP"), "fc": LayerRecord(path="fc",
                                                                                             type="Linear")},
                        step_time_s=1e-3, step_time_basis="unprofiled-median")


def _hfu(md: str) -> str:
    return next(ln for ln in md.splitlines() if ln.startswith("- **HFU**"))


def test_the_hfu_line_names_attention_recompute_only_when_the_step_has_it():
    # an MLP: hardware FLOPs exceed model FLOPs only by the optimizer's 16,384 FLOPs; no attention anywhere
    line = _hfu(api.roofline(_mlp(True), a100()).to_markdown())
    assert "attention" not in line and "optimizer" in line
    # a fused attention backward that recomputes the scores (flops_model below flops): named
    prof = _mlp(False)
    attn = op("aten._scaled_dot_product_flash_attention_backward", layer="attn", phase="backward",
              flops=5_000_000, category="attention", time_s=1e-4)
    attn = dataclasses.replace(attn, flops_model=4_000_000, index=len(prof.ops))
    prof.ops.append(attn)
    line = _hfu(api.roofline(prof, a100()).to_markdown())
    assert "attention backward's recomputed scores" in line and "optimizer" not in line
    assert "recompute," not in line  # no activation checkpointing in this step


def test_a_what_if_reports_heading_names_both_devices():
    prof = _mlp(True)
    prof.info = dataclasses.replace(prof.info, device="cpu")  # measured on this machine's CPU, placed on the A100's roofs
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the what-if warning (once per process)
        rep = api.roofline(prof, a100())
    assert rep.what_if is not None
    head = rep.to_markdown().splitlines()[0]
    assert head.startswith("## Roofline — what-if on NVIDIA A100-SXM4-80GB, measured on this machine's CPU · ")
    same = api.roofline(_mlp(True), a100()).to_markdown().splitlines()[0]
    assert same.startswith("## Roofline — NVIDIA A100-SXM4-80GB") and "what-if" not in same


def test_cli_report_with_file_outputs_prints_one_line_per_file(tmp_path, capsys):
    """`tscope report X --html OUT` used to print the whole markdown report too; now one line per file written,
    and the report only with --print (or --markdown), or when no file is asked for."""
    import json

    from profiles import toy_profile

    from tscope_callbacks.cli import main

    path = tmp_path / "step.json"
    path.write_text(json.dumps({"profile": toy_profile().to_dict(), "device": a100().to_dict()}))
    html, out_csv = tmp_path / "step.html", tmp_path / "rows.csv"
    assert main(["report", str(path), "--html", str(html), "--csv", str(out_csv)]) == 0
    out = capsys.readouterr().out
    assert out.splitlines() == [f"CSV written to {out_csv}", f"dashboard page written to {html}"]
    assert html.stat().st_size > 1000 and out_csv.stat().st_size > 0
    assert main(["report", str(path), "--html", str(html), "--markdown"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("## Roofline — ") and out.rstrip().endswith(f"dashboard page written to {html}")
    assert main(["report", str(path)]) == 0
    assert capsys.readouterr().out.startswith("## Roofline — ")


def test_the_nan_alert_is_short_lines_origin_first_and_no_lead_after_a_sudden_onset():
    from tscope_callbacks.analysis.grad_history import GradHistory
    from tscope_callbacks.analysis.nonfinite import NonFiniteEvent

    h = GradHistory(window=64, spike_factor=10.0)
    names = ["enc.w", "dec.w"]
    for s in range(12):
        h.add(s, names, [1.0, 1.0])
    for s, g in ((12, 3.0), (13, 30.0), (14, 300.0)):  # dec grows 300x by step 14
        h.add(s, names, [1.0, g])
    assert "'dec'" in h.trend() and "look there first" in h.trend()  # origin unknown: where to look
    assert "'dec'" in h.trend("secondary") and "secondary evidence" in h.trend("secondary")
    assert "look there first" not in h.trend("secondary") and "'dec'" not in h.trend("off")
    origin = ("first NaN made by aten.mul in the forward, called at train.py:87 in hook: return out * nan; "
              "its inputs were finite: float32[4x8] min -1 max 2")
    ev = NonFiniteEvent(step=15, epoch=0, batch_idx=15, kind="activation", layer="blocks.1.fc", ranks=[0],
                        action="stopping the run", origin=origin, loss=float("nan"),
                        trend=h.trend("off") + " Onset: sudden. Steady before.",
                        note=f"Origin: {origin}. Other words.")
    lines = str(ev).splitlines()
    assert lines[0] == ("NaN guard: non-finite activation at step 15 in layer 'blocks.1.fc': first NaN made by "
                        "aten.mul in the forward, called at train.py:87 in hook: return out * nan. "
                        "Action: stopping the run.")
    assert lines[1] == "- Onset: sudden. Steady before."
    assert lines[2] == "- Inputs of that op (all finite): float32[4x8] min -1 max 2."
    assert lines[-1] == "- Note: Other words." and str(ev).count("first NaN made by") == 1
    assert all(len(ln) < 300 for ln in lines)
