"""The files of a metric's values: the metric-line format and matrix files.

A metric log (`<Metric>.log`) holds one `value,weight,check` line per iteration: `check`
is the CRC-32 (8 hex digits) of the line's `value,weight` text chained on the line
before's (the first line's starts from 0), so an edited, dropped, duplicated or torn
line breaks the chain exactly where it happened and the reader names that line. A
checkpoint taken inside an epoch counts the lines of each log, which catches lines lost
at the end. Logs written by an earlier ember (`value,weight` lines) are read as they
are, unchecked. A matrix metric's counts go to `<Metric>.json`.
`ember.train.files.artifacts` places these files in the artifact directory.
"""

from __future__ import annotations

import json
import math
import os
import re
import zlib
from dataclasses import dataclass
from itertools import groupby
from operator import attrgetter
from pathlib import Path
from typing import Any, Iterable

from ember.durable import atomic_write_bytes
from ember.errors import EmberError, RunRecordError

__all__ = [
    "MATRIX_FORMAT",
    "MetricLog",
    "add_lines",
    "format_line",
    "format_value",
    "format_weight",
    "last_check",
    "matrix_file_name",
    "metric_file_name",
    "metric_log_path",
    "metric_stem",
    "parse_lines",
    "read_matrix",
    "read_metric_log",
    "scan_log",
    "tail_check",
    "truncate_log",
    "write_matrix",
]

_UNSAFE = re.compile(r"[^A-Za-z0-9._+\-=@%()\[\]]")


# The metric-line format -----------------------------------------------------------
def metric_file_name(name: str) -> str:
    """A metric's log file name: spaces become `_`, anything unsafe on common file
    systems becomes `_`, and no name can climb out of its folder (`..`, `/`)."""
    safe = _UNSAFE.sub("_", name.strip().replace(" ", "_"))
    safe = safe.lstrip(".") or "metric"
    return f"{safe}.log"


def metric_stem(name: str) -> str:
    """A metric's log file name without `.log`: how summaries and plots name it."""
    return metric_file_name(name)[: -len(".log")]


def metric_log_path(split_dir: str | os.PathLike[str], epoch: int, name: str) -> Path:
    """`split_dir/epoch-N/<Metric>.log`: where a metric's lines of one epoch go."""
    return Path(split_dir) / f"epoch-{epoch}" / metric_file_name(name)


def format_value(value: float) -> str:
    """Shortest exact text of a float (round-trips), so aggregates read from disk match."""
    return repr(float(value))


def format_weight(weight: float) -> str:
    return str(int(weight)) if float(weight).is_integer() else repr(float(weight))


def format_line(value: float, weight: float, chain: int = 0) -> str:
    """One iteration's line: `value,weight,check` and a newline (`chain`: the check of
    the line before, 0 for a file's first line)."""
    body = f"{format_value(value)},{format_weight(weight)}"
    return f"{body},{zlib.crc32(body.encode(), chain):08x}\n"


def add_lines(
    lines: dict[str, list[str]], records: Iterable[Any], chains: dict[str, int] | None = None
) -> dict[str, list[str]]:
    """Append each record's line (`format_line`) to its metric's list in `lines`; return
    `lines`. Each line's check chains on the line before: the last one in `lines`, or
    `chains[name]` (the check of the file's last line, updated here) when given. This
    runs for every iteration of every metric: the records of a tick (a metric's are
    consecutive) are formatted a metric at a time."""
    for name, group in groupby(records, _name):
        run = list(group)
        values = list(map(float, map(_value, run)))
        weights = list(map(float, map(_weight, run)))
        text = lines.setdefault(name, [])
        if all(map(float.is_integer, weights)):  # counts, written as integers
            bodies = list(map("{!r},{}".format, values, map(int, weights)))
        else:
            bodies = [f"{format_value(v)},{format_weight(w)}" for v, w in zip(values, weights)]
        last = tail_check(text[-1]) if text else 0
        chain = chains.get(name, 0) if chains is not None else last
        crc32 = zlib.crc32
        for body in bodies:
            chain = crc32(body.encode(), chain)
            text.append(f"{body},{chain:08x}\n")
        if chains is not None:
            chains[name] = chain
    return lines


_name, _value, _weight = attrgetter("name"), attrgetter("value"), attrgetter("weight")


def last_check(path: Path) -> int:
    """The check of the last complete line of the log at `path` (0 when it has none):
    where the lines appended to it chain on."""
    try:
        with open(path, "rb") as file:
            size = file.seek(0, os.SEEK_END)
            file.seek(max(0, size - 256))
            tail = file.read()
    except OSError:
        return 0
    lines = tail.split(b"\n")[:-1]
    return tail_check(lines[-1].decode("utf-8", errors="replace")) if lines else 0


def tail_check(line: str) -> int:
    """The check of a log line (the chain the next line starts from); 0 for a line of an
    earlier version, which has none."""
    parts = line.rstrip("\n").split(",")
    try:
        return int(parts[2], 16) if len(parts) == 3 else 0
    except ValueError:
        return 0


def _parse_line(line: str) -> tuple[float, float] | None:
    parts = line.split(",")
    if len(parts) != 2:
        return None
    try:
        value, weight = float(parts[0]), float(parts[1])
    except ValueError:
        return None
    if not math.isfinite(weight) or weight < 0:
        return None
    return value, weight


@dataclass(frozen=True)
class MetricLog:
    """A metric log as read: the rows of its complete lines up to the first damaged one,
    whether its lines carry checks (an earlier ember's do not), and the damage."""

    path: Path
    rows: list[tuple[float, float]]
    checked: bool
    damaged_line: int | None = None
    problem: str | None = None
    checks: list[int] | None = None
    """Each row's check (the chain after its line), for a checked log."""

    @property
    def damaged(self) -> bool:
        return self.problem is not None

    def error(self, fix: str | None = None) -> RunRecordError:
        """The error naming the file, the line, what is wrong and the fix."""
        where = f"{self.path}, line {self.damaged_line}" if self.damaged_line else str(self.path)
        error = RunRecordError(f"{where}: {self.problem}. {fix or log_repair_hint(self.path)}")
        line = f"line {self.damaged_line}: " if self.damaged_line else ""
        error.problem = f"{line}{self.problem}"
        return error


def log_repair_hint(path: Path) -> str:
    """The fix for a damaged metric log: `ember repair` on the run that holds it."""
    run = run_of(path)
    return (
        f"Run `ember repair {run}`: it cuts the log back to the lines a checkpoint counted "
        "(keeping the damaged file as <name>.damaged) and says what else to do"
    )


def run_of(path: Path) -> Path:
    """The artifact directory of a metric log (the folder above its `train`, `valid` or
    `test` folder), or its own folder when it lies elsewhere."""
    for parent in path.parents:
        if parent.name in ("train", "valid", "test"):
            return parent.parent
    return path.parent


def parse_log(data: bytes, path: Path) -> MetricLog:
    """A metric log's bytes as a `MetricLog` (see `scan_log`)."""
    rows: list[tuple[float, float]] = []
    checks: list[int] = []
    complete = data.split(b"\n")[:-1]  # what follows the last newline is torn by a kill
    checked = bool(complete) and complete[0].count(b",") == 2
    chain = 0
    for number, raw in enumerate(complete, start=1):
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError:
            problem = "it is not UTF-8 text (a byte was damaged)"
            return MetricLog(path, rows, checked, number, problem, checks)
        if checked:
            body, _, check = line.rpartition(",")
            parsed = _parse_line(body)
            if parsed is None or len(check) != 8:
                problem = f"it is not 'value,weight,check': {line!r}"
                return MetricLog(path, rows, checked, number, problem, checks)
            chain = zlib.crc32(body.encode(), chain)
            if check != f"{chain:08x}":
                problem = (
                    f"its check does not match ({line!r}): the line was changed, or a line "
                    "before it was lost or repeated"
                )
                return MetricLog(path, rows, checked, number, problem, checks)
            checks.append(chain)
        else:  # an earlier ember's log (lines a later one appended carry a check)
            parsed = _parse_line(line.rpartition(",")[0] if line.count(",") == 2 else line)
            if parsed is None:
                problem = f"it is not 'value,weight': {line!r}"
                return MetricLog(path, rows, checked, number, problem)
        rows.append(parsed)
    return MetricLog(path, rows, checked, checks=checks if checked else None)


def scan_log(path: str | os.PathLike[str]) -> MetricLog:
    """The metric log at `path`, each line checked: its rows up to the first damaged
    line, and that line and what is wrong with it. Only newline-terminated lines count:
    whatever follows the last newline is a line torn by a kill (even if it looks
    complete, its weight may be cut short). A missing file raises `OSError`."""
    path = Path(path)
    return parse_log(path.read_bytes(), path)


def parse_lines(text: str, source: object = "metric log") -> list[tuple[float, float]]:
    """The `(value, weight)` rows of a metric log's text; a damaged line is an error
    naming `source`, the line and the fix."""
    found = parse_log(text.encode("utf-8", errors="surrogateescape"), Path(str(source)))
    if found.damaged:
        raise found.error()
    return found.rows


def read_metric_log(
    path: str | os.PathLike[str], damage: list[str] | None = None
) -> list[tuple[float, float]]:
    """The `(value, weight)` lines of a metric log. An unterminated last line (left by a
    kill mid-write) is ignored. A damaged line is an error naming the file, the line and
    the fix; with `damage`, its message is appended there instead and the rows before
    it are returned (for readers that show what is left, with a warning)."""
    found = scan_log(path)
    if found.damaged:
        if damage is None:
            raise found.error()
        damage.append(str(found.error()))
    return found.rows


def truncate_log(path: Path, keep: int) -> list[tuple[float, float]]:
    """Keep the first `keep` lines of the metric log at `path` (the lines a checkpoint
    counted); return their rows. Those lines must all be there and whole: a damaged,
    short or missing log is a `RunRecordError` naming the file, the line and the fix
    (a missing log counted no line is fine: it has none)."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        if keep <= 0:
            return []
        found = MetricLog(
            path,
            [],
            True,
            None,
            f"the file is missing; the checkpoint counted {keep} line(s) of it",
        )
        raise found.error() from None
    found = parse_log(data, path)
    if found.damaged and found.damaged_line is not None and found.damaged_line <= keep:
        raise found.error()
    if len(found.rows) < keep:
        problem = (
            f"it holds {len(found.rows)} line(s), but the checkpoint counted {keep}: its last "
            f"{keep - len(found.rows)} line(s) were lost"
        )
        raise MetricLog(path, found.rows, found.checked, len(found.rows) + 1, problem).error()
    if len(data.split(b"\n")) - 1 != keep or not data.endswith(b"\n"):
        kept = b"".join(line + b"\n" for line in data.split(b"\n")[:keep])
        atomic_write_bytes(path, kept)
    return found.rows[:keep]


# Matrix files ---------------------------------------------------------------------
MATRIX_FORMAT = "ember-matrix"


def matrix_file_name(name: str) -> str:
    """A matrix metric's file name: its log file's stem with `.json`."""
    return f"{metric_stem(name)}.json"


def write_matrix(path: str | os.PathLike[str], name: str, counts: list[list[int]]) -> Path:
    """Save a count matrix (rows: targets, columns: predictions) atomically, as
    {"format": "ember-matrix", "version": 1, "name": ..., "counts": [[...], ...]}."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    record = {"format": MATRIX_FORMAT, "version": 1, "name": name, "counts": counts}
    atomic_write_bytes(path, (json.dumps(record) + "\n").encode("utf-8"))
    return path


def read_matrix(path: str | os.PathLike[str]) -> tuple[str, list[list[int]]] | None:
    """A saved matrix file as `(metric name, counts)`; None when the file is not one
    (another tool's JSON) and an `EmberError` naming the file when it is damaged."""
    try:
        record = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise EmberError(f"{path}: cannot read the matrix file: {error}.") from None
    if not isinstance(record, dict) or record.get("format") != MATRIX_FORMAT:
        return None
    counts, name = record.get("counts"), record.get("name")
    if not isinstance(counts, list) or not isinstance(name, str):
        raise EmberError(f"{path}: a matrix file needs a name and a list of count rows.")
    if not all(isinstance(row, list) and len(row) == len(counts) for row in counts):
        raise EmberError(f"{path}: a matrix file's counts must be square.")
    return name, [[int(cell) for cell in row] for row in counts]
