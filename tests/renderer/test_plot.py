"""`ember plot DIR`: PNG charts of a run that a person can read."""

from __future__ import annotations

import io
import sys

import pytest
import torch
from tui_script import Blobs, blobs

from ember.cli import main
from ember.errors import EmberError
from ember.optim import AdamConfig
from ember.train import LearnerBuilder
from ember.train.metric import AccuracyMetric, LossMetric
from ember.train.renderer import PlainRenderer


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    directory = tmp_path_factory.mktemp("plot") / "run"
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny tensors: a thread pool only adds contention
    try:
        (
            LearnerBuilder(directory)
            .metric_train_numeric(LossMetric())
            .metric_train_numeric(AccuracyMetric())
            .metric_valid_numeric(LossMetric())
            .num_epochs(3)
            .renderer(PlainRenderer(stream=io.StringIO()))
            .build(Blobs(sleep=0.0), AdamConfig().init(), 1e-2)
            .fit(blobs(40, seed=1), blobs(8, seed=2))
        )
    finally:
        torch.set_num_threads(threads)
    return directory


def test_plot_writes_readable_pngs(finished_run, capsys):
    import matplotlib.image as image
    import numpy as np

    assert main(["plot", str(finished_run)]) == 0
    printed = capsys.readouterr().out.split()
    plots = finished_run / "plots"
    names = sorted(p.name for p in plots.iterdir())
    assert names == [
        "Accuracy-epochs.png",
        "Accuracy-iterations.png",
        "Loss-epochs.png",
        "Loss-iterations.png",
    ]
    assert sorted(printed) == sorted(str(plots / name) for name in names)
    for name in names:
        pixels = image.imread(plots / name)
        height, width = pixels.shape[:2]
        assert width >= 800 and height >= 400, (name, pixels.shape)
        colours = np.unique((pixels[..., :3] * 255).astype(np.uint8).reshape(-1, 3), axis=0)
        assert len(colours) > 50, name  # text, axes and curves, not a blank canvas
    # Loss has both splits: two stacked panels, so a taller figure than Accuracy's.
    assert (
        image.imread(plots / "Loss-iterations.png").shape[0]
        > image.imread(plots / "Accuracy-iterations.png").shape[0]
    )


def test_plot_to_another_directory(finished_run, tmp_path, capsys):
    import matplotlib  # noqa: F401  (a dev requirement: a missing one fails here)

    out = tmp_path / "charts"
    assert main(["plot", str(finished_run), "-o", str(out)]) == 0
    assert len(list(out.glob("*.png"))) == 4


def test_plot_of_a_directory_without_logs_exits_2(tmp_path, capsys):
    (tmp_path / "train" / "epoch-1").mkdir(parents=True)  # a run that logged nothing
    assert main(["plot", str(tmp_path)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("ember: ")
    assert "holds no metric logs" in captured.err and str(tmp_path) in captured.err
    assert not (tmp_path / "plots").exists()
    assert main(["plot", str(tmp_path / "missing")]) == 2
    assert "no such artifact directory" in capsys.readouterr().err


def test_plot_without_matplotlib_says_how_to_install_it(finished_run, monkeypatch):
    from ember import plot

    for name in ("matplotlib", "matplotlib.figure", "matplotlib.backends.backend_agg"):
        monkeypatch.setitem(sys.modules, name, None)
    with pytest.raises(EmberError, match=r"pip install matplotlib.*pip install ember\[plot\]"):
        plot.plot_run(finished_run)
