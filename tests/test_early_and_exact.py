"""What a user porting a project meets first: errors before training (not after an
epoch), exact figures everywhere, a damaged newest checkpoint skipped, exit codes a
scheduler can read, one fit per learner, and torch.compile as a builder option."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from ember_testing import Batch, Classifier, StopAt

import ember
from ember.errors import ConfigError, TrainingError
from ember.optim import AdamConfig
from ember.record import DefaultRecorder
from ember.train import (
    ClassificationOutput,
    KeepLastNCheckpoints,
    LearnerBuilder,
    ProcessedItem,
    TrainOutput,
)
from ember.train.history import RunHistory
from ember.train.metric import AccuracyMetric, AurocMetric, LossMetric


def builder(directory, quiet, epochs=2):
    return (
        LearnerBuilder(directory)
        .metric_train_numeric(AccuracyMetric())
        .metric_valid_numeric(AccuracyMetric())
        .metric_valid_numeric(LossMetric())
        .num_epochs(epochs)
        .renderer(quiet)
    )


def weights(model):
    return {name: value.clone() for name, value in model.state_dict().items()}


class OneHotValid(Classifier):
    """Validation returns one-hot targets: accuracy cannot read them."""

    def valid_step(self, batch):
        output = super().valid_step(batch)
        one_hot = F.one_hot(output.targets, output.output.shape[1])
        return ClassificationOutput(output.loss, output.output, one_hot)


def test_a_validation_metric_that_cannot_read_the_output_fails_before_training(
    tmp_path, loaders, quiet
):
    model = OneHotValid()
    before = weights(model)
    learner = builder(tmp_path, quiet).build(model, AdamConfig().init(), 1e-2)
    with pytest.raises(TrainingError) as caught:
        learner.fit(*loaders)
    message = str(caught.value)
    assert "valid metric 'Accuracy' fails on the first valid batch" in message
    assert "got outputs [32, 3] and targets [32, 3]" in message  # what it received
    assert "class indices, not one-hot" in message
    assert not (tmp_path / "train").exists()  # not one training batch ran
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


class BrokenMetric:
    """A metric of one's own that fails with a plain error."""

    name, unit, input_type = "Broken", "", object

    def update(self, item, meta):
        raise RuntimeError("shapes do not match")

    def clear(self):
        pass


def test_a_metric_of_ones_own_failing_is_named_with_what_it_received(tmp_path, loaders, quiet):
    learner = (
        LearnerBuilder(tmp_path)
        .metric_valid(BrokenMetric())
        .renderer(quiet)
        .build(Classifier(), AdamConfig().init(), 1e-2)
    )
    with pytest.raises(TrainingError) as caught:
        learner.fit(*loaders)
    message = str(caught.value)
    assert "valid metric 'Broken' fails on the first valid batch" in message
    assert "RuntimeError: shapes do not match" in message
    assert "targets=Tensor[32] int64" in message  # what it received, with shapes


class OneHotTrain(Classifier):
    def train_step(self, batch):
        output = super().train_step(batch).item
        one_hot = F.one_hot(output.targets, output.output.shape[1])
        return TrainOutput(ClassificationOutput(output.loss, output.output, one_hot))


def test_a_training_metric_that_cannot_read_the_output_fails_before_the_first_step(
    tmp_path, loaders, quiet
):
    model = OneHotTrain()
    before = weights(model)
    learner = builder(tmp_path, quiet).build(model, AdamConfig().init(), 1e-2)
    with pytest.raises(TrainingError, match=r"train metric 'Accuracy' fails on the first train"):
        learner.fit(*loaders)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert learner.outcome == "failed" and learner.exit_code == 1


def test_restore_best_without_a_best_keeping_strategy_fails_before_training(
    tmp_path, loaders, quiet
):
    learner = (
        builder(tmp_path, quiet)
        .with_file_checkpointer(DefaultRecorder())
        .with_checkpointing_strategy(KeepLastNCheckpoints(2))
        .build(Classifier(), AdamConfig().init(), 1e-2)
    )
    with pytest.raises(TrainingError, match=r"names no best epoch among this run's metrics"):
        learner.fit(*loaders, restore_best=True)
    assert not (tmp_path / "train").exists()

    no_checkpoints = builder(tmp_path / "b", quiet).build(Classifier(), AdamConfig().init(), 1e-2)
    with pytest.raises(TrainingError, match=r"no checkpointer is set"):
        no_checkpoints.fit(*loaders, restore_best=True)
    assert not (tmp_path / "b" / "train").exists()


def test_a_device_this_machine_lacks_is_named_with_those_it_has(tmp_path, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    with pytest.raises(
        ConfigError, match=r"cuda:3 does not exist.*Devices here: cpu, cuda:0, cuda:1"
    ):
        LearnerBuilder(tmp_path).devices(["cuda:3"])
    LearnerBuilder(tmp_path).devices(["cuda:1"])  # one it has is accepted
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ConfigError, match=r"cuda:0 is not available.*Devices here: cpu\."):
        LearnerBuilder(tmp_path).devices(["cuda:0"])


def test_a_metric_class_instead_of_an_instance_names_the_fix(tmp_path):
    with pytest.raises(ConfigError, match=r"AccuracyMetric is a class.*AccuracyMetric\(\)"):
        LearnerBuilder(tmp_path).metric_train(AccuracyMetric)


class CallsBackward(Classifier):
    def train_step(self, batch):
        output = super().train_step(batch)
        output.loss.backward()
        return output


def test_backward_inside_train_step_names_the_fix(tmp_path, loaders, quiet):
    learner = builder(tmp_path, quiet).build(CallsBackward(), AdamConfig().init(), 1e-2)
    with pytest.raises(TrainingError, match=r"train_step called loss.backward\(\) itself"):
        learner.fit(*loaders)


class TrainOnly(torch.nn.Module):
    """A model with no validation step at all."""

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(8, 3)

    def train_step(self, batch: Batch):
        logits = self.linear(batch.inputs)
        return TrainOutput(
            ClassificationOutput(F.cross_entropy(logits, batch.targets), logits, batch.targets)
        )


def test_fit_without_validation_needs_no_valid_step_and_runs_once(tmp_path, loaders, quiet):
    learner = (
        LearnerBuilder(tmp_path)
        .metric_train_numeric(LossMetric())
        .renderer(quiet)
        .build(TrainOnly(), AdamConfig().init(), 1e-2)
    )
    learner.fit(loaders[0])
    assert learner.outcome == "completed" and learner.exit_code == 0
    logs = sorted(p.name for p in (tmp_path / "train").iterdir())
    with pytest.raises(TrainingError, match=r"fit\(\) was already called on this Learner"):
        learner.fit(loaders[0])
    assert sorted(p.name for p in (tmp_path / "train").iterdir()) == logs  # nothing wiped
    with pytest.raises(TrainingError, match=r"TrainOnly has no valid_step method"):
        LearnerBuilder(tmp_path / "v").renderer(quiet).build(
            TrainOnly(), AdamConfig().init(), 1e-2
        ).fit(*loaders)


class StopBySignal:
    def __init__(self, interrupter, signum):
        self.interrupter, self.signum = interrupter, signum

    def on_event(self, event):
        if isinstance(event, ProcessedItem) and (event.epoch, event.iteration) == (1, 2):
            self.interrupter.stop("terminated by SIGTERM", signal=self.signum)


def test_a_stop_by_signal_gives_the_exit_code_a_scheduler_reads(tmp_path, loaders, quiet):
    run = builder(tmp_path, quiet).with_file_checkpointer(DefaultRecorder())
    run.listener(StopBySignal(run.interrupter(), 15))
    learner = run.build(Classifier(), AdamConfig().init(), 1e-2)
    learner.fit(*loaders)
    assert learner.outcome == "stopped: terminated by SIGTERM"
    assert learner.exit_code == 143


def test_a_finished_run_resumed_says_it_is_complete(tmp_path, loaders, quiet):
    builder(tmp_path, quiet).with_file_checkpointer(DefaultRecorder()).build(
        Classifier(), AdamConfig().init(), 1e-2
    ).fit(*loaders)
    quiet.stream_text.truncate(0)
    again = (
        builder(tmp_path, quiet)
        .with_file_checkpointer(DefaultRecorder())
        .checkpoint("latest")
        .build(Classifier(), AdamConfig().init(), 1e-2)
    )
    again.fit(*loaders)
    assert again.outcome == "completed" and again.exit_code == 0
    assert "epoch 3/2" not in quiet.stream_text.getvalue()  # no "resuming at epoch 3/2"
    log = (tmp_path / "experiment.log").read_text()
    assert "The run is already complete: its checkpoint is at the end of epoch 2" in log


def test_latest_skips_a_damaged_newest_checkpoint_and_says_so(tmp_path, loaders, quiet):
    def run(epochs):
        return builder(tmp_path, quiet, epochs).with_file_checkpointer(DefaultRecorder())

    ember.seed(1)
    run(3).build(Classifier(), AdamConfig().init(), 1e-2).fit(*loaders)
    damaged = tmp_path / "checkpoint" / "model-3.mpk"
    damaged.write_bytes(damaged.read_bytes()[:100])  # cut short, as a full disk leaves it

    with pytest.raises(TrainingError) as caught:
        run(4).checkpoint(3).build(Classifier(), AdamConfig().init(), 1e-2).fit(*loaders)
    assert "model-3.mpk" in str(caught.value) and "Epochs that load: 2" in str(caught.value)

    learner = run(4).checkpoint("latest").build(Classifier(), AdamConfig().init(), 1e-2)
    learner.fit(*loaders)
    assert learner.outcome == "completed"
    log = (tmp_path / "experiment.log").read_text()
    assert "The checkpoint of epoch 3 cannot be loaded" in log and "model-3.mpk" in log
    assert "Resuming from the checkpoint of epoch 2." in log
    assert "Resumed from the checkpoint of epoch 2" in log
    assert [epoch for epoch, _ in learner.history] == [1, 2, 3, 4]


def test_every_figure_of_an_epoch_is_the_exact_epoch_value(tmp_path, loaders, quiet):
    from ember.plot import read_run
    from ember.train.logger.file import read_metric_log, weighted_mean

    learner = (
        LearnerBuilder(tmp_path)
        .metric_valid_numeric(AurocMetric(from_logits=True))
        .metric_valid_numeric(LossMetric())
        .num_epochs(2)
        .summary()
        .renderer(quiet)
        .build(Classifier(), AdamConfig().init(), 1e-5)  # barely trained: AUROC below 1
    )
    ember.seed(0)
    learner.fit(*loaders)
    history = RunHistory.load(tmp_path / "history.jsonl").to_json()
    exact = {e["epoch"]: e["valid"]["AUROC"] for e in history["epochs"]}
    assert exact == {epoch: values["valid"]["AUROC"] for epoch, values in learner.history}
    plotted = next(m for m in read_run(tmp_path) if m.name == "AUROC").epochs("valid")
    assert plotted == (list(exact), list(exact.values()))  # the plot shows the whole-epoch value
    mean = weighted_mean(read_metric_log(tmp_path / "valid" / "epoch-2" / "AUROC.log"))
    assert not math.isclose(mean, exact[2], rel_tol=1e-9)  # which a mean of batches is not
    log = (tmp_path / "experiment.log").read_text()
    assert f"AUROC {exact[2]!r}" in log


def test_compile_is_a_builder_option_and_its_checkpoints_load_into_the_plain_model(
    tmp_path, loaders, quiet
):
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    learner = (
        builder(tmp_path, quiet, epochs=1)
        .with_file_checkpointer(DefaultRecorder())
        .compile(backend="eager")
        .build(Classifier(), AdamConfig().init(), 1e-2)
    )
    model = learner.fit(*loaders)
    assert counters["stats"]["unique_graphs"] >= 1  # frames really went through dynamo
    assert "compiled (backend='eager')" in (tmp_path / "experiment.log").read_text()
    plain = Classifier()
    DefaultRecorder().load(plain, tmp_path / "checkpoint" / "model-1")  # plain keys
    assert sorted(plain.state_dict()) == sorted(model.state_dict())
    for name, value in model.state_dict().items():
        assert torch.equal(value, plain.state_dict()[name]), name

    with pytest.raises(ConfigError, match=r"wrapped by torch.compile.*LearnerBuilder.compile"):
        builder(tmp_path / "w", quiet).build(
            torch.compile(Classifier(), backend="eager"), AdamConfig().init(), 1e-2
        )


def test_a_whole_epoch_metric_resumed_mid_epoch_covers_the_whole_epoch(tmp_path, loaders, quiet):
    def run(directory, stop=None, resume=False):
        ember.seed(2)
        builder = (
            LearnerBuilder(directory)
            .metric_train_numeric(AurocMetric(from_logits=True))
            .metric_train_numeric(LossMetric())
            .with_file_checkpointer(DefaultRecorder())
            .num_epochs(2)
            .renderer(quiet)
        )
        if stop is not None:
            builder.listener(StopAt(builder.interrupter(), *stop))
        if resume:
            builder = builder.checkpoint("latest")
        learner = builder.build(Classifier(), AdamConfig().init(), 1e-3)
        learner.fit(loaders[0])
        return learner

    straight = run(tmp_path / "a")
    run(tmp_path / "b", stop=(2, 4))
    resumed = run(tmp_path / "b", resume=True)
    assert resumed.history == straight.history  # AUROC of epoch 2 over all its batches
