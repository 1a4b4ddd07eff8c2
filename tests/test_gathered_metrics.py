"""Whole-epoch metrics (AUROC, precision, F-beta, MCC, AUC-PR, RMSE, R2, BLEU...) are exact over every process's share:
their states are merged on rank 0, so 1 and 2 processes give the same epoch values."""

from __future__ import annotations

import json
import math
from pathlib import Path

from ember_testing import run_script

SCRIPT = Path(__file__).parent / "scripts" / "train_gather.py"


def valid_values(directory: Path, processes: int) -> dict[str, float]:
    done = run_script(SCRIPT, str(directory), "--processes", str(processes), timeout=180)
    assert done.returncode == 0, done.stderr
    history = json.loads((directory / "history.json").read_text())
    return history["epochs"][0]["valid"]


def test_whole_epoch_metrics_are_the_same_on_one_and_two_processes(tmp_path):
    one = valid_values(tmp_path / "one", 1)
    two = valid_values(tmp_path / "two", 2)
    exact = ("AUROC", "F2 Score", "Precision", "MCC", "Confusion Matrix", "BLEU", "Dice")
    for name in exact:
        assert two[name] == one[name], name  # merged states: exactly the same figure
    for name in ("AUC-PR", "RMSE", "R2", "WER", "CER", "MAE", "ROUGE-L"):  # float sums
        # (a mean of batch values for MAE, CER and ROUGE-L: every rank's rows are gathered)
        assert math.isclose(two[name], one[name], rel_tol=1e-9), name
    assert 0 < one["BLEU"] < 100 and 0 < one["WER"] < 1 and one["R2"] < 1 and one["Dice"] < 1
    assert math.isclose(two["Loss"], one["Loss"], rel_tol=1e-6)  # a mean of batch means
    log = (tmp_path / "two" / "experiment.log").read_text()
    assert "covers rank 0's share of the data only" not in log  # no metric left unmerged
