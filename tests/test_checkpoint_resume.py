"""Checkpoints per epoch and `checkpoint(n)` resume, as a user restarts a run."""

from __future__ import annotations

import pytest
import torch
from ember_testing import Classifier

import ember
from ember.errors import ConfigError, TrainingError
from ember.optim import AdamConfig
from ember.record import CompactRecorder, DefaultRecorder
from ember.train import LearnerBuilder
from ember.train.metric import AccuracyMetric, LossMetric


def builder(directory, quiet, epochs, recorder=None):
    return (
        LearnerBuilder(directory)
        .metric_train_numeric(AccuracyMetric())
        .metric_valid_numeric(LossMetric())
        .with_file_checkpointer(recorder or DefaultRecorder())
        .num_epochs(epochs)
        .renderer(quiet)
    )


def test_each_epoch_writes_model_optim_and_scheduler(tmp_path, loaders, quiet):
    builder(tmp_path, quiet, 2, CompactRecorder()).build(
        Classifier(), AdamConfig().init(), 1e-2
    ).fit(*loaders)
    names = sorted(p.name for p in (tmp_path / "checkpoint").iterdir())
    assert names == [
        "model-1.mpk.gz",
        "model-2.mpk.gz",
        "optim-1.mpk.gz",
        "optim-2.mpk.gz",
        "scheduler-1.mpk.gz",
        "scheduler-2.mpk.gz",
    ]
    log = (tmp_path / "experiment.log").read_text()
    assert (
        "Checkpoint of epoch 2 written: model-2.mpk.gz, optim-2.mpk.gz, scheduler-2.mpk.gz" in log
    )


def test_resume_from_checkpoint_gives_the_same_weights_as_an_uninterrupted_run(
    tmp_path, blobs, quiet
):
    from ember_testing import BlobBatcher

    from ember.data import DataLoaderBuilder

    def loaders():
        return (
            DataLoaderBuilder(BlobBatcher()).batch_size(32).shuffle(11).build(blobs[0]),
            DataLoaderBuilder(BlobBatcher()).batch_size(32).build(blobs[1]),
        )

    ember.seed(5)
    straight = (
        builder(tmp_path / "a", quiet, 3)
        .build(Classifier(), AdamConfig().init(), 1e-2)
        .fit(*loaders())
    )

    ember.seed(5)
    builder(tmp_path / "b", quiet, 2).build(Classifier(), AdamConfig().init(), 1e-2).fit(*loaders())
    ember.seed(123)  # a new process would start from anything: the checkpoint restores the RNGs
    resumed = (
        builder(tmp_path / "b", quiet, 3)
        .checkpoint(2)
        .build(Classifier(), AdamConfig().init(), 1e-2)
        .fit(*loaders())
    )
    for (name, a), (_, b) in zip(straight.state_dict().items(), resumed.state_dict().items()):
        assert torch.equal(a, b), name
    for split in ("train", "valid"):
        for epoch in (1, 2, 3):
            name = "Accuracy.log" if split == "train" else "Loss.log"
            assert (tmp_path / "a" / split / f"epoch-{epoch}" / name).read_text() == (
                tmp_path / "b" / split / f"epoch-{epoch}" / name
            ).read_text()
    assert (
        "Resumed from the checkpoint of epoch 2" in (tmp_path / "b" / "experiment.log").read_text()
    )


def test_a_missing_checkpoint_names_the_epochs_that_exist(tmp_path, loaders, quiet):
    builder(tmp_path, quiet, 2).build(Classifier(), AdamConfig().init(), 1e-2).fit(*loaders)
    with pytest.raises(ConfigError, match=r"no checkpoint of epoch 7 .*\(epochs saved: 1, 2\)"):
        builder(tmp_path, quiet, 9).checkpoint(7).build(Classifier(), AdamConfig().init(), 1e-2)


class ScriptedLoss:
    """A validation "Loss" whose epoch values are scripted: best at epoch 2."""

    name, unit, input_type = "Loss", "", object
    values = {1: 3.0, 2: 0.5, 3: 2.0, 4: 1.0, 5: 1.5}

    def update(self, item, meta):
        from ember.train.metric import MetricValue

        return MetricValue(self.values[meta.epoch], 1)

    def clear(self):
        pass


def scripted_builder(directory, quiet, epochs):
    return (
        LearnerBuilder(directory)
        .metric_valid_numeric(ScriptedLoss())
        .with_file_checkpointer(DefaultRecorder())
        .num_epochs(epochs)
        .renderer(quiet)
    )


def saved_epochs(directory) -> list[int]:
    return sorted(
        {int(p.name.split("-")[1].split(".")[0]) for p in (directory / "checkpoint").iterdir()}
    )


def test_default_retention_keeps_the_last_two_and_the_best_by_valid_loss(tmp_path, loaders, quiet):
    scripted_builder(tmp_path, quiet, 5).build(Classifier(), AdamConfig().init(), 1e-2).fit(
        *loaders
    )
    assert saved_epochs(tmp_path) == [2, 4, 5]
    assert len(list((tmp_path / "checkpoint").iterdir())) == 9  # three parts each
    assert "Checkpoint of epoch 3 deleted (retention)." in (tmp_path / "experiment.log").read_text()


def test_keep_last_n_strategy(tmp_path, loaders, quiet):
    from ember.train.checkpoint import KeepLastNCheckpoints

    builder = scripted_builder(tmp_path, quiet, 4).with_checkpointing_strategy(
        KeepLastNCheckpoints(1)
    )
    builder.build(Classifier(), AdamConfig().init(), 1e-2).fit(*loaders)
    assert saved_epochs(tmp_path) == [4]


def test_composed_strategy_deletes_only_when_all_agree(tmp_path, loaders, quiet):
    from ember.train.checkpoint import (
        ComposedCheckpointingStrategy,
        KeepLastNCheckpoints,
        MetricCheckpointingStrategy,
    )

    strategy = ComposedCheckpointingStrategy(
        KeepLastNCheckpoints(1), MetricCheckpointingStrategy(ScriptedLoss(), direction="highest")
    )
    builder = scripted_builder(tmp_path, quiet, 5).with_checkpointing_strategy(strategy)
    builder.build(Classifier(), AdamConfig().init(), 1e-2).fit(*loaders)
    assert saved_epochs(tmp_path) == [1, 5]  # epoch 1 has the highest scripted value


def test_restore_best_hands_back_the_best_epoch_weights(tmp_path, loaders, quiet):
    learner = scripted_builder(tmp_path, quiet, 4).build(Classifier(), AdamConfig().init(), 1e-2)
    model = learner.fit(*loaders, restore_best=True)
    best = DefaultRecorder().load(Classifier(), tmp_path / "checkpoint" / "model-2").state_dict()
    for name, value in model.state_dict().items():
        assert torch.equal(value, best[name]), name
    assert (
        "Restored the weights of epoch 2, best by the checkpointing strategy (keeps the last "
        "2 and the best valid Loss (lowest))" in (tmp_path / "experiment.log").read_text()
    )


def test_a_failed_checkpoint_write_stops_the_run_and_keeps_the_previous_one(
    tmp_path, loaders, quiet, monkeypatch
):
    builder = scripted_builder(tmp_path, quiet, 4)
    learner = builder.build(Classifier(), AdamConfig().init(), 1e-2)
    calls = {"n": 0}
    original = DefaultRecorder.save

    def failing_save(self, item, path, **kwargs):
        calls["n"] += 1
        if calls["n"] > 3:  # epoch 1 writes fine, epoch 2 fails
            raise OSError(28, "No space left on device")
        return original(self, item, path, **kwargs)

    monkeypatch.setattr(DefaultRecorder, "save", failing_save)
    with pytest.raises(
        TrainingError,
        match=r"Writing a checkpoint failed \(OSError: \[Errno 28\] No space left on device\); the last complete checkpoint is epoch 1",
    ):
        learner.fit(*loaders)
    assert saved_epochs(tmp_path) == [1]
    DefaultRecorder().load(Classifier(), tmp_path / "checkpoint" / "model-1")  # whole and loadable
    assert "No space left on device" in (tmp_path / "experiment.log").read_text()


def test_on_checkpoint_error_warn_goes_on(tmp_path, loaders, quiet, monkeypatch):
    builder = (
        LearnerBuilder(tmp_path)
        .metric_valid_numeric(ScriptedLoss())
        .with_file_checkpointer(DefaultRecorder(), on_checkpoint_error="warn")
        .num_epochs(3)
        .renderer(quiet)
    )
    learner = builder.build(Classifier(), AdamConfig().init(), 1e-2)

    def failing_save(self, item, path, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(DefaultRecorder, "save", failing_save)
    learner.fit(*loaders)
    assert learner.outcome == "completed"
    assert (
        "Training goes on (on_checkpoint_error='warn')" in (tmp_path / "experiment.log").read_text()
    )


def test_resuming_a_finished_run_returns_its_model_without_training(tmp_path, loaders, quiet):
    trained = (
        builder(tmp_path, quiet, 2).build(Classifier(), AdamConfig().init(), 1e-2).fit(*loaders)
    )
    fresh = Classifier()
    learner = (
        builder(tmp_path, quiet, 2).checkpoint("latest").build(fresh, AdamConfig().init(), 1e-2)
    )
    returned = learner.fit(*loaders)
    assert learner.outcome == "completed" and fresh.seen == []
    for name, value in trained.state_dict().items():
        assert torch.equal(returned.state_dict()[name], value), name
    assert "nothing is left to train" in (tmp_path / "experiment.log").read_text()
