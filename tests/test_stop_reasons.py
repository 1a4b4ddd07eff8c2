"""Why a run ended: the early stopping rules, `learner.outcome` and its reason, and the
same text in experiment.log, history.jsonl, the summary and the renderer."""

from __future__ import annotations

import math

import pytest
from ember_testing import Classifier

from ember.errors import ConfigError, TrainingError
from ember.optim import AdamConfig
from ember.train import LearnerBuilder, MetricEarlyStoppingStrategy
from ember.train.history import RunHistory
from ember.train.metric import LossMetric, MetricValue
from ember.train.outcome import EarlyStopRule, StopReason
from ember.train.summary import LearnerSummary


def history(values, split="valid", name="Loss"):
    return [(epoch, {split: {name: value}}) for epoch, value in enumerate(values, start=1)]


def test_min_delta_counts_only_improvements_larger_than_it():
    strategy = MetricEarlyStoppingStrategy("Loss", no_improvement_since=2, min_delta=0.1)
    # 1.0 -> 0.95 -> 0.92: improvements of 0.05 and 0.08 from the best (1.0) do not count
    decision = strategy.should_stop(history([1.0, 0.95, 0.92]))
    assert decision is not None and decision.rule is EarlyStopRule.NO_IMPROVEMENT
    assert (
        decision == "valid Loss has not improved by more than 0.1 for 2 epochs (best 1 at epoch 1)"
    )
    assert (decision.epoch, decision.value, decision.reference) == (3, 0.92, 1.0)
    # the same values without min_delta are improvements
    assert (
        MetricEarlyStoppingStrategy("Loss", no_improvement_since=2).should_stop(
            history([1.0, 0.95, 0.92])
        )
        is None
    )
    # an improvement of more than min_delta resets the count
    assert strategy.should_stop(history([1.0, 0.95, 0.85])) is None


@pytest.mark.parametrize(
    ("direction", "values", "threshold", "stops_at"),
    [
        ("lowest", [0.9, 0.5, 0.2, 0.1], 0.2, 3),  # at the threshold counts
        ("highest", [50.0, 80.0, 96.0], 95.0, 3),
    ],
)
def test_stopping_threshold_stops_once_good_enough(direction, values, threshold, stops_at):
    strategy = MetricEarlyStoppingStrategy(
        "Accuracy", direction=direction, no_improvement_since=10, stopping_threshold=threshold
    )
    seen = [
        strategy.should_stop(history(values[:n], name="Accuracy"))
        for n in range(1, len(values) + 1)
    ]
    first = next(n for n, decision in enumerate(seen, start=1) if decision is not None)
    assert first == stops_at
    decision = seen[first - 1]
    assert decision.rule is EarlyStopRule.STOPPING_THRESHOLD
    assert (decision.value, decision.reference) == (values[stops_at - 1], threshold)
    assert "reached the stopping threshold" in decision


def test_divergence_threshold_stops_once_hopeless_after_warmup():
    strategy = MetricEarlyStoppingStrategy(
        "Loss", no_improvement_since=10, divergence_threshold=5.0, warmup_epochs=1
    )
    assert strategy.should_stop(history([9.0])) is None  # within warm-up
    assert strategy.should_stop(history([9.0, 4.0])) is None
    decision = strategy.should_stop(history([9.0, 4.0, 6.5]))
    assert decision.rule is EarlyStopRule.DIVERGENCE_THRESHOLD
    assert decision == "valid Loss diverged past the divergence threshold: 6.5 > 5"


@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_a_non_finite_monitored_value_stops_unless_check_finite_is_off(bad):
    strategy = MetricEarlyStoppingStrategy("Loss", no_improvement_since=5)
    decision = strategy.should_stop(history([1.0, bad]))
    assert decision.rule is EarlyStopRule.NON_FINITE
    assert decision == f"valid Loss is {bad} at epoch 2"
    lenient = MetricEarlyStoppingStrategy("Loss", no_improvement_since=5, check_finite=False)
    assert lenient.should_stop(history([1.0, bad])) is None


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"min_delta": -0.1}, "min_delta must be a finite number >= 0"),
        ({"stopping_threshold": "low"}, "stopping_threshold must be a number or None"),
        (
            {"stopping_threshold": 2.0, "divergence_threshold": 1.0},
            "stopping_threshold \\(2.0\\) must be better than divergence_threshold",
        ),
        ({"check_finite": 1}, "check_finite must be True or False"),
    ],
)
def test_bad_rules_fail_when_the_strategy_is_made(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        MetricEarlyStoppingStrategy("Loss", **kwargs)


class Scripted:
    """A validation metric whose epoch values are given."""

    name, input_type, unit = "Scripted", object, ""

    def __init__(self, values):
        self.values = values

    def update(self, item, meta):
        return MetricValue(self.values[meta.epoch], 1)

    def clear(self):
        pass


def test_the_rule_that_stopped_the_run_is_in_every_place_a_user_looks(
    tmp_path, quiet, loaders, capsys
):
    metric = Scripted({1: 3.0, 2: 0.25, 3: 0.125})
    strategy = MetricEarlyStoppingStrategy(metric, stopping_threshold=0.5)
    learner = (
        LearnerBuilder(tmp_path)
        .metric_valid_numeric(metric)
        .early_stopping(strategy)
        .num_epochs(3)
        .renderer(quiet)
        .summary()
        .build(Classifier(), AdamConfig().init(), 1e-2)
    )
    learner.fit(*loaders)
    why = "valid Scripted reached the stopping threshold: 0.25 <= 0.5"
    assert learner.outcome == f"stopped early: {why}"
    assert learner.outcome.reason is StopReason.EARLY_STOPPED
    assert learner.outcome.early_stop.rule is EarlyStopRule.STOPPING_THRESHOLD
    assert learner.exit_code == 0
    assert (
        f"Training stopped early: {why} after epoch 2." in (tmp_path / "experiment.log").read_text()
    )
    assert f"training stopped early: {why}" in quiet.stream_text.getvalue()
    saved = RunHistory.load(tmp_path / "history.jsonl").to_json()
    assert saved["outcome"] == f"stopped early: {why}"
    assert saved["stop_reason"] == {
        "reason": "early_stopped",
        "rule": "stopping_threshold",
        "split": "valid",
        "metric": "Scripted",
        "epoch": 2,
        "value": 0.25,
        "reference": 0.5,
    }
    first = LearnerSummary.from_dir(tmp_path).table().splitlines()[0]
    assert first.endswith(f"2 epochs, Classifier, 195 parameters; outcome: stopped early: {why}")
    assert first in capsys.readouterr().out  # the summary printed at the end of fit


def test_a_custom_strategy_gives_a_custom_rule(tmp_path, quiet, loaders):
    class AfterOne:
        def should_stop(self, history):
            return "one epoch is plenty"

    learner = (
        LearnerBuilder(tmp_path)
        .early_stopping(AfterOne())
        .num_epochs(3)
        .renderer(quiet)
        .build(Classifier(), AdamConfig().init(), 1e-2)
    )
    learner.fit(*loaders)
    assert learner.outcome == "stopped early: one epoch is plenty"
    assert learner.outcome.early_stop.rule is EarlyStopRule.CUSTOM


def test_completed_stopped_and_signalled_runs_have_their_reasons(tmp_path, quiet, loaders):
    def learner(directory, epochs=1):
        builder = LearnerBuilder(directory).num_epochs(epochs).renderer(quiet)
        return builder, builder.build(Classifier(), AdamConfig().init(), 1e-2)

    _, completed = learner(tmp_path / "a")
    completed.fit(*loaders)
    assert completed.outcome.reason is StopReason.COMPLETED and completed.exit_code == 0

    builder, stopped = learner(tmp_path / "b", 3)
    builder.interrupter().stop("enough")
    stopped.fit(*loaders)
    assert stopped.outcome == "stopped: enough"
    assert stopped.outcome.reason is StopReason.STOPPED and stopped.exit_code == 0

    builder, signalled = learner(tmp_path / "c", 3)
    builder.interrupter().stop("terminated by SIGTERM", signal=15)
    signalled.fit(*loaders)
    assert signalled.outcome.reason is StopReason.SIGNAL and signalled.outcome.signal == 15
    assert signalled.exit_code == 143
    saved = RunHistory.load(tmp_path / "c" / "history.jsonl").to_json()
    assert saved["stop_reason"] == {"reason": "signal", "signal": 15}


def test_a_non_finite_loss_fails_with_its_own_reason(tmp_path, quiet, loaders):
    class NanLoss(Classifier):
        def train_step(self, batch):
            output = super().train_step(batch)
            output.loss = output.item.loss = output.item.loss * math.nan
            return output

    learner = (
        LearnerBuilder(tmp_path)
        .metric_train_numeric(LossMetric())
        .renderer(quiet)
        .build(NanLoss(), AdamConfig().init(), 1e-2)
    )
    with pytest.raises(TrainingError, match="loss is NaN"):
        learner.fit(*loaders)
    assert learner.outcome == "failed: the loss is NaN at epoch 1, iteration 1"
    assert learner.outcome.reason is StopReason.NONFINITE_LOSS and learner.exit_code == 1
    assert (
        "training failed: the loss is NaN at epoch 1, iteration 1" in quiet.stream_text.getvalue()
    )
    saved = RunHistory.load(tmp_path / "history.jsonl").to_json()
    assert saved["outcome"] == learner.outcome
    assert saved["stop_reason"] == {"reason": "nonfinite_loss"}


def test_a_pruned_run_has_its_reason(tmp_path, quiet, loaders):
    class PruneAtTwo:
        def should_prune(self, history):
            return "trial 7 pruned" if history[-1][0] == 2 else None

    learner = (
        LearnerBuilder(tmp_path)
        .pruning(PruneAtTwo())
        .num_epochs(4)
        .renderer(quiet)
        .build(Classifier(), AdamConfig().init(), 1e-2)
    )
    learner.fit(*loaders)
    assert learner.outcome == "pruned: trial 7 pruned" and len(learner.history) == 2
    assert learner.outcome.reason is StopReason.PRUNED and learner.exit_code == 0
    saved = RunHistory.load(tmp_path / "history.jsonl").to_json()
    assert saved["stop_reason"] == {"reason": "pruned"}


def test_the_rules_judge_validation_points_inside_epochs():
    def points(values):
        # two validations an epoch: after 5 batches, and at the epoch's end
        return [
            (1 + n // 2, 5 if n % 2 == 0 else None, {"valid": {"Loss": value}})
            for n, value in enumerate(values)
        ]

    good = MetricEarlyStoppingStrategy("Loss", stopping_threshold=0.5)
    decision = good.should_stop_at_point(points([2.0, 1.0, 0.4]))
    assert decision.rule is EarlyStopRule.STOPPING_THRESHOLD
    assert (decision.epoch, decision.iteration, decision.value) == (2, 5, 0.4)
    assert good.should_stop_at_point(points([2.0, 1.0])) is None
    patient = MetricEarlyStoppingStrategy("Loss", no_improvement_since=2, min_delta=0.05)
    decision = patient.should_stop_at_point(points([1.0, 0.5, 0.48, 0.47]))
    assert decision == (
        "valid Loss has not improved by more than 0.05 for 2 validations (best 0.5 at epoch 1 end)"
    )
    nan = MetricEarlyStoppingStrategy("Loss").should_stop_at_point(points([1.0, math.nan]))
    assert nan.rule is EarlyStopRule.NON_FINITE and nan == "valid Loss is nan at epoch 1"
