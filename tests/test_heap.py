"""During a fit the objects the process held before it are frozen out of the cycle
collector's passes (`ember.train.heap`), and given back to it when the fit ends."""

from __future__ import annotations

import gc

import pytest
import torch
from ember_testing import BlobBatcher, BlobDataset, Classifier, blob_builder

from ember.data import DataLoaderBuilder
from ember.train import heap
from ember.train.callbacks import Callback


class FreezeCounts(Callback):
    def __init__(self) -> None:
        self.counts: list[int] = []

    def on_epoch_end(self, ctx) -> None:
        self.counts.append(gc.get_freeze_count())


def fit(tmp_path) -> FreezeCounts:
    torch.manual_seed(0)
    seen = FreezeCounts()
    model = Classifier()
    learner = (
        blob_builder(tmp_path / "run")
        .callback(seen)
        .num_epochs(2)
        .build(model, torch.optim.SGD(model.parameters(), lr=0.1), 0.1)
    )
    loader = DataLoaderBuilder(BlobBatcher()).batch_size(8)
    learner.fit(loader.build(BlobDataset(32)), loader.build(BlobDataset(32, seed=1)))
    return seen


def test_the_objects_held_before_a_fit_are_frozen_during_it_only(tmp_path):
    assert gc.get_freeze_count() == 0
    seen = fit(tmp_path)
    assert len(seen.counts) == 2
    assert all(count > 1000 for count in seen.counts)  # torch's objects, at least
    assert gc.get_freeze_count() == 0


def test_objects_the_user_froze_stay_frozen(tmp_path):
    gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        seen = fit(tmp_path)
        # ember neither froze more (objects freed since only lower the count) nor
        # unfroze the user's
        assert all(frozen * 0.9 < count <= frozen for count in seen.counts)
        assert frozen * 0.9 < gc.get_freeze_count() <= frozen
    finally:
        gc.unfreeze()


def test_a_disabled_collector_is_left_alone(tmp_path):
    gc.disable()
    try:
        seen = fit(tmp_path)
        assert seen.counts == [0, 0]
    finally:
        gc.enable()


def test_on_an_accelerator_earlier_cycles_are_collected_before_the_freeze(monkeypatch):
    collected: list[int] = []
    monkeypatch.setattr(heap, "accelerator", lambda device: True)
    monkeypatch.setattr(gc, "collect", lambda *args: collected.append(gc.get_freeze_count()))
    with heap.frozen_heap(torch.device("cuda")):
        assert gc.get_freeze_count() > 0
    assert collected == [0]  # a full pass, before anything was frozen
    assert gc.get_freeze_count() == 0


def test_an_error_inside_the_fit_unfreezes_too():
    with pytest.raises(RuntimeError, match="boom"):
        with heap.frozen_heap(torch.device("cpu")):
            raise RuntimeError("boom")
    assert gc.get_freeze_count() == 0
