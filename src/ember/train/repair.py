"""`ember repair DIR`: make a run's damaged or missing records whole again, losing nothing.

A resume refuses a run whose records do not read back as written (`RunRecordError`);
this is the fix it names. For each record of the run:

- `history.jsonl` damaged (a line whose checksum differs, that is not JSON, lost
  lines) or missing: every intact record is kept, in order; each epoch that the
  newest loadable checkpoint has trained and the history lacks is rebuilt from the
  epoch's metric logs (each metric's value is the weighted mean of its lines: exact
  for the metrics that are means, an approximation for whole-epoch ones such as
  AUROC); the file is written whole again with a `repaired` record saying what was
  dropped and rebuilt. An epoch with no training logs cannot be rebuilt and is named.
- `sessions.json` damaged: the sessions start again from the next fit (`ember compare`
  counts the wall time of the fits from then on).
- `hparams.json` damaged: the next fit writes it again from `LearnerBuilder.hparams`.

A damaged file is never deleted: it is moved aside as `<name>.damaged` (`.damaged-2`,
... when that exists). A run that is going on (its lock is held) is not touched.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, Callable

from ember.errors import EmberError, RunRecordError
from ember.train.files.artifacts import (
    SPLITS,
    Artifacts,
    checkpoint_epochs,
    checkpoint_path,
    staged_checkpoints,
)
from ember.train.files.lock import read_lock
from ember.train.files.metric_files import metric_stem, read_metric_log
from ember.train.files.run_record import read_hparams, read_sessions
from ember.train.history import RunHistory
from ember.train.metric.base import weighted_mean

__all__ = ["repair_run"]


def repair_run(directory: str | os.PathLike[str]) -> list[str]:
    """Repair the records of the run in `directory` (see the module); what was done, one
    sentence each (none when every record reads back as written)."""
    root = Path(directory)
    if not root.is_dir():
        raise EmberError(f"{root}: no such artifact directory.")
    artifacts = Artifacts(root)
    lock = read_lock(artifacts.lock)
    if lock is not None and lock.running:
        who = lock.owner.describe() if lock.owner is not None else "another run"
        raise EmberError(f"{root} is in use by {who}: repair it once that run has ended.")
    done: list[str] = []
    records: list[tuple[Path, Callable[[Path], Any], str]] = [
        (
            artifacts.hparams,
            read_hparams,
            "the next fit writes it again from LearnerBuilder.hparams(...)",
        ),
        (
            artifacts.sessions,
            read_sessions,
            "the sessions start again at the next fit (ember compare's wall time counts "
            "the fits from then on)",
        ),
    ]
    for path, read, then in records:
        try:
            read(root)
        except RunRecordError as error:
            aside = set_aside(path)
            done.append(f"{path.name}: {error.problem or error}; moved to {aside.name}; {then}.")
    done += repair_history(artifacts)
    return done


def repair_history(artifacts: Artifacts) -> list[str]:
    """Keep the intact records of the history, rebuild the epochs it lacks from the metric
    logs, and write it whole again; what was done (nothing when it is whole)."""
    saved = artifacts.saved_history
    trained, kept = checkpointed(artifacts)
    problems: list[str] = []
    history = RunHistory()
    if saved is None:
        if trained == 0:
            return []
        problems.append("the file is missing")
    else:
        try:
            history, problems = RunHistory.salvage(saved)
        except RunRecordError as error:
            problems.append(error.problem or str(error))
        history.path = None  # rebuilt in memory, then written whole
    have = {epoch for epoch, _ in history.epochs}
    missing = [epoch for epoch in range(1, trained + 1) if epoch not in have]
    if not problems and not missing:
        return []
    names = {
        (split, metric_stem(name)): name
        for _, values in history.epochs
        for split, split_values in values.items()
        for name in split_values
    }
    rebuilt, lost = [], []
    for epoch in missing:
        values = log_values(artifacts, epoch, names)
        if "train" in values:
            history.epochs.append((epoch, values))
            rebuilt.append(epoch)
        else:
            lost.append(epoch)
    history.epochs.sort(key=lambda entry: entry[0])
    if saved is None or problems:
        history.checkpoints = kept
    history.repairs.append({"at": time.time(), "dropped": problems, "rebuilt": rebuilt})
    name = saved.name if saved is not None else artifacts.history.name
    what = [f"{name}: {'; '.join(problems)}" if problems else f"{name}: epochs were missing"]
    if saved is not None:
        what.append(f"the file as it was is kept as {set_aside(saved).name}")
    history.path = artifacts.history
    history.rewrite()
    what.append(f"history.jsonl holds {len(history.epochs)} epoch(s) again")
    if rebuilt:
        what.append(
            f"epoch(s) {_listing(rebuilt)} rebuilt from the metric logs (each value the mean "
            "of the log's lines)"
        )
    if lost:
        what.append(
            f"epoch(s) {_listing(lost)} have no training logs and cannot be rebuilt: resume "
            "from an earlier checkpoint with checkpoint(epoch), or train again with "
            "LearnerBuilder(dir, overwrite=True)"
        )
    return ["; ".join(what) + "."]


def log_values(
    artifacts: Artifacts, epoch: int, names: dict[tuple[str, str], str]
) -> dict[str, dict[str, float]]:
    """The values of `epoch` from its metric logs: {split: {metric name: weighted mean}}
    (`names`: the metric names a log's file name stands for, where they are known)."""
    values: dict[str, dict[str, float]] = {}
    for split in SPLITS:
        for path in sorted(artifacts.epoch_dir(split, epoch).glob("*.log")):
            rows = read_metric_log(path)
            if rows:
                name = names.get((split, path.stem), path.stem.replace("_", " "))
                values.setdefault(split, {})[name] = weighted_mean(rows)
    return values


def checkpointed(artifacts: Artifacts) -> tuple[int, list[int]]:
    """The whole epochs that the newest loadable checkpoint of the file checkpointer
    has trained, and the epochs with a complete checkpoint (whatever its recorder)."""
    from ember.record import load
    from ember.record.file_recorder import EXTENSIONS

    directory = artifacts.checkpoints
    trained, kept = 0, set()
    for extension in EXTENSIONS:
        found = [
            (epoch, directory) for epoch in checkpoint_epochs(directory, "scheduler", extension)
        ]
        found += list(staged_checkpoints(directory).items())
        for epoch, folder in found:
            try:
                learner = load(None, checkpoint_path(folder, "scheduler", epoch, extension))
                learner = learner["learner"]
                done = int(learner["epoch"]) - (0 if learner["complete"] else 1)
            except Exception:  # a damaged checkpoint says nothing
                continue
            trained = max(trained, done)
            parts = ("model", "optim")
            if all(checkpoint_path(folder, part, epoch, extension).exists() for part in parts):
                kept.add(epoch)
    return trained, sorted(kept)


def set_aside(path: Path) -> Path:
    """Move `path` to `<name>.damaged` (`.damaged-2`, ... when taken); the new path."""
    aside = path.with_name(f"{path.name}.damaged")
    number = 2
    while aside.exists():
        aside = path.with_name(f"{path.name}.damaged-{number}")
        number += 1
    os.replace(path, aside)
    return aside


def _listing(epochs: list[int]) -> str:
    return ", ".join(map(str, epochs))
