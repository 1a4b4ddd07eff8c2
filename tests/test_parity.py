"""ember's loop computes exactly what a hand-written PyTorch loop computes.

Both start from the same weights and the same torch RNG state, see the samples in
the order `DataLoaderBuilder.shuffle(seed)` documents (epoch e: the permutation of
`np.random.default_rng([seed, e])`), and use the same optimizer. The model has
dropout, so the two loops must also draw from the RNG identically. The raw loop
builds its batches from that order by hand (no DataLoader) and never validates;
ember validates every epoch (and runs its one-batch preflight), so equality also
shows that validation, metrics, logs and checkpoints leave training untouched.
After two epochs the weights must be bitwise equal, and so must every iteration's
training loss that ember logged.
"""

from __future__ import annotations

import copy
import io

import numpy as np
import pytest
import torch
from ember_testing import BlobBatcher, BlobDataset, Classifier

import ember
from ember.data import DataLoaderBuilder
from ember.optim import AdamConfig
from ember.record import CompactRecorder
from ember.train import LearnerBuilder
from ember.train.logger import read_metric_log
from ember.train.metric import AccuracyMetric, LossMetric
from ember.train.renderer import PlainRenderer

SIZE, BATCH, EPOCHS = 150, 16, 2  # 10 batches per epoch, the last one of 6 samples
SHUFFLE_SEED, INIT_SEED, TRAIN_SEED = 5, 11, 1234
LR, EPS = 1e-2, 1e-5  # EPS: AdamConfig's default, given to torch's Adam by hand


def make_model() -> Classifier:
    """Two hidden layers of 32 with dropout: the loops must draw from the RNG alike."""
    return Classifier(hidden=(32, 32), dropout=0.3)


def raw_loop(
    model: Classifier, optimizer: torch.optim.Optimizer, dataset: BlobDataset, accumulation: int
) -> list[list[float]]:
    """Train by hand; return each epoch's per-iteration losses. With `accumulation`
    batches per optimizer step, each batch's loss is weighted by its share of the
    group's samples (the gradient of the group's mean loss)."""
    batcher = BlobBatcher()
    losses: list[list[float]] = []
    model.train()
    for epoch in range(1, EPOCHS + 1):
        order = np.random.default_rng([SHUFFLE_SEED, epoch]).permutation(len(dataset)).tolist()
        batches = [
            batcher.batch([dataset[i] for i in order[start : start + BATCH]])
            for start in range(0, len(order), BATCH)
        ]
        epoch_losses = []
        for first in range(0, len(batches), accumulation):
            group = batches[first : first + accumulation]
            group_items = sum(len(batch.targets) for batch in group)
            for batch in group:
                loss = model.classify(batch).loss
                (loss * (len(batch.targets) / group_items)).backward()
                epoch_losses.append(float(loss.detach()))
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        losses.append(epoch_losses)
    return losses


@pytest.mark.parametrize(
    ("optimizer", "accumulation", "checkpoint"),
    [("config", 1, False), ("torch", 1, True), ("config", 2, False)],
    ids=["adam-config", "torch-adam+checkpoints", "accumulate-2"],
)
def test_ember_matches_a_raw_loop_bit_for_bit(
    tmp_path, one_thread, optimizer, accumulation, checkpoint
):
    dataset, valid = BlobDataset(SIZE, seed=0), BlobDataset(40, seed=1)
    torch.manual_seed(INIT_SEED)
    initial = make_model()
    raw_model, ember_model = copy.deepcopy(initial), copy.deepcopy(initial)

    torch.manual_seed(TRAIN_SEED)
    raw_optimizer = torch.optim.Adam(raw_model.parameters(), lr=LR, eps=EPS)
    raw_losses = raw_loop(raw_model, raw_optimizer, dataset, accumulation)

    ember.seed(TRAIN_SEED)  # seeds torch's global RNG as torch.manual_seed does
    builder = (
        LearnerBuilder(tmp_path / "run")
        .metric_train_numeric(AccuracyMetric())
        .metric_valid_numeric(AccuracyMetric())
        .metric_train_numeric(LossMetric())
        .metric_valid_numeric(LossMetric())
        .renderer(PlainRenderer(interval=3600.0, stream=io.StringIO()))
        .grads_accumulation(accumulation)
        .num_epochs(EPOCHS)
    )
    if checkpoint:
        builder = builder.with_file_checkpointer(CompactRecorder())
    bound = (
        AdamConfig(epsilon=EPS).init()
        if optimizer == "config"
        else torch.optim.Adam(ember_model.parameters(), lr=LR, eps=EPS)
    )
    train = DataLoaderBuilder(BlobBatcher()).batch_size(BATCH).shuffle(SHUFFLE_SEED).build(dataset)
    valid_loader = DataLoaderBuilder(BlobBatcher()).batch_size(BATCH).build(valid)
    builder.build(ember_model, bound, LR).fit(train, valid_loader)

    for epoch, expected in enumerate(raw_losses, start=1):
        log = tmp_path / "run" / "train" / f"epoch-{epoch}" / "Loss.log"
        logged = [value for value, _ in read_metric_log(log)]
        assert logged == expected, f"epoch {epoch}: per-iteration training losses differ"
    raw_state, ember_state = raw_model.state_dict(), ember_model.state_dict()
    assert raw_state.keys() == ember_state.keys()
    for name in raw_state:
        assert torch.equal(raw_state[name], ember_state[name]), f"{name} differs after training"
    # The weights moved: the comparison is not between two untouched copies.
    assert not torch.equal(initial.state_dict()["net.0.weight"], ember_state["net.0.weight"])
