"""The Learner as the guide uses it: artifacts, metrics, modes, seeding and early errors."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
import torch
from ember_testing import Classifier

import ember
from ember.errors import ConfigError, TrainingError
from ember.optim import AdamConfig, SgdConfig
from ember.train import LearnerBuilder, RegressionOutput, TrainOutput
from ember.train.history import RunHistory
from ember.train.logger import read_metric_log
from ember.train.metric import AccuracyMetric, LearningRateMetric, LossMetric


def guide_builder(artifact_dir: Path, renderer, epochs: int = 2) -> LearnerBuilder:
    return (
        LearnerBuilder(artifact_dir)
        .metric_train_numeric(AccuracyMetric())
        .metric_valid_numeric(AccuracyMetric())
        .metric_train_numeric(LossMetric())
        .metric_valid_numeric(LossMetric())
        .devices(["cpu"])
        .num_epochs(epochs)
        .renderer(renderer)
    )


def tree(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


def test_artifact_tree_matches_the_seed_layout(tmp_path, loaders, quiet):
    ember.seed(0)
    learner = guide_builder(tmp_path, quiet).build(Classifier(), AdamConfig().init(), 1e-2)
    learner.fit(*loaders)
    assert tree(tmp_path) == [
        "experiment.log",
        "history.jsonl",
        "sessions.json",
        "train/epoch-1/Accuracy.log",
        "train/epoch-1/Loss.log",
        "train/epoch-2/Accuracy.log",
        "train/epoch-2/Loss.log",
        "valid/epoch-1/Accuracy.log",
        "valid/epoch-1/Loss.log",
        "valid/epoch-2/Accuracy.log",
        "valid/epoch-2/Loss.log",
    ]


def test_each_log_line_is_value_and_batch_size_summing_to_the_dataset(tmp_path, loaders, quiet):
    ember.seed(0)
    guide_builder(tmp_path, quiet).build(Classifier(), AdamConfig().init(), 1e-2).fit(*loaders)
    for split, size, batches in (("train", 200, 7), ("valid", 90, 3)):
        for epoch in (1, 2):
            for name in ("Accuracy", "Loss"):
                path = tmp_path / split / f"epoch-{epoch}" / f"{name}.log"
                lines = path.read_text().splitlines()
                assert len(lines) == batches
                for line in lines:
                    assert re.fullmatch(r"[-+0-9.e]+,[0-9]+,[0-9a-f]{8}", line), line
                    value, _weight, _check = line.split(",")
                    float(value)
                assert sum(int(line.split(",")[1]) for line in lines) == size


def test_training_learns_and_returns_the_model(tmp_path, loaders, quiet):
    ember.seed(0)
    model = Classifier()
    learner = guide_builder(tmp_path, quiet, epochs=3).build(model, AdamConfig().init(), 1e-2)
    trained = learner.fit(*loaders)
    assert trained is model
    rows = read_metric_log(tmp_path / "valid" / "epoch-3" / "Accuracy.log")
    accuracy = sum(v * w for v, w in rows) / sum(w for _, w in rows)
    assert accuracy > 90.0
    text = quiet.stream_text.getvalue()
    assert "valid epoch 3/3 done" in text


def test_validation_runs_in_eval_mode_under_inference_mode(tmp_path, loaders, quiet):
    model = Classifier()
    guide_builder(tmp_path, quiet, epochs=1).build(model, AdamConfig().init(), 1e-3).fit(*loaders)
    train_modes = {
        (training, inference) for split, training, inference in model.seen if split == "train"
    }
    valid_modes = {
        (training, inference) for split, training, inference in model.seen if split == "valid"
    }
    assert train_modes == {(True, False)}
    assert valid_modes == {(False, True)}
    assert model.training  # back in train mode after fit


def test_epoch_aggregate_in_experiment_log_is_the_weighted_mean_of_the_lines(
    tmp_path, loaders, quiet
):
    ember.seed(0)
    guide_builder(tmp_path, quiet, epochs=1).build(Classifier(), AdamConfig().init(), 1e-2).fit(
        *loaders
    )
    rows = read_metric_log(tmp_path / "valid" / "epoch-1" / "Loss.log")
    expected = math.fsum(v * w for v, w in rows) / math.fsum(w for _, w in rows)
    log = (tmp_path / "experiment.log").read_text()
    match = re.search(r"Epoch 1 valid: .*Loss ([-0-9.e+]+)", log)
    assert match and float(match.group(1)) == expected  # exact: the log shows the full value
    assert "Training Classifier" in log and "completed" in log


def test_two_seeded_runs_write_identical_logs(tmp_path, blobs, quiet):
    from ember_testing import BlobBatcher

    from ember.data import DataLoaderBuilder

    def run(directory: Path) -> dict[str, str]:
        ember.seed(3)
        train = DataLoaderBuilder(BlobBatcher()).batch_size(16).shuffle(3).build(blobs[0])
        valid = DataLoaderBuilder(BlobBatcher()).batch_size(16).build(blobs[1])
        guide_builder(directory, quiet).build(Classifier(), AdamConfig().init(), 1e-2).fit(
            train, valid
        )
        return {
            name: (directory / name).read_text()
            for name in tree(directory)
            if name.endswith(".log") and name != "experiment.log"
        }

    first, second = run(tmp_path / "a"), run(tmp_path / "b")
    assert first == second and len(first) == 8


def test_a_float_lr_beside_a_torch_optimizer_wins_and_says_so(tmp_path, loaders, quiet):
    model = Classifier()
    optimizer = torch.optim.SGD(model.parameters(), lr=123.0)
    with pytest.warns(
        UserWarning,
        match=r"lr=0\.05, and the SGD was created with lr=123\.0: the "
        r"given 0\.05 wins",
    ) as caught:
        learner = guide_builder(tmp_path, quiet, epochs=1).build(model, optimizer, 0.05)
    assert caught[0].filename == __file__  # the warning points at the build call
    learner.fit(*loaders)
    assert optimizer.param_groups[0]["lr"] == 0.05  # the learner's rate is what was used
    log = (tmp_path / "experiment.log").read_text()
    assert "WARNING" in log and "leave lr out: build(model, optimizer)" in log


def test_the_same_float_as_the_optimizer_says_nothing(tmp_path, quiet, recwarn):
    model = Classifier()
    guide_builder(tmp_path, quiet).build(model, torch.optim.SGD(model.parameters(), lr=0.05), 0.05)
    assert not [w for w in recwarn if "wins" in str(w.message)]


def test_without_lr_a_torch_optimizer_keeps_its_own_rates(tmp_path, loaders, quiet, recwarn):
    def run(directory, optimizer_of, lr=None):
        ember.seed(4)
        model = Classifier()
        optimizer = optimizer_of(model)
        builder = guide_builder(directory, quiet, epochs=2).metric_train(LearningRateMetric())
        learner = (
            builder.build(model, optimizer) if lr is None else builder.build(model, optimizer, lr)
        )
        return learner.fit(*loaders), learner, optimizer

    sgd = lambda model: torch.optim.SGD(model.parameters(), lr=0.05)
    own, learner, optimizer = run(tmp_path / "own", sgd)
    given, _, _ = run(tmp_path / "given", sgd, 0.05)
    assert [values["train"]["Learning Rate"] for _, values in learner.history] == [0.05, 0.05]
    for name, value in own.state_dict().items():
        assert torch.equal(given.state_dict()[name], value), name
    assert not [w for w in recwarn if "wins" in str(w.message)]

    # Param groups at different rates each keep theirs.
    def groups(model):
        first, *rest = model.net
        params = [{"params": first.parameters(), "lr": 0.1}]
        return torch.optim.SGD(
            [*params, {"params": [p for m in rest for p in m.parameters()]}], lr=0.01
        )

    _, learner, optimizer = run(tmp_path / "groups", groups)
    assert [group["lr"] for group in optimizer.param_groups] == [0.1, 0.01]
    assert [values["train"]["Learning Rate"] for _, values in learner.history] == [0.1, 0.1]


def test_an_ember_optimizer_config_without_lr_is_refused(tmp_path, quiet):
    with pytest.raises(
        ConfigError,
        match=r"ember optimizer config \(OptimizerFactory\) and no "
        r"learning rate.*build\(model, AdamConfig\(\), 1e-3\)",
    ):
        guide_builder(tmp_path, quiet).build(Classifier(), AdamConfig().init())


def test_sgd_config_binds_to_the_model(tmp_path, loaders, quiet):
    model = Classifier()
    before = [p.detach().clone() for p in model.parameters()]
    guide_builder(tmp_path, quiet, epochs=1).build(model, SgdConfig(momentum=0.9).init(), 0.05).fit(
        *loaders
    )
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))


def test_a_model_without_steps_fails_at_build(tmp_path, quiet):
    with pytest.raises(TrainingError, match=r"Linear has no train_step method"):
        guide_builder(tmp_path, quiet).build(torch.nn.Linear(2, 2), AdamConfig().init(), 1e-3)


def test_an_optimizer_of_another_model_fails_at_build(tmp_path, quiet):
    other = torch.optim.Adam(Classifier().parameters())
    with pytest.raises(ConfigError, match=r"not parameters of Classifier.*another model"):
        guide_builder(tmp_path, quiet).build(Classifier(), other, 1e-3)


class RegressionModel(Classifier):
    def valid_step(self, batch):
        output = self(batch.inputs)[:, 0]
        return RegressionOutput(output.mean(), output, batch.targets.float())


def test_a_metric_that_cannot_read_the_output_fails_before_training(tmp_path, loaders, quiet):
    model = RegressionModel()
    before = [p.detach().clone() for p in model.parameters()]
    learner = guide_builder(tmp_path, quiet).build(model, AdamConfig().init(), 1e-2)
    with pytest.raises(
        TrainingError, match=r"'Accuracy' cannot read the step output RegressionOutput"
    ):
        learner.fit(*loaders)
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    assert not (tmp_path / "train" / "epoch-1").exists()
    assert (
        "cannot read the step output RegressionOutput" in (tmp_path / "experiment.log").read_text()
    )


class NoTrainOutput(Classifier):
    def train_step(self, batch):
        return self.classify(batch)


def test_train_step_must_return_train_output(tmp_path, loaders, quiet):
    learner = guide_builder(tmp_path, quiet).build(NoTrainOutput(), AdamConfig().init(), 1e-2)
    with pytest.raises(
        TrainingError, match=r"returned ClassificationOutput; it must return TrainOutput"
    ):
        learner.fit(*loaders)


class Broken(Classifier):
    def train_step(self, batch):
        return TrainOutput(self.classify(batch.inputs))  # wrong: passes a tensor, not the batch


def test_an_error_in_a_step_names_the_step_and_shows_the_batch(tmp_path, loaders, quiet):
    learner = guide_builder(tmp_path, quiet).build(Broken(), AdamConfig().init(), 1e-2)
    with pytest.raises(AttributeError) as info:
        learner.fit(*loaders)
    notes = "\n".join(getattr(info.value, "__notes__", []))
    assert "train_step at epoch 1, iteration 1" in notes
    assert "Batch(inputs=Tensor[32, 8] float32 cpu, targets=Tensor[32] int64 cpu)" in notes
    log = (tmp_path / "experiment.log").read_text()
    assert "Traceback" in log and "AttributeError" in log


def test_a_directory_holding_a_run_is_not_mixed_with_a_new_one(tmp_path, loaders, quiet):
    guide_builder(tmp_path, quiet, epochs=1).build(Classifier(), AdamConfig().init(), 1e-2).fit(
        *loaders
    )
    with pytest.raises(
        TrainingError,
        match=r"already holds a run \(logs of 1 epoch\(s\)\)\. It saved no checkpoint.*overwrite=True",
    ):
        guide_builder(tmp_path, quiet, epochs=1).build(Classifier(), AdamConfig().init(), 1e-2).fit(
            *loaders
        )
    fresh = LearnerBuilder(tmp_path, overwrite=True).metric_train(LossMetric()).renderer(quiet)
    fresh.build(Classifier(), AdamConfig().init(), 1e-2).fit(*loaders)
    assert tree(tmp_path) == [
        "experiment.log",
        "history.jsonl",
        "sessions.json",
        "train/epoch-1/Loss.log",
    ]


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda b: b.num_epochs(0), r"num_epochs must be an int >= 1, got 0"),
        (lambda b: b.grads_accumulation(-1), r"grads_accumulation must be an int >= 1, got -1"),
        (
            lambda b: b.metric_train(LossMetric()).metric_train(LossMetric()),
            r"'Loss' is registered twice for train",
        ),
        (lambda b: b.devices([]), r"devices\(\) needs at least one device"),
        (lambda b: b.metric_train(object()), r"object is not a metric"),
    ],
)
def test_bad_builder_options_fail_at_once(tmp_path, call, message):
    with pytest.raises(ConfigError, match=message):
        call(LearnerBuilder(tmp_path))


def test_bad_learning_rate_fails_at_build(tmp_path, quiet):
    with pytest.raises(ConfigError, match=r"learning rate must be a finite number >= 0"):
        guide_builder(tmp_path, quiet).build(Classifier(), AdamConfig().init(), float("nan"))


def test_interrupter_stops_after_the_current_step(tmp_path, loaders, quiet):
    builder = guide_builder(tmp_path, quiet, epochs=5)
    interrupter = builder.interrupter()

    class StopAtThree:
        def on_event(self, event):
            if getattr(event, "iteration", 0) == 3 and event.split == "train":
                interrupter.stop("enough")

    learner = builder.listener(StopAtThree()).build(Classifier(), AdamConfig().init(), 1e-2)
    learner.fit(*loaders)
    assert len((tmp_path / "train" / "epoch-1" / "Loss.log").read_text().splitlines()) == 3
    assert not (tmp_path / "train" / "epoch-2").exists()
    assert "training stopped: enough" in quiet.stream_text.getvalue()


def test_summary_table_is_printed_logged_and_available_from_the_cli(
    tmp_path, loaders, quiet, capsys
):
    from ember.cli import main

    ember.seed(0)
    guide_builder(tmp_path, quiet, epochs=2).summary().build(
        Classifier(), AdamConfig().init(), 1e-2
    ).fit(*loaders)
    printed = capsys.readouterr().out
    assert "| Split | Metric   | Min." in printed
    assert "2 epochs, Classifier, 195 parameters" in printed
    rows = {
        tuple(c.strip() for c in line.strip("|").split("|")[:2])
        for line in printed.splitlines()[3:]
    }
    assert rows == {
        ("train", "Accuracy"),
        ("train", "Loss"),
        ("valid", "Accuracy"),
        ("valid", "Loss"),
    }
    assert printed.strip() in (tmp_path / "experiment.log").read_text()
    history = RunHistory.load(tmp_path / "history.jsonl").to_json()
    for line in printed.splitlines()[3:]:
        split, name, low, low_epoch, high, high_epoch = (
            c.strip() for c in line.strip("|").split("|")
        )
        values = {e["epoch"]: e[split][name] for e in history["epochs"]}
        assert float(low) == values[int(low_epoch)] == min(values.values())  # exact, not rounded
        assert float(high) == values[int(high_epoch)] == max(values.values())
    assert main(["summary", str(tmp_path)]) == 0
    assert capsys.readouterr().out == printed
    assert main(["summary", str(tmp_path / "nothing")]) == 2
    assert "no such artifact directory" in capsys.readouterr().err


def test_summary_uses_the_epoch_value_of_whole_epoch_metrics(tmp_path, loaders, quiet):
    from ember.cli import main
    from ember.train.metric import MetricValue

    class Whole:
        """Per batch 1.0, but an epoch value of its own (like AUROC)."""

        name, unit, input_type = "Whole Epoch", "", object

        def update(self, item, meta):
            return MetricValue(1.0, 1)

        def epoch_value(self):
            return 0.25

        def clear(self):
            pass

    LearnerBuilder(tmp_path).metric_valid_numeric(Whole()).renderer(quiet).build(
        Classifier(), AdamConfig().init(), 1e-2
    ).fit(*loaders)
    import io
    from contextlib import redirect_stdout

    out = io.StringIO()
    with redirect_stdout(out):
        assert main(["summary", str(tmp_path)]) == 0
    assert "| valid | Whole Epoch | 0.25" in out.getvalue()
