"""The regression example: its MAE, RMSE and R² equal scikit-learn's on the trained
model's validation predictions, and the model learns."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from ember_testing import load_example
from sklearn.metrics import mean_absolute_error, r2_score, root_mean_squared_error

from ember.train.logger import read_metric_log

SCRIPT = Path(__file__).resolve().parents[1] / "examples" / "regression" / "training.py"


def test_reported_metrics_match_scikit_learn(tmp_path, capsys):
    example = load_example(SCRIPT, "regression_training")
    directory = tmp_path / "regression"
    example.main(["--artifact-dir", str(directory), "--num-epochs", "6"])
    assert "validation after 6 epochs: MAE" in capsys.readouterr().out

    results = __import__("json").loads((directory / "results.json").read_text())
    model = example.Regressor()
    model.load_state_dict(torch.load(directory / "weights.pt", weights_only=True))
    x, y = example.make_data()
    with torch.inference_mode():
        predicted = model.eval()(x[800:]).double().numpy()
    truth = y[800:].double().numpy()
    assert results["MAE"] == pytest.approx(mean_absolute_error(truth, predicted), rel=1e-5)
    assert results["RMSE"] == pytest.approx(root_mean_squared_error(truth, predicted), rel=1e-5)
    assert results["R2"] == pytest.approx(r2_score(truth, predicted), rel=1e-5)
    assert results["R2"] > 0.8  # it learned (predicting the mean scores 0)

    lines = read_metric_log(directory / "valid" / "epoch-6" / "RMSE.log")
    assert [weight for _, weight in lines] == [64, 64, 64, 8]  # one line per batch
