"""WandbMetricLogger: offline runs read back from W&B's own run files."""

from __future__ import annotations

import logging
import math

import pytest
import wandb
from ember_testing import Classifier, StopAt
from wandb_records import read_offline_runs

import ember
from ember.optim import AdamConfig
from ember.record import DefaultRecorder
from ember.train import LearnerBuilder
from ember.train.logger import InMemoryMetricLogger, WandbMetricLogger, read_metric_log
from ember.train.metric import AccuracyMetric, LossMetric

HPARAMS = {"lr": 0.01, "model": {"width": 16, "layers": [16, 16]}, "note": "blobs"}


@pytest.fixture(autouse=True)
def no_api_key(monkeypatch, tmp_path):
    """No W&B key and no W&B settings of the machine: the logger chooses offline."""
    for name in ("WANDB_API_KEY", "WANDB_MODE", "WANDB_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb-config"))
    monkeypatch.setenv("WANDB_SILENT", "true")


def builder(directory, quiet, loggers, epochs=2):
    return (
        LearnerBuilder(directory)
        .hparams(HPARAMS)
        .metric_train_numeric(LossMetric())
        .metric_valid_numeric(LossMetric())
        .metric_valid(AccuracyMetric())
        .metric_loggers(train=loggers, valid=loggers)
        .with_file_checkpointer(DefaultRecorder())
        .num_epochs(epochs)
        .renderer(quiet)
    )


@pytest.mark.slow  # the first W&B start of the process: about 15 s on a busy machine
def test_offline_run_holds_steps_epochs_config_and_final_summary(tmp_path, loaders, quiet):
    board, memory = WandbMetricLogger(project="blobs"), InMemoryMetricLogger()
    assert board.chosen_mode() == "offline"
    ember.seed(0)
    learner = builder(tmp_path / "run", quiet, [board, memory]).build(
        Classifier(), AdamConfig().init(), 1e-2
    )
    learner.fit(*loaders)

    run = read_offline_runs(tmp_path / "run" / "wandb")
    assert run.run_ids == [board.run_id]
    assert {k: v for k, v in run.config.items() if k != "_wandb"} == HPARAMS
    for split in ("train", "valid"):
        values = [v for _, _, v, _ in memory.values[split]["Loss"]]
        found = run.series(f"{split}/Loss", f"{split}/step")
        assert [s for s, _ in found] == list(range(1, len(values) + 1))
        assert [v for _, v in found] == pytest.approx(values, rel=1e-6)
        assert run.series(f"{split}/epoch/Loss", "epoch") == [
            (epoch, pytest.approx(value, rel=1e-12))
            for epoch, value in memory.epochs[split]["Loss"]
        ]
    last = learner.history[-1][1]
    assert run.summary["train/epoch/Loss"] == pytest.approx(last["train"]["Loss"], rel=1e-12)
    assert run.summary["valid/epoch/Accuracy"] == pytest.approx(last["valid"]["Accuracy"])


def test_a_resumed_run_continues_the_same_wandb_run_and_sends_each_step_once(
    tmp_path, loaders, quiet
):
    directory = tmp_path / "run"
    first = WandbMetricLogger(project="blobs")
    ember.seed(0)
    stopping = builder(directory, quiet, first, epochs=3)
    stopping.listener(StopAt(stopping.interrupter(), 2, 4))
    stopped = stopping.build(Classifier(), AdamConfig().init(), 1e-2)
    stopped.fit(*loaders)
    assert stopped.outcome.startswith("stopped")

    second = WandbMetricLogger(project="blobs")
    resumed = (
        builder(directory, quiet, second, epochs=3)
        .checkpoint("latest")
        .build(Classifier(), AdamConfig().init(), 1e-2)
    )
    resumed.fit(*loaders)
    assert resumed.outcome == "completed"
    assert second.run_id == first.run_id

    run = read_offline_runs(directory / "wandb")
    assert set(run.run_ids) == {first.run_id}
    assert len(list((directory / "wandb").glob("offline-run-*"))) == 2
    # Each step once, in order, with the values of the metric files (which a resume cuts
    # back to the checkpoint and continues).
    found = run.series("train/Loss", "train/step")
    files = [
        value
        for epoch in (1, 2, 3)
        for value, _ in read_metric_log(directory / "train" / f"epoch-{epoch}" / "Loss.log")
    ]
    assert [s for s, _ in found] == list(range(1, len(files) + 1))
    assert [v for _, v in found] == pytest.approx(files, rel=1e-6)
    assert [e for e, _ in run.series("valid/epoch/Loss", "epoch")] == [1, 2, 3]
    assert run.summary["valid/epoch/Loss"] == pytest.approx(resumed.history[-1][1]["valid"]["Loss"])


def test_wandb_that_fails_to_start_or_to_log_never_stops_training(
    tmp_path, loaders, quiet, monkeypatch, caplog
):
    def unreachable(**kwargs):
        raise wandb.errors.CommError("the W&B server cannot be reached")

    monkeypatch.setattr(wandb, "init", unreachable)
    ember.seed(0)
    with caplog.at_level(logging.WARNING, logger="ember"):
        learner = builder(tmp_path / "a", quiet, WandbMetricLogger()).build(
            Classifier(), AdamConfig().init(), 1e-2
        )
        learner.fit(*loaders)
    assert learner.outcome == "completed"
    assert "W&B failed while starting the run (CommError: the W&B server cannot be reached)" in (
        caplog.text
    )
    monkeypatch.undo()

    class Flaky:
        """A W&B run whose third `log` call fails."""

        def __init__(self, run):
            self.run, self.calls, self.summary = run, 0, run.summary

        def log(self, row):
            self.calls += 1
            if self.calls == 3:
                raise OSError("disk full")
            self.run.log(row)

        def __getattr__(self, name):
            return getattr(self.run, name)

    real_init = wandb.init
    monkeypatch.setattr(wandb, "init", lambda **kwargs: Flaky(real_init(**kwargs)))
    caplog.clear()
    ember.seed(0)
    with caplog.at_level(logging.WARNING, logger="ember"):
        learner = builder(tmp_path / "b", quiet, WandbMetricLogger()).build(
            Classifier(), AdamConfig().init(), 1e-2
        )
        learner.fit(*loaders)
    assert learner.outcome == "completed"
    assert "W&B failed while logging values (OSError: disk full)" in caplog.text
    assert math.isfinite(learner.history[-1][1]["train"]["Loss"])


def test_mode_is_online_with_an_api_key_and_as_given_otherwise(monkeypatch, tmp_path):
    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)
    assert WandbMetricLogger().chosen_mode() == "online"
    assert WandbMetricLogger(mode="offline").chosen_mode() == "offline"
    monkeypatch.delenv("WANDB_API_KEY")
    (tmp_path / "netrc").write_text("machine api.wandb.ai\n  login user\n  password secret\n")
    monkeypatch.setenv("NETRC", str(tmp_path / "netrc"))
    assert WandbMetricLogger().chosen_mode() == "online"
    with pytest.raises(ember.errors.EmberError, match="mode=.*'offline'"):
        WandbMetricLogger(mode="cloud")
