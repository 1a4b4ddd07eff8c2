"""Checkpoints per epoch and `checkpoint(n)` resume, as a user restarts a run."""

from __future__ import annotations

import pytest
import torch

import ember
from ember.errors import ConfigError
from ember.optim import AdamConfig
from ember.record import CompactRecorder, DefaultRecorder
from ember.train import LearnerBuilder
from ember.train.metric import AccuracyMetric, LossMetric

from conftest import Classifier


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
    builder(tmp_path, quiet, 2, CompactRecorder()).build(Classifier(), AdamConfig().init(), 1e-2).fit(*loaders)
    names = sorted(p.name for p in (tmp_path / "checkpoint").iterdir())
    assert names == [
        "model-1.mpk.gz", "model-2.mpk.gz", "optim-1.mpk.gz", "optim-2.mpk.gz",
        "scheduler-1.mpk.gz", "scheduler-2.mpk.gz",
    ]
    log = (tmp_path / "experiment.log").read_text()
    assert "Checkpoint of epoch 2 written: model-2.mpk.gz, optim-2.mpk.gz, scheduler-2.mpk.gz" in log


def test_resume_from_checkpoint_gives_the_same_weights_as_an_uninterrupted_run(tmp_path, blobs, quiet):
    from ember.data import DataLoaderBuilder

    from conftest import BlobBatcher

    def loaders():
        return (
            DataLoaderBuilder(BlobBatcher()).batch_size(32).shuffle(11).build(blobs[0]),
            DataLoaderBuilder(BlobBatcher()).batch_size(32).build(blobs[1]),
        )

    ember.seed(5)
    straight = builder(tmp_path / "a", quiet, 3).build(Classifier(), AdamConfig().init(), 1e-2).fit(*loaders())

    ember.seed(5)
    builder(tmp_path / "b", quiet, 2).build(Classifier(), AdamConfig().init(), 1e-2).fit(*loaders())
    ember.seed(123)  # a new process would start from anything: the checkpoint restores the RNGs
    resumed = (
        builder(tmp_path / "b", quiet, 3).checkpoint(2).build(Classifier(), AdamConfig().init(), 1e-2).fit(*loaders())
    )
    for (name, a), (_, b) in zip(straight.state_dict().items(), resumed.state_dict().items()):
        assert torch.equal(a, b), name
    for split in ("train", "valid"):
        for epoch in (1, 2, 3):
            name = "Accuracy.log" if split == "train" else "Loss.log"
            assert (tmp_path / "a" / split / f"epoch-{epoch}" / name).read_text() == (
                tmp_path / "b" / split / f"epoch-{epoch}" / name
            ).read_text()
    assert "Resumed from the checkpoint of epoch 2" in (tmp_path / "b" / "experiment.log").read_text()


def test_a_missing_checkpoint_names_the_epochs_that_exist(tmp_path, loaders, quiet):
    builder(tmp_path, quiet, 2).build(Classifier(), AdamConfig().init(), 1e-2).fit(*loaders)
    with pytest.raises(ConfigError, match=r"no checkpoint of epoch 7 .*\(epochs saved: 1, 2\)"):
        builder(tmp_path, quiet, 9).checkpoint(7).build(Classifier(), AdamConfig().init(), 1e-2)
