"""The exact history of a run: every epoch's values, the checkpoint epochs, the outcome.

The learner keeps it in memory and in `history.jsonl` in the artifact directory.
Summaries, plots, early stopping and the best-checkpoint choice read it; nothing
parses numbers back from `experiment.log`, which is text for people.

`history.jsonl` (format "ember-history", version 3) is JSON Lines: a header, then
one record per change, each appended, flushed and fsynced as it happens, so an
epoch end costs one short line however long the run. Every line is sealed
(`ember.train.sealed`): it ends with the CRC-32 of its own bytes, and each record
carries its line number `n`, so a damaged line and a lost one are told apart from a
line never written:

```
{"format": "ember-history", "version": 3, "id": "5f0c...", "crc32": "..."}
{"model": "Model", "num_parameters": 7850, "n": 2, "crc32": "..."}
{"epoch": 1, "train": {"Loss": 0.3101...}, "valid": {"Loss": 0.22...}, "n": 3, "crc32": "..."}
{"checkpoints": {"add": [1], "remove": []}, "n": 4, "crc32": "..."}
{"epoch": 2, "train": {...}, "valid": {...}, "n": 5, "crc32": "..."}
{"checkpoints": {"add": [2], "remove": [1]}, "n": 6, "crc32": "..."}
{"point": {"epoch": 3, "iteration": 40, "valid": {"Loss": 0.21...}}, "n": 7, "crc32": "..."}
{"outcome": "completed", "stop_reason": {"reason": "completed"}, "n": 8, "crc32": "..."}
```

Reading replays the records in order: an epoch record adds the epoch (replacing
one of the same number), `keep_before` forgets the epochs from that one on (a run
resumed before them redoes them) and clears the outcome, `checkpoints` adds and
removes epochs with a complete checkpoint after retention, `point` adds a validation
inside an epoch (`valid_every`: the epoch, the training batches done in it, the
values), `keep_before` also forgets the points after `iteration` batches of its
epoch, and `outcome` comes with `stop_reason` (`Outcome.to_json()`, or null). A line cut
short by a kill (the last one, without its newline) is ignored; any other line that
is not what was written (its checksum differs, it is not JSON, a line number is
skipped) is damage: `load` refuses the file naming the line and the fix, and
`salvage` (what `ember repair` uses) keeps every intact record. A process that
starts writing a history (a new run, or one resumed) first rewrites the whole file
atomically (a new header `id`, and one record per fact), then appends; a checkpoint
notes the `id` and the lines the file had, so a resume tells lines lost from its end.

Values are the learner's epoch values at full precision (floats written as their
shortest round-tripping text); NaN and infinities are the strings "nan", "inf" and
"-inf". Files of version 2 (the same records without `n` and checksums) are read as
they are; the `history.json` of runs made by earlier versions (format version 1, one
JSON object rewritten at every epoch) is still read by `RunHistory.load`; `to_json`
gives that object's layout.
"""

from __future__ import annotations

import json
import math
import os
import secrets
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Mapping, Sequence

from ember.errors import ConfigError, EmberError, RunRecordError
from ember.train.sealed import SealBroken, not_json, seal, unseal

History = Sequence[tuple[int, Mapping[str, Mapping[str, float]]]]
"""Completed epochs in order: (epoch, {split: {metric name: epoch value}})."""

FORMAT = "ember-history"
VERSION = 3
"""The version `history.jsonl` is written in; versions 1 (`history.json`) and 2 (lines
without checksums) are read too."""
READ_VERSIONS = (2, 3)
"""The JSON Lines versions this ember reads."""


def repair_hint(directory: str | os.PathLike[str]) -> str:
    """The fix for a damaged or missing run record of the run in `directory`."""
    return (
        f"Run `ember repair {directory}`: it keeps every intact record, rebuilds the rest from "
        "the metric logs and the checkpoints, and keeps the damaged file beside them as "
        "<name>.damaged; or train again with LearnerBuilder(dir, overwrite=True)."
    )


def damaged(file: Path, problem: str, line: int | None = None) -> RunRecordError:
    """The error of a damaged or missing run record: the file (and line), the problem
    and the fix; the error's `problem` holds the problem alone."""
    where = f"{file}, line {line}" if line is not None else str(file)
    error = RunRecordError(f"{where}: {problem}. {repair_hint(file.parent)}")
    error.problem = f"line {line}: {problem}" if line is not None else problem
    return error


Points = Sequence[tuple[int, "int | None", Mapping[str, Mapping[str, float]]]]
"""Validation points in order: (epoch, iteration, {"valid": {metric name: value}}), the
iteration being the training batches done in the epoch, or None for the validation at
the epoch's end."""


def metric_name(metric: Any) -> str:
    """The name under which a metric (or a metric's name) appears in a history."""
    return metric if isinstance(metric, str) else str(metric.name)


@dataclass(frozen=True)
class Monitor:
    """One metric of one split, and which way is better: what early stopping, the
    best-checkpoint choice and pruning watch, and the one place that reads its value
    from an epoch's values (`value`) and compares two of them (`better`)."""

    name: str
    split: str = "valid"
    direction: str = "lowest"

    @classmethod
    def of(
        cls,
        metric: Any,
        aggregate: Literal["mean"] = "mean",
        direction: Literal["lowest", "highest"] = "lowest",
        split: Literal["train", "valid"] = "valid",
    ) -> Monitor:
        """A checked monitor: `aggregate` is the epoch value ("mean"), `direction` says
        which way is better, `split` which split's value is read."""
        if aggregate != "mean":
            raise ConfigError(f"aggregate must be 'mean' (the epoch value), got {aggregate!r}.")
        if direction not in ("lowest", "highest"):
            raise ConfigError(f"direction must be 'lowest' or 'highest', got {direction!r}.")
        if split not in ("train", "valid"):
            raise ConfigError(f"split must be 'train' or 'valid', got {split!r}.")
        return cls(metric_name(metric), split, direction)

    def value(self, values: Mapping[str, Mapping[str, float]]) -> float | None:
        """This metric's value among one epoch's (or one point's) `values`, {split:
        {metric name: value}}; None when they have none."""
        found = values.get(self.split, {}).get(self.name)
        return None if found is None else float(found)

    @property
    def sign(self) -> float:
        """1.0 when lower is better, -1.0 when higher is: `sign * value` falls as the
        value gets better."""
        return 1.0 if self.direction == "lowest" else -1.0

    def better(self, a: float, b: float) -> bool:
        """`a` is strictly better than `b`."""
        return a < b if self.direction == "lowest" else a > b

    def series(self, history: History) -> list[tuple[int, float]]:
        """(epoch, value) of every epoch that has a value that is not NaN."""
        found = ((epoch, self.value(values)) for epoch, values in history)
        return [(epoch, v) for epoch, v in found if v is not None and not math.isnan(v)]

    def point_series(self, points: Points) -> list[tuple[int, int | None, float]]:
        """(epoch, iteration, value) of every point that has a value that is not NaN."""
        found = ((epoch, iteration, self.value(values)) for epoch, iteration, values in points)
        return [(e, i, v) for e, i, v in found if v is not None and not math.isnan(v)]

    def best(self, history: History) -> tuple[int, float] | None:
        """The best epoch and its value (the earliest one on a tie), or None."""
        best: tuple[int, float] | None = None
        for epoch, value in self.series(history):
            if best is None or self.better(value, best[1]):
                best = (epoch, value)
        return best


class Watcher:
    """A strategy that watches one metric (its `monitor`): the metric's name, split and
    direction read as the strategy's own attributes."""

    monitor: Monitor

    @property
    def name(self) -> str:
        return self.monitor.name

    @property
    def split(self) -> str:
        return self.monitor.split

    @property
    def direction(self) -> str:
        return self.monitor.direction


class RunHistory:
    """The history of one run, in memory and (with a `path`) in `history.jsonl`.

    Methods may be called from the checkpoint writer's thread (`set_checkpoints`) and
    the training thread; a lock keeps each change and its file write together. Each
    change appends one line (flushed and fsynced); the first one this object writes
    rewrites the file atomically with everything it holds.
    """

    def __init__(self, path: str | os.PathLike[str] | None = None) -> None:
        self.path = Path(path) if path is not None else None
        self.epochs: list[tuple[int, dict[str, dict[str, float]]]] = []
        self.checkpoints: list[int] = []
        self.points: list[tuple[int, int, dict[str, dict[str, float]]]] = []
        """Mid-epoch validation points: (epoch, iteration, {"valid": {metric: value}})."""
        self.counters: dict[int, dict[str, int]] = {}
        """The run's counters (optimizer steps, samples, tokens) at each epoch's end."""
        self.point_counters: dict[tuple[int, int], dict[str, int]] = {}
        """The run's counters at each validation point, by (epoch, iteration)."""
        self.outcome: str | None = None
        self.stop_reason: dict[str, Any] | None = None
        """Why the run ended, once it has (`Outcome.to_json()`: "reason", and for early
        stopping "rule", "split", "metric", "epoch", "value", "reference")."""
        self.model: str | None = None
        self.num_parameters: int | None = None
        self.repairs: list[dict[str, Any]] = []
        """What `ember repair` did to the file, oldest first: when (`at`, Unix time), the
        problems it dropped (`dropped`) and the epochs it rebuilt from the metric logs
        (`rebuilt`: their values are the means of the log lines)."""
        self.file_id: str | None = None
        """The `id` of the file's header (a random token each time the file is rewritten
        whole); None for a file of an earlier version, or none."""
        self.lines = 0
        """The lines the file holds (its header included), as read or written."""
        self._lock = threading.Lock()
        self._written: Path | None = None
        """The file this object has written whole, and now appends to."""

    # Changes (each one written at once) ---------------------------------------------
    def describe_model(self, model: str, num_parameters: int) -> None:
        with self._lock:
            self.model, self.num_parameters = model, num_parameters
            self._write({"model": model, "num_parameters": num_parameters})

    def add_epoch(
        self,
        epoch: int,
        values: Mapping[str, Mapping[str, float]],
        counters: Mapping[str, int] | None = None,
    ) -> None:
        """The epoch values of a completed epoch (a redone epoch replaces the old one),
        with the run's counters at its end (steps, samples, tokens), when given."""
        entry = {split: dict(split_values) for split, split_values in values.items()}
        with self._lock:
            if self.epochs and self.epochs[-1][0] >= epoch:
                self.epochs = [(e, v) for e, v in self.epochs if e < epoch]
            self.epochs.append((epoch, entry))
            if counters is not None:
                self.counters[epoch] = dict(counters)
            self._write(_epoch_record(epoch, entry, self.counters.get(epoch)))

    def add_point(
        self,
        epoch: int,
        iteration: int,
        values: Mapping[str, Mapping[str, float]],
        counters: Mapping[str, int] | None = None,
    ) -> None:
        """The values of a validation point inside `epoch`, after `iteration` batches
        (and the run's counters there, when given)."""
        entry = {split: dict(split_values) for split, split_values in values.items()}
        with self._lock:
            self._add_point(epoch, iteration, entry)
            record = _point_record(epoch, iteration, entry)
            if counters is not None:
                self.point_counters[(epoch, iteration)] = dict(counters)
                record["counters"] = dict(counters)
            self._write({"point": record})

    def _add_point(self, epoch: int, iteration: int, entry: dict[str, dict[str, float]]) -> None:
        if self.points and (self.points[-1][0], self.points[-1][1]) >= (epoch, iteration):
            self.points = [p for p in self.points if (p[0], p[1]) < (epoch, iteration)]
        self.points.append((epoch, iteration, entry))

    def keep_before(self, epoch: int, iteration: int = 0) -> None:
        """Forget the epochs from `epoch` on (a run resumed before them redoes them), and
        the validation points after `iteration` batches of `epoch`."""
        with self._lock:
            self._keep_before(epoch, iteration)
            self._write({"keep_before": epoch, "iteration": iteration})

    def trim(self, epoch: int, iteration: int = 0) -> None:
        """`keep_before` in memory only: a resumed run writes nothing before every check
        passed, and its first record then rewrites the whole file from what is kept."""
        with self._lock:
            self._keep_before(epoch, iteration)

    def _keep_before(self, epoch: int, iteration: int) -> None:
        self.epochs = [(e, v) for e, v in self.epochs if e < epoch]
        self.points = [p for p in self.points if (p[0], p[1]) <= (epoch, iteration)]
        self.checkpoints = [e for e in self.checkpoints if e < epoch]
        self.outcome = None
        self.stop_reason = None

    def set_checkpoints(self, epochs: Sequence[int]) -> None:
        with self._lock:
            kept = sorted({int(e) for e in epochs})
            before = set(self.checkpoints)
            added = [e for e in kept if e not in before]
            removed = sorted(before.difference(kept))
            self.checkpoints = kept
            if added or removed or self._written != self.path:
                self._write({"checkpoints": {"add": added, "remove": removed}})

    def finish(self, outcome: str) -> None:
        """The run ended: its outcome text, and its reason when `outcome` is an `Outcome`."""
        to_json = getattr(outcome, "to_json", None)
        with self._lock:
            self.outcome = str(outcome)
            self.stop_reason = to_json() if callable(to_json) else None
            self._write({"outcome": self.outcome, "stop_reason": self.stop_reason})

    def rewrite(self) -> None:
        """Write the whole file now (atomically), from what this history holds."""
        with self._lock:
            self._written = None
            self._write({})

    # Reading --------------------------------------------------------------------------
    def entries(self) -> list[tuple[int, dict[str, dict[str, float]]]]:
        """The epochs, as `History` (a new list, safe to hand to another thread: the
        value dicts of a recorded epoch are never changed, only replaced)."""
        with self._lock:
            return list(self.epochs)

    def point_entries(self) -> list[tuple[int, int, dict[str, dict[str, float]]]]:
        """A copy of the mid-epoch validation points (safe to hand to another thread)."""
        with self._lock:
            return [(e, i, {s: dict(v) for s, v in values.items()}) for e, i, values in self.points]

    def to_json(self) -> dict[str, Any]:
        """Everything at once, in the layout of `history.json` (version 1)."""
        data: dict[str, Any] = {
            "format": FORMAT,
            "version": 1,
            "model": self.model,
            "num_parameters": self.num_parameters,
            "epochs": [_epoch_record(epoch, values) for epoch, values in self.epochs],
            "checkpoints": list(self.checkpoints),
            "outcome": self.outcome,
            "stop_reason": self.stop_reason,
        }
        if self.points:
            data["points"] = [_point_record(e, i, values) for e, i, values in self.points]
        return data

    @property
    def written(self) -> bool:
        """Whether this object has written its file (a fit that never did leaves it as it was)."""
        return self._written is not None and self._written == self.path

    def mark(self) -> tuple[str, int] | None:
        """The file's `id` and its lines now, for a checkpoint to note (None before this
        object has written it): a resume from that checkpoint then knows the lines the
        file must have."""
        with self._lock:
            if not self.written or self.file_id is None:
                return None
            return self.file_id, self.lines

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> RunHistory:
        """Read `history.jsonl` (or an earlier version's `history.json`); a missing,
        foreign or damaged file (a line whose checksum differs, that is not JSON or not a
        record, a line number skipped) is a `RunRecordError` naming the file, the line
        and the fix."""
        return cls._read(Path(path), None)

    @classmethod
    def salvage(cls, path: str | os.PathLike[str]) -> tuple[RunHistory, list[str]]:
        """Read what can be read of a damaged history: every intact record, replayed in
        order, and each problem in words ("line 7: ..."). A file that is missing or not a
        run history at all is still a `RunRecordError`."""
        problems: list[str] = []
        return cls._read(Path(path), problems), problems

    @classmethod
    def _read(cls, file: Path, problems: list[str] | None) -> RunHistory:
        try:
            data = file.read_bytes()
        except FileNotFoundError:
            raise RunRecordError(f"{file}: no such history file.") from None
        except OSError as error:
            raise RunRecordError(f"{file} cannot be read: {error}.") from None
        history = cls(file)
        first = data.split(b"\n", 1)[0]
        try:
            header = json.loads(first)
        except ValueError:
            header = None  # not JSON Lines: an earlier version's indented history.json
        if isinstance(header, dict) and header.get("format") == FORMAT and "epochs" in header:
            history._read_v1(header, file)
        elif isinstance(header, dict) and "epochs" not in header:
            history._read_lines(data, header, file, problems)
        else:
            try:  # a version 1 file laid out over several lines
                whole = json.loads(data)
            except ValueError:
                whole = None
            if not isinstance(whole, dict) or whole.get("format") != FORMAT:
                if problems is None or not data.strip():
                    raise damaged(file, f"not an ember run history (no format {FORMAT!r})", 1)
                problems.append("line 1: not the header of an ember run history")
                history._read_lines(data, {"format": FORMAT, "version": VERSION}, file, problems)
            else:
                history._read_v1(whole, file)
        return history

    def _read_v1(self, data: dict[str, Any], file: Path) -> None:
        try:
            self._apply_v1(data, file)
        except (KeyError, TypeError, ValueError, AttributeError) as error:
            raise RunRecordError(f"{file}: malformed run history ({error!r}).") from None

    def _read_lines(
        self, data: bytes, header: dict[str, Any], file: Path, problems: list[str] | None
    ) -> None:
        """Replay the records of a JSON Lines history (the last line, cut short by a kill
        when it has no newline, is left out). `problems` None: the first damage raises."""

        def damage(number: int, problem: str) -> None:
            if problems is None:
                raise RunRecordError(
                    f"{file}, line {number}: {problem}. {repair_hint(file.parent)}"
                )
            problems.append(f"line {number}: {problem}")

        lines = data.split(b"\n")
        version = header.get("version")
        if header.get("format") != FORMAT:
            raise RunRecordError(f"{file} is not an ember run history (no format {FORMAT!r}).")
        if version not in READ_VERSIONS:
            raise RunRecordError(
                f"{file} has history version {version!r}; this ember reads versions 1 to "
                f"{VERSION}. Upgrade ember to read it."
            )
        sealed = version == VERSION
        if sealed:
            try:
                unsealed, was_sealed = unseal(lines[0])
                if not was_sealed:
                    raise SealBroken("the header has no checksum")
                self.file_id = str(unsealed["id"])
            except (SealBroken, KeyError) as error:
                damage(1, f"the header is damaged ({error})")
        expected = 2
        for number, line in enumerate(lines[1:-1], start=2):
            try:
                if sealed:
                    record, was_sealed = unseal(line)
                    if not was_sealed:
                        raise SealBroken(
                            "it has no checksum (it was edited, or written by another program)"
                        )
                    count = record.pop("n", None) if isinstance(record, dict) else None
                    if count != expected:
                        if type(count) is int and count > expected:
                            damage(number, _lost(expected, count - 1))
                        elif type(count) is int:
                            damage(number, f"it repeats record {count}")
                        else:
                            damage(number, "it has no record number")
                    expected = (count if type(count) is int else expected) + 1
                elif not line.strip():
                    continue
                else:
                    record = json.loads(line)
            except SealBroken as error:
                damage(number, f"the line is damaged: {error}")
                expected += 1
                continue
            except ValueError as error:
                damage(number, f"the line is damaged: {not_json(error)}")
                continue
            try:
                self._apply(record, file, number)
            except (KeyError, TypeError, ValueError, AttributeError, EmberError) as error:
                damage(number, f"the line is not a history record ({error})")
        self.lines = len(lines) - 1

    def _apply_v1(self, data: Any, file: Path) -> None:
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise EmberError(f"{file} is not an ember run history (no format {FORMAT!r}).")
        if data.get("version") != 1:
            raise EmberError(
                f"{file} has history version {data.get('version')!r}; this ember reads "
                f"versions 1 and {VERSION}. Upgrade ember to read it."
            )
        for entry in data["epochs"]:
            self.epochs.append((int(entry["epoch"]), _decode_splits(entry)))
        self.checkpoints = [int(e) for e in data.get("checkpoints", [])]
        for entry in data.get("points", []):
            self._read_point(entry)
        self.outcome = data.get("outcome")
        self.stop_reason = data.get("stop_reason")
        self.model = data.get("model")
        self.num_parameters = data.get("num_parameters")

    def _apply(self, record: Any, file: Path, line: int) -> None:
        """Replay one record of `history.jsonl`."""
        if not isinstance(record, dict):
            raise EmberError(f"{file}: line {line} is not a history record: {record!r}.")
        if "epoch" in record:
            epoch = int(record["epoch"])
            if self.epochs and self.epochs[-1][0] >= epoch:
                self.epochs = [(e, v) for e, v in self.epochs if e < epoch]
            self.epochs.append((epoch, _decode_splits(record)))
            if isinstance(record.get("counters"), dict):
                self.counters[epoch] = {k: int(v) for k, v in record["counters"].items()}
        elif "point" in record:
            self._read_point(record["point"])
        elif "keep_before" in record:
            self._keep_before(int(record["keep_before"]), int(record.get("iteration", 0)))
        elif "checkpoints" in record:
            change = record["checkpoints"]
            kept = set(self.checkpoints).difference(int(e) for e in change["remove"])
            self.checkpoints = sorted(kept.union(int(e) for e in change["add"]))
        elif "outcome" in record:
            self.outcome = record["outcome"]
            self.stop_reason = record.get("stop_reason")
        elif "model" in record:
            self.model = record["model"]
            self.num_parameters = record.get("num_parameters")
        elif "repaired" in record and isinstance(record["repaired"], dict):
            self.repairs.append(record["repaired"])
        else:
            raise EmberError(f"{file}: line {line} is not a history record: {record!r}.")

    def _read_point(self, entry: Mapping[str, Any]) -> None:
        values = {
            split: {str(k): _decode(v) for k, v in split_values.items()}
            for split, split_values in entry.items()
            if split not in ("epoch", "iteration", "counters")
        }
        epoch, iteration = int(entry["epoch"]), int(entry["iteration"])
        self._add_point(epoch, iteration, values)
        if isinstance(entry.get("counters"), dict):
            self.point_counters[(epoch, iteration)] = {
                k: int(v) for k, v in entry["counters"].items()
            }

    def _records(self) -> list[dict[str, Any]]:
        """Everything this history holds, as the records that rebuild it."""
        records: list[dict[str, Any]] = []
        if self.model is not None:
            records.append({"model": self.model, "num_parameters": self.num_parameters})
        records += [{"repaired": repair} for repair in self.repairs]
        records += [
            _epoch_record(epoch, values, self.counters.get(epoch)) for epoch, values in self.epochs
        ]
        records += [
            {"point": _point_record(e, i, v, self.point_counters.get((e, i)))}
            for e, i, v in self.points
        ]
        records.append({"checkpoints": {"add": list(self.checkpoints), "remove": []}})
        if self.outcome is not None:
            records.append({"outcome": self.outcome, "stop_reason": self.stop_reason})
        return records

    def _write(self, record: dict[str, Any]) -> None:
        """Append `record` (the first write rewrites the whole file atomically); a failed
        write is a `RunRecordError` saying so."""
        if self.path is None:
            return
        try:
            if self._written != self.path:
                from ember.record.atomic import atomic_write_bytes  # ember.record loads msgpack

                file_id = secrets.token_hex(8)
                records = self._records()
                lines = [seal({"format": FORMAT, "version": VERSION, "id": file_id})]
                lines += [_line(one, number) for number, one in enumerate(records, start=2)]
                self.path.parent.mkdir(parents=True, exist_ok=True)
                atomic_write_bytes(self.path, b"\n".join(lines) + b"\n")
                self._written, self.file_id, self.lines = self.path, file_id, len(lines)
                return
            with open(self.path, "ab") as file:
                file.write(_line(record, self.lines + 1) + b"\n")
                file.flush()
                os.fsync(file.fileno())
            self.lines += 1
        except OSError as error:
            raise RunRecordError(
                f"Writing the run history {self.path} failed ({error.strerror or error}). Free "
                "disk space or fix its permissions; the records written before stay whole."
            ) from error


def _lost(first: int, last: int) -> str:
    if first == last:
        return f"the line before it is missing (record {first} was lost)"
    return f"{last - first + 1} lines before it are missing (records {first} to {last} were lost)"


def _line(record: Mapping[str, Any], number: int) -> bytes:
    """One sealed line (without its newline): the record and its line number."""
    return seal({**record, "n": number})


def _epoch_record(
    epoch: int,
    values: Mapping[str, Mapping[str, float]],
    counters: Mapping[str, int] | None = None,
) -> dict[str, Any]:
    record = {"epoch": epoch, **{split: _encode(v) for split, v in values.items()}}
    if counters is not None:
        record["counters"] = dict(counters)
    return record


def _point_record(
    epoch: int,
    iteration: int,
    values: Mapping[str, Mapping[str, float]],
    counters: Mapping[str, int] | None = None,
) -> dict[str, Any]:
    record = {"epoch": epoch, "iteration": iteration, **{s: _encode(v) for s, v in values.items()}}
    if counters is not None:
        record["counters"] = dict(counters)
    return record


def _decode_splits(entry: Mapping[str, Any]) -> dict[str, dict[str, float]]:
    return {
        split: {str(k): _decode(v) for k, v in split_values.items()}
        for split, split_values in entry.items()
        if split not in ("epoch", "counters")
    }


_NON_FINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}


def _encode(values: Mapping[str, float]) -> dict[str, float | str]:
    return {name: value if math.isfinite(value) else repr(value) for name, value in values.items()}


def _decode(value: Any) -> float:
    if isinstance(value, str):
        if value not in _NON_FINITE:
            raise ValueError(f"not a number: {value!r}")
        return _NON_FINITE[value]
    return float(value)
