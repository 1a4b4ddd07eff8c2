"""The plain renderer as a user reads it in a log: short lines, no escape codes."""

from __future__ import annotations

import io
import time

from ember_testing import Classifier

from ember.optim import AdamConfig
from ember.train import LearnerBuilder
from ember.train.files.model_summary import ModelSummary
from ember.train.metric import AccuracyMetric, LossMetric
from ember.train.renderer import PlainRenderer


class SlowClassifier(Classifier):
    def train_step(self, batch):
        time.sleep(0.03)  # slower than the 0.1 s render tick every few steps
        return super().train_step(batch)


def run(tmp_path, loaders, interval: float, model=None) -> list[str]:
    stream = io.StringIO()
    (
        LearnerBuilder(tmp_path)
        .metric_train_numeric(AccuracyMetric())
        .metric_train_numeric(LossMetric())
        .metric_valid_numeric(LossMetric())
        .num_epochs(2)
        .renderer(PlainRenderer(interval=interval, stream=stream))
        .build(model or Classifier(), AdamConfig().init(), 1e-2)
        .fit(*loaders)
    )
    return stream.getvalue().splitlines()


def test_one_line_per_split_per_epoch_and_no_escape_codes(tmp_path, loaders):
    lines = run(tmp_path, loaders, interval=3600.0)
    assert all("\x1b" not in line for line in lines)
    assert lines[0].startswith("training epoch 1/2: Classifier (195 parameters) on cpu")
    done = [line for line in lines if " done: " in line]
    assert [line.split(" done:")[0].split() for line in done] == [
        ["train", "epoch", "1/2"],
        ["valid", "epoch", "1/2"],
        ["train", "epoch", "2/2"],
        ["valid", "epoch", "2/2"],
    ]
    assert "7 iterations, 200 items" in done[0] and "Accuracy" in done[0] and "%" in done[0]
    assert lines[-1] == "training completed"
    summary = ModelSummary.of(Classifier()).table().splitlines()
    assert lines[1 : 1 + len(summary)] == summary  # the model summary, under the first line
    assert len(lines) == 6 + len(summary)  # no progress line within an hour's interval


def test_progress_lines_show_position_speed_and_metrics(tmp_path, loaders):
    lines = run(tmp_path, loaders, interval=0.0, model=SlowClassifier())
    progress = [line for line in lines if " iter " in line]
    assert progress, lines
    assert all(" items/s" in line and "Loss" in line for line in progress)
    assert all("Accuracy" in line for line in progress if line.startswith("train"))
    assert any(line.startswith("train epoch 1/2  iter ") and "/7 (" in line for line in progress)
