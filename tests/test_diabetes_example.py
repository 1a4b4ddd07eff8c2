"""The diabetes example trains as its README says: artifacts, overrides, and a model
that beats predicting the mean."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch
from ember_testing import load_example

from ember.record import DefaultRecorder
from ember.train.logger import read_metric_log

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "examples" / "diabetes" / "training.py"


def load_diabetes():
    """The example as a module of its own name (examples/mnist has a training.py too)."""
    return load_example(SCRIPT, "diabetes_training")


def test_a_short_run_writes_its_artifacts_and_beats_the_mean_predictor(tmp_path):
    directory = tmp_path / "diabetes"
    env = {**os.environ, "EMBER_PROGRESS_INTERVAL": "3600"}
    paths = [str(ROOT / "src"), env.get("PYTHONPATH", "")]
    env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    done = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            "--artifact-dir",
            str(directory),
            "--num-epochs",
            "8",
            "--patience",
            "3",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "for the mean predictor" in done.stdout

    results = json.loads((directory / "results.json").read_text())
    assert results["valid_rmse"] < 0.85 * results["baseline_rmse"], results
    assert results["valid_samples"] == 88 and results["train_samples"] == 354
    assert 1 <= results["best_epoch"] <= results["epochs_run"] <= 8

    config = json.loads((directory / "config.json").read_text())
    assert config["num_epochs"] == 8 and config["patience"] == 3  # the command line won
    log = (directory / "experiment.log").read_text()
    assert "CosineAnnealingLrScheduler" in log
    assert f"Restored the weights of epoch {results['best_epoch']}" in log
    for split, name in (
        ("train", "Loss"),
        ("train", "RMSE"),
        ("train", "Learning_Rate"),
        ("valid", "Loss"),
        ("valid", "RMSE"),
        ("valid", "MAE"),
    ):
        assert read_metric_log(directory / split / "epoch-1" / f"{name}.log"), (split, name)
    kept = sorted(p.name for p in (directory / "checkpoint").glob("model-*.mpk"))
    assert f"model-{results['best_epoch']}.mpk" in kept  # the best epoch is kept for restore_best

    # The saved model is the restored best one: it reproduces the reported RMSE.
    example = load_diabetes()
    model = DefaultRecorder().load(example.ModelConfig().init(), directory / "model").eval()
    data = example.load_splits(0.2, 42)
    with torch.inference_mode():
        predicted = model(torch.stack([x for x, _ in data.valid])).double().numpy()
    predicted = predicted * data.target_std + data.target_mean
    rmse = float(((predicted - data.valid_targets) ** 2).mean() ** 0.5)
    assert abs(rmse - results["valid_rmse"]) < 1e-6


def test_the_epoch_rmse_is_exact_over_the_epoch_not_a_mean_of_batches():
    example = load_diabetes()
    from ember.train.metric import MetricMetadata, RegressionInput

    metric = example.RmseMetric(scale=2.0)
    meta = MetricMetadata("valid", 1, 1, 1, 2, None)
    first = metric.update(RegressionInput(torch.tensor([1.0, 1.0]), torch.tensor([0.0, 0.0])), meta)
    second = metric.update(RegressionInput(torch.tensor([3.0]), torch.tensor([0.0])), meta)
    assert first.resolve() == (2.0, 2.0) and second.resolve() == (6.0, 1.0)
    assert abs(float(metric.epoch_value()) - 2.0 * (11 / 3) ** 0.5) < 1e-12
    metric.clear()
    assert metric.epoch_value() != metric.epoch_value()  # NaN once cleared
