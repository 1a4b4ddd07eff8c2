"""ember's training step dispatches no more torch operations than a hand-written loop
with the same accuracy and loss bookkeeping: the loss guard rides on the loss metric.
Counted with a TorchDispatchMode (every aten op), so the figure is exact, not a timing."""

from __future__ import annotations

import collections
import io
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from ember_testing import Batch, Classifier, load_example

from ember.errors import TrainingError
from ember.train import LearnerBuilder, TrainOutput
from ember.train.metric import AccuracyMetric, LossMetric
from ember.train.renderer import PlainRenderer

# the counter of bench/ops.py: one definition for the benchmark and this test
OpCounter = load_example(Path(__file__).parents[1] / "bench" / "ops.py", "bench_ops").OpCounter


def batches(count: int) -> list[Batch]:
    generator = torch.Generator().manual_seed(0)
    return [
        Batch(torch.randn(32, 8, generator=generator), torch.randint(0, 3, (32,)))
        for _ in range(count)
    ]


def raw_ops(count: int) -> collections.Counter[str]:
    """A hand-written epoch: step, then accuracy and loss summed on the device."""
    torch.manual_seed(0)
    model = Classifier(dropout=0.0)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    data = batches(count)
    with OpCounter() as counter:
        loss_sum = torch.zeros((), dtype=torch.float64)
        correct = torch.zeros((), dtype=torch.int64)
        for batch in data:
            logits = model(batch.inputs)
            loss = F.cross_entropy(logits, batch.targets)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            with torch.no_grad():
                loss_sum += loss.detach() * batch.targets.shape[0]
                correct += (logits.argmax(dim=1) == batch.targets).sum()
        (loss_sum.item(), correct.item())
    return counter.ops


def ember_ops(count: int, tmp_path, model=None) -> collections.Counter[str]:
    """ember's fit of one epoch with Accuracy and Loss on the training split."""
    torch.manual_seed(0)
    model = model if model is not None else Classifier(dropout=0.0)
    learner = (
        LearnerBuilder(tmp_path / f"run-{count}")
        .metric_train_numeric(AccuracyMetric())
        .metric_train_numeric(LossMetric())
        .renderer(PlainRenderer(interval=0.0, stream=io.StringIO()))
        .num_epochs(1)
        .build(model, torch.optim.Adam(model.parameters(), lr=1e-3), 1e-3)
    )
    data = batches(count)
    with OpCounter() as counter:
        learner.fit(data)
    return counter.ops


def per_step(count, small: int = 3, large: int = 7) -> float:
    """Ops per step: the difference between two runs, so once-per-run work cancels."""
    return (sum(count(large).values()) - sum(count(small).values())) / (large - small)


@pytest.fixture(scope="module")
def ember_per_step(tmp_path_factory) -> float:
    """ember's ops per step with a LossMetric reading the backpropagated loss."""
    directory = tmp_path_factory.mktemp("ember-ops")
    return per_step(lambda n: ember_ops(n, directory))


def test_an_ember_step_dispatches_no_more_ops_than_the_raw_loop(ember_per_step):
    raw, ember = per_step(raw_ops), ember_per_step
    # forward, backward and Adam are the same ops; the bookkeeping differs: the raw loop
    # sums on the device (detach, mul, add_; argmax, eq, sum, add_), ember reads each
    # value on the CPU (detach, item; argmax, eq, sum, item) and the guard adds nothing.
    assert ember <= raw, (ember, raw)
    assert raw - ember <= 2, (ember, raw)


class OwnLoss(Classifier):
    """Backpropagates a loss other than the one its output (and LossMetric) holds."""

    def __init__(self, bad_call: int = 0) -> None:
        super().__init__(dropout=0.0)
        self.bad_call, self.calls = bad_call, 0

    def train_step(self, batch):
        self.calls += 1
        item = self.classify(batch)
        loss = item.loss * 1.0
        if self.calls == self.bad_call:
            loss = loss * float("nan")
        return TrainOutput(item, loss=loss)


def test_without_a_metric_reading_the_loss_the_guard_checks_each_step(ember_per_step, tmp_path):
    covered = ember_per_step
    own = per_step(lambda n: ember_ops(n, tmp_path / "own", OwnLoss()))
    # the step's own loss (a mul, and its backward), and the guard's detach and read of it
    assert own - covered == 4, (own, covered)
    with pytest.raises(TrainingError, match="loss is NaN at epoch 1, iteration 4"):
        ember_ops(6, tmp_path / "nan", OwnLoss(bad_call=4))


class NanOnCall(Classifier):
    def __init__(self, bad_call: int) -> None:
        super().__init__(dropout=0.0)
        self.bad_call, self.calls = bad_call, 0

    def train_step(self, batch):
        self.calls += 1
        output = super().train_step(batch)
        if self.calls == self.bad_call:
            output.item.loss = output.item.loss * float("nan")
            output.loss = output.item.loss
        return output


@pytest.mark.cuda
def test_on_cuda_the_loss_metric_names_the_exact_nan_iteration(quiet, tmp_path):
    """On an accelerator the loss values reach the host in bulk; the error still names
    the iteration whose loss was NaN, and no checkpoint of a NaN epoch is written."""
    model = NanOnCall(bad_call=5)
    learner = (
        LearnerBuilder(tmp_path)
        .metric_train_numeric(LossMetric())
        .devices(["cuda"])
        .renderer(quiet)
        .num_epochs(1)
        .build(model, torch.optim.Adam(model.parameters(), lr=1e-3), 1e-3)
    )
    data = [Batch(b.inputs.cuda(), b.targets.cuda()) for b in batches(8)]
    with pytest.raises(TrainingError, match="loss is NaN at epoch 1, iteration 5"):
        learner.fit(data)
    assert learner.guard.covered
