"""Callbacks: their hooks, what they may change, EMA, the gradient norm, custom
optimization, and the errors for what cannot work."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from ember_testing import Batch, BlobBatcher, BlobDataset, Classifier

import ember
from ember.data import DataLoaderBuilder
from ember.errors import ConfigError, TrainingError
from ember.optim import AdamConfig, SgdConfig
from ember.record import DefaultRecorder
from ember.train import ClassificationOutput, LearnerBuilder, TrainOutput
from ember.train.callbacks import EMA, HOOKS, Callback
from ember.train.logger import read_metric_log
from ember.train.metric import GradNormMetric, LossMetric
from ember.train.renderer.silent import SilentRenderer

pytestmark = pytest.mark.usefixtures("one_thread")


class Recorder:
    """Writes down every hook it gets, with where the loop was (no base class needed)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int, int]] = []

    def __getattr__(self, name):
        if name in HOOKS:
            return lambda ctx: self.calls.append((name, ctx.epoch, ctx.iteration))
        raise AttributeError(name)


def builder(directory, quiet, **options):
    return (
        LearnerBuilder(directory, **options)
        .metric_train_numeric(LossMetric())
        .metric_valid_numeric(LossMetric())
        .renderer(quiet)
    )


def test_the_hooks_come_in_the_loops_order(tmp_path, loaders, quiet):
    recorder = Recorder()
    ember.seed(0)
    learner = (
        builder(tmp_path, quiet)
        .callback(recorder)
        .grads_accumulation(4)  # 7 batches: steps of 4 and 3 batches
        .num_epochs(2)
        .build(Classifier(), SgdConfig(), 0.1)
    )
    learner.fit(*loaders)
    names = [name for name, _, _ in recorder.calls]
    assert names[0] == "on_fit_start" and names[-1] == "on_fit_end"
    epoch_one = [call for call in recorder.calls if call[1] == 1 and call[0] != "on_fit_start"]
    backward = ["on_before_backward", "on_after_backward"]
    step = ["on_before_optimizer_step", "on_after_optimizer_step"]
    assert [name for name, _, _ in epoch_one] == [
        "on_epoch_start",
        *backward * 4,
        *step,
        *backward * 3,
        *step,
        "on_validation_start",
        "on_validation_end",
        "on_epoch_end",
    ]
    steps = [(epoch, it) for name, epoch, it in recorder.calls if name == "on_after_optimizer_step"]
    assert steps == [(1, 4), (1, 7), (2, 4), (2, 7)]  # after the last batch of each group


def test_a_callback_may_change_the_gradients(tmp_path, loaders, quiet):
    class Freeze(Callback):
        """Zeroes the gradient of the first layer before every step."""

        def on_before_optimizer_step(self, ctx):
            for param in ctx.model.net[0].parameters():
                param.grad.zero_()

    ember.seed(0)
    model = Classifier()
    first = copy.deepcopy(model.net[0].state_dict())
    last = copy.deepcopy(model.net[-1].state_dict())
    builder(tmp_path, quiet).callback(Freeze()).build(model, SgdConfig(), 0.5).fit(*loaders)
    for key, value in model.net[0].state_dict().items():
        assert torch.equal(value, first[key]), key  # SGD without momentum: no change at all
    assert not torch.equal(model.net[-1].weight, last["weight"])


def test_the_ema_is_the_average_its_formula_gives(tmp_path, loaders, quiet):
    """The shadow against the formula applied by hand to the weights after each step."""

    class Weights(Callback):
        def __init__(self):
            self.seen = []

        def on_after_optimizer_step(self, ctx):
            self.seen.append({k: v.clone() for k, v in ctx.model.state_dict().items()})

    ember.seed(0)
    model = Classifier()
    expected = {k: v.clone().double() for k, v in model.state_dict().items()}
    ema, weights = EMA(decay=0.8, every=2), Weights()
    (
        builder(tmp_path, quiet)
        .callback(ema)
        .callback(weights)
        .num_epochs(2)
        .build(model, AdamConfig(), 1e-2)
        .fit(*loaders)
    )
    assert len(weights.seen) == 14 and ema.updates == 7
    for n, state in enumerate(weights.seen[1::2]):
        decay = min(0.8, (1 + n) / (10 + n))
        for key in expected:
            expected[key] = decay * expected[key] + (1 - decay) * state[key].double()
    for key, value in ema.shadow.items():
        assert torch.allclose(value.double(), expected[key], rtol=1e-5, atol=1e-6), key
    averaged = ema.copy_to(copy.deepcopy(model))
    assert torch.equal(averaged.net[0].weight, ema.shadow["net.0.weight"])
    assert not torch.equal(averaged.net[0].weight, model.net[0].weight)


def test_validating_with_the_ema_measures_the_averaged_weights(tmp_path, loaders, quiet):
    ember.seed(0)
    model = Classifier(dropout=0.0)
    ema = EMA(decay=0.9, validate_with_ema=True)
    learner = builder(tmp_path, quiet).callback(ema).build(model, AdamConfig(), 1e-2)
    learner.fit(*loaders)
    averaged = ema.copy_to(copy.deepcopy(model)).eval()
    valid = loaders[1]
    with torch.no_grad():
        total = sum(
            F.cross_entropy(averaged(batch.inputs), batch.targets, reduction="sum").item()
            for batch in valid
        )
    assert learner.history[-1][1]["valid"]["Loss"] == pytest.approx(total / 90, rel=1e-5)
    trained = learner.history[-1][1]["valid"]["Loss"]
    with torch.no_grad():  # the model keeps its trained weights: they validate otherwise
        own = sum(
            F.cross_entropy(model(batch.inputs), batch.targets, reduction="sum").item()
            for batch in valid
        )
    assert own / 90 != pytest.approx(trained, rel=1e-5)


def test_the_gradient_norm_is_taken_before_clipping(tmp_path, quiet):
    """The first step's logged norm against the norm computed by hand on the same batch."""
    data = BlobDataset(64)
    loader = DataLoaderBuilder(BlobBatcher()).batch_size(32).build(data)
    ember.seed(0)
    model = Classifier(dropout=0.0)
    reference = copy.deepcopy(model)
    (
        builder(tmp_path, quiet)
        .metric_train_numeric(GradNormMetric())
        .grad_clipping(norm=1e-3)
        .build(model, SgdConfig(), 0.1)
        .fit(loader)
    )
    batch = next(iter(loader))
    F.cross_entropy(reference(batch.inputs), batch.targets).backward()
    norm = torch.linalg.vector_norm(
        torch.stack([p.grad.norm() for p in reference.parameters()])
    ).item()
    rows = read_metric_log(tmp_path / "train" / "epoch-1" / "Grad_Norm.log")
    assert len(rows) == 2 and rows[0] == (pytest.approx(norm, rel=1e-5), 1.0)
    assert norm > 1e-2  # far above the clipping norm: the value is the unclipped one


def test_under_accumulation_only_the_batches_that_step_weigh(tmp_path, loaders, quiet):
    ember.seed(0)
    learner = (
        builder(tmp_path, quiet)
        .metric_train_numeric(GradNormMetric())
        .grads_accumulation(3)  # 7 batches: steps after batches 3, 6 and 7
        .build(Classifier(), SgdConfig(), 0.1)
    )
    learner.fit(*loaders)
    rows = read_metric_log(tmp_path / "train" / "epoch-1" / "Grad_Norm.log")
    assert [weight for _, weight in rows] == [0, 0, 1, 0, 0, 1, 1]
    steps = [value for value, weight in rows if weight]
    assert rows[3][0] == rows[2][0]  # a batch that ends no step shows the last step's norm
    assert learner.history[0][1]["train"]["Grad Norm"] == pytest.approx(sum(steps) / 3)


# Custom optimization ----------------------------------------------------------------


class TwoHeads(torch.nn.Module):
    """Two parts, two optimizers, one step that steps both."""

    def __init__(self, calls=("backward", "step")):
        super().__init__()
        self.body = torch.nn.Linear(8, 3)
        self.head = torch.nn.Linear(8, 3)
        self.calls = calls

    def train_step(self, batch: Batch, ctx):
        loss_body = F.cross_entropy(self.body(batch.inputs), batch.targets)
        loss_head = F.cross_entropy(self.head(batch.inputs), batch.targets)
        if "backward" in self.calls:
            ctx.backward(loss_body, "body")
            ctx.backward(loss_head, "head")
        if "step" in self.calls:
            ctx.step("body")
            ctx.step("head")
        if "step twice" in self.calls:
            ctx.step("body")
        logits = self.body(batch.inputs)
        return TrainOutput(ClassificationOutput(loss_body.detach(), logits, batch.targets))

    def valid_step(self, batch):
        logits = self.body(batch.inputs)
        return ClassificationOutput(F.cross_entropy(logits, batch.targets), logits, batch.targets)


def optimizers(model, lr=0.1):
    return {
        "body": torch.optim.SGD(model.body.parameters(), lr=lr),
        "head": torch.optim.SGD(model.head.parameters(), lr=lr),
    }


def test_custom_optimization_equals_the_same_loop_by_hand(tmp_path, loaders, quiet):
    ember.seed(0)
    model = TwoHeads()
    by_hand = copy.deepcopy(model)
    learner = (
        builder(tmp_path, quiet)
        .grads_accumulation(2)
        .grad_clipping(norm=0.5)
        .build(model, optimizers(model), {"body": 0.1, "head": 0.05})
    )
    learner.fit(*loaders)
    hand = {"body": torch.optim.SGD(by_hand.body.parameters(), lr=0.1)}
    hand["head"] = torch.optim.SGD(by_hand.head.parameters(), lr=0.05)
    loaders[0].sampler.set_epoch(1)  # the order of the Learner's epoch 1
    batches = list(loaders[0])
    for group in (batches[0:2], batches[2:4], batches[4:6], batches[6:7]):
        sizes = [len(batch.targets) for batch in group]
        for batch, size in zip(group, sizes):
            share = size / sum(sizes)
            for name in ("body", "head"):
                part = getattr(by_hand, name)
                (F.cross_entropy(part(batch.inputs), batch.targets) * share).backward()
        for name in ("body", "head"):
            params = list(getattr(by_hand, name).parameters())
            torch.nn.utils.clip_grad_norm_(params, 0.5)
            hand[name].step()
            hand[name].zero_grad()
    for key, value in by_hand.state_dict().items():
        assert torch.allclose(model.state_dict()[key], value, atol=1e-6), key
    assert learner.history[0][1]["train"]["Loss"] > 0


@pytest.mark.parametrize(
    ("calls", "message"),
    [
        (("step",), "never called ctx.backward(loss)"),
        (("backward",), "never called ctx.step(optimizer)"),
        (("backward", "step", "step twice"), "ctx.step('body') twice"),
    ],
)
def test_a_step_that_misuses_its_context_is_stopped_at_once(
    tmp_path, loaders, quiet, calls, message
):
    model = TwoHeads(calls)
    learner = builder(tmp_path, quiet).build(model, optimizers(model), 0.1)
    with pytest.raises(TrainingError, match=message.replace("(", r"\(").replace(")", r"\)")):
        learner.fit(*loaders)
    assert learner.iteration == 1


def test_build_refuses_what_custom_optimization_cannot_run(tmp_path):
    model = TwoHeads()
    with pytest.raises(ConfigError, match=r"must take the step context"):
        LearnerBuilder(tmp_path).build(Classifier(), optimizers(model), 0.1)
    with pytest.raises(ConfigError, match=r"build\(model, \{'main': optimizer\}, lr\)"):
        LearnerBuilder(tmp_path).build(model, torch.optim.SGD(model.parameters(), lr=0.1), 0.1)
    with pytest.raises(ConfigError, match=r"one rate per optimizer"):
        LearnerBuilder(tmp_path).build(model, optimizers(model), {"body": 0.1})
    both = {
        "body": torch.optim.SGD(model.parameters(), lr=0.1),
        "head": torch.optim.SGD(model.head.parameters(), lr=0.1),
    }
    with pytest.raises(ConfigError, match=r"'body' and 'head' both update a tensor"):
        LearnerBuilder(tmp_path).build(model, both, 0.1)
    configs = {"body": AdamConfig(), "head": AdamConfig()}
    with pytest.raises(ConfigError, match=r"ember would bind it to every parameter"):
        LearnerBuilder(tmp_path).build(model, configs, 0.1)
    learner = (
        LearnerBuilder(tmp_path)
        .metric_train(GradNormMetric())
        .renderer(SilentRenderer())
        .build(model, optimizers(model), 0.1)
    )
    data = DataLoaderBuilder(BlobBatcher()).batch_size(32).build(BlobDataset(64))
    with pytest.raises(
        ConfigError, match=r"name the one to measure, e.g. GradNormMetric\('body'\)"
    ):
        learner.fit(data)


def test_the_builder_refuses_what_cannot_be_a_callback(tmp_path):
    builder = LearnerBuilder(tmp_path)
    with pytest.raises(ConfigError, match="EMA is a class, not a callback"):
        builder.callback(EMA)

    class Misspelt(Callback):
        def on_epoch_begin(self, ctx):
            pass

    with pytest.raises(
        ConfigError, match=r"`on_epoch_begin`, which is no callback hook \(did you mean `on_epoch_"
    ):
        builder.callback(Misspelt())
    with pytest.raises(ConfigError, match="defines none of the hooks"):
        builder.callback(Callback())

    class HalfState(Callback):
        def on_fit_end(self, ctx):
            pass

        def state_dict(self):
            return {}

    with pytest.raises(ConfigError, match="no `load_state_dict`"):
        builder.callback(HalfState())
    with pytest.raises(ConfigError, match="register it with metric_train"):
        builder.metric_valid(GradNormMetric())
    ema = EMA()
    builder.callback(ema)
    with pytest.raises(ConfigError, match="registered twice"):
        builder.callback(ema)
    with pytest.raises(ConfigError, match=r"decay=\.\.\.\) must be a number in \[0, 1\)"):
        EMA(decay=1.0)


def test_a_resumed_run_says_which_callback_state_it_does_not_use(tmp_path, loaders, quiet):
    ember.seed(0)
    first = builder(tmp_path, quiet).with_file_checkpointer(DefaultRecorder()).callback(EMA())
    first.build(Classifier(), AdamConfig(), 1e-2).fit(*loaders)
    again = (
        builder(tmp_path, quiet)
        .with_file_checkpointer(DefaultRecorder())
        .num_epochs(2)
        .checkpoint("latest")
    )
    again.build(Classifier(), AdamConfig(), 1e-2).fit(*loaders)
    log = (tmp_path / "experiment.log").read_text()
    assert "holds the state of callbacks (EMA) that this run does not register" in log


def test_a_non_finite_loss_skips_the_steps_it_would_reach(tmp_path, quiet, capsys):
    class Poisoned(TwoHeads):
        """The head's loss is NaN at the second batch."""

        def train_step(self, batch, ctx):
            loss_body = F.cross_entropy(self.body(batch.inputs), batch.targets)
            loss_head = F.cross_entropy(self.head(batch.inputs), batch.targets)
            if ctx.iteration == 2:
                loss_head = loss_head * float("nan")
            ctx.backward(loss_body, "body")
            ctx.backward(loss_head, "head")
            ctx.step("body")
            ctx.step("head")
            self.after.append((self.body.weight.clone(), self.head.weight.clone()))
            logits = self.body(batch.inputs).detach()
            return TrainOutput(ClassificationOutput(loss_body.detach(), logits, batch.targets))

    model = Poisoned()
    model.after = []
    loader = DataLoaderBuilder(BlobBatcher()).batch_size(32).build(BlobDataset(96))
    learner = (
        LearnerBuilder(tmp_path)
        .renderer(quiet)
        .nonfinite_loss("skip")
        .build(model, optimizers(model), 0.1)
    )
    learner.fit(loader)
    (body_1, head_1), (body_2, head_2), _ = model.after
    assert torch.equal(head_1, head_2)  # the head's step was skipped
    assert not torch.equal(body_1, body_2)  # the body's was not
    assert "Skipped the step of the optimizer 'head' at epoch 1, iteration 2" in (
        capsys.readouterr().err
    )
