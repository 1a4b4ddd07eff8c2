"""Hyperparameters recorded with a run: hparams.json, experiment.log, TensorBoard's
HPARAMS table and MLflow params, read back from what each wrote."""

from __future__ import annotations

import enum
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from ember_testing import Classifier
from mlflow import MlflowClient
from tensorboard.backend.event_processing import event_accumulator
from tensorboard.plugins.hparams import plugin_data_pb2

import ember
from ember import Config
from ember.errors import ConfigError
from ember.optim import AdamConfig
from ember.train import LearnerBuilder
from ember.train.files.run_record import read_hparams
from ember.train.logger import MlflowMetricLogger, TensorBoardMetricLogger
from ember.train.metric import AccuracyMetric, LossMetric


class Kind(enum.Enum):
    WIDE = "wide"


@dataclass
class ModelHparams:
    width: int = 16
    kind: Kind = Kind.WIDE


@dataclass
class Hparams:
    lr: float = 0.01
    model: ModelHparams = field(default_factory=ModelHparams)
    data: Path = Path("data/blobs")
    layers: tuple[int, ...] = (16, 8)


class ModelConfig(Config):
    width: int = 16
    dropout: float = 0.1


class TrainingConfig(Config):
    lr: float = 0.01
    model: ModelConfig = ModelConfig()


EXPECTED = {
    "lr": 0.01,
    "model": {"width": 16, "kind": "wide"},
    "data": "data/blobs",
    "layers": [16, 8],
}


def fit(directory, quiet, loaders, hparams, loggers=()):
    ember.seed(0)
    learner = (
        LearnerBuilder(directory)
        .hparams(hparams)
        .metric_train_numeric(LossMetric())
        .metric_valid_numeric(LossMetric())
        .metric_valid_numeric(AccuracyMetric())
        .metric_loggers(train=list(loggers), valid=list(loggers))
        .num_epochs(2)
        .renderer(quiet)
        .build(Classifier(), AdamConfig().init(), 1e-2)
    )
    learner.fit(*loaders)
    return learner


def test_a_dataclass_lands_in_hparams_json_experiment_log_and_tensorboard(tmp_path, quiet, loaders):
    board = TensorBoardMetricLogger(tmp_path / "board")
    learner = fit(tmp_path / "run", quiet, loaders, Hparams(), [board])
    written = json.loads((tmp_path / "run" / "hparams.json").read_text())
    assert list(written)[-1] == "$crc32" and len(written.pop("$crc32")) == 8  # its checksum
    assert written == EXPECTED
    assert read_hparams(tmp_path / "run") == EXPECTED
    log = (tmp_path / "run" / "experiment.log").read_text()
    assert f"Hyperparameters: {json.dumps(EXPECTED, separators=(', ', ': '))}" in log

    reader = event_accumulator.EventAccumulator(
        str(tmp_path / "board"), size_guidance={event_accumulator.SCALARS: 0}
    )
    reader.Reload()
    content = reader.PluginTagToContent("hparams")
    start = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/session_start_info"])
    found = {
        key: value.WhichOneof("kind") and getattr(value, value.WhichOneof("kind"))
        for key, value in start.session_start_info.hparams.items()
    }
    assert found == {
        "lr": 0.01,
        "model.width": 16.0,
        "model.kind": "wide",
        "data": "data/blobs",
        "layers": "[16, 8]",
    }
    experiment = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/experiment"])
    tags = {info.name.tag for info in experiment.experiment.metric_infos}
    assert tags == {"train/epoch/Loss", "valid/epoch/Loss", "valid/epoch/Accuracy"}
    final = learner.history[-1][1]
    for tag in tags:  # the HPARAMS table shows the last value of each metric's scalars
        split, _, name = tag.split("/")
        last = reader.Scalars(tag)[-1]
        assert (last.step, last.value) == (2, pytest.approx(final[split][name], rel=1e-6))


def test_a_config_becomes_mlflow_params(tmp_path, quiet, loaders, tracking_uri):
    tracking = MlflowMetricLogger(tracking_uri=tracking_uri, experiment_name="hparams")
    fit(tmp_path / "run", quiet, loaders, TrainingConfig(model=ModelConfig(width=32)), [tracking])
    params = MlflowClient(tracking_uri).get_run(tracking.run_id).data.params
    assert params == {"lr": "0.01", "model.width": "32", "model.dropout": "0.1"}
    assert read_hparams(tmp_path / "run") == {"lr": 0.01, "model": {"width": 32, "dropout": 0.1}}


@pytest.mark.parametrize(
    ("hparams", "message"),
    [
        ({"lr": 0.1, "model": {"act": object()}}, r"model\.act is a object .*str\(value\)"),
        ({"lr": math.nan}, r"lr is nan, which JSON cannot hold"),
        ({1: 2}, r"key 1 is a int.*use str keys"),
        ({"layers": [1, {2}]}, r"layers\[1\] is a set"),
        (Hparams, r"got the class Hparams: pass an instance"),
        ([("lr", 0.1)], r"takes a dict, a dataclass or a pydantic model.*not list"),
    ],
)
def test_values_json_cannot_hold_are_refused_at_build_time(tmp_path, hparams, message):
    with pytest.raises(ConfigError, match=message):
        LearnerBuilder(tmp_path).hparams(hparams)


def test_a_resumed_tensorboard_run_holds_its_hyperparameters_once(tmp_path):
    from ember.train.logger import MetricRecord, RunStart

    board = TensorBoardMetricLogger(tmp_path)
    for start, epochs in (
        (RunStart(hparams={"lr": 0.1}), (1, 2)),
        (RunStart(2, 0, True, hparams={"lr": 0.2}), (2,)),
    ):
        board.start_run(start)
        for epoch in epochs:
            board.log("train", epoch, [MetricRecord("Loss", 1, 1.0 / epoch, 1.0)])
            board.end_epoch("train", epoch, {"Loss": 1.0 / epoch})
        board.close()
    reader = event_accumulator.EventAccumulator(str(tmp_path))
    reader.Reload()
    content = reader.PluginTagToContent("hparams")
    start = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/session_start_info"])
    assert start.session_start_info.hparams["lr"].number_value == 0.2
    assert [s.step for s in reader.Scalars("train/epoch/Loss")] == [1, 2]
    # The first session's summaries went with the rewrite: one set is left.
    files = list(tmp_path.glob("*tfevents*"))
    assert sum(f.read_bytes().count(b"_hparams_/session_start_info") for f in files) == 1
