"""Per-layer views: post-hoc selection, the torchprof-style tree table, InspectorGadgets JSON (pure records)."""

from __future__ import annotations

import json

from tscope_callbacks.analysis.layers import inspector_gadgets_json, layer_rows, select_layers, top_layers
from tscope_callbacks.records import LayerRecord
from tscope_callbacks.render.layer_table import render_tree_table


def _L(path: str, typ: str, fwd: float, bwd: float, self_fwd: float, self_bwd: float, **kw) -> LayerRecord:
    return LayerRecord(path=path, type=typ, forward_s=fwd, backward_s=bwd, self_forward_s=self_fwd,
                       self_backward_s=self_bwd, calls=1, **kw)


def _layers() -> dict[str, LayerRecord]:
    # root 10ms fwd = self 1 + enc 6 + head 3 ; enc = self 1 + enc.a 2 + enc.b 3
    return {
        "": _L("", "Net", 0.010, 0.020, 0.001, 0.002, flops_fwd=1000, self_flops_fwd=0),
        "enc": _L("enc", "Encoder", 0.006, 0.012, 0.001, 0.002, flops_fwd=600, self_flops_fwd=100),
        "enc.a": _L("enc.a", "Linear", 0.002, 0.004, 0.002, 0.004, flops_fwd=200, self_flops_fwd=200,
                    input_shapes=[[4, 8]], output_shapes=[[4, 16]], grad_output_shapes=[[4, 16]],
                    num_parameters=144, num_trainable_parameters=144, param_bytes=576, output_bytes=2_000_000),
        "enc.b": _L("enc.b", "ReLU", 0.003, 0.006, 0.003, 0.006, flops_fwd=300, self_flops_fwd=300,
                    nonfinite_output=True),
        "head": _L("head", "Linear", 0.003, 0.006, 0.003, 0.006, flops_fwd=400, self_flops_fwd=400),
    }


def test_select_by_depth_keeps_a_folded_layers_own_self_time() -> None:
    sel = select_layers(_layers(), depth=1)
    assert list(sel) == ["", "enc", "head"]
    enc = sel["enc"]
    # enc's sub-layers are not listed, but its self time is still its own ops' (1 ms fwd, 2 ms bwd), as every other
    # surface (the page's tree, the reports) shows it; its total includes them (6 ms, 12 ms)
    assert enc.self_forward_s == 0.001 and enc.self_backward_s == 0.002
    assert enc.forward_s == 0.006 and enc.self_flops_fwd == 100 and enc.flops_fwd == 600
    assert abs(sel[""].self_forward_s - 0.001) < 1e-12  # 10 - 6 - 3
    # the input is not modified
    assert _layers()["enc"].self_forward_s == 0.001


def test_select_by_paths_glob_and_identity() -> None:
    sel = select_layers(_layers(), paths=["enc.*"])
    assert list(sel) == ["", "enc.a", "enc.b"]
    assert abs(sel[""].self_forward_s - (0.010 - 0.005)) < 1e-12  # enc and head folded into the root
    assert select_layers(_layers()) == _layers()


def test_tree_table_draws_the_tree_and_columns() -> None:
    text = render_tree_table(_layers(), title="step 3")
    lines = text.splitlines()
    assert lines[0] == "step 3"
    header = [c.strip() for c in lines[1].split("|")]
    assert header == ["Module", "Self fwd", "fwd total", "Self bwd", "bwd total", "GFLOPs fwd", "GFLOPs bwd",
                      "output MiB", "mem fwd MiB", "mem bwd MiB", "calls"]
    labels = [ln.split(" | ")[0].rstrip() for ln in lines[3:]]
    assert labels == ["Net", "├── enc", "│   ├── a", "│   └── b", "└── head"]
    row_a = [c.strip() for c in lines[5].split("|")]
    # the one formatter's units: 2 ms; 2,000,000 B / 2**20 = 1.907 MiB -> "1.91" (3 significant figures)
    assert row_a[1] == "2 ms" and row_a[7] == "1.91"
    row_b = [c.strip() for c in lines[6].split("|")]
    assert row_b[1] == "3 ms" and row_b[7] == "0"  # no output bytes recorded


def test_inspector_gadgets_json_nesting_and_keys() -> None:
    doc = inspector_gadgets_json(_layers())
    json.dumps(doc)
    assert list(doc) == ["Net"]
    root = doc["Net"]
    assert list(root["children"]) == ["enc", "head"]
    a = root["children"]["enc"]["children"]["a"]
    info = a["info"]
    for key in ("type", "input_shapes", "output_shapes", "grad_in_shape", "grad_out_shape", "num_parameters",
                "num_learnable_parameters", "param_memory_usage", "gradient_memory_usage", "output_memory_usage",
                "effective_additional_memory_fwd", "effective_additional_memory_bwd", "forward_nan", "grad_in_nan",
                "grad_out_nan", "forward_latency", "backward_latency", "self_forward_latency",
                "self_backward_latency", "flops_fwd", "flops_bwd", "bytes_fwd", "bytes_bwd", "calls"):
        assert key in info, key
    assert info["type"] == "Linear" and info["output_shapes"] == [[4, 16]]
    assert info["forward_latency"] == 2.0 and info["output_memory_usage"] == [2.0]
    assert root["children"]["enc"]["children"]["b"]["info"]["forward_nan"] is True
    assert a["children"] == {}


def test_top_layers_and_rows() -> None:
    top = [L.path for L in top_layers(_layers(), 2)]
    assert top == ["head", "enc.b"]  # by self FLOPs (400, 300): stable, unlike self time; root excluded
    rows = layer_rows(_layers())
    assert rows[0]["layer"] == "(root)" and rows[2]["forward_ms"] == 2.0 and rows[3]["nonfinite"] is True


def test_text_tab_tables_never_print_float_noise_or_exponents() -> None:
    # the Text tab printed `6.939e-15` ms for `model.blocks` (a ModuleList: its self time is its total minus its
    # children's, float noise) and `8.19e-06` GFLOP for a tiny embedding
    from tscope_callbacks.render.layer_table import render_tree_markdown
    from tscope_callbacks.render.tables import rows_to_markdown

    layers = {"": LayerRecord(path="", type="Net", forward_s=2e-3, self_forward_s=6.939e-18, flops_fwd=8192),
              "pos": LayerRecord(path="pos", type="Embedding", forward_s=2.26e-5, self_forward_s=2.26e-5,
                                 memory_fwd_bytes=32768, memory_bwd_bytes=-512)}
    md = render_tree_markdown(layers)
    nb = "\u00a0"
    assert f"| `Net` | 0{nb}ms | 2{nb}ms | 0{nb}ms | 0{nb}ms | 0.00000819 |" in md, md  # 8,192 FLOP in GFLOP
    assert f"| 22.6{nb}µs | 22.6{nb}µs |" in md and f"32{nb}KiB | -512{nb}B |" in md  # the page's units
    assert "e-" not in md
    rows = rows_to_markdown(layer_rows(layers))
    assert "e-" not in rows and "| 0 |" in rows  # self_forward_ms 6.939e-15: 0
