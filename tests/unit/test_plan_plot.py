"""The plan's --plot figure: a y axis a few tiny batches cannot stretch, a legend that covers
no bar, the batches it cannot draw named, and a file created like any other (0666 - umask)."""

from __future__ import annotations

import os
import stat

import pytest

from ascendgraph.config import GraphConfig
from ascendgraph.tools.plan import Workload, make_plan
from ascendgraph.tools.plan.plot import padding_waste_figure, plot_padding_waste

pytest.importorskip("matplotlib")

SIZES = [8, 16, 32, 64]


def _plan(batches: list[int], budget: int = 4):
    config = GraphConfig.from_vllm_args(compilation_config={"cudagraph_capture_sizes": SIZES})
    workload = Workload("file", "test", batches, batches)
    return make_plan(config, workload, budget=budget, measure="off")


def test_a_few_tiny_batches_do_not_stretch_the_y_axis_and_the_clipping_is_said():
    # 1- and 2-token batches padded to 8 waste 700 % and 300 %; the other 98 batches less than 100 %.
    result = _plan([1, 2] + [9, 17, 30, 33, 40, 60, 63] * 14)
    figure, notes = padding_waste_figure(result)
    axis = figure.axes[0]
    bottom, top = axis.get_ylim()
    assert bottom == 0 and top < 300
    assert any("the y axis stops at" in note and "waste more" in note for note in notes)
    import matplotlib.pyplot as plt

    plt.close(figure)


def test_the_y_axis_keeps_everything_when_nothing_is_extreme():
    result = _plan([9, 17, 30, 33, 40, 60, 63] * 4)
    figure, notes = padding_waste_figure(result)
    top = figure.axes[0].get_ylim()[1]
    assert top >= 10 and not any("stops at" in n for n in notes)
    import matplotlib.pyplot as plt

    plt.close(figure)


def test_the_legend_sits_outside_the_axes_so_it_covers_no_bar():
    result = _plan([9, 17, 30, 33, 40, 60, 63] * 4 + [64] * 40)  # the tallest bar is at the right edge
    figure, _ = padding_waste_figure(result)
    figure.canvas.draw()
    axis = figure.axes[0]
    legend = axis.get_legend()
    renderer = figure.canvas.get_renderer()
    legend_box = legend.get_window_extent(renderer)
    axes_box = axis.get_window_extent(renderer)
    assert legend_box.y1 <= axes_box.y0  # entirely below the plotting area
    assert len(legend.get_texts()) == 3  # both selections and the workload histogram
    import matplotlib.pyplot as plt

    plt.close(figure)


def test_batches_beyond_the_largest_size_are_named(tmp_path):
    result = _plan([9, 17, 30] * 5 + [100, 200, 300])
    notes = plot_padding_waste(result, str(tmp_path / "waste.png"))
    assert any("3 batch(es) above 64 tokens" in note and "not drawn" in note for note in notes)


def test_the_png_is_created_with_the_users_umask_not_0600(tmp_path):
    old = os.umask(0o022)
    try:
        plot_padding_waste(_plan([9, 17, 30] * 5), str(tmp_path / "waste.png"))
    finally:
        os.umask(old)
    mode = stat.S_IMODE((tmp_path / "waste.png").stat().st_mode)
    assert mode == 0o644
    assert [p.name for p in tmp_path.iterdir()] == ["waste.png"]  # no temporary file left
