"""MlflowMetricLogger on local tracking stores (no server), read back with MlflowClient.

The full check uses MLflow's file store (opted into with MLFLOW_ALLOW_FILE_STORE, since
MLflow 3 refuses it by default) because it opens instantly; the SQLite store that MLflow
recommends takes seconds to create its tables, so it gets one shorter `slow` test.
"""

from __future__ import annotations

import sys

import pytest
from logger_driver import METRICS, drive

# Imported at the top on purpose: with mlflow missing this module fails, not skips.
from mlflow import MlflowClient

import ember
from ember.errors import EmberError
from ember.train.logger import MetricLogger, MetricRecord, MlflowMetricLogger, mlflow_key
from ember.train.logger.mlflow_logger import flatten_params


class ModelConfig(ember.Config):
    hidden_size: int = 16
    dropout: float = 0.1


class RunConfig(ember.Config):
    learning_rate: float = 3e-4
    num_epochs: int = 2
    model: ModelConfig = ModelConfig()


def test_metric_keys_are_sanitized_for_mlflow():
    assert mlflow_key("valid/Accuracy (top-1)") == "valid/Accuracy _top-1_"
    assert mlflow_key("train/F1@k=5, macro") == "train/F1_k_5_ macro"
    assert mlflow_key("train//../x/./") == "train/_/x/_"
    assert mlflow_key("/") == "_"
    assert mlflow_key("train/Lösung") == "train/L_sung"
    assert len(mlflow_key("x" * 300)) == 250
    assert flatten_params(RunConfig()) == {
        "learning_rate": "0.0003",
        "num_epochs": "2",
        "model.hidden_size": "16",
        "model.dropout": "0.1",
    }
    assert flatten_params({"a": {"b": [1, 2], "c": {}}, "d e": None}) == {
        "a.b": "[1, 2]",
        "a.c": "{}",
        "d e": "None",
    }


def test_run_holds_params_iteration_and_epoch_metrics_and_ends_finished(tracking_uri):
    logger = MlflowMetricLogger(
        tracking_uri, experiment_name="ember-tests", run_name="drive", params=RunConfig()
    )
    assert isinstance(logger, MetricLogger)
    expected = drive(logger)

    client = MlflowClient(tracking_uri=tracking_uri)
    run = client.get_run(logger.run_id)
    assert run.info.status == "FINISHED"
    assert run.info.run_name == "drive"
    assert client.get_experiment(run.info.experiment_id).name == "ember-tests"
    assert run.data.params == flatten_params(RunConfig())
    assert set(run.data.metrics) == {
        mlflow_key(f"{split}/{kind}{name}")
        for split in ("train", "valid")
        for kind in ("", "epoch/")
        for name in METRICS
    }
    for split in ("train", "valid"):
        for name in METRICS:
            history = client.get_metric_history(logger.run_id, mlflow_key(f"{split}/{name}"))
            found = sorted((m.step, m.value) for m in history)
            assert found == expected.series(split, name)  # float64: exact
            history = client.get_metric_history(logger.run_id, mlflow_key(f"{split}/epoch/{name}"))
            assert sorted((m.step, m.value) for m in history) == expected.epoch_series(split, name)
    assert "valid/Accuracy _top-1_" in run.data.metrics

    # Attaching by run_id continues the same run; equal params are accepted again.
    again = MlflowMetricLogger(tracking_uri, run_id=logger.run_id, params=RunConfig())
    assert client.get_run(logger.run_id).info.status == "RUNNING"
    again.end_epoch("valid", 3, {"Loss": 0.25})
    again.close()
    assert client.get_run(logger.run_id).info.status == "FINISHED"
    history = client.get_metric_history(logger.run_id, "valid/epoch/Loss")
    assert [(m.step, m.value) for m in sorted(history, key=lambda m: m.step)][-1] == (3, 0.25)
    with pytest.raises(EmberError, match="ended by close"):
        again.log("train", 3, [MetricRecord("Loss", 1, 0.1, 1.0)])

    # A changed param is refused rather than silently kept.
    with pytest.raises(EmberError, match=r"learning_rate: '0.0003' -> '0.001'"):
        MlflowMetricLogger(tracking_uri, run_id=logger.run_id, params=RunConfig(learning_rate=1e-3))


def test_iteration_values_wait_for_the_interval_or_the_epoch_end(tracking_uri):
    logger = MlflowMetricLogger(tracking_uri, interval=3600.0)
    client = MlflowClient(tracking_uri=tracking_uri)
    logger.log("train", 1, [MetricRecord("Loss", 1, 0.5, 1.0), MetricRecord("Loss", 2, 0.25, 1.0)])
    assert client.get_metric_history(logger.run_id, "train/Loss") == []
    logger.end_epoch("train", 1, {"Loss": 0.375})
    history = client.get_metric_history(logger.run_id, "train/Loss")
    assert sorted((m.step, m.value) for m in history) == [(1, 0.5), (2, 0.25)]
    logger.log("train", 2, [MetricRecord("Loss", 1, 0.125, 1.0)])
    logger.close()
    history = client.get_metric_history(logger.run_id, "train/Loss")
    assert sorted((m.step, m.value) for m in history)[-1] == (3, 0.125)
    with pytest.raises(EmberError, match="Cannot attach to MLflow run 'nope'"):
        MlflowMetricLogger(tracking_uri, run_id="nope")


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:The ``noload`` loader strategy:DeprecationWarning")
def test_sqlite_store_from_the_environment_works_offline(tmp_path, monkeypatch):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.chdir(tmp_path)
    logger = MlflowMetricLogger(params={"optimizer": {"name": "adam", "betas": (0.9, 0.99)}})
    expected = drive(logger)
    client = MlflowClient(tracking_uri=uri)
    run = client.get_run(logger.run_id)
    assert run.info.status == "FINISHED"
    assert client.get_experiment(run.info.experiment_id).name == "ember"
    assert run.data.params == {"optimizer.name": "adam", "optimizer.betas": "(0.9, 0.99)"}
    history = client.get_metric_history(logger.run_id, "train/Loss")
    assert sorted((m.step, m.value) for m in history) == expected.series("train", "Loss")
    history = client.get_metric_history(logger.run_id, "valid/epoch/Accuracy _top-1_")
    assert sorted((m.step, m.value) for m in history) == expected.epoch_series(
        "valid", "Accuracy (top-1)"
    )


def test_missing_mlflow_names_the_install_command(monkeypatch):
    monkeypatch.setitem(sys.modules, "mlflow", None)
    with pytest.raises(EmberError, match=r"pip install mlflow.*pip install ember\[mlflow\]"):
        MlflowMetricLogger("sqlite:///unused.db")
