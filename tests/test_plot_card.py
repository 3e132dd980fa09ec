"""The images logged to a logger (TensorBoard's Images tab, W&B media) are readable at the card's size.

TensorBoard's Images tab shows every image 350 CSS px wide until "Show actual image size" is ticked (measured in
TensorBoard 2.21 in headless Chromium: the <img> box of each card). A card figure is 3.5 in x 200 dpi = 700 px wide,
so on the card 1 pt = 200 / 72 px x 350 / 700 = 1.389 px; its smallest text, 8 pt, is 11.1 px there (the full-size
``report.plot`` figure, 1200 px at 120 dpi, shows its 8 pt labels at 8 x 120 / 72 x 350 / 1200 = 3.9 px)."""

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
    assert CARD_WIDTH_PX == 350


@pytest.mark.parametrize("timed", [True, False])
def test_card_roofline_size_and_fonts(timed):
    fig = card_figure(api.roofline(toy_profile(timed), a100(), kernel_model=False))
    assert _pixels(fig) == (700, 600)
    texts = _texts(fig)
    labels = [t for t in fig.axes[0].texts]
    assert 1 <= len(labels) <= 3  # the largest layer x phase points, no ridge labels
    assert len(texts) > 10
    small = [(t.get_text(), displayed_font_px(t.get_fontsize(), fig)) for t in texts
             if displayed_font_px(t.get_fontsize(), fig) < MIN_PX]
    assert not small
    # everything drawn (titles, axis labels, tick labels in view, legends, point labels) inside the image
    x0, y0, x1, y1 = fig.get_tightbbox(fig.canvas.get_renderer()).extents * fig.dpi
    assert x0 >= 0 and y0 >= 0 and x1 <= 700 + 1 and y1 <= 600 + 1, (x0, y0, x1, y1)


def test_card_layer_bars_size_and_fonts():
    cfg = GPTConfig()
    model = TinyGPT(cfg)
    with ts.profile(model, layer_details=True) as p:
        model(torch.randint(0, cfg.vocab_size, (2, cfg.seq_len))).sum().backward()
    fig = card_layer_bars(p.layers, top=5)
    w, h = _pixels(fig)
    assert w == 700 and h == round((0.36 * 5 + 0.85) * 200)
    by_time = sorted((L for k, L in p.layers.items() if k), key=lambda L: -(L.self_forward_s + L.self_backward_s))
    names = [t.get_text() for t in fig.axes[0].texts]
    assert names[::-1] == [L.path for L in by_time[:5]]  # the largest at the top, the full path
    assert all(displayed_font_px(t.get_fontsize(), fig) >= MIN_PX for t in _texts(fig))


def test_tensorboard_logs_the_card_images(tmp_path: Path):
    roof = ts.RooflineCallback(gpu=test_spec(), start_step=1, every_n_steps=10, profile_steps=1,
                               wait_for_warmup=False)
    lay = ts.LayerProfilerCallback(start_step=1, every_n_steps=10)
    trainer = pl.Trainer(max_steps=2, default_root_dir=tmp_path, callbacks=[roof, lay],
                         logger=pl.loggers.TensorBoardLogger(tmp_path, name="tb"), **FAST)
    trainer.fit(TinyLM())
    acc = EventAccumulator(trainer.logger.log_dir, size_guidance={"images": 0})
    acc.Reload()
    (plot,) = acc.Images("tscope/roofline/plot")
    assert (plot.width, plot.height) == (700, 600)  # shown 350 px wide: 8 pt text at 11.1 px
    (bars,) = acc.Images("tscope/layers/bars")
    assert bars.width == 700


def test_csv_logger_writes_the_card_png(tmp_path: Path):
    import struct

    roof = ts.RooflineCallback(gpu=test_spec(), start_step=1, every_n_steps=10, profile_steps=1,
                               wait_for_warmup=False)
    trainer = pl.Trainer(max_steps=2, default_root_dir=tmp_path, callbacks=[roof],
                         logger=pl.loggers.CSVLogger(tmp_path, name="csv"), **FAST)
    trainer.fit(TinyLM())
    head = (Path(trainer.logger.log_dir) / "tscope" / "roofline_plot_step_1.png").read_bytes()[:24]
    assert struct.unpack(">II", head[16:24]) == (700, 600)  # the figure's own 200 dpi, as in TensorBoard
