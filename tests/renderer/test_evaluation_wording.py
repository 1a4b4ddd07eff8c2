"""An evaluation says that it evaluates: "evaluating 'name'", "evaluation 'name' done",
never "training", on every renderer; a prediction prints nothing."""

from __future__ import annotations

import html
import io

import pytest
import torch
from rich.console import Console
from tui_script import Blobs, blobs

from ember.optim import AdamConfig
from ember.train import EvaluatorBuilder, LearnerBuilder
from ember.train.metric import AccuracyMetric, LossMetric
from ember.train.renderer import NotebookRenderer, PlainRenderer, TuiRenderer


@pytest.fixture
def trained(tmp_path):
    torch.set_num_threads(1)
    stream = io.StringIO()
    learner = (
        LearnerBuilder(tmp_path / "run")
        .metric_train_numeric(LossMetric())
        .metric_valid_numeric(LossMetric())
        .metric_valid_numeric(AccuracyMetric())
        .num_epochs(1)
        .renderer(PlainRenderer(interval=0.0, stream=stream))
        .build(Blobs(sleep=0.0), AdamConfig().init(), 1e-2)
    )
    learner.fit(blobs(10, seed=1), blobs(3, seed=2))
    stream.seek(0)
    stream.truncate()
    return learner, stream


def test_learner_evaluate_and_predict_in_plain_lines(trained):
    learner, stream = trained
    values = learner.evaluate("held-out", blobs(4, seed=3))
    lines = stream.getvalue().splitlines()
    assert lines[0].startswith("evaluating 'held-out': Blobs (195 parameters) on cpu")
    done = [line for line in lines if line.startswith("evaluation 'held-out' done: ")]
    assert len(done) == 1 and "4 iterations, 64 items" in done[0]
    assert f"Loss {values['Loss']:.4g}"[:9] in done[0]
    assert not any("training" in line or "epoch" in line for line in lines), lines
    stream.seek(0)
    stream.truncate()
    learner.predict(blobs(2, seed=4))
    assert stream.getvalue() == ""


def test_an_evaluator_reports_a_failed_evaluation_as_such(tmp_path):
    stream = io.StringIO()
    evaluator = (
        EvaluatorBuilder(tmp_path)
        .metric_numeric(LossMetric())
        .renderer(PlainRenderer(interval=0.0, stream=stream))
        .build(Blobs(sleep=0.0))
    )
    evaluator.eval("first", blobs(2, seed=3))

    class Broken:
        def __iter__(self):
            yield blobs(1, seed=3)[0]
            raise OSError("the disk went away")

    with pytest.raises(OSError):
        evaluator.eval("second", Broken())
    lines = stream.getvalue().splitlines()
    assert lines[0].startswith("evaluating 'first': ")
    assert lines[1].startswith("evaluating 'first'  iter 2/2 (100%)")  # a progress line
    assert lines[2].startswith("evaluation 'first' done: 2 iterations, 32 items")
    assert lines[3].startswith("evaluating 'second': ")
    assert lines[-1] == "evaluation 'second' failed"
    assert not any("training" in line for line in lines), lines


def test_the_dashboard_and_the_notebook_view_say_evaluating(trained):
    learner, _ = trained
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=100, height=30, color_system=None)
    dashboard = TuiRenderer(console=console, keys=False)
    evaluator = (
        EvaluatorBuilder(learner.artifact_dir)
        .metric_numeric(LossMetric())
        .renderer(dashboard)
        .build(learner.model)
    )
    values = evaluator.eval("dash", blobs(3, seed=3))
    final = "\n".join("".join(s.text for s in line) for line in dashboard._frame.lines)
    assert "evaluation 'dash' completed" in final and "mode      evaluating" in final
    assert "test (whole set)" in final and f"{values['Loss']:.4g}"[:6] in final
    assert "training" not in final

    notebook = NotebookRenderer()
    evaluator.renderer = notebook
    evaluator.eval("book", blobs(3, seed=3))
    text = notebook.mime_bundle()["text/plain"]
    assert "completed" in text and "test (whole set)" in text and "training" not in text
    notebook._run.reason = None  # as it was while the evaluation ran
    assert html.escape("evaluating 'book'") in notebook.mime_bundle()["text/html"]
