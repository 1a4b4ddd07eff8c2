"""Quick runs (`limit_batches`) and the smoke test (`learner.smoke_test`)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from ember_testing import BlobBatcher, BlobDataset, Classifier, StopAt
from ember_testing import blob_builder as builder

import ember
from ember.data import DataLoaderBuilder
from ember.errors import ConfigError
from ember.lr import CosineAnnealingLrSchedulerConfig
from ember.optim import AdamConfig
from ember.record import DefaultRecorder
from ember.train import LearnerBuilder, SmokeTestError
from ember.train.logger import read_metric_log
from ember.train.metric import LossMetric
from ember.train.renderer import PlainRenderer


class Unsized:
    """A loader without len(): the batches of another loader."""

    def __init__(self, loader):
        self.loader = loader

    def __iter__(self):
        return iter(self.loader)


def lines(path: Path) -> int:
    return len(read_metric_log(path))


# limit_batches ------------------------------------------------------------------------
def test_a_count_of_batches_per_epoch(tmp_path, loaders, quiet):
    learner = (
        builder(tmp_path, quiet)
        .limit_batches(train=3, valid=1)
        .num_epochs(2)
        .build(Classifier(), AdamConfig().init(), 1e-2)
    )
    assert learner.steps(loaders[0]) == (3, 6)
    learner.fit(*loaders)
    assert (learner.steps_per_epoch, learner.total_steps) == (3, 6)
    for epoch in (1, 2):
        assert lines(tmp_path / "train" / f"epoch-{epoch}" / "Loss.log") == 3
        assert lines(tmp_path / "valid" / f"epoch-{epoch}" / "Loss.log") == 1
    shown = quiet.stream_text.getvalue()
    assert "train epoch 2/2 done: 3 iterations, 96 items" in shown
    first = (tmp_path / "experiment.log").read_text().splitlines()[0]
    assert "train limited to 3 of the batches of each epoch" in first
    assert "valid limited to 1 of the batches of each epoch" in first
    assert "valid epoch 2/2 done: 1 iterations, 32 items" in shown


def test_a_fraction_of_the_batches_with_accumulation(tmp_path, loaders):
    # 7 training batches: half is 3; 3 validation batches: half is 1 (at least 1)
    learner = (
        builder(tmp_path)
        .limit_batches(train=0.5, valid=0.5)
        .grads_accumulation(2)
        .build(Classifier(), AdamConfig().init(), 1e-2)
    )
    assert learner.steps(loaders[0]) == (2, 2)
    learner.fit(*loaders)
    assert lines(tmp_path / "train" / "epoch-1" / "Loss.log") == 3
    assert lines(tmp_path / "valid" / "epoch-1" / "Loss.log") == 1


def test_limited_batches_are_the_first_of_the_epoch_order(tmp_path, loaders, one_thread):
    """Reference: a loop of our own over the first 2 batches of each epoch, same model,
    same optimizer, same seeds."""
    ember.seed(5)
    model = Classifier(dropout=0.0)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    builder(tmp_path).limit_batches(train=2).num_epochs(2).build(model, optimizer, 1e-2).fit(
        loaders[0]
    )
    ember.seed(5)
    reference = Classifier(dropout=0.0)
    optimizer = torch.optim.Adam(reference.parameters(), lr=1e-2)
    for epoch in (1, 2):
        loaders[0].sampler.set_epoch(epoch)
        for index, batch in enumerate(loaders[0]):
            if index == 2:
                break
            reference.train_step(batch).loss.backward()
            optimizer.step()
            optimizer.zero_grad()
    for a, b in zip(model.parameters(), reference.parameters()):
        assert torch.equal(a, b)


def test_a_limited_run_stopped_mid_epoch_resumes_exactly(tmp_path, loaders, one_thread):
    def train(directory, stop=False, resume=False):
        ember.seed(2)
        options = (
            builder(directory)
            .with_file_checkpointer(DefaultRecorder())
            .limit_batches(train=5)
            .num_epochs(3)
        )
        if stop:
            options = options.listener(StopAt(options.interrupter(), 2, 2))
        if resume:
            options = options.checkpoint("latest")
        learner = options.build(Classifier(), AdamConfig().init(), 1e-2)
        return learner, learner.fit(*loaders)

    stopped, _ = train(tmp_path / "resumed", stop=True)
    assert stopped.outcome == "stopped: test stop"
    resumed, model = train(tmp_path / "resumed", resume=True)
    assert resumed.outcome == "completed"
    _, straight = train(tmp_path / "straight")
    for (name, a), (_, b) in zip(model.state_dict().items(), straight.state_dict().items()):
        assert torch.equal(a, b), name
    assert lines(tmp_path / "resumed" / "train" / "epoch-2" / "Loss.log") == 5


def test_a_count_works_on_a_loader_without_length(tmp_path, loaders):
    learner = (
        builder(tmp_path).limit_batches(train=2).build(Classifier(), AdamConfig().init(), 1e-2)
    )
    assert learner.steps(Unsized(loaders[0])) == (2, 2)  # a stream is as long as the limit
    learner.fit(Unsized(loaders[0]))
    assert lines(tmp_path / "train" / "epoch-1" / "Loss.log") == 2


def test_a_fraction_of_a_loader_without_length_is_refused(tmp_path, loaders):
    learner = (
        builder(tmp_path).limit_batches(train=0.5).build(Classifier(), AdamConfig().init(), 1e-2)
    )
    with pytest.raises(ConfigError, match=r"has no len\(\)\. Give a number of batches"):
        learner.fit(Unsized(loaders[0]))
    assert not (tmp_path / "train").exists()


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (0, "must be >= 1"),
        (-2, "must be >= 1"),
        (1.5, r"must be in \(0, 1\]"),
        (0.0, r"must be in \(0, 1\]"),
        (-0.5, r"must be in \(0, 1\]"),
        ("10", "takes an int"),
        (True, "takes an int"),
    ],
)
def test_limits_that_cannot_work_are_refused(tmp_path, value, message):
    with pytest.raises(ConfigError, match=message):
        LearnerBuilder(tmp_path).limit_batches(valid=value)


# smoke_test ---------------------------------------------------------------------------
def learner_for(directory, **extra):
    return (
        builder(directory)
        .with_file_checkpointer(DefaultRecorder())
        .valid_every(1)
        .num_epochs(2)
        .build(
            Classifier(),
            AdamConfig().init(),
            CosineAnnealingLrSchedulerConfig(initial_lr=1e-2, num_iters="auto"),
        )
    )


def test_the_smoke_test_exercises_the_run_and_changes_nothing(
    tmp_path, loaders, capsys, one_thread
):
    ember.seed(4)
    learner = learner_for(tmp_path / "run")
    before = {k: v.clone() for k, v in learner.model.state_dict().items()}
    optimizer_before = learner.optimizer.state_dict()
    report = learner.smoke_test(*loaders, batches=2)

    printed = capsys.readouterr().out
    assert printed.startswith("smoke test passed:")
    assert str(report) in printed
    assert report.batches == {"train": 2, "valid": 2}
    assert set(report.values) == {"train", "valid"}
    text = str(report)
    assert "train_step: 2 batches" in text
    assert "loaded back with checkpoint('latest'): weights equal to the trained ones" in text
    assert "validation inside the epoch (valid_every)" in text
    for name, tensor in learner.model.state_dict().items():
        assert torch.equal(tensor, before[name]), name
    assert learner.optimizer.state_dict() == optimizer_before
    assert learner.optim.lr.pending is not None  # the "auto" schedule waits for fit
    assert not (tmp_path / "run").exists()  # the run's directory was never touched

    # and the run trains exactly as one that had no smoke test
    model = learner.fit(*loaders)
    ember.seed(4)
    plain = learner_for(tmp_path / "plain")
    reference = plain.fit(*loaders)
    for (name, a), (_, b) in zip(model.state_dict().items(), reference.state_dict().items()):
        assert torch.equal(a, b), name


class BrokenValid(Classifier):
    def valid_step(self, batch):
        raise RuntimeError("no validation here")


class BrokenRecorder(DefaultRecorder):
    def save(self, item, path, **options):
        raise OSError("disk full")


def test_the_smoke_test_names_the_failing_part(tmp_path, loaders):
    learner = builder(tmp_path / "a").build(BrokenValid(), AdamConfig().init(), 1e-2)
    with pytest.raises(SmokeTestError, match="Smoke test failed in valid_step: RuntimeError"):
        learner.smoke_test(*loaders, echo=False)

    learner = (
        builder(tmp_path / "b")
        .with_file_checkpointer(BrokenRecorder())
        .build(Classifier(), AdamConfig().init(), 1e-2)
    )
    with pytest.raises(SmokeTestError, match="Smoke test failed in the checkpoint write"):
        learner.smoke_test(*loaders, echo=False)

    with pytest.raises(ConfigError, match="batches=...\\) must be an int >= 1"):
        learner.smoke_test(*loaders, batches=0)


class BrokenMetric(LossMetric):
    def update(self, item, metadata):
        raise ValueError("cannot read this")


class NaNLoss(Classifier):
    def train_step(self, batch):
        output = super().train_step(batch)
        output.loss = output.loss * float("nan")
        return output


def test_the_smoke_test_names_a_failing_metric_and_a_diverging_step(tmp_path, loaders):
    learner = (
        LearnerBuilder(tmp_path / "a")
        .metric_valid(BrokenMetric())
        .renderer(PlainRenderer(interval=3600))
        .build(Classifier(), AdamConfig().init(), 1e-2)
    )
    with pytest.raises(SmokeTestError, match="Smoke test failed in a metric: .*cannot read this"):
        learner.smoke_test(*loaders, echo=False)
    learner = builder(tmp_path / "b").build(NaNLoss(), AdamConfig().init(), 1e-2)
    with pytest.raises(SmokeTestError, match=r"failed in train_step \(the loss is not finite\)"):
        learner.smoke_test(*loaders, echo=False)


def test_a_smoke_test_leaves_an_existing_run_as_it_was(tmp_path, loaders):
    learner = (
        builder(tmp_path)
        .with_file_checkpointer(DefaultRecorder())
        .build(Classifier(), AdamConfig().init(), 1e-2)
    )
    learner.fit(*loaders)
    files = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    again = (
        builder(tmp_path)
        .with_file_checkpointer(DefaultRecorder())
        .checkpoint("latest")
        .num_epochs(2)
        .build(Classifier(), AdamConfig().init(), 1e-2)
    )
    again.smoke_test(*loaders, echo=False)
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == files


def test_an_unsized_valid_loader_and_a_small_loader(tmp_path):
    train = DataLoaderBuilder(BlobBatcher()).batch_size(8).build(BlobDataset(8))
    learner = builder(tmp_path).build(Classifier(), AdamConfig().init(), 1e-2)
    report = learner.smoke_test(train, Unsized(train), batches=3, echo=False)
    assert report.batches == {"train": 1, "valid": 1}  # the loaders had one batch each
