"""`evaluate_run` and `load_checkpoint`: a finished run's best, last or any checkpoint,
named rather than found by hand, evaluated in one call; its values are those the run
recorded for that epoch's validation."""

from __future__ import annotations

import json

import pytest
import torch
from ember_testing import BlobBatcher, BlobDataset, Classifier

import ember
from ember.data import DataLoaderBuilder
from ember.errors import ConfigError, TrainingError
from ember.optim import AdamConfig
from ember.record import CompactRecorder
from ember.train import (
    LearnerBuilder,
    MetricCheckpointingStrategy,
    evaluate_run,
    load_checkpoint,
)
from ember.train.history import RunHistory
from ember.train.logger import read_metric_log
from ember.train.metric import AccuracyMetric, LossMetric
from ember.train.renderer.silent import SilentRenderer


def loaders():
    batcher = BlobBatcher()
    train = DataLoaderBuilder(batcher).batch_size(32).shuffle(1).build(BlobDataset(160))
    valid = DataLoaderBuilder(batcher).batch_size(16).build(BlobDataset(50, seed=1))
    return train, valid


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A finished run of 4 epochs, its checkpoints written by CompactRecorder and kept by
    the default strategy (the last 2 and the best by valid Loss)."""
    directory = tmp_path_factory.mktemp("evaluate-run") / "run"
    ember.seed(0)
    train, valid = loaders()
    learner = (
        LearnerBuilder(directory)
        .metric_valid_numeric(AccuracyMetric())
        .metric_valid_numeric(LossMetric())
        .with_file_checkpointer(CompactRecorder())
        .renderer(SilentRenderer())
        .num_epochs(4)
        .build(Classifier(dropout=0.0), AdamConfig().init(), 3e-2)
    )
    learner.fit(train, valid)
    return directory


def epoch_mean(path):
    rows = read_metric_log(path)
    return sum(value * weight for value, weight in rows) / sum(weight for _, weight in rows)


def recorded(run):
    return dict(RunHistory.load(run / "history.jsonl").entries())


def evaluate(run, **options):
    _, valid = loaders()
    return evaluate_run(
        run,
        Classifier(dropout=0.0),
        valid,
        AccuracyMetric(),
        LossMetric(),
        renderer=SilentRenderer(),
        **options,
    )


def test_the_best_checkpoint_gives_the_values_the_run_recorded_for_its_epoch(run):
    history = recorded(run)
    saved = sorted(int(p.name.split("-")[1].split(".")[0]) for p in run.glob("checkpoint/model-*"))
    best = min(saved, key=lambda epoch: history[epoch]["valid"]["Loss"])
    values = evaluate(run)
    for name in ("Accuracy", "Loss"):
        assert abs(values[name] - history[best]["valid"][name]) < 1e-6
        logged = epoch_mean(run / "valid" / f"epoch-{best}" / f"{name}.log")
        assert abs(values[name] - logged) < 1e-6
    written = json.loads((run / "test" / f"epoch-{best}" / "values.json").read_text())
    assert written["values"] == values and written["items"] == 50


def test_last_an_epoch_number_and_a_strategy_choose_the_checkpoint(run):
    history = recorded(run)
    for options, epoch in (
        ({"checkpoint": "last"}, 4),
        ({"checkpoint": 3, "name": "third"}, 3),
        (
            {"best_by": MetricCheckpointingStrategy(AccuracyMetric(), direction="highest")},
            max((3, 4), key=lambda e: history[e]["valid"]["Accuracy"]),
        ),
    ):
        values = evaluate(run, **options)
        assert abs(values["Loss"] - history[epoch]["valid"]["Loss"]) < 1e-6, options
    assert (run / "test" / "third" / "values.json").exists()


def test_load_checkpoint_puts_the_weights_of_the_named_epoch_in_a_model(run):
    model = Classifier(dropout=0.0)
    assert load_checkpoint(run, model, "last") == 4
    saved = CompactRecorder().load(None, run / "checkpoint" / "model-4")
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, saved[name]), name


def test_what_cannot_be_evaluated_is_refused_naming_the_fix(run, tmp_path):
    with pytest.raises(TrainingError, match=r"no complete checkpoint of epoch 1: the epochs"):
        evaluate(run, checkpoint=1)
    with pytest.raises(ConfigError, match=r"takes 'best', 'last' or an epoch number"):
        evaluate(run, checkpoint="first")
    with pytest.raises(
        TrainingError,
        match=r"has the value that the best valid Perplexity \(lowest\) is chosen by: the run recorded valid Accuracy, valid Loss\.",
    ):
        evaluate(run, best_by="Perplexity")
    with pytest.raises(ConfigError, match=r"needs at least one metric"):
        evaluate_run(run, Classifier(), loaders()[1])
    with pytest.raises(TrainingError, match=r"holds no checkpoint.*with_file_checkpointer"):
        evaluate(tmp_path)
