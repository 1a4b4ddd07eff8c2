"""Evaluating and predicting: whole-set values, the files under test/, predict's outputs."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from ember_testing import BlobBatcher, BlobDataset, Classifier
from sklearn.metrics import roc_auc_score

import ember
from ember.data import DataLoaderBuilder
from ember.errors import TrainingError
from ember.optim import AdamConfig
from ember.train import (
    ClassificationOutput,
    EvaluationInterrupted,
    EvaluatorBuilder,
    LearnerBuilder,
)
from ember.train.logger import read_metric_log
from ember.train.metric import AccuracyMetric, AurocMetric, LossMetric


def loader(size: int = 90, seed: int = 1, batch: int = 32):
    return DataLoaderBuilder(BlobBatcher()).batch_size(batch).build(BlobDataset(size, seed=seed))


def tree(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


class WithTestStep(Classifier):
    """A classifier whose test_step reports the loss twice as large, to tell it apart."""

    def test_step(self, batch):
        output = self.valid_step(batch)
        return ClassificationOutput(output.loss * 2, output.output, output.targets)


def evaluator(root: Path, renderer, model: torch.nn.Module, **kwargs):
    builder = (
        EvaluatorBuilder(root)
        .metric_numeric(AccuracyMetric())
        .metric_numeric(LossMetric())
        .metric(AurocMetric(from_logits=True))
        .devices(["cpu"])
        .renderer(renderer)
    )
    if kwargs.get("summary"):
        builder.summary()
    return builder.build(model)


def by_hand(model: torch.nn.Module, dataset: BlobDataset) -> dict[str, float]:
    model.eval()
    with torch.no_grad():
        logits = model(dataset.inputs)
    targets = dataset.targets
    losses = [
        F.cross_entropy(logits[i : i + 32], targets[i : i + 32]).item() * len(targets[i : i + 32])
        for i in range(0, len(targets), 32)
    ]
    probs = torch.softmax(logits.double(), dim=1).numpy()
    return {
        "Accuracy": 100 * (logits.argmax(1) == targets).double().mean().item(),
        "Loss": sum(losses) / len(targets),
        "AUROC": roc_auc_score(targets.numpy(), probs, multi_class="ovr", average="macro"),
    }


def test_values_are_those_of_the_whole_set(tmp_path, quiet):
    ember.seed(0)
    model = Classifier()
    values = evaluator(tmp_path, quiet, model).eval("holdout", loader())
    assert model.training  # the mode it had comes back
    expected = by_hand(model, BlobDataset(90, seed=1))
    assert values.keys() == expected.keys()
    assert values["Accuracy"] == pytest.approx(expected["Accuracy"], abs=1e-9)
    assert values["Loss"] == pytest.approx(expected["Loss"], rel=1e-5)
    assert values["AUROC"] == pytest.approx(expected["AUROC"], abs=1e-6)
    saved = json.loads((tmp_path / "test" / "holdout" / "values.json").read_text())
    assert saved == {"name": "holdout", "values": values, "items": 90, "batches": 3}


def test_file_layout_lines_and_log(tmp_path, quiet):
    ember.seed(0)
    evaluator(tmp_path, quiet, Classifier()).eval("holdout", loader())
    assert tree(tmp_path) == [
        "evaluation.log",
        "test/holdout/AUROC.log",
        "test/holdout/Accuracy.log",
        "test/holdout/Loss.log",
        "test/holdout/values.json",
    ]
    rows = read_metric_log(tmp_path / "test" / "holdout" / "Accuracy.log")
    assert [weight for _, weight in rows] == [32, 32, 26]
    values = json.loads((tmp_path / "test" / "holdout" / "values.json").read_text())["values"]
    assert sum(v * w for v, w in rows) / 90 == pytest.approx(values["Accuracy"], abs=1e-9)
    text = (tmp_path / "evaluation.log").read_text()
    assert "Evaluation 'holdout'" in text


def test_two_named_evaluations_side_by_side_and_a_name_replaced(tmp_path, quiet):
    ember.seed(0)
    model = Classifier()
    run = evaluator(tmp_path, quiet, model)
    first = run.eval("small", loader(40, seed=2))
    second = run.eval("large", loader(90, seed=1))
    assert sorted(p.name for p in (tmp_path / "test").iterdir()) == ["large", "small"]
    read = {
        name: json.loads((tmp_path / "test" / name / "values.json").read_text())
        for name in ("small", "large")
    }
    assert read["small"]["values"] == first and read["small"]["items"] == 40
    assert read["large"]["values"] == second and read["large"]["items"] == 90
    again = run.eval("small", loader(60, seed=3))
    saved = json.loads((tmp_path / "test" / "small" / "values.json").read_text())
    assert saved["values"] == again and saved["items"] == 60
    assert len(read_metric_log(tmp_path / "test" / "small" / "Loss.log")) == 2  # 32 + 28
    assert "replaces the earlier evaluation" in (tmp_path / "evaluation.log").read_text()


def test_test_step_is_used_and_valid_step_is_the_fallback(tmp_path, quiet):
    ember.seed(0)
    model = WithTestStep()
    tested = evaluator(tmp_path / "a", quiet, model).eval("x", loader())
    plain = Classifier()
    plain.load_state_dict(model.state_dict())
    validated = evaluator(tmp_path / "b", quiet, plain).eval("x", loader())
    assert tested["Loss"] == pytest.approx(2 * validated["Loss"], rel=1e-6)
    assert tested["Accuracy"] == validated["Accuracy"]


def test_a_model_without_test_or_valid_step_is_refused(tmp_path, quiet):
    with pytest.raises(TrainingError, match="no test_step or valid_step"):
        evaluator(tmp_path, quiet, torch.nn.Linear(8, 3)).eval("x", loader())


def test_summary_prints_the_values(tmp_path, quiet, capsys):
    ember.seed(0)
    values = evaluator(tmp_path, quiet, Classifier(), summary=True).eval("holdout", loader())
    out = capsys.readouterr().out
    assert "Evaluation 'holdout' (90 items)" in out
    assert repr(values["Loss"]) in out


def test_a_stop_discards_the_evaluation_and_keeps_the_earlier_one(tmp_path, quiet):
    ember.seed(0)
    builder = EvaluatorBuilder(tmp_path).metric(AccuracyMetric()).renderer(quiet)
    run = builder.build(Classifier())
    kept = run.eval("x", loader())
    builder.interrupter().stop("stopped by a test")
    with pytest.raises(EvaluationInterrupted, match="discarded"):
        run.eval("x", loader(60, seed=4))
    assert tree(tmp_path / "test") == ["x/Accuracy.log", "x/values.json"]
    assert json.loads((tmp_path / "test" / "x" / "values.json").read_text())["values"] == kept
    assert run.eval("y", loader())  # the stop request does not outlive its evaluation


def test_learner_evaluate_after_fit(tmp_path, loaders, quiet):
    ember.seed(0)
    learner = (
        LearnerBuilder(tmp_path)
        .metric_train_numeric(LossMetric())
        .metric_valid_numeric(AccuracyMetric())
        .metric_valid_numeric(LossMetric())
        .devices(["cpu"])
        .renderer(quiet)
        .build(Classifier(), AdamConfig().init(), 1e-2)
    )
    model = learner.fit(*loaders)
    values = learner.evaluate("holdout", loader(70, seed=5))
    expected = by_hand(model, BlobDataset(70, seed=5))
    assert values.keys() == {"Accuracy", "Loss"}
    assert values["Accuracy"] == pytest.approx(expected["Accuracy"], abs=1e-9)
    assert values["Loss"] == pytest.approx(expected["Loss"], rel=1e-5)
    assert (tmp_path / "history.jsonl").exists()
    assert tree(tmp_path / "test") == [
        "holdout/Accuracy.log",
        "holdout/Loss.log",
        "holdout/values.json",
    ]


def test_learner_evaluate_uses_train_metrics_without_valid_ones(tmp_path, loaders, quiet):
    ember.seed(0)
    learner = (
        LearnerBuilder(tmp_path)
        .metric_train_numeric(AccuracyMetric())
        .devices(["cpu"])
        .renderer(quiet)
        .build(Classifier(), AdamConfig().init(), 1e-2)
    )
    learner.fit(loaders[0])
    assert set(learner.evaluate("holdout", loaders[1])) == {"Accuracy"}


def test_predict_returns_every_output_in_order_on_the_cpu(tmp_path, quiet):
    ember.seed(0)
    model = Classifier()
    dataset = BlobDataset(90, seed=1)
    out = evaluator(tmp_path, quiet, model).predict(loader())
    assert out.shape == (90, 3) and out.device.type == "cpu"
    assert model.training  # the mode it had comes back
    model.eval()
    with torch.no_grad():
        assert torch.allclose(out, model(dataset.inputs), atol=1e-6)
    assert not (tmp_path / "test").exists()  # predicting writes nothing


@dataclass
class Prediction:
    scores: torch.Tensor
    labels: torch.Tensor
    note: str


class WithPredictStep(Classifier):
    def predict_step(self, batch):
        scores = self(batch.inputs)
        return Prediction(scores, scores.argmax(1), "batch")


def test_predict_step_and_a_dataclass_output(tmp_path, quiet):
    ember.seed(0)
    model = WithPredictStep()
    out = evaluator(tmp_path, quiet, model).predict(loader())
    assert isinstance(out, Prediction)
    assert out.scores.shape == (90, 3) and out.labels.shape == (90,)
    assert torch.equal(out.labels, out.scores.argmax(1))
    assert out.note == ["batch", "batch", "batch"]


def test_learner_predict_tuples_and_dicts(tmp_path, loaders, quiet):
    ember.seed(0)

    class Pair(Classifier):
        def predict_step(self, batch):
            logits = self(batch.inputs)
            return logits, {"targets": batch.targets}

    learner = (
        LearnerBuilder(tmp_path)
        .devices(["cpu"])
        .renderer(quiet)
        .build(Pair(), AdamConfig().init(), 1e-2)
    )
    learner.fit(loaders[0])
    logits, extra = learner.predict(loader())
    assert logits.shape == (90, 3)
    assert torch.equal(extra["targets"], BlobDataset(90, seed=1).targets)


class Carrying(Classifier):
    """Counts its batches since a split started, as a recurrent model carries its hidden
    state, and reports a loss that depends on that count; notes each split it is told
    of, in which mode."""

    def __init__(self):
        super().__init__()
        self.carried = 0
        self.told: list[tuple[str, bool]] = []

    def on_split_start(self, split):
        self.told.append((split, self.training))
        self.carried = 0

    def valid_step(self, batch):
        self.carried += 1
        output = super().valid_step(batch)
        return ClassificationOutput(output.loss * self.carried, output.output, output.targets)

    def predict_step(self, batch):
        self.carried += 1
        return torch.full((len(batch.targets),), self.carried)


def test_every_evaluation_and_prediction_starts_its_split_afresh(tmp_path, loaders, quiet):
    ember.seed(0)
    model = Carrying()
    learner = (
        LearnerBuilder(tmp_path / "run")
        .metric_valid_numeric(LossMetric())
        .renderer(quiet)
        .build(model, AdamConfig().init(), 1e-2)
    )
    learner.fit(*loaders)
    assert model.carried == len(loaders[1])  # validation left its state

    holdout = loader(70, seed=5)  # 3 batches: the loss counts 1, 2, 3 times
    first = learner.evaluate("first", holdout)
    second = evaluator(tmp_path / "eval", quiet, model).eval("second", holdout)
    assert second["Loss"] == first["Loss"]
    by_batch = by_hand(model, BlobDataset(70, seed=5))["Loss"]  # every batch counted once
    assert first["Loss"] > 1.5 * by_batch
    assert model.told[-2:] == [("test", False), ("test", False)]  # in eval mode

    assert learner.predict(holdout).tolist() == [1] * 32 + [2] * 32 + [3] * 6
    assert model.told[-1] == ("predict", False)
