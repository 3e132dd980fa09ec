"""The images logged to a logger (TensorBoard's Images and Time Series tabs, W&B media) are readable as shown.

Until "Show actual image size" is ticked TensorBoard fits an image into a box (measured in TensorBoard 2.21 in
headless Chromium, the <img> boxes): 350 px wide in the Images tab, 215 px high in the Time Series tab. A card figure
is 3.5 x 2.15 in at 200 dpi = 700 x 430 px, shown at half size in both: 1 pt = 200 / 72 / 2 = 1.389 px, so its
smallest text, 8 pt, is 11.1 px (the full-size ``report.plot`` figure, 1200 x 720 px at 120 dpi, shows its 8 pt
labels at 8 x 120 / 72 x min(350 / 1200, 215 / 720) = 3.9 px)."""

from __future__ import annotations

from pathlib import Path

import lightning.pytorch as pl
import numpy as np
import pytest
import torch
from cb_utils import FAST, test_spec
from matplotlib.text import Text
from models import TinyLM
from profiles import a100, toy_profile
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

import tscope_callbacks as ts
from tscope_callbacks import api
from tscope_callbacks.demo.model import GPTConfig, TinyGPT
from tscope_callbacks.render.plot import (
    CARD_HEIGHT_PX,
    CARD_WIDTH_PX,
    card_figure,
    card_layer_bars,
    displayed_font_px,
    figure,
)

MIN_PX = 11.0


def _texts(fig) -> list[Text]:
    fig.canvas.draw()
    return [t for t in fig.findobj(Text) if t.get_visible() and t.get_text().strip()]


def _pixels(fig) -> tuple[int, int]:
    fig.canvas.draw()
    h, w = np.asarray(fig.canvas.buffer_rgba()).shape[:2]
    return w, h


def test_display_arithmetic():
    full = figure(api.roofline(toy_profile(), a100(), kernel_model=False))
    assert displayed_font_px(8, full) == pytest.approx(8 * 120 / 72 * 350 / 1200)  # 3.9 px: unreadable
    card = card_figure(api.roofline(toy_profile(), a100(), kernel_model=False))
    assert displayed_font_px(8, card) == pytest.approx(8 * 200 / 72 * 350 / 700)  # 11.1 px
    assert displayed_font_px(8, card) == pytest.approx(8 * 200 / 72 * 215 / 430)  # the same in Time Series
    assert (CARD_WIDTH_PX, CARD_HEIGHT_PX) == (350, 215)


@pytest.mark.parametrize("timed", [True, False])
def test_card_roofline_size_and_fonts(timed):
    fig = card_figure(api.roofline(toy_profile(timed), a100(), kernel_model=False))
    assert _pixels(fig) == (700, 430)
    texts = _texts(fig)
    labels = [t for t in fig.axes[0].texts]
    assert 1 <= len(labels) <= 3  # the largest layer x phase points, no ridge labels
    assert len(texts) > 10
    small = [(t.get_text(), displayed_font_px(t.get_fontsize(), fig)) for t in texts
             if displayed_font_px(t.get_fontsize(), fig) < MIN_PX]
    assert not small
    # everything drawn (titles, axis labels, tick labels in view, legends, point labels) inside the image
    x0, y0, x1, y1 = fig.get_tightbbox(fig.canvas.get_renderer()).extents * fig.dpi
    assert x0 >= 0 and y0 >= 0 and x1 <= 700 + 1 and y1 <= 430 + 1, (x0, y0, x1, y1)


def test_card_layer_bars_size_and_fonts():
    cfg = GPTConfig()
    model = TinyGPT(cfg)
    with ts.profile(model, layer_details=True) as p:
        model(torch.randint(0, cfg.vocab_size, (2, cfg.seq_len))).sum().backward()
    fig = card_layer_bars(p.layers, top=5)
    assert _pixels(fig) == (700, 430)
    by_time = sorted((L for k, L in p.layers.items() if k), key=lambda L: -(L.self_forward_s + L.self_backward_s))
    names = [t.get_text() for t in fig.axes[0].get_yticklabels()]
    assert names[::-1] == [L.path for L in by_time[:5]]  # the largest at the top, the full path
    assert all(displayed_font_px(t.get_fontsize(), fig) >= MIN_PX for t in _texts(fig))
    x0, y0, x1, y1 = fig.get_tightbbox(fig.canvas.get_renderer()).extents * fig.dpi
    assert x0 >= 0 and y0 >= 0 and x1 <= 700 + 1 and y1 <= 430 + 1, (x0, y0, x1, y1)  # no name cut off


def test_tensorboard_logs_the_card_images(tmp_path: Path):
    roof = ts.RooflineCallback(gpu=test_spec(), start_step=1, every_n_steps=10,
                               capture=ts.CaptureOptions(steps=1, wait_for_warmup=False))
    lay = ts.LayerProfilerCallback(start_step=1, every_n_steps=10)
    trainer = pl.Trainer(max_steps=2, default_root_dir=tmp_path, callbacks=[roof, lay],
                         logger=pl.loggers.TensorBoardLogger(tmp_path, name="tb"), **FAST)
    trainer.fit(TinyLM())
    acc = EventAccumulator(trainer.logger.log_dir, size_guidance={"images": 0})
    acc.Reload()
    (plot,) = acc.Images("tscope/roofline/plot")
    assert (plot.width, plot.height) == (700, 430)  # shown 350 x 215 px: 8 pt text at 11.1 px
    (bars,) = acc.Images("tscope/layers/bars")
    assert (bars.width, bars.height) == (700, 430)


def test_csv_logger_writes_the_card_png(tmp_path: Path):
    import struct

    roof = ts.RooflineCallback(gpu=test_spec(), start_step=1, every_n_steps=10,
                               capture=ts.CaptureOptions(steps=1, wait_for_warmup=False))
    trainer = pl.Trainer(max_steps=2, default_root_dir=tmp_path, callbacks=[roof],
                         logger=pl.loggers.CSVLogger(tmp_path, name="csv"), **FAST)
    trainer.fit(TinyLM())
    head = (Path(trainer.logger.log_dir) / "tscope" / "roofline_plot_step_1.png").read_bytes()[:24]
    assert struct.unpack(">II", head[16:24]) == (700, 430)  # the figure's own 200 dpi, as in TensorBoard


def test_an_untimed_plot_uses_the_expected_kernel_time_like_the_dashboard() -> None:
    # an estimate (meta device, no timing): a point's y is FLOPs / its expected (shape-aware kernel) time, the basis
    # of the dashboard's roofline and of the text report; a misaligned GEMM (N = 50257, not a multiple of 8) is
    # expected below its roof, so it must not be drawn on it
    import torch

    import tscope_callbacks as ts
    from tscope_callbacks.render.plot import _points

    model = torch.nn.Sequential(torch.nn.Linear(768, 50257))
    rep = ts.analyze_model(model, input_shape=(8 * 1024, 768), gpu="h100", precision="bf16")
    assert not rep.timed
    pts = _points(rep)
    assert pts and all(p["y"] == p["row"].flops / p["row"].expected_s / 1e12 for p in pts)
    below = [p for p in pts if p["row"].expected_s > p["row"].estimate_s * 1.01]
    assert below, [(p["row"].name, p["row"].expected_s, p["row"].estimate_s) for p in pts]
