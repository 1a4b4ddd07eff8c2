"""`learner.evaluate` and `learner.predict` after an FSDP fit, on the two CPU processes
(gloo) the fit ran on (tests/scripts/evaluate_fsdp.py), against one process evaluating
the trained weights; and `evaluate_run` on that run's checkpoints, written in shards."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from ember_testing import load_example

from ember.errors import TrainingError
from ember.optim import AdamConfig
from ember.record import DefaultRecorder
from ember.train import EvaluatorBuilder, LearnerBuilder, evaluate_run
from ember.train.history import RunHistory
from ember.train.logger import read_metric_log
from ember.train.metric import AccuracyMetric, LossMetric
from ember.train.renderer import PlainRenderer
from ember.train.renderer.silent import SilentRenderer

SCRIPT = Path(__file__).parent / "scripts" / "evaluate_fsdp.py"


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """The run of the script: its directory (trained, evaluated and predicted on two
    processes)."""
    directory = tmp_path_factory.mktemp("fsdp-evaluate") / "run"
    done = subprocess.run(
        [sys.executable, str(SCRIPT), str(directory)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    return directory


def one_process(run, tmp_path):
    """The trained model in this one process, its evaluator and the script's loaders."""
    script = load_example(SCRIPT, "evaluate_fsdp_script")
    model = script.Model()
    DefaultRecorder().load(model, run / "final")
    evaluator = (
        EvaluatorBuilder(tmp_path / "one")
        .metric_numeric(AccuracyMetric())
        .metric_numeric(LossMetric())
        .renderer(PlainRenderer(interval=3600))
        .build(model)
    )
    return evaluator, script.loaders()


@pytest.mark.slow
def test_evaluate_on_two_processes_equals_one_process(run, tmp_path):
    evaluator, (_, valid, _) = one_process(run, tmp_path)
    expected = evaluator.eval("holdout", valid)
    for rank in (0, 1):  # every process gets the values
        got = json.loads((run / f"rank-{rank}.json").read_text())
        assert got.keys() == expected.keys()
        for name, value in expected.items():
            assert abs(got[name] - value) < 1e-6, (rank, name, got[name], value)
    # rank 0 wrote the evaluation: every batch of both processes, none of the stand-in
    saved = json.loads((run / "test" / "holdout" / "values.json").read_text())
    assert (saved["items"], saved["batches"]) == (53, 7)
    assert len(read_metric_log(run / "test" / "holdout" / "Loss.log")) == 7


@pytest.mark.slow
def test_predict_on_two_processes_gives_every_output_in_order(run, tmp_path):
    evaluator, (_, valid, tiny) = one_process(run, tmp_path)
    expected = evaluator.predict(valid)
    few = evaluator.predict(tiny)
    for rank in (0, 1):
        got = DefaultRecorder().load(None, run / f"rank-{rank}-predictions")
        assert got["logits"].shape == (53, 3)
        torch.testing.assert_close(got["logits"], expected["logits"], rtol=0, atol=1e-6)
        assert torch.equal(got["labels"], expected["labels"])
        # one batch for two processes: the second ran a stand-in, nothing of it counted
        torch.testing.assert_close(got["few"], few["logits"], rtol=0, atol=1e-6)


@pytest.mark.slow
def test_evaluate_run_joins_a_checkpoint_written_in_shards(run, tmp_path):
    script = load_example(SCRIPT, "evaluate_fsdp_script")
    _, valid, _ = script.loaders()
    history = dict(RunHistory.load(run / "history.jsonl").entries())
    for checkpoint, epoch in (("last", 2), (1, 1)):
        values = evaluate_run(
            run,
            script.Model(),
            valid,
            AccuracyMetric(),
            LossMetric(),
            checkpoint=checkpoint,
            renderer=SilentRenderer(),
        )
        for name, value in history[epoch]["valid"].items():
            assert abs(values[name] - value) < 1e-6, (epoch, name)
        assert (run / "test" / f"epoch-{epoch}" / "values.json").exists()


def test_evaluate_and_predict_before_an_fsdp_fit_are_refused(tmp_path):
    script = load_example(SCRIPT, "evaluate_fsdp_script")
    learner = (
        LearnerBuilder(tmp_path)
        .devices(["cpu", "cpu"], strategy="fsdp")
        .build(script.Model(), AdamConfig().init(), 1e-2)
    )
    _, valid, _ = script.loaders()
    for verb in (lambda: learner.evaluate("holdout", valid), lambda: learner.predict(valid)):
        with pytest.raises(
            TrainingError, match=r"Under FSDP, evaluate\(\) and predict\(\) run after"
        ):
            verb()
