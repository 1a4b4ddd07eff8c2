"""What a run records about itself beside its metrics: hyperparameters and sessions.

- `hparams.json`: the hyperparameters given to `LearnerBuilder.hparams(...)` (a dict,
  a dataclass or a pydantic model such as an ember `Config`), as indented JSON.
  Values must be JSON values (str, int, float, bool, None, lists and nested
  mappings); `pathlib` paths become their text and enums their value. Anything
  else is refused when the builder is called, naming the key and the fix.
- `sessions.json`: when each `fit` of the run started and ended (a resumed run adds
  a session), and how it ended; `ember compare` sums them into the run's wall time.

Both are written atomically and sealed (`ember.train.sealed`: the CRC-32 of the file's
bytes as its last key, `"$crc32"` in `hparams.json`, whose other keys are the user's),
so damage is told from absence; files of earlier versions, without it, are read as
they are. Their paths belong to `artifacts.py`.

A resumed run reads all of its records at once (`read_records`) and checks them against
the checkpoint it resumes from (`check_resume`) before it writes anything: a damaged or
missing record refuses the resume, naming the file, the line and the fix, and leaves
the directory as it was.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import logging
import math
import os
import re
import time
from pathlib import Path, PurePath
from typing import Any, Mapping

from ember.durable import atomic_write_bytes
from ember.errors import ConfigError, RunRecordError
from ember.train.files.artifacts import (
    SPLITS,
    Artifacts,
    checkpoint_epochs,
    checkpoint_path,
    staged_checkpoints,
)
from ember.train.files.metric_files import MetricLog, metric_file_name, scan_log
from ember.train.history import RunHistory, damaged
from ember.train.sealed import SealBroken, seal, unseal

log = logging.getLogger(__name__)
SESSIONS_FORMAT = "ember-sessions"
SESSIONS_VERSION = 2
"""Sealed; version 1 (no checksum) is read too."""
HPARAMS_KEY = "$crc32"
"""The key of `hparams.json` holding its checksum (the others are the hyperparameters)."""


# Hyperparameters ---------------------------------------------------------------------
def to_hparams(value: Any) -> dict[str, Any]:
    """`value` (a mapping, a dataclass instance or a pydantic model) as a JSON-ready
    dict; a value JSON cannot hold is a `ConfigError` naming its key."""
    if isinstance(value, type):
        raise ConfigError(
            f"hparams() got the class {value.__name__}: pass an instance of it (a dict, a "
            "dataclass or a pydantic model such as an ember Config)."
        )
    data = _as_mapping(value)
    if data is None:
        raise ConfigError(
            f"hparams() takes a dict, a dataclass or a pydantic model (e.g. an ember Config), "
            f"not {type(value).__name__}."
        )
    if HPARAMS_KEY in data:
        raise ConfigError(
            f"hparams: the key {HPARAMS_KEY!r} holds the checksum of hparams.json: rename it."
        )
    return _mapping(data, "")


def _as_mapping(value: Any) -> Mapping[Any, Any] | None:
    if isinstance(value, Mapping):
        return value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {field.name: getattr(value, field.name) for field in dataclasses.fields(value)}
    dump = getattr(value, "model_dump", None)  # pydantic v2 models, ember Configs included
    if callable(dump):
        return dump(mode="json")
    return None


def _mapping(data: Mapping[Any, Any], prefix: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, item in data.items():
        if not isinstance(key, str):
            raise ConfigError(
                f"hparams: the key {prefix}{key!r} is a {type(key).__name__}; JSON keys are "
                "text: use str keys."
            )
        out[key] = _value(item, f"{prefix}{key}")
    return out


def _value(item: Any, where: str) -> Any:
    if item is None or isinstance(item, (bool, str, int)):
        return item
    if isinstance(item, float):
        if not math.isfinite(item):
            raise ConfigError(
                f"hparams: {where} is {item!r}, which JSON cannot hold: give a finite number "
                "or a string."
            )
        return item
    if isinstance(item, enum.Enum):
        return _value(item.value, where)
    if isinstance(item, PurePath):
        return str(item)
    if isinstance(item, (list, tuple)):
        return [_value(element, f"{where}[{index}]") for index, element in enumerate(item)]
    nested = _as_mapping(item)
    if nested is not None:
        return _mapping(nested, f"{where}.")
    if hasattr(item, "item") and getattr(item, "ndim", None) == 0:  # a numpy or torch scalar
        return _value(item.item(), where)
    raise ConfigError(
        f"hparams: {where} is a {type(item).__name__} ({_short(item)}), which JSON cannot "
        f"hold. Give a str, number, bool, None, list or dict (str(value) for the text of "
        "an object), or leave it out."
    )


def _short(item: Any) -> str:
    text = repr(item)
    return text if len(text) <= 60 else text[:57] + "..."


def flatten_hparams(hparams: Mapping[str, Any]) -> dict[str, Any]:
    """Nested mappings as dotted keys (`model.width`); lists stay values."""
    flat: dict[str, Any] = {}

    def walk(data: Mapping[str, Any], prefix: str) -> None:
        for key, value in data.items():
            if isinstance(value, Mapping) and value:
                walk(value, f"{prefix}{key}.")
            else:
                flat[f"{prefix}{key}"] = value

    walk(hparams, "")
    return flat


def hparams_text(hparams: Mapping[str, Any]) -> str:
    """One line of JSON, for `experiment.log`."""
    return json.dumps(hparams, separators=(", ", ": "))


def write_hparams(
    artifacts: Artifacts, hparams: Mapping[str, Any], previous: Mapping[str, Any] | None = None
) -> list[str]:
    """Write `hparams.json` (atomically); returns the keys whose value differs from
    `previous` (the file a resumed run found, read before anything was written)."""
    changed: list[str] = []
    if previous is not None:
        old, new = flatten_hparams(previous), flatten_hparams(hparams)
        changed = sorted(k for k in old.keys() | new.keys() if old.get(k) != new.get(k))
    text = seal(dict(hparams), key=HPARAMS_KEY, indent=2) + b"\n"
    artifacts.root.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(artifacts.hparams, text)
    return changed


def _read_sealed(path: Path, key: str = "crc32") -> tuple[Any, bool] | None:
    """The JSON in `path` and whether it was sealed; None when there is no file; a
    `RunRecordError` naming the file and the fix when it is damaged."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as error:
        raise RunRecordError(
            f"{path} cannot be read ({error.strerror or error}): fix its permissions."
        ) from None
    try:
        return unseal(data, key)
    except SealBroken as error:
        raise damaged(path, str(error)) from None


def read_hparams(directory: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The hyperparameters of the run in `directory`; None when it recorded none."""
    path = Artifacts(directory).hparams
    found = _read_sealed(path, HPARAMS_KEY)
    if found is None:
        return None
    if not isinstance(found[0], dict):
        raise damaged(path, "it does not hold a JSON object of hyperparameters")
    return found[0]


def record_start(
    artifacts: Artifacts,
    start_epoch: int,
    hparams: Mapping[str, Any] | None,
    records: SavedRecords | None,
) -> None:
    """At the start of a `fit` (rank 0), once every check passed: write `hparams.json`,
    describe the hyperparameters in `experiment.log`, and open a session in
    `sessions.json`. `records`: what a resumed run read before (None: a fresh run)."""
    if hparams is not None:
        changed = write_hparams(artifacts, hparams, records.hparams if records else None)
        log.info("Hyperparameters: %s", hparams_text(hparams))
        if changed:
            log.warning(
                "The hyperparameters differ from those the run was started with (%s): "
                "hparams.json now holds this run's.",
                ", ".join(changed),
            )
    start_session(artifacts, start_epoch, records.sessions if records else [])


# Sessions -----------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Session:
    """One `fit` of a run: its start and end (Unix time), first epoch and outcome."""

    started: float
    start_epoch: int
    ended: float | None = None
    outcome: str | None = None


def read_sessions(directory: str | os.PathLike[str]) -> list[Session]:
    """The sessions of the run in `directory`, oldest first; none for a run written by
    an ember that did not record them. A damaged file is a `RunRecordError`."""
    path = Artifacts(directory).sessions
    found = _read_sealed(path)
    if found is None:
        return []
    data, sealed = found
    if not isinstance(data, dict) or data.get("format") != SESSIONS_FORMAT:
        raise damaged(path, "it is not an ember sessions file")
    if data.get("version") not in (1, SESSIONS_VERSION):
        raise RunRecordError(
            f"{path} has sessions version {data.get('version')!r}; this ember reads versions "
            f"1 and {SESSIONS_VERSION}. Upgrade ember to read it."
        )
    if data["version"] == SESSIONS_VERSION and not sealed:
        raise damaged(path, "it has no checksum (it was edited, or written by another program)")
    try:
        return [
            Session(
                float(entry["started"]),
                int(entry["start_epoch"]),
                None if entry.get("ended") is None else float(entry["ended"]),
                entry.get("outcome"),
            )
            for entry in data["sessions"]
        ]
    except (KeyError, TypeError, ValueError) as error:
        raise damaged(path, f"malformed sessions ({error!r})") from None


def _write_sessions(artifacts: Artifacts, sessions: list[Session]) -> None:
    data = {
        "format": SESSIONS_FORMAT,
        "version": SESSIONS_VERSION,
        "sessions": [dataclasses.asdict(session) for session in sessions],
    }
    atomic_write_bytes(artifacts.sessions, seal(data, indent=1) + b"\n")


def start_session(artifacts: Artifacts, start_epoch: int, sessions: list[Session]) -> None:
    """A `fit` starts at `start_epoch`, after the `sessions` a resumed run read (a fresh
    run starts the file again with none)."""
    _write_sessions(artifacts, [*sessions, Session(time.time(), start_epoch)])


def end_session(artifacts: Artifacts, outcome: str) -> None:
    """The last `fit` ended with `outcome` (a file damaged since is left as it is)."""
    try:
        sessions = read_sessions(artifacts.root)
    except RunRecordError as error:
        log.error("The end of this session is not recorded: %s", error)
        return
    if sessions and sessions[-1].ended is None:
        last = sessions[-1]
        sessions[-1] = Session(last.started, last.start_epoch, time.time(), str(outcome))
        _write_sessions(artifacts, sessions)


def last_outcome(directory: str | os.PathLike[str]) -> str | None:
    """How the last `fit` of the run in `directory` ended, as `sessions.json` recorded it
    (its history records the same); None when that fit did not end (it was killed), or
    the file is missing or damaged."""
    try:
        sessions = read_sessions(directory)
    except RunRecordError:
        return None
    last = sessions[-1] if sessions else None
    return last.outcome if last is not None and last.ended is not None else None


def wall_time(sessions: list[Session], running: bool, last_write: float | None) -> float | None:
    """Seconds spent in `fit` over every session. An unfinished last session counts
    until now when the run is `running`, else until `last_write` (the last time the
    run wrote its history: it was killed after that); None without sessions."""
    if not sessions:
        return None
    total = 0.0
    for index, session in enumerate(sessions):
        end = session.ended
        last = index == len(sessions) - 1
        if end is None:
            if running and last:
                end = time.time()
            else:  # killed: it wrote last at `last_write`, before the next session began
                end = last_write if last_write is not None else session.started
                if not last:
                    end = min(end, sessions[index + 1].started)
        total += max(0.0, end - session.started)
    return total


# A resume's checks -------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class SavedRecords:
    """The records of a run as a resumed `fit` reads them, all at once, before it writes
    anything: its history (None when it has none), sessions and hyperparameters."""

    history: RunHistory | None
    sessions: list[Session]
    hparams: dict[str, Any] | None


def read_records(artifacts: Artifacts) -> SavedRecords:
    """Every record of the run in `artifacts`, each checked: a damaged one is a
    `RunRecordError` naming the file, the line and the fix."""
    saved = artifacts.saved_history
    history = RunHistory.load(saved) if saved is not None else None
    return SavedRecords(history, read_sessions(artifacts.root), read_hparams(artifacts.root))


def check_open_logs(artifacts: Artifacts, epoch: int, iteration: int) -> None:
    """The training logs of the epoch a checkpoint stopped inside (after `iteration`
    batches) must hold the lines that checkpoint counted, whole: a missing, short or
    damaged one is a `RunRecordError` naming the file, the line and the fix."""
    counts, checks = _counted_lines(artifacts, epoch, iteration)
    folder = artifacts.epoch_dir("train", epoch)
    expected = {metric_file_name(name): count for name, count in counts.items()}
    noted = {metric_file_name(name): check for name, check in checks.items()}
    for path in sorted({*folder.glob("*.log"), *(folder / name for name in expected)}):
        keep = expected.get(path.name, iteration)
        try:
            found = scan_log(path)
        except FileNotFoundError:
            if keep > 0:
                problem = f"the file is missing; the checkpoint counted {keep} line(s) of it"
                raise MetricLog(path, [], True, None, problem).error() from None
            continue
        except OSError as error:
            raise RunRecordError(f"{path} cannot be read: {error}.") from None
        if found.damaged and (found.damaged_line or 0) <= keep:
            raise found.error()
        if len(found.rows) < keep:
            problem = (
                f"it holds {len(found.rows)} line(s), but the checkpoint counted {keep}: its "
                f"last {keep - len(found.rows)} line(s) were lost"
            )
            raise MetricLog(path, found.rows, found.checked, len(found.rows) + 1, problem).error()
        saved = noted.get(path.name)
        written = found.checks or []
        got = f"{written[keep - 1]:08x}" if 0 < keep <= len(written) else None
        if saved is not None and got is not None and got != saved:
            problem = (
                f"its line {keep} is not the line the checkpoint counted (check {got}, the "
                f"checkpoint noted {saved}): the file was replaced or written again"
            )
            fix = (
                "Put back the log the run wrote, or resume from the checkpoint of an earlier "
                f"epoch (checkpoint({epoch - 1}))"
                if epoch > 1
                else "Put back the log the run wrote, or start the run again"
            )
            raise MetricLog(path, found.rows, True, keep, problem).error(fix)


def _counted_lines(
    artifacts: Artifacts, epoch: int, iteration: int
) -> tuple[dict[str, int], dict[str, str]]:
    """The log lines per training metric that the checkpoint of `epoch` taken after
    `iteration` batches counted, and the check of each one's last counted line (none
    found: {}, {})."""
    from ember.record import load
    from ember.record.file_recorder import EXTENSIONS

    for extension in EXTENSIONS:
        path = artifacts.checkpoints / f"scheduler-{epoch}.{extension}"
        if not path.exists():
            continue
        try:
            state = load(None, path)
            learner = state["learner"]
            if int(learner.get("iteration") or 0) == iteration:
                counts = {str(k): int(v) for k, v in dict(learner.get("log_lines") or {}).items()}
                checks = {str(k): str(v) for k, v in dict(state.get("log_checks") or {}).items()}
                return counts, checks
        except Exception:  # the resume reads the checkpoint and names its damage
            continue
    return {}, {}


ENDED = ("completed", "stopped", "early_stopped", "pruned", "signal", "preempted", "time_limit")
"""The stop reasons of a run that ended of its own accord or was stopped with a checkpoint:
`checkpoint("auto")` never replaces one."""


def check_resume(
    records: SavedRecords,
    artifacts: Artifacts,
    trained: int,
    where: str,
    mark: Any = None,
    carried: bool = False,
) -> None:
    """A resume from a checkpoint (`where`: "epoch 3, iteration 40") that has trained
    `trained` whole epochs: the history must hold each of them, and every line it had
    when the checkpoint was written (`mark`: the file's id and lines then). `carried`:
    the checkpoint holds the history itself (a run of an ember before the history file)."""
    inside = re.search(r"iteration (\d+)", where)
    if inside is not None:  # the logs of the epoch it stopped inside, before any write
        check_open_logs(artifacts, trained + 1, int(inside.group(1)))
    history, path = records.history, artifacts.history
    if history is None:
        if trained >= 1 and not carried:
            raise damaged(
                path,
                f"the file is missing, and the checkpoint of {where} comes after {trained} "
                "epoch(s) it should hold",
            )
        return
    same_file = isinstance(mark, (list, tuple)) and len(mark) == 2 and history.file_id == mark[0]
    if same_file and history.lines < int(mark[1]):
        raise damaged(
            path,
            f"the file ends before it, but it had {int(mark[1])} lines when the checkpoint "
            f"of {where} was written: its last {int(mark[1]) - history.lines} line(s) were lost",
            history.lines + 1,
        )
    have = {epoch for epoch, _ in history.epochs}
    missing = [epoch for epoch in range(1, trained + 1) if epoch not in have]
    if missing:
        listing = ", ".join(map(str, missing[:10])) + (", ..." if len(missing) > 10 else "")
        raise damaged(
            path,
            f"the file holds no values of epoch(s) {listing}, which the checkpoint of {where} "
            "has trained: lines of it were lost",
        )


def check_replace(artifacts: Artifacts) -> None:
    """`checkpoint("auto")` found no checkpoint and would start a fresh run in place of
    what the directory holds: refused for a run that ended or was stopped (it is never
    deleted), for a damaged history, and for metric logs without a history (nothing
    says how that run ended)."""
    saved = artifacts.saved_history
    history = RunHistory.load(saved) if saved is not None else None
    if history is None:
        epochs = sorted({epoch for split in SPLITS for epoch in artifacts.epoch_dirs(split)})
        if epochs:
            raise RunRecordError(
                f"checkpoint('auto'): {artifacts.root} holds the metric logs of {len(epochs)} "
                f"epoch(s) but no history.jsonl and no checkpoint, so nothing says how that run "
                "ended; it is left as it is. Train in another directory, or replace it with "
                "LearnerBuilder(dir, overwrite=True)."
            )
        return
    reason = (history.stop_reason or {}).get("reason")
    if reason is None and history.outcome is not None:  # a history of an earlier version
        text = str(history.outcome)
        reason = "failed" if text.startswith(("failed", "interrupted")) else "completed"
    if reason in ENDED:
        raise RunRecordError(
            f"checkpoint('auto'): {artifacts.root} holds a run that ended ({history.outcome}, "
            f"{len(history.epochs)} epoch(s)) and saved no checkpoint to resume from; it is "
            "left as it is. Train in another directory, or replace it with "
            "LearnerBuilder(dir, overwrite=True)."
        )


# The newest checkpoint, as `ember runs` reads it -----------------------------------------
def latest_loop_state(artifacts: Artifacts) -> dict[str, Any] | None:
    """The loop state (`learner`) of the newest checkpoint of the file checkpointer whose
    state part loads, in any recorder's format (a set staged whole is read first, as the
    checkpointer reads it); None when there is none."""
    from ember.record import load
    from ember.record.file_recorder import EXTENSIONS

    directory, staged = artifacts.checkpoints, staged_checkpoints(artifacts.checkpoints)
    found: list[tuple[int, Path]] = []
    for extension in EXTENSIONS:
        for epoch in set(checkpoint_epochs(directory, "scheduler", extension)).union(staged):
            paths = [checkpoint_path(directory, "scheduler", epoch, extension)]
            if epoch in staged:
                paths.insert(0, checkpoint_path(staged[epoch], "scheduler", epoch, extension))
            path = next((path for path in paths if path.exists()), None)
            if path is not None:
                found.append((epoch, path))
    for _, path in sorted(found, key=lambda entry: entry[0], reverse=True):
        try:
            learner = load(None, path)["learner"]
            if isinstance(learner, dict) and "epoch" in learner and "complete" in learner:
                return learner
        except Exception:  # a damaged checkpoint says nothing: the one before it may
            continue
    return None


def check_latest(artifacts: Artifacts, history: RunHistory | None) -> None:
    """What a resume from the newest checkpoint checks of the run's history before it
    writes anything (`check_resume`): a `RunRecordError` naming the damage and the fix;
    nothing when there is no checkpoint."""
    from ember.train.length.position import Position

    learner = latest_loop_state(artifacts)
    if learner is None:
        return
    try:
        start = Position.from_state(learner)
    except (KeyError, TypeError, ValueError):
        return
    where = f"epoch {learner['epoch']}" + (
        f", iteration {start.iteration}" if start.iteration else ""
    )
    records = SavedRecords(history, [], None)
    mark = learner.get("history_mark")
    check_resume(records, artifacts, start.epoch - 1, where, mark, "history" in learner)
