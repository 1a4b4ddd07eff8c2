"""The charts of `ember plot` and `ember compare` as a person sees them, checked with
matplotlib's own geometry: no legend over the plotted data or off the picture, every
series inside its axes, every number in a label rounded to at most 4 significant digits."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
import torch
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.legend import Legend
from matplotlib.lines import Line2D
from matplotlib.text import Text
from picture_run import family, sample_run

from ember.comparison import compare
from ember.plot import (
    epochs_figure,
    iterations_figure,
    lr_find_figure,
    matrix_figure,
    read_run,
    train_lengths,
)
from ember.train.lr_finder import LrFinderResult
from ember.train.summary import last_matrices


@pytest.fixture(scope="module")
def pictures(tmp_path_factory):
    """The sample run (validated inside its epochs, with a range test) and 30 runs to
    compare, trained once for the module."""
    root = tmp_path_factory.mktemp("pictures")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        run = sample_run(root / "sample")
        runs = family(root / "family", 30)
    finally:
        torch.set_num_threads(threads)
    return run, runs


def draw(figure):
    FigureCanvasAgg(figure)
    figure.canvas.draw()
    return figure.canvas.get_renderer()


def plotting_axes(figure):
    """The axes that hold curves or a picture (a colour bar's axes are left out)."""
    return [ax for ax in figure.axes if ax.lines or ax.images]


def data_lines(ax):
    """The curves drawn in data coordinates (not the rules across the axes)."""
    return [
        line
        for line in ax.lines
        if isinstance(line, Line2D)
        and line.get_transform() == ax.transData
        and len(line.get_xdata())
    ]


def display_points(ax, line, upto=None):
    xy = np.asarray(line.get_xydata(), dtype=float)[:upto]
    xy = xy[np.isfinite(xy).all(axis=1)]
    return ax.transData.transform(xy) if len(xy) else np.zeros((0, 2))


def inside(box, points, slack=1.0):
    return (
        (points[:, 0] >= box.x0 - slack)
        & (points[:, 0] <= box.x1 + slack)
        & (points[:, 1] >= box.y0 - slack)
        & (points[:, 1] <= box.y1 + slack)
    )


def legends(ax):
    return [child for child in ax.get_children() if isinstance(child, Legend)]


def significant_digits(number: str) -> int:
    """The significant digits of a number as written: "0.01000" has 4, "12500" 3,
    "2.007e-4" 4."""
    mantissa = re.split(r"[eE]", number)[0]
    digits = mantissa.replace(".", "").lstrip("0")
    if "." not in mantissa:
        digits = digits.rstrip("0")  # an integer's trailing zeros tell nothing
    return len(digits)


def numbers_in(text: str) -> list[str]:
    return re.findall(r"\d+(?:\.\d+)?(?:[eE][-+−]?\d+)?", text)


def check_picture(figure, clipped_after=None):
    """The geometry of a chart as drawn. `clipped_after`: for an axes of the range
    test, the index past which a curve may leave the axes at the top (the divergence)."""
    renderer = draw(figure)
    picture = figure.bbox
    boxes = [ax.get_window_extent(renderer) for ax in plotting_axes(figure)]
    assert boxes, "nothing is plotted"
    for ax, box in zip(plotting_axes(figure), boxes):
        points = [display_points(ax, line) for line in data_lines(ax)]
        for line, found in zip(data_lines(ax), points):
            if clipped_after is not None and ax is plotting_axes(figure)[0]:
                found = display_points(ax, line, upto=clipped_after + 1)
            ok = inside(box, found)
            assert ok.all(), f"{line.get_label()!r}: {int((~ok).sum())} point(s) off the axes"
        for legend in legends(ax):
            area = legend.get_window_extent(renderer)
            assert (
                area.x0 >= picture.x0 - 1
                and area.x1 <= picture.x1 + 1
                and area.y0 >= picture.y0 - 1
                and area.y1 <= picture.y1 + 1
            ), f"a legend is cut off the picture: {area} in {picture}"
            for other in boxes:
                assert not area.overlaps(other), "a legend lies over a plotting area"
            for found in points:
                hidden = inside(area, found, slack=0.0)
                assert not hidden.any(), "a legend hides plotted points"
    for text in figure.findobj(Text):
        if not text.get_visible() or not text.get_text():
            continue
        for number in numbers_in(text.get_text()):
            assert significant_digits(number) <= 4, f"{number!r} in {text.get_text()!r}"
    return renderer


def test_iteration_and_epoch_charts_keep_their_legends_beside_the_curves(pictures):
    run, _ = pictures
    metrics = read_run(run)
    lengths = train_lengths(metrics)
    names = {metric.name for metric in metrics}
    assert {"Loss", "Accuracy"} <= names
    for metric in metrics:
        for figure in (iterations_figure(metric, lengths), epochs_figure(metric)):
            check_picture(figure)
    loss = next(metric for metric in metrics if metric.name == "Loss")
    assert len(loss.points) == 4 * 2  # two validations inside each of 4 epochs
    figure = iterations_figure(loss, lengths)
    check_picture(figure)
    top = plotting_axes(figure)[0]
    marks = [line for line in top.lines if line.get_marker() == "D"]
    assert len(marks) == 1 and len(marks[0].get_xdata()) == 4 * 3  # points and epoch ends
    # each point at its iteration: epoch e's k-th batch is (e - 1) * 50 + k
    expected = sorted([(e - 1) * 50 + k for e in range(1, 5) for k in (20, 40, 50)])
    assert sorted(marks[0].get_xdata()) == expected
    legend_text = " ".join(t.get_text() for t in legends(top)[0].get_texts())
    assert "latest epoch 4: " in legend_text
    epochs = epochs_figure(loss)
    check_picture(epochs)
    labels = [t.get_text() for t in legends(plotting_axes(epochs)[0])[0].get_texts()]
    assert labels[0].startswith("train (epoch 4: ") and labels[1].startswith("valid (epoch 4: ")
    assert all(significant_digits(numbers_in(label)[-1]) == 4 for label in labels)


def test_the_confusion_matrix_is_drawn_whole(pictures):
    run, _ = pictures
    (matrix,) = list(last_matrices(run))
    figure = matrix_figure(matrix)
    renderer = check_picture(figure)
    (ax,) = plotting_axes(figure)
    cells = [t for t in ax.texts if t.get_text().isdigit()]
    assert len(cells) == 9 and sum(int(t.get_text()) for t in cells) == 256
    box = ax.get_window_extent(renderer)
    for cell in cells:
        area = cell.get_window_extent(renderer)
        assert box.x0 <= area.x0 and area.x1 <= box.x1 and box.y0 <= area.y0 and area.y1 <= box.y1


def test_the_range_test_shows_its_lowest_loss_and_marks_the_suggestion(pictures):
    run, _ = pictures
    result = LrFinderResult.load(run / "lr-find.json")
    assert result.suggestion is not None and result.edge is not None
    lowest = min(range(len(result.losses)), key=lambda i: result.losses[i])
    figure = lr_find_figure(run / "lr-find.json")
    renderer = check_picture(figure, clipped_after=lowest)
    loss_axes, ratio_axes = plotting_axes(figure)
    box = loss_axes.get_window_extent(renderer)
    # the lowest raw loss is on the picture, not under its bottom edge
    at = loss_axes.transData.transform([(result.lrs[lowest], result.losses[lowest])])
    assert inside(box, at).all()
    # the suggestion and the edge: rules across both axes, named with their values
    for value in (result.suggestion, result.edge):
        x = loss_axes.transData.transform([(value, 1.0)])[0, 0]
        assert box.x0 < x < box.x1
        rules = [
            line
            for ax in (loss_axes, ratio_axes)
            for line in ax.lines
            if line.get_transform() != ax.transData and list(line.get_xdata()) == [value, value]
        ]
        assert len(rules) == 2
    legend_text = " ".join(t.get_text() for t in legends(loss_axes)[0].get_texts())
    assert "suggestion " in legend_text and "x largest stable rate)" in legend_text
    assert "largest stable rate " in legend_text and "steps stop gaining " in legend_text


@pytest.mark.parametrize("count", [10, 30])
def test_a_comparison_of_many_runs_keeps_its_legend_off_the_curves(pictures, count):
    _, runs = pictures
    chart = compare(runs[:count]).chart("Loss")
    renderer = check_picture(chart.figure)
    (ax,) = plotting_axes(chart.figure)
    found = legends(ax)
    assert len(found) == 2  # the runs, and train / valid line styles
    runs_legend = max(found, key=lambda legend: len(legend.get_texts()))
    labels = [t.get_text() for t in runs_legend.get_texts()]
    assert len(labels) == count
    assert (
        len(
            {
                tuple(line.get_color())
                if not isinstance(line.get_color(), str)
                else line.get_color()
                for line in runs_legend.get_lines()
            }
        )
        == count
    )
    # beside the plotting area, to its right
    assert runs_legend.get_window_extent(renderer).x0 > ax.get_window_extent(renderer).x1
    assert all(math.isfinite(float(numbers_in(label)[-1])) for label in labels)
