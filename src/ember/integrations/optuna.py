"""Optuna: prune the trials of a hyperparameter search from ember runs (needs `optuna`).

```python
def objective(trial):
    lr = trial.suggest_float("lr", 1e-4, 1e-1, log=True)
    pruning = OptunaPruning(trial, "Loss", split="valid")
    learner = (
        LearnerBuilder(f"runs/trial-{trial.number}")
        .hparams(trial.params)
        .pruning(pruning)
        ...
        .build(model, AdamConfig().init(), lr)
    )
    learner.fit(train, valid)
    pruning.raise_if_pruned()  # optuna.TrialPruned: Optuna records the trial as pruned
    return learner.history[-1][1]["valid"]["Loss"]
```

At each epoch end the watched epoch value is reported to the trial
(`trial.report(value, epoch)`); when the study's pruner then says the trial should be
pruned, the run ends like an early stop: that epoch's checkpoint is written, and
`learner.outcome` (and `history.jsonl`, `experiment.log`) say "pruned: ...". The
objective then raises `optuna.TrialPruned` (`raise_if_pruned`), which is how Optuna
expects a pruned trial to end.
"""

from __future__ import annotations

import math
from typing import Any

from ember.errors import EmberError
from ember.train.history import History, Monitor


class OptunaPruning:
    """A pruning strategy for `LearnerBuilder.pruning`: reports `split`'s epoch value
    of `metric` to `trial` at each epoch end and prunes when the study's pruner says so.

    The run trains on one process (Optuna's trial lives there); under several, rank 0
    asks the pruner and every process stops with it.
    """

    def __init__(self, trial: Any, metric: Any = "Loss", split: str = "valid") -> None:
        self._optuna = _import_optuna()
        if not callable(getattr(trial, "report", None)) or not callable(
            getattr(trial, "should_prune", None)
        ):
            raise EmberError(
                f"OptunaPruning needs an optuna Trial (the objective's argument), got "
                f"{type(trial).__name__}."
            )
        self.trial = trial
        self.monitor = Monitor.of(metric, split=split)  # type: ignore[arg-type]
        self.pruned_at: int | None = None
        """The epoch after which the run was pruned, or None."""
        self.reason: str | None = None

    @property
    def pruned(self) -> bool:
        """Whether the pruner ended the run."""
        return self.pruned_at is not None

    def should_prune(self, history: History) -> str | None:
        """Report the last epoch's value; why the run is pruned, or None."""
        epoch, values = history[-1]
        split, name = self.monitor.split, self.monitor.name
        value = self.monitor.value(values)
        if value is None:
            known = ", ".join(sorted(values.get(split, {}))) or "none"
            raise EmberError(
                f"OptunaPruning watches the {split} metric {name!r}, which this run does not "
                f"have (its {split} metrics: {known}). Register it with metric_{split}_numeric"
                f"(...) or watch another one: OptunaPruning(trial, metric, split)."
            )
        self.trial.report(value, epoch)
        if not self.trial.should_prune():
            return None
        self.pruned_at = epoch
        pruner = getattr(getattr(self.trial, "study", None), "pruner", None)
        by = f" by {type(pruner).__name__}" if pruner is not None else ""
        shown = "nan" if math.isnan(value) else f"{value:.6g}"
        self.reason = f"Optuna trial {self.trial.number} pruned{by} ({split} {name} {shown})"
        return self.reason

    def raise_if_pruned(self) -> None:
        """Raise `optuna.TrialPruned` when the run was pruned (call it after `fit`)."""
        if self.pruned_at is not None:
            raise self._optuna.TrialPruned(f"{self.reason} after epoch {self.pruned_at}")


def _import_optuna() -> Any:
    try:
        import optuna
    except ImportError as error:
        raise EmberError(
            "OptunaPruning needs the optuna package, which cannot be imported "
            f"({error}). Install it with `pip install optuna` (or `pip install ember[optuna]`)."
        ) from error
    return optuna
