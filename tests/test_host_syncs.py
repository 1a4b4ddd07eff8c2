"""Between epoch ends the loop never waits for an accelerator: metric values and the
loss guard's flags reach the host through non-blocking copies read once they arrived,
and a checkpoint waits once for its whole snapshot.

Driven on the CPU by a stand-in for an accelerator (`ember.train.host`'s seam): every
tensor counts as device memory, every copy's completion is reported late (the first
look at an event says "not yet"), and each wait and each direct read of a tensor
(`item`, `tolist`, `float`, `bool`, ...) is recorded with where it came from."""

from __future__ import annotations

import io
import traceback

import pytest
import torch
from ember_testing import Batch, Classifier
from torch.overrides import TorchFunctionMode

from ember.errors import TrainingError
from ember.record import CompactRecorder, DefaultRecorder
from ember.train import LearnerBuilder, TrainOutput, host, processor
from ember.train.metric import AccuracyMetric, LossMetric
from ember.train.renderer import PlainRenderer

READS = {
    torch.Tensor.item,
    torch.Tensor.tolist,
    torch.Tensor.__float__,
    torch.Tensor.__int__,
    torch.Tensor.__bool__,
    torch.Tensor.__index__,
    torch.Tensor.numpy,
    torch.Tensor.cpu,
}


def caller() -> str | None:
    """Where in ember a tensor was read: the frame that called the read, when it is
    ember's own code (reads inside torch, such as an optimizer reading its CPU step
    counter, are the same in a hand-written loop). None otherwise, and for random
    generator states, which live in host memory on every device."""
    frame = traceback.extract_stack()[-3]
    path = frame.filename.replace("\\", "/")
    if "/src/ember/" not in path or path.endswith("/ember/rng.py"):
        return None
    return f"{path.rsplit('/src/ember/', 1)[-1]}:{frame.lineno} {frame.name}"


class StandIn(TorchFunctionMode):
    """An accelerator stand-in: host memory is only what `host_buffer` hands out."""

    def __init__(self, quick: bool) -> None:
        super().__init__()
        self.quick = quick
        self.done = 0
        self.waits: list[str] = []
        self.reads: list[str] = []
        self.buffers: set[int] = set()
        self.events = 0

    def install(self, monkeypatch) -> None:
        monkeypatch.setattr(host, "on_host", lambda tensor: False)
        monkeypatch.setattr(host, "host_buffer", self.host_buffer)
        monkeypatch.setattr(host, "record_event", lambda device: Event(self))
        monkeypatch.setattr(processor, "TICK", 0.0)  # a tick after every update

    def host_buffer(self, size: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        buffer = torch.empty(size, dtype=dtype)
        self.buffers.add(buffer.untyped_storage().data_ptr())
        return buffer

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in READS and isinstance(args[0], torch.Tensor):
            where = caller()
            if where is not None and args[0].untyped_storage().data_ptr() not in self.buffers:
                self.reads.append(where)
        return func(*args, **(kwargs or {}))

    @property
    def syncs(self) -> list[str]:
        return self.waits + self.reads


class Event:
    """Work queued on the stand-in's stream up to this event. A quick device has it
    done by the second look; a slow one only once waited for. Waiting for an event
    completes every event before it (one stream); each `synchronize` is counted."""

    def __init__(self, owner: StandIn) -> None:
        owner.events += 1
        self.owner, self.number, self.looks = owner, owner.events, 0

    def query(self) -> bool:
        self.looks += 1
        return self.number <= self.owner.done or (self.owner.quick and self.looks > 1)

    def synchronize(self) -> None:
        self.owner.waits.append("".join(traceback.format_stack(limit=3)[:1]).strip())
        self.owner.done = max(self.owner.done, self.number)


def data(count: int, seed: int = 0) -> list[Batch]:
    generator = torch.Generator().manual_seed(seed)
    return [
        Batch(torch.randn(16, 8, generator=generator), torch.randint(0, 3, (16,)))
        for _ in range(count)
    ]


def learner(directory, model=None, epochs: int = 2, every: int | None = None, recorder=None):
    torch.manual_seed(0)
    model = model if model is not None else Classifier(dropout=0.0)
    builder = (
        LearnerBuilder(directory)
        .metric_train_numeric(AccuracyMetric())
        .metric_train_numeric(LossMetric())
        .metric_valid_numeric(AccuracyMetric())
        .metric_valid_numeric(LossMetric())
        .renderer(PlainRenderer(interval=0.0, stream=io.StringIO()))
        .with_file_checkpointer(recorder or CompactRecorder())
        .num_epochs(epochs)
    )
    if every is not None:
        builder = builder.checkpoint_every(steps=every)
    return builder.build(model, torch.optim.Adam(model.parameters(), lr=1e-3), 1e-3)


def metric_logs(directory) -> dict:
    return {
        path.relative_to(directory): path.read_text() for path in directory.glob("*/epoch-*/*.log")
    }


@pytest.mark.parametrize("quick", [True, False], ids=["quick-device", "slow-device"])
def test_a_fit_waits_twice_an_epoch_and_once_a_checkpoint(tmp_path, monkeypatch, quick):
    plain = learner(tmp_path / "plain")
    plain.fit(data(30), data(6, seed=1))
    expected = {
        path.relative_to(tmp_path / "plain"): path.read_text()
        for path in (tmp_path / "plain").glob("*/epoch-*/*.log")
    }

    stand_in = StandIn(quick)
    stand_in.install(monkeypatch)
    run = learner(tmp_path / "stand-in")
    with stand_in:
        run.fit(data(30), data(6, seed=1))

    # Before the first step, the first training and validation outputs are checked at
    # once (3 waits: a wrong model fails before it trains). Then each of the 2 epochs
    # ends its training and its validation split with one wait each, and waits once for
    # its checkpoint's snapshot: nothing in between, nothing per step.
    assert len(stand_in.syncs) <= 3 + 2 * (2 + 1), stand_in.syncs
    assert not stand_in.reads, stand_in.reads
    if quick:  # the values travelled tick by tick, not all at a split's end
        assert stand_in.events > 20
    # What the user sees is what a run reading every value at once writes.
    written = {
        path.relative_to(tmp_path / "stand-in"): path.read_text()
        for path in (tmp_path / "stand-in").glob("*/epoch-*/*.log")
    }
    assert written == expected
    assert len(expected) == 8
    assert all(
        len(text.splitlines()) == 30 for name, text in expected.items() if "train" in str(name)
    )


@pytest.mark.parametrize("quick", [True, False], ids=["quick-device", "slow-device"])
def test_a_checkpoint_inside_an_epoch_waits_once(tmp_path, monkeypatch, quick):
    """The values of the steps since the last tick start to the host before the
    snapshot, whose one wait brings them too; their lines are written before the
    checkpoint, which counts them."""
    plain = learner(tmp_path / "plain", every=7)
    plain.fit(data(30), data(6, seed=1))
    expected = metric_logs(tmp_path / "plain")

    stand_in = StandIn(quick)
    stand_in.install(monkeypatch)
    monkeypatch.setattr(processor, "TICK", 3600.0)  # values wait for the checkpoints
    run = learner(tmp_path / "stand-in", every=7)
    with stand_in:
        run.fit(data(30), data(6, seed=1))
    # 3 start-up checks; per epoch 2 split ends, the epoch's checkpoint and 4 inside it
    # (after steps 7, 14, 21 and 28), one wait each
    assert len(stand_in.syncs) <= 3 + 2 * (2 + 1 + 4), stand_in.syncs
    assert not stand_in.reads, stand_in.reads
    assert metric_logs(tmp_path / "stand-in") == expected


class Crash(Exception):
    pass


class CrashAt:
    """A listener that fails the run when `iteration` is processed (no stop, no
    checkpoint: as a kill would end it)."""

    def __init__(self, iteration: int) -> None:
        self.iteration = iteration

    def on_event(self, event) -> None:
        if getattr(event, "iteration", None) == self.iteration:
            raise Crash


def test_a_run_resumed_from_a_checkpoint_inside_an_epoch_counts_every_line(tmp_path):
    """The lines a checkpoint inside an epoch counts are those written before it: a run
    resumed from it ends with the files and weights of one never stopped."""
    train, valid = data(30), data(6, seed=1)  # (their targets come from the global RNG)
    whole = learner(tmp_path / "whole", epochs=1, every=7, recorder=DefaultRecorder())
    whole.fit(train, valid)

    def builder():
        return (
            LearnerBuilder(tmp_path / "resumed")
            .metric_train_numeric(AccuracyMetric())
            .metric_train_numeric(LossMetric())
            .metric_valid_numeric(AccuracyMetric())
            .metric_valid_numeric(LossMetric())
            .renderer(PlainRenderer(interval=3600.0, stream=io.StringIO()))
            .with_file_checkpointer(DefaultRecorder())
            .checkpoint_every(steps=7)
            .num_epochs(1)
        )

    torch.manual_seed(0)
    model = Classifier(dropout=0.0)
    crashing = builder().listener(CrashAt(17))  # after the checkpoint of step 14
    with pytest.raises(Crash):
        crashing.build(model, torch.optim.Adam(model.parameters(), lr=1e-3), 1e-3).fit(train, valid)
    lines = (tmp_path / "resumed" / "train" / "epoch-1" / "Loss.log").read_text()
    assert len(lines.splitlines()) >= 14  # the lines up to the checkpoint, at least

    model = Classifier(dropout=0.0)
    resumed = builder().checkpoint("latest")
    trained = resumed.build(model, torch.optim.Adam(model.parameters(), lr=1e-3), 1e-3).fit(
        train, valid
    )
    assert metric_logs(tmp_path / "resumed") == metric_logs(tmp_path / "whole")
    for name, tensor in trained.state_dict().items():
        assert torch.equal(tensor, whole.model.state_dict()[name]), name


class NanAt(Classifier):
    """The loss of its `bad`-th training step is NaN; with `own_loss`, the loss it
    backpropagates is not the one its output (and LossMetric) holds."""

    def __init__(self, bad: int, own_loss: bool = False) -> None:
        super().__init__(dropout=0.0)
        self.bad, self.own_loss, self.calls = bad, own_loss, 0

    def train_step(self, batch):
        self.calls += 1
        item = self.classify(batch)
        loss = item.loss * 1.0 if self.own_loss else item.loss
        if self.calls == self.bad:
            loss = loss * float("nan")
        if not self.own_loss:
            item.loss = loss
        return TrainOutput(item, loss=loss)


@pytest.mark.parametrize("own_loss", [False, True], ids=["loss-metric", "guard-flags"])
def test_a_nan_loss_still_stops_the_run_naming_its_iteration(tmp_path, monkeypatch, own_loss):
    stand_in = StandIn(quick=False)
    stand_in.install(monkeypatch)
    run = learner(tmp_path, NanAt(bad=7, own_loss=own_loss), epochs=1)
    with stand_in, pytest.raises(TrainingError, match="loss is NaN at epoch 1, iteration 7"):
        run.fit(data(30), data(6, seed=1))
    # No value was read on its own: the NaN came with the split's last values (a slow
    # device), and no checkpoint of the NaN epoch was written.
    assert not stand_in.reads, stand_in.reads
    assert len(stand_in.waits) <= 3 + 2, stand_in.waits
    assert not list((tmp_path / "checkpoint").glob("*"))


@pytest.mark.cuda
def test_on_cuda_a_fit_synchronises_twice_an_epoch_and_once_a_checkpoint(tmp_path):
    """The same budget on a real device, counted by CUDA's own synchronisation check."""
    import warnings

    run = learner(tmp_path, Classifier(dropout=0.0).cuda())
    train = [Batch(b.inputs.cuda(), b.targets.cuda()) for b in data(200)]
    valid = [Batch(b.inputs.cuda(), b.targets.cuda()) for b in data(20, seed=1)]
    waits = 0
    synchronize = torch.cuda.Event.synchronize

    def counted(event):
        nonlocal waits
        waits += 1
        synchronize(event)

    torch.cuda.Event.synchronize = counted  # type: ignore[method-assign]
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                run.fit(train, valid)
            finally:
                torch.cuda.set_sync_debug_mode(0)
    finally:
        torch.cuda.Event.synchronize = synchronize  # type: ignore[method-assign]
    syncs = waits + sum("synchroniz" in str(w.message) for w in caught)
    assert syncs <= 3 + 2 * (2 + 1), [str(w.message) for w in caught]


class GradsSeen(LossMetric):
    """A loss metric that notes, at each update, whether the model had gradients and
    whether its weights were still the initial ones."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model, self.seen = model, []
        self.initial = [p.detach().clone() for p in model.parameters()]

    def update(self, input, meta):
        params = list(self.model.parameters())
        unchanged = all(torch.equal(a, b) for a, b in zip(self.initial, params))
        self.seen.append((params[0].grad is not None, unchanged))
        return super().update(input, meta)


def test_the_first_outputs_metric_checks_run_once_backward_freed_the_graph(tmp_path):
    """Metric checks on the first output add no memory to the step's peak (the
    activations are gone) and still come before the first optimizer step."""
    torch.manual_seed(0)
    model = Classifier(dropout=0.0)
    metric = GradsSeen(model)
    run = (
        LearnerBuilder(tmp_path)
        .metric_train_numeric(metric)
        .renderer(PlainRenderer(interval=0.0, stream=io.StringIO()))
        .num_epochs(1)
        .build(model, torch.optim.SGD(model.parameters(), lr=0.1), 0.1)
    )
    run.fit(data(3))
    # The first output's check: gradients computed, weights not yet stepped. Then
    # each step's own update (after the step of its group, the weights have moved).
    assert metric.seen == [(True, True), (True, True), (True, False), (True, False)]


def test_values_of_any_single_number_shape_reach_the_host(monkeypatch):
    """A metric may return its value as a 0-d or a [1] tensor, of any dtype."""
    stand_in = StandIn(quick=False)
    stand_in.install(monkeypatch)
    copies = host.HostCopies()
    values = [torch.tensor(2.5), torch.tensor([3]), torch.tensor([[1.5]], dtype=torch.bfloat16), 7]
    assert copies.launch(values, scalars=True).values() == [2.5, 3, 1.5, 7]
    grid = torch.arange(6).reshape(2, 3)
    assert copies.launch([grid, torch.tensor(1.0)]).values() == [[[0, 1, 2], [3, 4, 5]], 1.0]
    assert len(stand_in.waits) == 2  # one per transfer, whatever it holds
