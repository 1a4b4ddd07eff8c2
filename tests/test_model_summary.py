"""The model summary written when `fit` starts, and its warnings."""

from __future__ import annotations

import pytest
import torch
from ember_testing import Classifier
from torch import nn

from ember.errors import ConfigError, TrainingError
from ember.optim import AdamConfig
from ember.train import LearnerBuilder
from ember.train.files.model_summary import ModelSummary


class Tower(Classifier):
    """A frozen half-precision embedding beside the trainable MLP, and a batch norm."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(10, 4).half().requires_grad_(False)
        self.norm = nn.BatchNorm1d(8)


def test_rows_count_trainable_and_frozen_parameters_size_and_dtypes():
    summary = ModelSummary.of(Tower(), depth=1)
    rows = {row.name: row for row in summary.rows}
    assert list(rows) == ["net", "embed", "norm"]
    assert (rows["net"].trainable, rows["net"].frozen) == (8 * 16 + 16 + 16 * 3 + 3, 0)
    assert (rows["embed"].trainable, rows["embed"].frozen) == (0, 40)
    assert rows["embed"].dtypes == ("float16",)
    assert rows["embed"].size_mb == 40 * 2 / 1e6
    # batch norm: weight and bias trainable, running mean/var (float32) and count (int64) buffers
    assert rows["norm"].trainable == 16 and rows["norm"].dtypes == ("float32", "int64")
    assert rows["norm"].size_mb == (16 * 4 + 16 * 4 + 8) / 1e6
    assert (summary.total.trainable, summary.total.frozen) == (195 + 16, 40)
    table = summary.table()
    assert table.splitlines()[0] == "Model Tower:"
    assert (
        "| embed  | Embedding   |         0 |     40 |    <0.001 | float16                 |"
        in table
    )
    assert table.splitlines()[-1].startswith("| Total  | Tower       |       211 |     40 |")


def test_depth_shows_nested_modules_indented():
    summary = ModelSummary.of(Classifier(), depth=2)
    assert [row.name for row in summary.rows] == [
        "net",
        "net.0",
        "net.1",
        "net.2",
        "net.3",
    ]
    assert "|   net.0 | Linear     |" in summary.table()


def test_fit_writes_the_summary_to_the_log_and_the_top_of_the_output(tmp_path, quiet, loaders):
    learner = (
        LearnerBuilder(tmp_path).renderer(quiet).build(Classifier(), AdamConfig().init(), 1e-2)
    )
    learner.fit(*loaders)
    table = ModelSummary.of(Classifier()).table()
    assert table in (tmp_path / "experiment.log").read_text()
    printed = quiet.stream_text.getvalue().splitlines()
    assert printed[0].startswith("training epoch 1/1: Classifier")
    assert "\n".join(printed[1 : 1 + len(table.splitlines())]) == table


def test_the_summary_can_be_deeper_or_off(tmp_path, quiet, loaders):
    deep = LearnerBuilder(tmp_path / "deep").renderer(quiet).model_summary(depth=2)
    deep.build(Classifier(), AdamConfig().init(), 1e-2).fit(*loaders)
    assert "|   net.2 | Dropout    |" in (tmp_path / "deep" / "experiment.log").read_text()
    off = LearnerBuilder(tmp_path / "off").renderer(quiet).model_summary(None)
    off.build(Classifier(), AdamConfig().init(), 1e-2).fit(*loaders)
    assert "Model Classifier:" not in (tmp_path / "off" / "experiment.log").read_text()


@pytest.mark.parametrize("depth", [0, -1, 1.5, True])
def test_a_bad_depth_fails_at_build_time(depth):
    with pytest.raises(ConfigError, match="model_summary\\(depth=...\\) takes an int >= 1"):
        LearnerBuilder("unused").model_summary(depth)


def test_a_module_in_eval_mode_when_fit_starts_is_warned_about(tmp_path, quiet, loaders):
    model = Tower()
    model.norm.eval()  # meant to stay frozen: fit() will put it back in training mode
    model.embed.eval()
    learner = LearnerBuilder(tmp_path).renderer(quiet).build(model, AdamConfig().init(), 1e-2)
    learner.fit(*loaders)
    log = (tmp_path / "experiment.log").read_text()
    assert "WARNING" in log and "modules in eval mode when fit starts: embed, norm." in log
    assert "override the model's train(mode)" in log
    assert "warning: The model has modules in eval mode" in quiet.stream_text.getvalue()


def test_a_model_all_in_eval_mode_is_named_once():
    model = Classifier().eval()
    assert ModelSummary.of(model).eval_modules == ("(model)",)


def test_a_model_without_trainable_parameters_is_warned_about(tmp_path, quiet, loaders):
    model = Classifier().requires_grad_(False)
    model.net[0].weight.requires_grad_(True)  # an optimizer needs one parameter to be built
    optimizer = torch.optim.SGD([model.net[0].weight], lr=0.1)
    model.net[0].weight.requires_grad_(False)
    learner = LearnerBuilder(tmp_path).renderer(quiet).build(model, optimizer, 0.1)
    with pytest.raises(TrainingError, match="loss does not require grad"):
        learner.fit(*loaders)
    log = (tmp_path / "experiment.log").read_text()
    assert "No parameter of the model requires grad" in log
