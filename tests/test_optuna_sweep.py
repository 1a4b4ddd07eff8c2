"""The Optuna sweep example: trials report to Optuna, a pruned run ends "pruned" with
its checkpoint, and the study stored in SQLite reads back what the runs wrote."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest
from ember_testing import load_example

from ember.errors import EmberError
from ember.integrations.optuna import OptunaPruning
from ember.train.files.run_record import read_hparams
from ember.train.history import RunHistory

ROOT = Path(__file__).resolve().parents[1]


class PruneTrial(optuna.pruners.BasePruner):
    """Prunes one given trial once it has reported a value: a pruned trial for sure."""

    def __init__(self, number: int) -> None:
        self.number = number

    def prune(self, study, trial) -> bool:
        return trial.number == self.number and trial.last_step is not None


@pytest.mark.slow  # three short runs and a fresh SQLite study: about 25 s on a busy machine
def test_a_study_in_sqlite_holds_each_trial_with_its_runs_values(tmp_path, monkeypatch):
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    sweep = load_example(ROOT / "examples" / "sweep" / "sweep.py", "sweep_example")
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    sweep.search(storage, tmp_path, trials=3, epochs=2, pruner=PruneTrial(1), limit=400)

    study = optuna.load_study(study_name="digits", storage=storage)
    assert [t.state for t in study.trials] == [
        optuna.trial.TrialState.COMPLETE,
        optuna.trial.TrialState.PRUNED,
        optuna.trial.TrialState.COMPLETE,
    ]
    for trial in study.trials:
        run = tmp_path / f"trial-{trial.number}"
        history = RunHistory.load(run / "history.jsonl")
        losses = {epoch: values["valid"]["Loss"] for epoch, values in history.epochs}
        assert trial.intermediate_values == losses
        assert read_hparams(run) == {**trial.params, "epochs": 2}
        if trial.state == optuna.trial.TrialState.PRUNED:
            assert list(losses) == [1]  # pruned after its first epoch
            assert history.outcome.startswith("pruned: Optuna trial 1 pruned by PruneTrial")
            assert history.checkpoints == [1]
            assert "pruned: Optuna trial 1" in (run / "experiment.log").read_text()
        else:
            assert history.outcome == "completed"
            assert trial.value == losses[2]


def test_pruning_names_a_metric_the_run_lacks_and_needs_a_trial(tmp_path):
    study = optuna.create_study()
    trial = study.ask()
    pruning = OptunaPruning(trial, "Accuracy")
    with pytest.raises(EmberError, match=r"valid metric 'Accuracy'.*its valid metrics: Loss"):
        pruning.should_prune([(1, {"valid": {"Loss": 0.5}})])
    with pytest.raises(EmberError, match="needs an optuna Trial"):
        OptunaPruning(object())
    assert not pruning.pruned
    pruning.raise_if_pruned()  # nothing to raise
