"""The exact history of a run: every epoch's values, the checkpoint epochs, the outcome.

The learner keeps it in memory and in `history.jsonl` in the artifact directory
(its lines: `ember.train.history_format`). Summaries, plots, early stopping and the
best-checkpoint choice read it; nothing parses numbers back from `experiment.log`,
which is text for people. What they watch in it is a `Monitor`
(`ember.train.monitor`, re-exported here).
"""

from __future__ import annotations

import json
import os
import secrets
import threading
from pathlib import Path
from typing import Any, Mapping, Sequence

from ember.durable import atomic_write_bytes, sync_later
from ember.errors import EmberError, RunRecordError
from ember.train.history_format import (
    damaged,
    decode,
    decode_splits,
    epoch_record,
    lost,
    point_record,
    sealed_line,
)
from ember.train.history_format import repair_hint as repair_hint
from ember.train.monitor import History as History
from ember.train.monitor import Monitor as Monitor
from ember.train.monitor import Points as Points
from ember.train.monitor import Watcher as Watcher
from ember.train.monitor import metric_name as metric_name
from ember.train.sealed import SealBroken, not_json, seal, unseal

FORMAT = "ember-history"
VERSION = 3
"""The version `history.jsonl` is written in; versions 1 (`history.json`) and 2 (lines
without checksums) are read too."""
READ_VERSIONS = (2, 3)
"""The JSON Lines versions this ember reads."""


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
            self._write(epoch_record(epoch, entry, self.counters.get(epoch)))

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
            record = point_record(epoch, iteration, entry)
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
            "epochs": [epoch_record(epoch, values) for epoch, values in self.epochs],
            "checkpoints": list(self.checkpoints),
            "outcome": self.outcome,
            "stop_reason": self.stop_reason,
        }
        if self.points:
            data["points"] = [point_record(e, i, values) for e, i, values in self.points]
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
                raise damaged(file, problem, number)
            problems.append(f"line {number}: {problem}")

        lines = data.split(b"\n")
        version = header.get("version")
        if header.get("format") != FORMAT:
            raise RunRecordError(f"{file} is not an ember run history (no format {FORMAT!r}).")
        broken: SealBroken | None = None
        try:
            unsealed, was_sealed = unseal(lines[0])
        except SealBroken as error:  # a checked header whose bytes changed: the version
            unsealed, was_sealed, broken = {}, True, error  # it names is not to be trusted
            version = VERSION
        if version not in READ_VERSIONS:
            raise RunRecordError(
                f"{file} has history version {version!r}; this ember reads versions 1 to "
                f"{VERSION}. Upgrade ember to read it."
            )
        sealed = version == VERSION
        if sealed:
            try:
                if broken is not None:
                    raise broken
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
                            damage(number, lost(expected, count - 1))
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
            self.epochs.append((int(entry["epoch"]), decode_splits(entry)))
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
            self.epochs.append((epoch, decode_splits(record)))
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
            split: {str(k): decode(v) for k, v in split_values.items()}
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
            epoch_record(epoch, values, self.counters.get(epoch)) for epoch, values in self.epochs
        ]
        records += [
            {"point": point_record(e, i, v, self.point_counters.get((e, i)))}
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
                file_id = secrets.token_hex(8)
                records = self._records()
                lines = [seal({"format": FORMAT, "version": VERSION, "id": file_id})]
                lines += [sealed_line(one, number) for number, one in enumerate(records, start=2)]
                self.path.parent.mkdir(parents=True, exist_ok=True)
                atomic_write_bytes(self.path, b"\n".join(lines) + b"\n")
                self._written, self.file_id, self.lines = self.path, file_id, len(lines)
                return
            flags = os.O_WRONLY | os.O_APPEND | getattr(os, "O_NOFOLLOW", 0)  # never a link
            with open(os.open(self.path, flags), "ab") as file:
                file.write(sealed_line(record, self.lines + 1) + b"\n")
                file.flush()
                sync_later(self.path, file.fileno())
            self.lines += 1
        except OSError as error:
            raise RunRecordError(
                f"Writing the run history {self.path} failed ({error.strerror or error}). Free "
                "disk space or fix its permissions; the records written before stay whole."
            ) from error
