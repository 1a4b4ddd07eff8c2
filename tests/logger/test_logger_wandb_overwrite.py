"""`LearnerBuilder(dir, overwrite=True)` starts afresh: W&B's files of the earlier run go
too, so `wandb sync ARTIFACT_DIR/wandb/offline-run-*` uploads the new run alone."""

from __future__ import annotations

import pytest
from ember_testing import Classifier
from wandb_records import read_offline_runs

import ember
from ember.optim import AdamConfig
from ember.record import DefaultRecorder
from ember.train import LearnerBuilder
from ember.train.metric import LossMetric


def builder(directory, quiet, overwrite, loggers=None):
    builder = (
        LearnerBuilder(directory, overwrite=overwrite)
        .metric_train_numeric(LossMetric())
        .with_file_checkpointer(DefaultRecorder())
        .num_epochs(1)
        .renderer(quiet)
    )
    return builder.metric_loggers(train=loggers, valid=loggers) if loggers is not None else builder


def test_overwrite_removes_the_earlier_runs_wandb_files(tmp_path, loaders, quiet):
    directory = tmp_path / "run"
    builder(directory, quiet, False).build(Classifier(), AdamConfig().init(), 1e-2).fit(*loaders)
    stale = directory / "wandb" / "offline-run-20240101_000000-old" / "run-old.wandb"
    stale.parent.mkdir(parents=True)
    stale.write_bytes(b":W&B")
    (directory / "notes.txt").write_text("mine")  # not ember's: kept
    builder(directory, quiet, True).build(Classifier(), AdamConfig().init(), 1e-2).fit(*loaders)
    assert not (directory / "wandb").exists()
    assert (directory / "notes.txt").read_text() == "mine"
    assert (directory / "train" / "epoch-1" / "Loss.log").is_file()


@pytest.mark.slow  # two W&B starts: about 20 s on a busy machine
def test_two_offline_runs_in_one_directory_leave_one_to_sync(tmp_path, loaders, quiet, monkeypatch):
    from ember.train.logger import WandbMetricLogger

    for name in ("WANDB_API_KEY", "WANDB_MODE", "WANDB_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb-config"))
    monkeypatch.setenv("WANDB_SILENT", "true")
    directory = tmp_path / "run"
    ids = []
    for _ in range(2):
        board = WandbMetricLogger(project="blobs", mode="offline")
        ember.seed(0)
        learner = builder(directory, quiet, True, board).build(
            Classifier(), AdamConfig().init(), 1e-2
        )
        learner.fit(*loaders)
        ids.append(board.run_id)
    assert ids[0] != ids[1]
    assert len(list((directory / "wandb").glob("offline-run-*"))) == 1
    assert read_offline_runs(directory / "wandb").run_ids == [ids[1]]
