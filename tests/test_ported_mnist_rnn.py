"""The MNIST RNN port (pytorch/examples `mnist_rnn`): an LSTM reads an image's 28 rows
and classifies it from its last output (batch norm, dropout, two linear layers),
Adadelta with the rate times 0.7 after each epoch, and the script's own torch
DataLoaders, shuffled from the global generator. On MNIST-shaped synthetic images,
ember's run and the script's loop give the same weights bit for bit and the same
figures: every training loss as it is, the epoch values to float rounding."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from ember.record import DefaultRecorder
from ember.train import ClassificationOutput, LearnerBuilder, StartSplit, TrainOutput
from ember.train.logger import read_metric_log
from ember.train.metric import AccuracyMetric, LearningRateMetric, LossMetric

pytestmark = pytest.mark.usefixtures("one_thread")

SEED, EPOCHS, LR, GAMMA = 1, 2, 1.0, 0.7  # the script run with --lr 1.0 (its default: 0.1)
BATCH, TEST_BATCH = 64, 100


def mnist_like(size: int, seed: int) -> TensorDataset:
    """Standardised 28x28 images of 10 classes, each class a bright band at its own
    rows with noise over it: MNIST's shapes, learnable by an RNN reading rows."""
    generator = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 10, (size,), generator=generator)
    images = torch.rand(size, 1, 28, 28, generator=generator) * 0.3
    for index, label in enumerate(labels.tolist()):
        images[index, 0, 2 * label + 2 : 2 * label + 6, 4:24] += 0.7
    return TensorDataset((images - 0.1307) / 0.3081, labels)


class Net(nn.Module):
    """The script's model (its Dropout2d on a [B, 64] input is plain dropout, which
    torch asks for instead)."""

    def __init__(self) -> None:
        super().__init__()
        self.rnn = nn.LSTM(input_size=28, hidden_size=64, batch_first=True)
        self.batchnorm = nn.BatchNorm1d(64)
        self.dropout1 = nn.Dropout(0.25)
        self.dropout2 = nn.Dropout(0.5)
        self.fc1 = nn.Linear(64, 32)
        self.fc2 = nn.Linear(32, 10)

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        output, _ = self.rnn(input.reshape(-1, 28, 28))  # the rows, in order
        output = self.batchnorm(output[:, -1, :])  # the last time step
        output = self.dropout1(output)
        output = F.relu(self.fc1(output))
        output = self.fc2(self.dropout2(output))
        return F.log_softmax(output, dim=1)


class Ported(Net):
    def classify(self, batch) -> ClassificationOutput:
        data, target = batch
        output = self(data)
        return ClassificationOutput(F.nll_loss(output, target), output, target)

    def train_step(self, batch) -> TrainOutput:
        return TrainOutput(self.classify(batch))

    def valid_step(self, batch) -> ClassificationOutput:
        return self.classify(batch)


def loaders() -> tuple[DataLoader, DataLoader]:
    """The script's loaders: torch DataLoaders shuffled from the global generator."""
    train = DataLoader(mnist_like(320, seed=11), batch_size=BATCH, shuffle=True)
    test = DataLoader(mnist_like(250, seed=12), batch_size=TEST_BATCH, shuffle=True)
    return train, test


def plain_script():
    """The script's `main()`, written out: its `train()` and `test()` per epoch, then
    `scheduler.step()`. `train()` also keeps each batch's loss, as its log prints it."""
    torch.manual_seed(SEED)
    train_loader, test_loader = loaders()
    model = Net()
    optimizer = torch.optim.Adadelta(model.parameters(), lr=LR)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=GAMMA)
    history = []
    for _ in range(EPOCHS):
        rate = optimizer.param_groups[0]["lr"]
        model.train()
        losses = []
        for data, target in train_loader:
            optimizer.zero_grad()
            output = model(data)
            loss = F.nll_loss(output, target)
            loss.backward()
            optimizer.step()
            losses.append((loss.item(), len(target)))
        model.eval()
        test_loss, correct, means = 0.0, 0, []
        with torch.no_grad():
            for data, target in test_loader:
                output = model(data)
                test_loss += F.nll_loss(output, target, reduction="sum").item()
                means.append((F.nll_loss(output, target).item(), len(target)))
                pred = output.argmax(dim=1, keepdim=True)
                correct += pred.eq(target.view_as(pred)).sum().item()
        size = len(test_loader.dataset)
        history.append(
            {
                "losses": losses,
                "rate": rate,
                "test_loss": test_loss / size,
                "test_means": means,
                "accuracy": 100.0 * correct / size,
            }
        )
        scheduler.step()
    return model, history


def ember_run(directory, quiet, *, stop_after: int | None = None, resume: bool = False):
    """The port: the script's model, optimizer, scheduler and loaders, and ember's loop
    (checkpointed at each epoch's end; `stop_after` an epoch, or `resume` the run)."""
    torch.manual_seed(SEED)  # the script seeds torch alone; ember.seed would do as well
    train_loader, test_loader = loaders()
    model = Ported()
    optimizer = torch.optim.Adadelta(model.parameters(), lr=LR)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=GAMMA)
    builder = (
        LearnerBuilder(directory)
        .metric_train_numeric(LossMetric())
        .metric_train(LearningRateMetric())
        .metric_valid_numeric(LossMetric())
        .metric_valid_numeric(AccuracyMetric())
        .with_file_checkpointer(DefaultRecorder())
        .num_epochs(EPOCHS)
        .renderer(quiet)
    )
    if resume:
        builder = builder.checkpoint("latest")
    if stop_after is not None:
        builder = builder.listener(StopAfter(builder.interrupter(), stop_after))
    learner = builder.build(model, optimizer, (scheduler, "epoch"))  # StepLR once per epoch
    return learner.fit(train_loader, test_loader), learner


class StopAfter:
    """Stops the run once the training of `epoch` is over (its validation ends it)."""

    def __init__(self, interrupter, epoch: int) -> None:
        self.interrupter, self.epoch = interrupter, epoch

    def on_event(self, event) -> None:
        if isinstance(event, StartSplit) and (event.split, event.epoch) == ("valid", self.epoch):
            self.interrupter.stop("stopped after an epoch")


def test_ember_trains_the_rnn_as_the_script_does_on_the_scripts_loaders(tmp_path, quiet):
    reference, expected = plain_script()
    trained, learner = ember_run(tmp_path / "run", quiet)

    for name, value in reference.state_dict().items():  # BatchNorm's running stats too
        assert torch.equal(trained.state_dict()[name], value), name
    for (epoch, values), want in zip(learner.history, expected, strict=True):
        # every training batch's loss, as the script's log prints it, in the same order
        lines = read_metric_log(tmp_path / "run" / "train" / f"epoch-{epoch}" / "Loss.log")
        assert lines == want["losses"], epoch
        assert values["train"]["Learning Rate"] == want["rate"]
        mean = math.fsum(loss * size for loss, size in want["losses"]) / 320
        assert values["train"]["Loss"] == mean
        # the test pass: ember weighs each batch's mean loss by its images, exactly;
        # the script adds up losses summed in float32: the same figure to float32 rounding
        means = want["test_means"]
        assert values["valid"]["Loss"] == math.fsum(loss * size for loss, size in means) / 250
        torch.testing.assert_close(values["valid"]["Loss"], want["test_loss"], rtol=1e-6, atol=0)
        torch.testing.assert_close(
            values["valid"]["Accuracy"], want["accuracy"], rtol=1e-12, atol=0
        )
    assert [want["rate"] for want in expected] == [1.0, 0.7]
    assert expected[-1]["accuracy"] > expected[0]["accuracy"] + 10  # it learns


def test_a_run_on_the_scripts_loaders_resumed_after_an_epoch_is_the_straight_run(tmp_path, quiet):
    """The checkpoint at an epoch's end holds the global generator's state: the resumed
    run's torch loaders draw the numbers the straight run's draw."""
    straight, _ = ember_run(tmp_path / "straight", quiet)
    _, first = ember_run(tmp_path / "resumed", quiet, stop_after=1)
    assert first.outcome == "stopped: stopped after an epoch"
    resumed, second = ember_run(tmp_path / "resumed", quiet, resume=True)
    assert second.outcome == "completed" and [e for e, _ in second.history] == [1, 2]
    for name, value in straight.state_dict().items():
        assert torch.equal(resumed.state_dict()[name], value), name
