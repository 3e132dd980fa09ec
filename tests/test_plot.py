"""Roofline plot: a PNG of the expected size, untimed profiles, achievable roofs, no pyplot state left behind."""

from __future__ import annotations

import functools
import struct
import sys
import threading

from profiles import a100, make_profile, matmul, op, pointwise, toy_profile

from tscope_callbacks import api
from tscope_callbacks.devices.spec import DeviceSpec
from tscope_callbacks.render.plot import card_figure, figure, plot

# these tests check the roofline arithmetic itself: no shape-aware kernel model on top of it
roofline = functools.partial(api.roofline, kernel_model=False)


def _png_size(path) -> tuple[int, int]:
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", head[16:24])


def test_plot_writes_png_of_expected_size(tmp_path):
    out = tmp_path / "roof.png"
    assert roofline(toy_profile(), a100()).plot(out) == str(out)
    assert out.stat().st_size > 20_000
    assert _png_size(out) == (1200, 720)  # 10 x 6 in at 120 dpi


def test_plot_untimed_and_achievable(tmp_path):
    ach = DeviceSpec(name="measured", flops={"bf16": 250e12}, bandwidth=1.7e12, vector_flops={"bf16": 30e12,
                                                                                                "fp32": 15e12})
    for i, rep in enumerate((roofline(toy_profile(timed=False), a100()),
                             roofline(toy_profile(), a100(achievable=ach)))):
        out = tmp_path / f"r{i}.png"
        plot(rep, out, top_labels=3)
        assert _png_size(out) == (1200, 720)


def test_figure_has_roofs_points_and_labels_without_pyplot():
    rep = roofline(toy_profile(), a100())
    fig = figure(rep, top_labels=4)
    (ax,) = fig.axes
    assert ax.get_xscale() == ax.get_yscale() == "log"
    assert "FLOP/B" in ax.get_xlabel() and "TFLOP/s" in ax.get_ylabel()
    assert "NVIDIA A100-SXM4-80GB" in ax.get_title() and "step 7" in ax.get_title()
    labels = [t.get_text() for t in ax.texts]
    assert "blocks.0.fc (bwd)" in labels and sum(t.endswith(")") and "." in t for t in labels) == 4
    legend_text = [t.get_text() for leg in (ax.get_legend(),) for t in leg.get_texts()]
    assert legend_text  # phase legend
    assert "matplotlib.pyplot" not in sys.modules or not __import__("matplotlib.pyplot").pyplot.get_fignums()


def test_cpu_roofs_read_in_gflops():
    # a CPU's roofs (here 0.3 TFLOP/s matrix, 0.1 vector) are under 1 TFLOP/s: the axis reads GFLOP/s, a tick drawn
    # at 0.01 TFLOP/s reads "10" (it read "0.01" under "TFLOP/s")
    cpu = DeviceSpec(name="x86 CPU", flops={"fp32": 0.3e12}, bandwidth=40e9, vector_flops={"fp32": 0.1e12})
    rep = roofline(make_profile([matmul(512, 512, 512, dtype="float32", time_s=2e-3),
                                 pointwise(1 << 20, dtype="float32", time_s=1e-3)]), cpu)
    for fig in (figure(rep), card_figure(rep)):
        ax = fig.axes[0]
        assert "GFLOP/s" in ax.get_ylabel() and "TFLOP/s" not in ax.get_ylabel()
        assert ax.yaxis.get_major_formatter()(0.01, 0) == "10"
    gpu = figure(roofline(toy_profile(), a100())).axes[0]
    assert "TFLOP/s" in gpu.get_ylabel() and gpu.yaxis.get_major_formatter()(100.0, 0) == "100"


def test_figure_is_thread_safe_and_handles_degenerate_profiles():
    errors: list[BaseException] = []

    def work(prof):
        try:
            figure(roofline(prof, a100()))
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    profs = [toy_profile(), make_profile([]), make_profile([pointwise(1024, time_s=1e-6)]),
             make_profile([matmul(64, 64, 64)])]
    threads = [threading.Thread(target=work, args=(p,)) for p in profs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


def _widened_report():
    """A measured CPU-like roof (fp32 100 GFLOP/s, 25 GB/s) that a relu beat: 1e6 fp32 elements read and written =
    8e6 B in 0.2 ms = 40 GB/s > 25 GB/s, so analysis.roofs.widen raises the bandwidth roof to 40 GB/s."""
    spec = DeviceSpec(name="cpu", flops={"fp32": 100e9}, bandwidth=25e9, measured=True)
    prof = make_profile([pointwise(1_000_000, time_s=2e-4, layer="act"),
                         matmul(256, 256, 256, dtype="float32", layer="fc", time_s=1e-3)])
    return api.roofline(prof, spec)


def test_widened_bandwidth_is_the_roof_drawn_and_the_device_one_dashed():
    rep = _widened_report()
    assert rep.summary.bandwidth == 25e9 and rep.roofs[0].bandwidth == 40e9  # 8e6 B / 2e-4 s
    assert any("bandwidth roof widened from 25 GB/s to 40 GB/s" in n for n in rep.context.roof_notes)
    fig = figure(rep)
    (ax,) = fig.axes
    slopes = []
    for ln in ax.get_lines():
        x, y = ln.get_xdata(), ln.get_ydata()
        if len(x) == 2 and x[1] > x[0] and y[1] > y[0]:
            slopes.append((round(y[0] * 1e12 / x[0] / 1e9, 6), ln.get_linestyle()))
    # the solid memory roof is the widened 40 GB/s one (it meets the 100 GFLOP/s roof at its ridge 2.5 FLOP/B);
    # the device's 25 GB/s is drawn dashed
    assert (40.0, "-") in slopes and (25.0, "--") in slopes, slopes
    solid = next(ln for ln in ax.get_lines() if ln.get_linestyle() == "-" and len(ln.get_xdata()) == 2
                 and ln.get_ydata()[1] > ln.get_ydata()[0])
    assert abs(solid.get_xdata()[1] - 2.5) < 1e-9 and abs(solid.get_ydata()[1] - 0.1) < 1e-12
    legend = [t.get_text() for t in ax.get_legend().get_texts()] if ax.get_legend() else []
    legend += [t.get_text() for a in ax.artists for t in getattr(a, "get_texts", lambda: [])()]
    assert "memory 40 GB/s" in legend and "measured 25 GB/s (not used: an op beat it)" in legend, legend
    notes = [t.get_text() for t in fig.texts]
    assert any("widened from 25 GB/s to 40 GB/s" in t for t in notes)
    assert any("MBU uses the device's 25 GB/s" in t for t in notes), notes


def test_card_labels_the_device_bandwidth_it_draws_dashed():
    from tscope_callbacks.render.plot import card_figure

    fig = card_figure(_widened_report())
    (ax,) = fig.axes
    texts = [t.get_text() for leg in fig.legends for t in leg.get_texts()]
    # the dashboard's names: the memory roof drawn, and the measured bandwidth an op beat (it read "device 25 GB/s")
    assert "memory 40 GB/s" in texts and "measured 25 GB/s (not used)" in texts, texts
    assert "fp32 100 GFLOP/s" in texts  # a CPU's matrix and vector roofs at one peak: one entry
    assert any(ln.get_linestyle() == "--" and abs(ln.get_ydata()[0] * 1e12 / ln.get_xdata()[0] - 25e9) < 1e3
               for ln in ax.get_lines() if len(ln.get_xdata()) == 2)


def test_roof_notes_and_the_not_shown_line_stay_under_the_x_label():
    # a widened roof (three note lines) and rows without FLOPs (the "not shown" line): the x label overlapped the
    # first note, whose room left out the "not shown" line under it
    prof = make_profile([pointwise(1_000_000, time_s=2e-4, layer="act"),
                         matmul(256, 256, 256, dtype="float32", layer="fc", time_s=1e-3),
                         op("aten.view", "flatten", category="view", time_s=1e-6)])
    rep = api.roofline(prof, DeviceSpec(name="cpu", flops={"fp32": 100e9}, bandwidth=25e9, measured=True))
    fig = figure(rep)
    fig.canvas.draw()  # the axis label is placed at draw time
    r = fig.canvas.get_renderer()
    (ax,) = fig.axes
    notes = [t for t in fig.texts if t.get_text().startswith(("Roof note", "not shown", "    "))]
    assert any(t.get_text().startswith("not shown") for t in notes) and len(notes) >= 3
    label = ax.xaxis.label.get_window_extent(r)
    assert all(t.get_window_extent(r).y1 < label.y0 for t in notes)


def test_card_key_of_four_roofs_keeps_two_columns():
    # a CPU's widened memory roof, its measured bandwidth beaten, and distinct matrix and vector roofs: four entries,
    # whose longest ("measured 25.7 GB/s (not used)") made the key one column of four rows, a third of the card;
    # it is now broken before its parenthesis so two columns fit (three lines of text)
    from tscope_callbacks.render.plot import card_figure

    spec = DeviceSpec(name="cpu", flops={"fp32": 94e9}, bandwidth=25.7e9, vector_flops={"fp32": 93.2e9},
                      measured=True)
    rep = api.roofline(make_profile([pointwise(1_000_000, time_s=1.5e-4, layer="act"),  # 8e6 B: 53.3 GB/s
                                     matmul(256, 256, 256, dtype="float32", layer="fc", time_s=1e-3)]), spec)
    fig = card_figure(rep)
    (key,) = fig.legends
    texts = [t.get_text() for t in key.get_texts()]
    assert len(texts) == 4 and "measured 25.7 GB/s\n(not used)" in texts, texts
    assert key._ncols == 2
    box = key.get_window_extent(fig.canvas.get_renderer())
    assert box.x0 >= 0 and box.x1 <= fig.bbox.width  # within the card


def test_card_keys_and_labels_cover_no_point_and_no_other_text():
    """The Images tab's card: its labels overlapped the points and the roofs' key (drawn over the memory slope and
    the ridge); now the key sits above the axes and a label goes only where it covers no marker, key or label."""
    from matplotlib.text import Text

    from tscope_callbacks.render.plot import card_figure

    for rep in (roofline(toy_profile(), a100()), _widened_report()):
        fig = card_figure(rep, top_labels=3)
        fig.canvas.draw()
        r = fig.canvas.get_renderer()
        (ax,) = fig.axes
        ax_box = ax.get_window_extent(r)
        key = fig.legends[0].get_window_extent(r)
        assert key.y0 >= ax_box.y1  # the roofs' key is above the axes
        labels = [Text.get_window_extent(t, r) for t in ax.texts]  # the text itself (a leader line may cross)
        others = [ax.get_legend().get_window_extent(r), key]
        marks = []  # each marker's box: its centre and radius (a scatter's size is its area in points^2)
        for c in ax.collections:
            for (x, y), s in zip(ax.transData.transform(c.get_offsets()), c.get_sizes()):
                rad = (s ** 0.5) / 2 * fig.dpi / 72
                marks.append((x - rad, y - rad, x + rad, y + rad))
        assert marks and labels
        for i, b in enumerate(labels):
            assert not any(b.overlaps(o) for o in others + labels[:i]), ax.texts[i].get_text()
            assert not any(min(b.x1, m[2]) > max(b.x0, m[0]) and min(b.y1, m[3]) > max(b.y0, m[1]) for m in marks)
            assert ax_box.contains(b.x0, b.y0) and ax_box.contains(b.x1, b.y1)


def test_a_ridge_shared_by_two_roofs_is_labelled_once():
    # a CPU's fp32 matrix and vector roofs have one peak: 'ridge 2.03' was drawn twice, one over the other
    spec = DeviceSpec(name="cpu", flops={"fp32": 100e9}, bandwidth=50e9, measured=True)
    prof = make_profile([pointwise(1_000_000, time_s=1e-3, layer="act"),
                         matmul(256, 256, 256, dtype="float32", layer="fc", time_s=1e-3)])
    rep = api.roofline(prof, spec)
    assert {(r.matrix, r.ridge) for r in rep.roofs} == {(True, 2.0), (False, 2.0)}  # 100 GFLOP/s / 50 GB/s
    ridges = [t.get_text() for t in figure(rep).axes[0].texts if t.get_text().startswith("ridge")]
    assert ridges == ["ridge 2"]


def test_ridges_a_few_percent_apart_get_labels_that_do_not_overlap():
    # a measured CPU's fp32 matrix and vector roofs 4% apart: 'ridge 2' and 'ridge 1.92' were printed over each other
    spec = DeviceSpec(name="cpu", flops={"fp32": 100e9}, vector_flops={"fp32": 96e9}, bandwidth=50e9, measured=True)
    prof = make_profile([pointwise(1_000_000, time_s=1e-3, layer="act"),
                         matmul(256, 256, 256, dtype="float32", layer="fc", time_s=1e-3)])
    rep = api.roofline(prof, spec)
    assert sorted(r.ridge for r in rep.roofs) == [1.92, 2.0]  # 96 and 100 GFLOP/s over 50 GB/s
    fig = figure(rep)
    fig.canvas.draw()
    r = fig.canvas.get_renderer()
    labels = [t for t in fig.axes[0].texts if t.get_text().startswith("ridge")]
    assert sorted(t.get_text() for t in labels) == ["ridge 1.92", "ridge 2"]
    a, b = (t.get_window_extent(r) for t in labels)
    assert not a.overlaps(b)


def test_the_reports_roof_line_says_which_bandwidth_the_roofs_use():
    # the markdown said "bandwidth 25.7 GB/s" beside a ridge only 51 GB/s gives, the widening in a footnote
    rep = _widened_report()
    line = next(ln for ln in rep.to_markdown().splitlines() if ln.startswith("- **Roofs**"))
    assert line.endswith("bandwidth 25 GB/s (MBU's basis; the roofs and their ridges below use 40 GB/s: widened, see "
                         "the roof note)")
    roofs_used = next(ln for ln in rep.to_markdown().splitlines() if ln.startswith("- **Roofs used**"))
    assert "ridge 2.5 FLOP/B" in roofs_used  # 100 GFLOP/s / 40 GB/s
    plain = api.roofline(make_profile([matmul(256, 256, 256, dtype="float32", layer="fc", time_s=1e-3)]),
                         DeviceSpec(name="cpu", flops={"fp32": 100e9}, bandwidth=25e9, measured=True))
    line = next(ln for ln in plain.to_markdown().splitlines() if ln.startswith("- **Roofs**"))
    assert line.endswith("bandwidth 25 GB/s")
