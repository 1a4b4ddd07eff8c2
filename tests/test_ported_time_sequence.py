"""The time-sequence prediction port (pytorch/examples `time_sequence_prediction`):
sine waves, a model of two LSTM cells in double precision, L-BFGS at a rate of 0.8,
the whole training set as one batch a step and a test pass after each step. ember's
run gives the weights and losses of the script's loop bit for bit, and evaluates the
loss as many times; what cannot work with a closure is refused at build."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import ember
from ember.errors import ConfigError, TrainingError
from ember.record import DefaultRecorder
from ember.train import LearnerBuilder, RegressionOutput, StartSplit, TrainOutput
from ember.train.logger import read_metric_log
from ember.train.metric import LossMetric

pytestmark = pytest.mark.usefixtures("one_thread")

T, L, N = 20, 100, 12  # the script's period; shorter and fewer waves than its 1000 and 100
FUTURE = 30  # time steps the test pass predicts beyond its input (the script: 1000)
STEPS = 3


def sine_waves() -> np.ndarray:
    """The script's `generate_sine_wave.py`: N shifted sine waves of length L."""
    np.random.seed(2)
    x = np.empty((N, L), "int64")
    x[:] = np.array(range(L)) + np.random.randint(-4 * T, 4 * T, N).reshape(N, 1)
    return np.sin(x / 1.0 / T).astype("float64")


def splits() -> tuple[tuple[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]:
    """The script's data: the first 3 waves test, the others train; the target of each
    time step is the next one."""
    data = sine_waves()
    train = torch.from_numpy(data[3:, :-1]), torch.from_numpy(data[3:, 1:])
    test = torch.from_numpy(data[:3, :-1]), torch.from_numpy(data[:3, 1:])
    return train, test


class Sequence(nn.Module):
    """The script's model: two LSTM cells of 51 and a linear read-out, run step by step;
    `future` steps more are predicted from its own outputs."""

    def __init__(self) -> None:
        super().__init__()
        self.lstm1 = nn.LSTMCell(1, 51)
        self.lstm2 = nn.LSTMCell(51, 51)
        self.linear = nn.Linear(51, 1)
        self.evaluations = 0

    def forward(self, input: torch.Tensor, future: int = 0) -> torch.Tensor:
        self.evaluations += 1
        outputs = []
        h_t = torch.zeros(input.size(0), 51, dtype=torch.double)
        c_t = torch.zeros(input.size(0), 51, dtype=torch.double)
        h_t2 = torch.zeros(input.size(0), 51, dtype=torch.double)
        c_t2 = torch.zeros(input.size(0), 51, dtype=torch.double)
        for input_t in input.split(1, dim=1):
            h_t, c_t = self.lstm1(input_t, (h_t, c_t))
            h_t2, c_t2 = self.lstm2(h_t, (h_t2, c_t2))
            output = self.linear(h_t2)
            outputs += [output]
        for _ in range(future):
            h_t, c_t = self.lstm1(output, (h_t, c_t))
            h_t2, c_t2 = self.lstm2(h_t, (h_t2, c_t2))
            output = self.linear(h_t2)
            outputs += [output]
        return torch.cat(outputs, dim=1)


class Ported(Sequence):
    """The model with ember's two steps: the training loss, and the script's test loss
    (the prediction beyond the input is what the script plots)."""

    def train_step(self, batch) -> TrainOutput:
        inputs, target = batch
        return TrainOutput(RegressionOutput(F.mse_loss(self(inputs), target), inputs, target))

    def valid_step(self, batch) -> RegressionOutput:
        inputs, target = batch
        prediction = self(inputs, future=FUTURE)[:, :-FUTURE]
        return RegressionOutput(F.mse_loss(prediction, target), prediction, target)


def plain_script(steps: int = STEPS):
    """The script's loop, written out: each step one `optimizer.step(closure)`, whose
    closure clears the gradients, runs the forward and backward and returns the loss
    (the script prints it at every call); then the test loss under `no_grad`."""
    np.random.seed(0)
    torch.manual_seed(0)
    (inputs, target), (test_input, test_target) = splits()
    seq = Sequence()
    seq.double()
    criterion = nn.MSELoss()
    optimizer = torch.optim.LBFGS(seq.parameters(), lr=0.8)
    history = []
    for _ in range(steps):
        printed = []

        def closure():
            optimizer.zero_grad()
            out = seq(inputs)
            loss = criterion(out, target)
            printed.append(loss.item())  # print('loss:', loss.item())
            loss.backward()
            return loss

        first = optimizer.step(closure)
        with torch.no_grad():
            pred = seq(test_input, future=FUTURE)
            test_loss = criterion(pred[:, :-FUTURE], test_target)
        history.append({"first": first.item(), "printed": printed, "test": test_loss.item()})
    return seq, history


def ember_run(directory, quiet, steps: int = STEPS, clip: float | None = None, **resumes):
    """The port's run; `stop=True` stops it after its first step, `resume=True`
    resumes it (both checkpoint with DefaultRecorder)."""
    ember.seed(0)
    train, test = splits()
    model = Ported().double()
    builder = (
        LearnerBuilder(directory)
        .metric_train_numeric(LossMetric())
        .metric_valid_numeric(LossMetric())
        .num_epochs(steps)
        .renderer(quiet)
    )
    if clip is not None:
        builder = builder.grad_clipping(norm=clip)
    if resumes:
        builder = builder.with_file_checkpointer(DefaultRecorder())
    if resumes.get("resume"):
        builder = builder.checkpoint("latest")
    if resumes.get("stop"):
        builder = builder.listener(StopAfterFirst(builder.interrupter()))
    learner = builder.build(model, torch.optim.LBFGS(model.parameters(), lr=0.8))
    return learner.fit([train], [test]), learner


def test_ember_steps_lbfgs_as_the_script_does(tmp_path, quiet):
    reference, expected = plain_script()
    model, learner = ember_run(tmp_path / "run", quiet)

    for name, value in reference.state_dict().items():
        assert torch.equal(model.state_dict()[name], value), name
    assert [epoch for epoch, _ in learner.history] == [1, 2, 3]
    for (epoch, values), want in zip(learner.history, expected):
        # The step's Loss is the closure's first evaluation: what optimizer.step(closure)
        # returns, the first loss the script prints at each step. The metric line holds
        # it as it is; the epoch value weighs it by its 9 waves (to float rounding).
        line = read_metric_log(tmp_path / "run" / "train" / f"epoch-{epoch}" / "Loss.log")
        assert line == [(want["first"], 9)] and want["first"] == want["printed"][0]
        line = read_metric_log(tmp_path / "run" / "valid" / f"epoch-{epoch}" / "Loss.log")
        assert line == [(want["test"], 3)]
        torch.testing.assert_close(values["train"]["Loss"], want["first"], rtol=1e-15, atol=0)
        torch.testing.assert_close(values["valid"]["Loss"], want["test"], rtol=1e-15, atol=0)
    assert len(expected[0]["printed"]) > 1  # L-BFGS evaluated the loss several times a step
    # ember evaluates as often as the script: each closure call, each test pass, and one
    # validation batch checked before training (on a copy of the model, whose count it keeps).
    script_calls = sum(len(step["printed"]) for step in expected) + STEPS
    assert model.evaluations == reference.evaluations == script_calls


def test_clipping_bounds_every_evaluation_of_the_step(tmp_path, quiet):
    """With grad_clipping, the gradients L-BFGS reads are clipped after each evaluation,
    as a script that clips inside its closure clips them."""
    torch.manual_seed(0)
    (inputs, target), _ = splits()
    reference = Sequence().double()
    optimizer = torch.optim.LBFGS(reference.parameters(), lr=0.8)

    def closure():
        optimizer.zero_grad()
        loss = F.mse_loss(reference(inputs), target)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(reference.parameters(), 0.05)
        return loss

    for _ in range(2):
        optimizer.step(closure)
    model, _ = ember_run(tmp_path / "run", quiet, steps=2, clip=0.05)
    for name, value in reference.state_dict().items():
        assert torch.equal(model.state_dict()[name], value), name


class Custom(Ported):
    """The step under custom optimization: it passes its own closure to ctx.step."""

    def train_step(self, batch, ctx) -> TrainOutput:
        inputs, target = batch

        def closure():
            ctx.optimizers["main"].zero_grad()
            loss = F.mse_loss(self(inputs), target)
            ctx.backward(loss, "main")
            return loss

        first = ctx.step("main", closure=closure)
        return TrainOutput(RegressionOutput(first, inputs, target))


def test_custom_optimization_passes_its_closure_through_ctx_step(tmp_path, quiet):
    reference, expected = plain_script(steps=2)
    ember.seed(0)
    train, test = splits()
    model = Custom().double()
    learner = (
        LearnerBuilder(tmp_path / "run")
        .metric_train_numeric(LossMetric())
        .num_epochs(2)
        .renderer(quiet)
        .build(model, {"main": torch.optim.LBFGS(model.parameters(), lr=0.8)})
    )
    learner.fit([train], [test])
    for name, value in reference.state_dict().items():
        assert torch.equal(model.state_dict()[name], value), name
    for epoch, step in enumerate(expected, start=1):
        line = read_metric_log(tmp_path / "run" / "train" / f"epoch-{epoch}" / "Loss.log")
        assert line == [(step["first"], 9)]  # what ctx.step returned: the first evaluation


def test_a_custom_step_without_the_closure_is_told_how_to_pass_it(tmp_path, quiet):
    class NoClosure(Ported):
        def train_step(self, batch, ctx):
            ctx.step("main")

    model = NoClosure().double()
    learner = (
        LearnerBuilder(tmp_path / "run")
        .renderer(quiet)
        .build(model, {"main": torch.optim.LBFGS(model.parameters(), lr=0.8)})
    )
    with pytest.raises(TrainingError, match=r"ctx.step\('main'\) steps a LBFGS.*closure=closure"):
        learner.fit([splits()[0]])


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("grads_accumulation", 2, r"LBFGS steps with a closure.*cannot accumulate"),
        ("grads_accumulation", "auto", r"LBFGS steps with a closure.*cannot accumulate"),
        ("mixed_precision", "fp16", r"LBFGS steps with a closure.*GradScaler refuses one"),
    ],
)
def test_what_cannot_work_with_a_closure_is_refused_at_build(tmp_path, option, value, message):
    model = Ported().double()
    builder = getattr(LearnerBuilder(tmp_path), option)(value)
    with pytest.raises(ConfigError, match=message):
        builder.build(model, torch.optim.LBFGS(model.parameters(), lr=0.8))


def test_the_learning_rate_range_test_steps_lbfgs_with_its_closure(tmp_path, quiet):
    model = Ported().double()
    learner = (
        LearnerBuilder(tmp_path)
        .renderer(quiet)
        .build(model, torch.optim.LBFGS(model.parameters(), lr=0.8))
    )
    train = splits()[0]
    result = learner.lr_find([train] * 3, start=0.01, end=1.0, steps=3)
    assert result.lrs == pytest.approx([0.01, 0.1, 1.0])
    assert len(result.losses) == 3


class StopAfterFirst:
    """Stops the run once its first step is taken (its test pass ends it)."""

    def __init__(self, interrupter) -> None:
        self.interrupter = interrupter

    def on_event(self, event) -> None:
        if isinstance(event, StartSplit) and (event.split, event.epoch) == ("valid", 1):
            self.interrupter.stop("stopped after a step")


def test_a_run_stopped_after_a_step_resumes_to_the_same_weights(tmp_path, quiet):
    """L-BFGS's state (its curvature pairs) and the double weights are checkpointed
    exactly: a run stopped after its first step and resumed ends as one never stopped."""

    straight, whole = ember_run(tmp_path / "straight", quiet, stop=False)
    _, first = ember_run(tmp_path / "resumed", quiet, stop=True)
    assert first.outcome == "stopped: stopped after a step"
    resumed, second = ember_run(tmp_path / "resumed", quiet, resume=True)
    assert second.outcome == "completed"
    assert second.history == whole.history
    for name, value in straight.state_dict().items():
        assert torch.equal(resumed.state_dict()[name], value), name
