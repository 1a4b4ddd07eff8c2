"""A checkpointer of one's own, defined here and plugged in with no change to ember:
it saves, resumes exactly (after an epoch and mid-epoch), keeps what the strategy keeps,
and restores the best epoch."""

from __future__ import annotations

import copy
from typing import Any, Callable

import pytest
import torch
from ember_testing import BlobBatcher, Classifier, StopAt

import ember
from ember.data import DataLoaderBuilder
from ember.errors import ConfigError
from ember.optim import AdamConfig
from ember.train import LearnerBuilder
from ember.train.history import RunHistory
from ember.train.metric import AccuracyMetric, LossMetric


class MemoryCheckpointer:
    """Keeps checkpoints in a dict, as deep copies taken at `save` (a storage of its own)."""

    def __init__(self) -> None:
        self.saved: dict[int, dict[str, Any]] = {}
        self.writes = 0

    def save(
        self,
        epoch: int,
        model: Any,
        optimizer: Any,
        state: dict[str, Any],
        *,
        on_saved: Callable[[list[str]], None] | None = None,
    ) -> None:
        self.saved[epoch] = {
            "model": copy.deepcopy(model.state_dict()),
            "optim": copy.deepcopy(optimizer.state_dict()),
            "scheduler": copy.deepcopy(state),
        }
        self.writes += 1
        if on_saved is not None:
            on_saved([f"memory:{epoch}"])

    def load(self, epoch: int, part: str, target: Any) -> Any:
        tree = copy.deepcopy(self.saved[epoch][part])
        if target is None:
            return tree
        target.load_state_dict(tree)
        return target

    def epochs(self) -> list[int]:
        return sorted(self.saved)

    def latest(self) -> int | None:
        return max(self.saved, default=None)

    def delete(self, epoch: int) -> None:
        self.saved.pop(epoch, None)

    def wait(self) -> None:
        pass

    @property
    def failed(self) -> bool:
        return False

    def location(self, epoch: int) -> str:
        return f"memory slot {epoch}"

    def __str__(self) -> str:
        return "memory"


def loaders(blobs):
    return (
        DataLoaderBuilder(BlobBatcher()).batch_size(32).shuffle(11).build(blobs[0]),
        DataLoaderBuilder(BlobBatcher()).batch_size(32).build(blobs[1]),
    )


def builder(directory, quiet, epochs, checkpointer):
    return (
        LearnerBuilder(directory)
        .metric_train_numeric(AccuracyMetric())
        .metric_valid_numeric(LossMetric())
        .with_checkpointer(checkpointer)
        .num_epochs(epochs)
        .renderer(quiet)
    )


def train(builder, blobs):
    return builder.build(Classifier(), AdamConfig().init(), 1e-2).fit(*loaders(blobs))


def assert_same_weights(a, b):
    for (name, x), (_, y) in zip(a.state_dict().items(), b.state_dict().items()):
        assert torch.equal(x, y), name


def test_a_checkpointer_of_ones_own_resumes_exactly_and_keeps_what_the_strategy_keeps(
    tmp_path, blobs, quiet
):
    ember.seed(5)
    straight = train(builder(tmp_path / "a", quiet, 4, MemoryCheckpointer()), blobs)

    memory = MemoryCheckpointer()
    ember.seed(5)
    train(builder(tmp_path / "b", quiet, 2, memory), blobs)
    assert memory.epochs() == [1, 2]
    ember.seed(123)  # the checkpoint restores every random generator
    resumed = train(builder(tmp_path / "b", quiet, 4, memory).checkpoint(2), blobs)
    assert_same_weights(straight, resumed)

    # The default strategy (last 2 and the best valid Loss) ran over this storage too.
    history = RunHistory.load(tmp_path / "b" / "history.jsonl").to_json()
    losses = {entry["epoch"]: entry["valid"]["Loss"] for entry in history["epochs"]}
    best = min(losses, key=losses.__getitem__)
    assert memory.epochs() == sorted({3, 4, best})
    assert history["checkpoints"] == memory.epochs()
    assert history["outcome"] == "completed"
    assert (
        "Resumed from the checkpoint of epoch 2" in (tmp_path / "b" / "experiment.log").read_text()
    )


def test_a_checkpointer_of_ones_own_resumes_mid_epoch_and_restores_the_best(tmp_path, blobs, quiet):
    ember.seed(5)
    straight = train(builder(tmp_path / "a", quiet, 3, MemoryCheckpointer()), blobs)

    memory = MemoryCheckpointer()
    ember.seed(5)
    first = builder(tmp_path / "b", quiet, 3, memory)
    first.listener(StopAt(first.interrupter(), 2, 3))
    learner = first.build(Classifier(), AdamConfig().init(), 1e-2)
    learner.fit(*loaders(blobs))
    assert learner.outcome == "stopped: test stop"
    assert memory.latest() == 2
    assert memory.saved[2]["scheduler"]["learner"]["iteration"] == 3

    ember.seed(99)
    second = builder(tmp_path / "b", quiet, 3, memory).checkpoint("latest")
    learner = second.build(Classifier(), AdamConfig().init(), 1e-2)
    resumed = learner.fit(*loaders(blobs))
    assert_same_weights(straight, resumed)
    for epoch in (1, 2, 3):
        name = f"train/epoch-{epoch}/Accuracy.log"
        assert (tmp_path / "a" / name).read_text() == (tmp_path / "b" / name).read_text()

    best = min(learner.history, key=lambda entry: entry[1]["valid"]["Loss"])[0]
    kept = MemoryCheckpointer()
    again = builder(tmp_path / "c", quiet, 3, kept)
    ember.seed(5)
    restored = again.build(Classifier(), AdamConfig().init(), 1e-2)
    model = restored.fit(*loaders(blobs), restore_best=True)
    expected = Classifier()
    expected.load_state_dict(kept.saved[best]["model"])
    assert_same_weights(model, expected)


def test_an_object_that_is_not_a_checkpointer_is_refused_with_what_it_lacks(tmp_path):
    class Half:
        def save(self, *args, **kwargs):
            pass

    with pytest.raises(
        ConfigError, match=r"Half is not a checkpointer: it has no `load`, `epochs`"
    ):
        LearnerBuilder(tmp_path).with_checkpointer(Half())
