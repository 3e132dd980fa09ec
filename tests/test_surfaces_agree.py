"""The same number for the same thing on every surface: for three fits (the demo's TinyGPT, a small CNN, Hugging
Face GPT-2 built from a config, all tiny) with a RooflineCallback that merges 3 profiled steps (so every time is a
median), each layer x phase time read from the markdown report, the CSV, the step file's JSON, the TensorBoard Text
tab's table and the dashboard page's layer tree (in headless Chromium) agrees to the precision it is shown at.

The definition they all show: a layer x phase row's time is the median of its per-step totals (``analysis.noise
.merge_steps``); the tree's self times are that row's, its totals the sums over the layer's sub-tree. Display
precision: the one formatter's (``analysis.fmt.ms_text``: 3 significant figures), which every surface uses; the CSV
and the JSON keep full precision and must round to the same text.
"""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from browser import chromium
from cb_utils import test_spec
from lightning.pytorch.loggers import TensorBoardLogger
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

import tscope_callbacks as ts
from tscope_callbacks.analysis.fmt import ms_text, time_text
from tscope_callbacks.demo.lightning import DemoLM, RandomTokenData

PHASES = {"fwd": "forward", "bwd": "backward", "opt": "optimizer", "recomp": "recompute"}


class TinyCNN(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
            torch.nn.Conv2d(8, 16, 3, padding=1), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1),
            torch.nn.Flatten(), torch.nn.Linear(16, 10))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return torch.nn.functional.cross_entropy(self.net(x), y)

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.01)

    def train_dataloader(self) -> Any:
        g = torch.Generator().manual_seed(0)
        data = torch.utils.data.TensorDataset(torch.randn(64, 3, 16, 16, generator=g), torch.randint(0, 10, (64,)))
        return torch.utils.data.DataLoader(data, batch_size=8)


class TinyGPT2(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        transformers = pytest.importorskip("transformers")
        cfg = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=64, n_positions=32)
        self.model = transformers.GPT2LMHeadModel(cfg)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        (x,) = batch
        return self.model(input_ids=x, labels=x).loss

    def configure_optimizers(self) -> Any:
        return torch.optim.AdamW(self.parameters(), lr=1e-3)

    def train_dataloader(self) -> Any:
        g = torch.Generator().manual_seed(0)
        return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randint(0, 64, (64, 16), generator=g)),
                                           batch_size=4)


def _fit(tmp: Path, model: pl.LightningModule, data: Any = None) -> tuple[ts.RooflineCallback, Path, int]:
    cb = ts.RooflineCallback(gpu=test_spec(), start_step=2, every_n_steps=1000, monitor=None,
                             capture=ts.CaptureOptions(steps=3, wait_for_warmup=False),
                             outputs=ts.RooflineOutputs(top=1000, plot=False), mfu=ts.MFUOptions(automatic=False))
    trainer = pl.Trainer(max_steps=8, logger=TensorBoardLogger(tmp, name="tb"), callbacks=[cb], accelerator="cpu",
                         devices=1, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                         log_every_n_steps=1, num_sanity_val_steps=0, default_root_dir=tmp)
    trainer.fit(model, datamodule=data)
    assert cb.last_report is not None and cb.last_report.noise.steps == 3  # medians over 3 steps
    return cb, Path(trainer.logger.log_dir), cb.last_report.step


FITS = {"demo": lambda: (DemoLM(vocab_size=64, seq_len=16, d_model=32, n_layer=2, n_head=2),
                         RandomTokenData(vocab_size=64, seq_len=16, batch_size=4, num_samples=64)),
        "cnn": lambda: (TinyCNN(), None),
        "gpt2": lambda: (TinyGPT2(), None)}


@pytest.fixture(scope="module", params=sorted(FITS))
def fit(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path, int, Path]:
    tmp = tmp_path_factory.mktemp(request.param)
    model, data = FITS[request.param]()
    cb, log_dir, step = _fit(tmp, model, data)
    return cb, log_dir, step, tmp


def _table(markdown: str) -> dict[tuple[str, str], str]:
    """The layer x phase table of a markdown report (its first table with a layer and a phase column): (layer, phase)
    -> its measured time's text, the group and total rows left out."""
    out: dict[tuple[str, str], str] = {}
    head: list[str] | None = None
    for line in markdown.splitlines():
        if not line.startswith("|"):
            if head is not None:
                break  # the table ended
            continue
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip()[1:-1])]
        if head is None:
            head = cells if "layer" in cells and "phase" in cells else None
            continue
        if set(line) <= set("|-: "):
            continue
        row = dict(zip(head, cells))
        layer = row["layer"].strip("`")
        if layer.startswith("**") or layer.startswith("(other"):
            continue
        t = row.get("measured ms", row.get("ms", "")).removesuffix(" (noise)")
        out[("" if layer == "(root)" else layer, PHASES.get(row["phase"], row["phase"]))] = t
    return out


def _json_rows(log_dir: Path, step: int) -> dict[tuple[str, str], float]:
    report = json.loads((log_dir / "tscope" / f"step_{step}.json").read_text())["report"]
    return {(r["layer"], r["phase"]): r["measured_s"] for r in report["rows"]["layer_phase"]}


def test_every_surface_shows_the_same_layer_times(fit: tuple[Any, Path, int, Path]) -> None:
    cb, log_dir, step, tmp = fit
    want = _json_rows(log_dir, step)  # the step file's JSON: full precision
    report = ts.load_step_file(log_dir / "tscope" / f"step_{step}.json")
    assert {(r.layer, r.phase): r.measured_s for r in report.rows["layer_phase"]} == want
    text = {k: ms_text(v) for k, v in want.items()}
    # the sentences beside a noisy row list the samples its median is of
    for m in report.noise.marks:
        assert m.measured_s == pytest.approx(sorted(m.samples)[len(m.samples) // 2]) and time_text(m.measured_s) in m.text

    # where the step goes: the parts add up to the step (the op parts scaled when the capture slowed the ops)
    split = report.time_split
    parts = (split.compute_bound_s + split.memory_bound_s + split.communication_s + split.uncounted_s
             + split.overhead_s + (split.idle_s or 0.0))
    assert split.step_s and parts == pytest.approx(split.step_s, rel=1e-9)
    assert split.scale == 1.0 or ("scaled x" in split.basis and split.idle_s == 0.0)

    # markdown (every row the table lists)
    md = _table(report.to_markdown(top=1000))
    assert md and all(md[k] == text[k] for k in md), {k: (md[k], text[k]) for k in md if md[k] != text[k]}

    # CSV: full precision, the same times
    path = tmp / "rows.csv"
    report.to_csv(path)
    rows = [r for r in csv.DictReader(path.open()) if r["table"] == "layer"]
    assert len(rows) == len(want)
    for r in rows:
        assert float(r["measured_ms"]) == pytest.approx(want[(r["layer"], r["phase"])] * 1e3, rel=1e-9)

    # TensorBoard's Text tab: the table the callback logged at the step (its narrow form)
    acc = EventAccumulator(str(log_dir), size_guidance={"tensors": 0})
    acc.Reload()
    (ev,) = [e for e in acc.Tensors("tscope/roofline/table/text_summary") if e.step == step]
    tb = _table(ev.tensor_proto.string_val[0].decode())
    assert tb and all(tb[k] == text[k] for k in tb), {k: (tb[k], text[k]) for k in tb if tb[k] != text[k]}
    assert set(tb) == set(md)

    # the dashboard page's layer tree (headless Chromium): each layer's self forward and backward times
    page = tmp / "step.html"
    report.to_html(page)
    with chromium() as driver:
        driver.get(page.as_uri())
        driver.find_element("css selector", "#tree-expand").click()
        cells = driver.execute_script("""return [...document.querySelectorAll('#tree-table tr.tree-row')].map(
            (tr) => [tr.getAttribute('data-path'), tr.children[2].textContent, tr.children[4].textContent]);""")
    assert cells
    shown = 0
    for path_, fwd, bwd in cells:
        for phase, t in (("forward", fwd), ("backward", bwd)):
            v = want.get((path_, phase))
            if v is None:  # a layer with no op of its own in this phase: the tree shows 0
                assert t in ("0", "–", ""), (path_, phase, t)
                continue
            assert t == text[(path_, phase)], (path_, phase, t, text[(path_, phase)])
            shown += 1
    assert shown >= len([k for k in want if k[1] in ("forward", "backward") and k[0] in {c[0] for c in cells}])


# ---------------------------------------------------------------- the LayerProfiler's surfaces beside the page's tree
def _fit_with_layers(tmp: Path, steps: int) -> tuple[ts.LayerProfilerCallback, ts.RooflineCallback, Path]:
    """The demo's pair: a LayerProfilerCallback (depth 3, as ``tscope demo``) beside a RooflineCallback merging
    ``steps`` steps, both due at step 2 (one shared capture series)."""
    roof = ts.RooflineCallback(gpu=test_spec(), start_step=2, every_n_steps=1000, monitor=None,
                               capture=ts.CaptureOptions(steps=steps, wait_for_warmup=False),
                               outputs=ts.RooflineOutputs(top=1000, plot=False), mfu=ts.MFUOptions(automatic=False))
    layers = ts.LayerProfilerCallback(start_step=2, every_n_steps=1000, depth=3,
                                      outputs=ts.LayerOutputs(plot=False, save_json=False))
    trainer = pl.Trainer(max_steps=7, logger=TensorBoardLogger(tmp, name="tb"), callbacks=[roof, layers],
                         accelerator="cpu", devices=1, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, log_every_n_steps=1, num_sanity_val_steps=0, default_root_dir=tmp)
    model, data = FITS["demo"]()
    trainer.fit(model, datamodule=data)
    assert roof.last_report is not None and layers.last_layers is not None
    return layers, roof, Path(trainer.logger.log_dir)


def _page_tree(report: Any, page: Path) -> tuple[str, dict[str, list[str]]]:
    """The page's layer-tree caption and, per path, its row's cells (name, bar, fwd self, fwd total, bwd self,
    bwd total, ...)."""
    report.to_html(page)
    with chromium() as driver:
        driver.get(page.as_uri())
        driver.find_element("css selector", "#tree-expand").click()
        caption = driver.find_element("css selector", "#tree-basis").text
        cells = driver.execute_script("""return [...document.querySelectorAll('#tree-table tr.tree-row')].map(
            (tr) => [tr.getAttribute('data-path'), tr.querySelector('.p').textContent,
                     ...[...tr.children].slice(2, 6).map((td) => td.textContent)]);""")
    return caption, {c[0]: c[1:] for c in cells}


def _tb_layers(log_dir: Path) -> tuple[str, dict[str, list[str]], dict[str, float]]:
    """The LayerProfiler's TensorBoard surfaces: its Text-tab table (title, per row name -> self fwd, fwd, self bwd,
    bwd) and its scalars (tag -> value)."""
    acc = EventAccumulator(str(log_dir), size_guidance={"tensors": 0, "scalars": 0})
    acc.Reload()
    (ev,) = acc.Tensors("tscope/layers/table/text_summary")
    lines = ev.tensor_proto.string_val[0].decode().splitlines()
    rows = {}
    for line in lines:
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("| ") and "`" in cells[0]:
            rows[cells[0].replace("&nbsp;", "").strip("`")] = [c.replace("\u00a0", " ") for c in cells[1:5]]
    scalars = {t: acc.Scalars(t)[0].value for t in acc.Tags()["scalars"] if t.startswith("tscope/layers/")}
    return lines[0], rows, scalars


def _seconds(text: str) -> float:
    """``"35 µs"`` -> 3.5e-05 (``analysis.fmt.time_text``'s units)."""
    v, unit = text.split()
    return float(v) * {"ns": 1e-9, "µs": 1e-6, "ms": 1e-3, "s": 1.0}[unit]


def test_layer_profiler_and_page_tree_agree_on_one_step(tmp_path: Path) -> None:
    """One profiled step (capture.steps=1): the LayerProfiler's Text-tab table, its scalars and the page's tree show
    the same times for the same layer (one capture, op times, self = the layer's own ops, total = with its sub-layers)
    and the same root name; a block listed without its sub-layers (depth 3) still shows its own self time."""
    layers, roof, log_dir = _fit_with_layers(tmp_path, steps=1)
    title, table, scalars = _tb_layers(log_dir)
    caption, tree = _page_tree(roof.last_report, tmp_path / "step.html")
    assert "step 2 only" in title and "step 2 only" in caption, (title, caption)
    assert "hooks" not in caption  # layer times are the layer's ops' times, not host hook timers
    assert tree[""][0] == "(root)" and "(root)" in table  # one root name
    L = layers.last_layers
    for path, name in (("model.head", "head"), ("model.blocks.0", "0"), ("", "(root)")):
        fs, ft, bs, bt = tree[path][1:5]
        # the table says its unit per cell ("35 µs", "1.52 ms"), the page's columns are in ms: both 3 figures
        assert [ms_text(_seconds(c)) for c in table[name]] == [fs, ft, bs, bt], (path, table[name], tree[path])
    # the scalars are the tree's totals, unrounded
    for path in ("model.head", "model.blocks.0"):
        for phase, i in (("forward", 2), ("backward", 4)):
            v = scalars[f"tscope/layers/{path}/{phase}_ms"]
            assert ms_text(v / 1e3) == tree[path][i], (path, phase, v, tree[path][i])
    blk = L["model.blocks.0"]
    assert 0 < blk.self_forward_s < blk.forward_s  # its attention and MLP are not its own ops
    assert table["0"][0] != table["0"][1]


def test_layer_profiler_and_page_tree_say_their_steps(tmp_path: Path) -> None:
    """Three merged steps: the page's tree shows each layer x phase's median of steps 2-4, the LayerProfiler's table
    step 2's own times; each says which, so two different figures for one layer are never unexplained."""
    layers, roof, log_dir = _fit_with_layers(tmp_path, steps=3)
    title, _, _ = _tb_layers(log_dir)
    caption, _ = _page_tree(roof.last_report, tmp_path / "step.html")
    assert "step 2 only" in title, title
    assert "median of steps 2, 3, 4" in caption, caption
