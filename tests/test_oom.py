"""grads_accumulation("auto"): a step that runs out of memory is run again in micro-batches."""

from __future__ import annotations

from collections import namedtuple
from dataclasses import dataclass

import pytest
import torch
import torch.nn.functional as F
from ember_testing import BlobBatcher, BlobDataset
from torch import nn

import ember
from ember.data import DataLoaderBuilder
from ember.errors import ConfigError, TrainingError
from ember.optim import AdamConfig
from ember.record import DefaultRecorder
from ember.train import ClassificationOutput, LearnerBuilder, TrainOutput
from ember.train.metric import LossMetric
from ember.train.oom import split_batch


class Fits(nn.Module):
    """Raises torch.OutOfMemoryError, as CUDA does, on a batch of more than `fits` samples."""

    def __init__(self, fits: int):
        super().__init__()
        self.layer = nn.Linear(8, 3)
        self.fits = fits
        self.raised = 0

    def train_step(self, batch):
        size = batch.inputs.shape[0]
        if size > self.fits:
            self.raised += 1
            raise torch.OutOfMemoryError(
                f"CUDA out of memory. Tried to allocate {size} MiB (a batch of {size})"
            )
        output = self.layer(batch.inputs)
        loss = F.cross_entropy(output, batch.targets)
        return TrainOutput(ClassificationOutput(loss, output, batch.targets))


def train(directory, quiet, batch, accumulation, epochs=2, fits=8, resume=False, make=Fits):
    ember.seed(1)
    model = make(fits)
    loader = DataLoaderBuilder(BlobBatcher()).batch_size(batch).shuffle(4).build(BlobDataset(100))
    builder = (
        LearnerBuilder(directory)
        .metric_train_numeric(LossMetric())
        .with_file_checkpointer(DefaultRecorder())
        .grads_accumulation(accumulation)
        .num_epochs(epochs)
        .renderer(quiet)
    )
    if resume:
        builder = builder.checkpoint("latest")
    learner = builder.build(model, AdamConfig().init(), 1e-2)
    learner.fit(loader)
    return model, learner


def test_auto_splits_until_it_fits_and_matches_explicit_micro_batches(tmp_path, quiet):
    auto, learner = train(tmp_path / "auto", quiet, batch=32, accumulation="auto")
    explicit, reference = train(tmp_path / "explicit", quiet, batch=8, accumulation=4)
    assert auto.raised == 2  # 32 and 16 samples did not fit, then 8 for the rest of the run
    for a, b in zip(auto.parameters(), explicit.parameters()):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=0)
    log = (tmp_path / "auto" / "experiment.log").read_text()
    assert "Out of memory at iteration 1 (CUDA out of memory. Tried to allocate 32 MiB" in log
    assert "every batch is now split into 2 micro-batches" in log
    assert "every batch is now split into 4 micro-batches" in log
    # the epoch's loss is the mean over the same samples; iterations count loader batches
    auto_epochs, explicit_epochs = learner.history, reference.history
    for (_, a), (_, b) in zip(auto_epochs, explicit_epochs):
        assert a["train"]["Loss"] == pytest.approx(b["train"]["Loss"], abs=1e-6)
    assert learner.iteration == 4  # 100 samples in batches of 32


def test_a_resumed_run_keeps_the_split(tmp_path, quiet):
    train(tmp_path / "run", quiet, batch=32, accumulation="auto", epochs=1)
    resumed, _ = train(tmp_path / "run", quiet, batch=32, accumulation="auto", resume=True)
    assert resumed.raised == 0  # the checkpoint's split: no out-of-memory to find it again
    log = (tmp_path / "run" / "experiment.log").read_text()
    assert "gradient accumulation auto (batches in 4)" in log
    assert "split into 4 micro-batches, as in the checkpoint's run" in log
    whole, _ = train(tmp_path / "whole", quiet, batch=8, accumulation=4)
    for a, b in zip(resumed.parameters(), whole.parameters()):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=0)


def test_out_of_memory_for_one_sample_ends_the_run(tmp_path, quiet):
    with pytest.raises(torch.OutOfMemoryError) as raised:
        train(tmp_path, quiet, batch=4, accumulation="auto", fits=0)
    assert "micro-batches of one sample (4 per batch)" in "\n".join(raised.value.__notes__)


def test_without_auto_out_of_memory_ends_the_run_at_once(tmp_path, quiet):
    models = []

    def make(fits):
        models.append(Fits(fits))
        return models[-1]

    with pytest.raises(torch.OutOfMemoryError):
        train(tmp_path, quiet, batch=32, accumulation=1, make=make)
    assert models[0].raised == 1


def test_auto_is_refused_with_custom_optimization_or_several_processes(tmp_path):
    class Manual(nn.Module):
        def __init__(self):
            super().__init__()
            self.layer = nn.Linear(2, 2)

        def train_step(self, batch, ctx):
            raise AssertionError("not reached")

    params = Manual().parameters()
    with pytest.raises(ConfigError, match="custom optimization .* grads_accumulation\\(n\\)"):
        LearnerBuilder(tmp_path).grads_accumulation("auto").build(
            Manual(), {"a": torch.optim.SGD(params, lr=0.1)}, 0.1
        )
    with pytest.raises(ConfigError, match="runs on one process"):
        LearnerBuilder(tmp_path).grads_accumulation("auto").devices(["cpu", "cpu"]).build(
            Fits(8), AdamConfig().init(), 1e-2
        )


@dataclass
class Pair:
    x: torch.Tensor
    tag: str


Named = namedtuple("Named", "x y")


def test_split_batch_cuts_every_tensor_along_the_first_dimension():
    x = torch.arange(10.0).reshape(5, 2)
    parts = split_batch(
        {"pair": Pair(x, "a"), "named": Named(x, [x[:, 0]]), "t": torch.tensor(3)}, 2
    )
    assert [part["pair"].x.shape[0] for part in parts] == [3, 2]
    assert parts[1]["pair"].tag == "a"
    assert torch.equal(parts[1]["named"].y[0], torch.tensor([6.0, 8.0]))
    assert torch.equal(torch.cat([part["named"].x for part in parts]), x)
    assert all(part["t"].item() == 3 for part in parts)

    class Opaque:
        def __init__(self):
            self.x = x

    with pytest.raises(TrainingError, match="cannot split a Opaque batch"):
        split_batch(Opaque(), 2)


class FailsOnce(Fits):
    """Also runs out of memory once in the middle of a split step (after a first
    micro-batch's backward), as memory fragmentation can make it."""

    def __init__(self, fits: int, at_call: int):
        super().__init__(fits)
        self.calls, self.at_call = 0, at_call

    def train_step(self, batch):
        self.calls += 1
        if self.calls == self.at_call:
            self.raised += 1
            raise torch.OutOfMemoryError("CUDA out of memory (fragmented)")
        return super().train_step(batch)


def test_the_gradients_of_a_half_done_step_are_dropped_before_it_runs_again(tmp_path, quiet):
    # calls: 1 (16 samples, too many), 2 and 3 (iteration 1 in halves), 4 (iteration 2's
    # first half, backpropagated), 5 (its second half: out of memory) -> split into 4
    auto, _ = train(
        tmp_path / "auto", quiet, 16, "auto", make=lambda fits: FailsOnce(fits, at_call=5)
    )
    explicit, _ = train(tmp_path / "explicit", quiet, batch=4, accumulation=4)
    assert auto.raised == 2
    for a, b in zip(auto.parameters(), explicit.parameters()):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=0)
