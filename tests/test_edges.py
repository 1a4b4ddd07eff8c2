"""The edges where a run could lose data or train on wrong numbers without saying so:
the last checkpoint, failed resumes, hints that lead somewhere, a changed optimizer,
empty loaders, negative rates, skipped steps and an unwritable log."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import torch
from ember_testing import Classifier

import ember
from ember.errors import ConfigError, EmberError, TrainingError
from ember.lr import CosineAnnealingLrSchedulerConfig
from ember.optim import AdamConfig
from ember.record import CompactRecorder, DefaultRecorder
from ember.train import LearnerBuilder
from ember.train.metric import AccuracyMetric, LossMetric


def builder(directory, quiet, epochs, recorder=None):
    return (
        LearnerBuilder(directory)
        .metric_train_numeric(LossMetric())
        .metric_valid_numeric(LossMetric())
        .with_file_checkpointer(recorder or DefaultRecorder())
        .num_epochs(epochs)
        .renderer(quiet)
    )


def contents(directory: Path) -> dict[str, str]:
    """Every file under `directory` and a digest of its bytes."""
    return {
        str(path.relative_to(directory)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(directory.rglob("*"))
        if path.is_file()
    }


def fail_saves_after(monkeypatch, parts: int) -> None:
    """The disk fills up after `parts` checkpoint parts have been written."""
    calls = {"n": 0}
    original = DefaultRecorder.save

    def failing_save(self, item, path, **kwargs):
        calls["n"] += 1
        if calls["n"] > parts:
            raise OSError(28, "No space left on device")
        return original(self, item, path, **kwargs)

    monkeypatch.setattr(DefaultRecorder, "save", failing_save)


@pytest.mark.parametrize("restore_best", [False, True])
def test_a_lost_last_checkpoint_fails_the_run(tmp_path, loaders, quiet, monkeypatch, restore_best):
    learner = builder(tmp_path, quiet, 2).build(Classifier(), AdamConfig().init(), 1e-2)
    fail_saves_after(monkeypatch, 3)  # epoch 1 is written, epoch 2 (the last) is not
    with pytest.raises(
        TrainingError, match=r"the last complete checkpoint is epoch 1.*checkpoint\('latest'\)"
    ):
        learner.fit(*loaders, restore_best=restore_best)
    assert learner.outcome == "failed" and learner.exit_code == 1
    assert "training completed" not in quiet.stream_text.getvalue()


def test_a_disk_full_before_any_checkpoint_names_the_command_that_works(
    tmp_path, loaders, quiet, monkeypatch
):
    learner = builder(tmp_path, quiet, 2).build(Classifier(), AdamConfig().init(), 1e-2)
    fail_saves_after(monkeypatch, 0)
    with pytest.raises(TrainingError, match=r"no complete checkpoint exists.*overwrite=True\)"):
        learner.fit(*loaders)
    monkeypatch.undo()
    with pytest.raises(ConfigError, match=r"holds a run that saved no checkpoint.*overwrite=True"):
        builder(tmp_path, quiet, 2).checkpoint("latest").build(
            Classifier(), AdamConfig().init(), 1e-2
        )
    LearnerBuilder(tmp_path, overwrite=True).renderer(quiet).build(
        Classifier(), AdamConfig().init(), 1e-2
    ).fit(*loaders)  # and that command works


def test_hints_name_the_recorder_and_count_epochs(tmp_path, loaders, quiet):
    builder(tmp_path, quiet, 2).build(Classifier(), AdamConfig().init(), 1e-2).fit(*loaders)
    with pytest.raises(
        ConfigError, match=r"another format \(epochs 1, 2 as \.mpk: DefaultRecorder"
    ):
        builder(tmp_path, quiet, 3, CompactRecorder()).checkpoint("latest").build(
            Classifier(), AdamConfig().init(), 1e-2
        )
    with pytest.raises(ConfigError, match=r"did you mean 'latest'"):
        LearnerBuilder(tmp_path).checkpoint("last")
    with pytest.raises(
        TrainingError,
        match=r"logs of 2 epoch\(s\), checkpoints\)\. Resume it with checkpoint\('latest'\)",
    ):
        builder(tmp_path, quiet, 2).build(Classifier(), AdamConfig().init(), 1e-2).fit(*loaders)


def test_a_failed_resume_leaves_the_directory_byte_identical(tmp_path, loaders, quiet):
    builder(tmp_path, quiet, 3).with_checkpointing_strategy(
        ember.train.KeepLastNCheckpoints(3)
    ).build(Classifier(), AdamConfig().init(), 1e-2).fit(*loaders)
    before = contents(tmp_path)
    assert "train/epoch-3/Loss.log" in before

    def resume(model, lr=1e-2):
        return (
            builder(tmp_path, quiet, 3)
            .checkpoint(1)
            .build(model, AdamConfig().init(), lr)
            .fit(*loaders)
        )

    with pytest.raises(EmberError):
        resume(Classifier(hidden=32))  # another architecture
    assert contents(tmp_path) == before
    with pytest.raises(TrainingError, match="scheduler"):
        resume(Classifier(), CosineAnnealingLrSchedulerConfig(initial_lr=0.1, num_iters=5))
    assert contents(tmp_path) == before


def test_another_optimizer_class_is_refused_before_the_first_step(tmp_path, loaders, quiet):
    builder(tmp_path, quiet, 1).build(Classifier(), AdamConfig().init(), 1e-2).fit(*loaders)
    before = contents(tmp_path)
    model = Classifier()
    sgd = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    with pytest.raises(TrainingError, match=r"written by a run with Adam and this run uses SGD"):
        builder(tmp_path, quiet, 2).checkpoint(1).build(model, sgd, 0.1).fit(*loaders)
    assert contents(tmp_path) == before


@pytest.mark.parametrize("rule", ["checkpoint", "new"])
def test_changed_hyperparameters_follow_one_rule_and_are_listed(tmp_path, loaders, quiet, rule):
    def adamw(model, weight_decay):
        return torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=weight_decay)

    first = Classifier()
    builder(tmp_path, quiet, 1).build(first, adamw(first, 0.01), 1e-2).fit(*loaders)
    model = Classifier()
    learner = (
        builder(tmp_path, quiet, 2)
        .checkpoint(1, hyperparameters=rule)
        .build(model, adamw(model, 0.5), 3e-3)
    )
    learner.fit(*loaders)
    group = learner.optimizer.param_groups[0]
    log = (tmp_path / "experiment.log").read_text()
    assert "weight_decay 0.5 (checkpoint 0.01)" in log and "lr 0.003 (checkpoint 0.01)" in log
    if rule == "checkpoint":
        assert group["weight_decay"] == 0.01 and group["lr"] == 0.01
        assert "The checkpoint's hyperparameters are kept" in log
    else:
        assert group["weight_decay"] == 0.5 and group["lr"] == 0.003
        assert "This run's hyperparameters replace the checkpoint's" in log


def test_empty_loaders_are_refused_before_anything_starts(tmp_path, loaders, quiet):
    empty = torch.utils.data.DataLoader([], batch_size=32)  # a plain torch loader of nothing
    learner = builder(tmp_path, quiet, 1).build(Classifier(), AdamConfig().init(), 1e-2)
    with pytest.raises(
        TrainingError, match=r"validation data loader is empty.*without validation data"
    ):
        learner.fit(loaders[0], empty)
    assert not (tmp_path / "train").exists()
    learner = builder(tmp_path / "b", quiet, 1).build(Classifier(), AdamConfig().init(), 1e-2)
    with pytest.raises(TrainingError, match=r"training data loader is empty.*drop_last"):
        learner.fit(empty)


def test_a_schedule_giving_a_negative_rate_is_an_error(tmp_path, loaders, quiet):
    model = Classifier()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 - step)
    learner = builder(tmp_path, quiet, 1).build(model, optimizer, schedule)
    with pytest.raises(TrainingError, match=r"LambdaLR gave the learning rate -0\.1"):
        learner.fit(*loaders)


class NaNOnce(Classifier):
    calls = 0

    def train_step(self, batch):
        output = super().train_step(batch)
        self.calls += 1
        if self.calls == 2:
            output.item.loss = output.loss * float("nan")
            return ember.train.TrainOutput(output.item)
        return output


def test_a_skipped_step_is_shown_and_left_out_of_the_epoch_loss(tmp_path, loaders, quiet, capsys):
    learner = (
        builder(tmp_path, quiet, 1)
        .metric_train_numeric(AccuracyMetric())
        .nonfinite_loss("skip")
        .build(NaNOnce(), AdamConfig().init(), 1e-2)
    )
    learner.fit(*loaders)
    assert "ember: Skipped the optimizer step at epoch 1, iteration 2" in capsys.readouterr().err
    loss = learner.history[-1][1]["train"]["Loss"]
    assert loss == loss  # not NaN: the skipped batch is not part of the epoch's loss
    lines = (tmp_path / "train" / "epoch-1" / "Loss.log").read_text().splitlines()
    assert len(lines) == 6  # 7 batches, one skipped


def test_an_unwritable_log_gets_embers_message(tmp_path, loaders, quiet):
    (tmp_path / "experiment.log").mkdir()  # cannot be opened as a file, even by root
    learner = builder(tmp_path, quiet, 1).build(Classifier(), AdamConfig().init(), 1e-2)
    with pytest.raises(EmberError, match=r"Cannot write the run's log .*experiment\.log"):
        learner.fit(*loaders)
