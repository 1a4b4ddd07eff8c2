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
- a metric log damaged (a line whose check differs, not UTF-8, lines lost): the log of
  the epoch the newest checkpoint stopped inside is cut back to the lines that
  checkpoint counted, when those are whole (its later lines are redone by the resume);
  when they are not, the lines cannot be rebuilt and the message names the earlier
  checkpoint to resume from. A finished epoch's log keeps its lines before the damage
  (the history holds the epoch's exact values).
- validation points (`valid_every`) missing from the history are rebuilt from their
  logs, up to where the newest checkpoint stands.

A damaged file is never deleted: it is moved aside as `<name>.damaged` (`.damaged-2`,
... when that exists). A run that is going on (its lock is held) is not touched.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, Callable

from ember.durable import atomic_write_bytes
from ember.errors import EmberError, RunRecordError
from ember.train.files.artifacts import (
    SPLITS,
    Artifacts,
    checkpoint_epochs,
    checkpoint_path,
    staged_checkpoints,
)
from ember.train.files.lock import read_lock
from ember.train.files.metric_files import (
    metric_file_name,
    metric_stem,
    parse_log,
    read_metric_log,
)
from ember.train.files.run_record import last_outcome, read_hparams, read_sessions
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
    artifacts.check_links(EmberError)  # repair writes: never through a link out of the run
    lock = read_lock(artifacts.lock)
    if lock is not None and lock.running:
        if lock.unreadable is not None:
            raise EmberError(
                f"{root} cannot be repaired yet: {lock.unreadable}. Repair it then, or now "
                f"after deleting {artifacts.lock} by hand if no process trains in it."
            )
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
    newest = newest_checkpoint(artifacts)
    done += repair_logs(artifacts, newest)
    done += repair_history(artifacts, newest)
    return done


def newest_checkpoint(artifacts: Artifacts) -> dict[str, Any] | None:
    """The learner state of the newest loadable checkpoint of the file checkpointer (its
    position, the log lines it counted, the history's lines then), or None."""
    from ember.record import load
    from ember.record.file_recorder import EXTENSIONS

    directory = artifacts.checkpoints
    best: tuple[tuple[int, int], dict[str, Any]] | None = None
    for extension in EXTENSIONS:
        found = [(e, directory) for e in checkpoint_epochs(directory, "scheduler", extension)]
        found += list(staged_checkpoints(directory).items())
        for epoch, folder in found:
            try:
                learner = load(None, checkpoint_path(folder, "scheduler", epoch, extension))
                learner = learner["learner"]
                at = (int(learner["epoch"]), 1 << 62 if learner["complete"] else 0)
                at = (at[0], at[1] or int(learner.get("iteration") or 0))
            except Exception:  # a damaged checkpoint says nothing
                continue
            if best is None or at > best[0]:
                best = (at, learner)
    return best[1] if best is not None else None


def repair_logs(artifacts: Artifacts, newest: dict[str, Any] | None) -> list[str]:
    """Make the metric logs whole again (see the module); what was done."""
    done: list[str] = []
    open_epoch, counts = None, {}
    if newest is not None and not newest.get("complete") and int(newest.get("iteration") or 0):
        open_epoch = int(newest["epoch"])
        counts = {
            metric_file_name(name): int(count)
            for name, count in dict(newest.get("log_lines") or {}).items()
        }
        counted = int(newest["iteration"])
        for name in sorted(set(counts)):
            path = artifacts.epoch_dir("train", open_epoch) / name
            if not path.exists():
                done.append(_cannot_rebuild(artifacts, path, "the file is missing", open_epoch))
        for path in sorted(artifacts.epoch_dir("train", open_epoch).glob("*.log")):
            keep = counts.get(path.name, counted)
            done += _repair_open_log(artifacts, path, keep, open_epoch)
    for split in SPLITS:
        for epoch, _, path in artifacts.metric_logs(split):
            if split != "train" or epoch != open_epoch:
                done += _repair_finished_log(artifacts, path)
    for epoch in artifacts.epoch_dirs("valid"):
        for folder in artifacts.point_dirs(epoch).values():
            for path in sorted(folder.glob("*.log")):
                done += _repair_finished_log(artifacts, path)
    return done


def _repair_open_log(artifacts: Artifacts, path: Path, keep: int, epoch: int) -> list[str]:
    """The log of the epoch the newest checkpoint stopped inside: cut back to the `keep`
    lines it counted, when those are whole."""
    data = path.read_bytes()
    found = parse_log(data, path)
    whole = not found.damaged or (found.damaged_line or 0) > keep
    if whole and len(found.rows) >= keep:
        if not found.damaged:
            return []  # lines after the checkpoint: the resume cuts them itself
        aside = set_aside_copy(path, data)
        kept = b"".join(line + b"\n" for line in data.split(b"\n")[:keep])
        atomic_write_bytes(path, kept)
        return [
            f"{_relative(artifacts, path)}: line {found.damaged_line}: {found.problem}; "
            f"cut back to the {keep} line(s) the checkpoint counted (the file as it was is "
            f"kept as {aside.name})"
        ]
    problem = (
        f"line {found.damaged_line}: {found.problem}"
        if found.damaged
        else f"it holds {len(found.rows)} line(s), the checkpoint counted {keep}"
    )
    return [_cannot_rebuild(artifacts, path, problem, epoch)]


def _cannot_rebuild(artifacts: Artifacts, path: Path, problem: str, epoch: int) -> str:
    earlier = [e for e in checkpointed(artifacts)[1] if e < epoch]
    fix = (
        f"resume from the checkpoint of epoch {earlier[-1]} with checkpoint({earlier[-1]}), "
        "which trains the rest again"
        if earlier
        else "no earlier checkpoint is left: train again with LearnerBuilder(dir, overwrite=True)"
    )
    return (
        f"{_relative(artifacts, path)}: {problem}; the lines the checkpoint of epoch {epoch} "
        f"counted are not all whole and cannot be rebuilt (the epoch's mean values came from "
        f"them): {fix}"
    )


def _repair_finished_log(artifacts: Artifacts, path: Path) -> list[str]:
    """A finished epoch's (or validation point's) log: keep its lines before the damage."""
    data = path.read_bytes()
    found = parse_log(data, path)
    if not found.damaged:
        return []
    aside = set_aside_copy(path, data)
    kept = len(found.rows)
    atomic_write_bytes(path, b"".join(line + b"\n" for line in data.split(b"\n")[:kept]))
    return [
        f"{_relative(artifacts, path)}: line {found.damaged_line}: {found.problem}; kept its "
        f"{kept} whole line(s) "
        f"before it (the file as it was is kept as {aside.name})"
    ]


def set_aside_copy(path: Path, data: bytes) -> Path:
    """Keep `data` (a file about to be rewritten) as `<name>.damaged` (`.damaged-2`, ...)."""
    aside = path.with_name(f"{path.name}.damaged")
    number = 2
    while aside.exists():
        aside = path.with_name(f"{path.name}.damaged-{number}")
        number += 1
    atomic_write_bytes(aside, data)
    return aside


def _relative(artifacts: Artifacts, path: Path) -> str:
    try:
        return str(path.relative_to(artifacts.root))
    except ValueError:
        return str(path)


def repair_history(artifacts: Artifacts, newest: dict[str, Any] | None = None) -> list[str]:
    """Keep the intact records of the history, rebuild the epochs and validation points
    it lacks from the metric logs, and write it whole again; what was done (nothing when
    it is whole). `newest`: the newest checkpoint's learner state."""
    saved = artifacts.saved_history
    trained, kept = checkpointed(artifacts)
    problems: list[str] = []
    history = RunHistory()
    if saved is None:
        if trained == 0 and not artifacts.point_dirs(1):
            return []
        problems.append("the file is missing")
    else:
        try:
            history, problems = RunHistory.salvage(saved)
        except RunRecordError as error:
            problems.append(error.problem or str(error))
        short = _lines_lost(history, newest)
        if short and not problems:
            problems.append(short)
        history.path = None  # rebuilt in memory, then written whole
    have = {epoch for epoch, _ in history.epochs}
    missing = [epoch for epoch in range(1, trained + 1) if epoch not in have]
    points = missing_points(artifacts, history, newest, trained)
    if not problems and not missing and not points:
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
    history.points = sorted([*history.points, *points], key=lambda point: point[:2])
    if saved is None or problems:
        history.checkpoints = kept
    history.repairs.append({"at": time.time(), "dropped": problems, "rebuilt": rebuilt})
    ended = None if history.outcome is not None or lost else last_outcome(artifacts.root)
    if ended is not None:  # lost with the end of the file: the last fit recorded it too
        history.outcome = ended
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
    if points:
        where = ", ".join(f"epoch {e} iteration {i}" for e, i, _ in points)
        what.append(f"validation point(s) at {where} rebuilt from their logs")
    if ended is not None:
        what.append(f"the run's outcome ({ended}) taken back from sessions.json")
    if lost:
        what.append(
            f"epoch(s) {_listing(lost)} have no training logs and cannot be rebuilt: resume "
            "from an earlier checkpoint with checkpoint(epoch), or train again with "
            "LearnerBuilder(dir, overwrite=True)"
        )
    return ["; ".join(what) + "."]


def _lines_lost(history: RunHistory, newest: dict[str, Any] | None) -> str | None:
    """What a resume from the newest checkpoint would refuse: the history is the file
    the checkpoint noted, but has fewer lines than it had then."""
    mark = newest.get("history_mark") if newest is not None else None
    if not isinstance(mark, (list, tuple)) or len(mark) != 2 or history.file_id != mark[0]:
        return None
    if history.lines >= int(mark[1]):
        return None
    return (
        f"it ends after line {history.lines}, but it had {int(mark[1])} lines when the "
        "newest checkpoint was written (its last lines were lost)"
    )


def missing_points(
    artifacts: Artifacts,
    history: RunHistory,
    newest: dict[str, Any] | None,
    trained: int,
) -> list[tuple[int, int, dict[str, dict[str, float]]]]:
    """The validation points inside epochs (`valid_every`) that have logs but that the
    history lacks, up to where the newest checkpoint stands, rebuilt from their logs."""
    if newest is not None and not newest.get("complete"):
        until = (int(newest["epoch"]), int(newest.get("iteration") or 0))
    else:
        until = (trained, 1 << 62)
    names = {metric_stem(name): name for _, _, values in history.points for name in values["valid"]}
    have = {(epoch, iteration) for epoch, iteration, _ in history.points}
    found = []
    for epoch in sorted(artifacts.epoch_dirs("valid")):
        for iteration, folder in sorted(artifacts.point_dirs(epoch).items()):
            if (epoch, iteration) in have or (epoch, iteration) > until:
                continue
            values = {}
            for path in sorted(folder.glob("*.log")):
                rows = read_metric_log(path, [])
                if rows:
                    values[names.get(path.stem, path.stem.replace("_", " "))] = weighted_mean(rows)
            if values:
                found.append((epoch, iteration, {"valid": values}))
    return found


def log_values(
    artifacts: Artifacts, epoch: int, names: dict[tuple[str, str], str]
) -> dict[str, dict[str, float]]:
    """The values of `epoch` from its metric logs: {split: {metric name: weighted mean}}
    (`names`: the metric names a log's file name stands for, where they are known)."""
    values: dict[str, dict[str, float]] = {}
    for split in SPLITS:
        for path in sorted(artifacts.epoch_dir(split, epoch).glob("*.log")):
            rows = read_metric_log(path, [])  # a damaged log's lines before the damage
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
