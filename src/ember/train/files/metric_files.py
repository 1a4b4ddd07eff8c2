"""The files of a metric's values: the metric-line format and matrix files.

A metric log (`<Metric>.log`) holds one `value,weight` line per iteration; a matrix
metric's counts go to `<Metric>.json`. `ember.train.files.artifacts` places these files in
the artifact directory.
"""

from __future__ import annotations

import json
import math
import os
import re
from itertools import groupby
from operator import attrgetter
from pathlib import Path
from typing import Any, Iterable

from ember.durable import atomic_write_bytes
from ember.errors import EmberError

__all__ = [
    "MATRIX_FORMAT",
    "add_lines",
    "format_line",
    "format_value",
    "format_weight",
    "matrix_file_name",
    "metric_file_name",
    "metric_log_path",
    "metric_stem",
    "parse_lines",
    "read_matrix",
    "read_metric_log",
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


def format_line(value: float, weight: float) -> str:
    """One iteration's line: `value,weight` and a newline."""
    return f"{format_value(value)},{format_weight(weight)}\n"


def add_lines(lines: dict[str, list[str]], records: Iterable[Any]) -> dict[str, list[str]]:
    """Append each record's line (`format_line`) to its metric's list in `lines`; return
    `lines`. This runs for every iteration of every metric: the records of a tick (a
    metric's are consecutive) are formatted a metric at a time, at C speed."""
    for name, group in groupby(records, _name):
        run = list(group)
        values = list(map(float, map(_value, run)))
        weights = list(map(float, map(_weight, run)))
        text = lines.setdefault(name, [])
        if all(map(float.is_integer, weights)):  # counts, written as integers
            text += map("{!r},{}\n".format, values, map(int, weights))
        else:
            text += map(format_line, values, weights)
    return lines


_name, _value, _weight = attrgetter("name"), attrgetter("value"), attrgetter("weight")


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


def parse_lines(text: str, source: object = "metric log") -> list[tuple[float, float]]:
    """The `(value, weight)` rows of a metric log's text. Only newline-terminated lines
    count: whatever follows the last newline is a line torn by a kill (even if it looks
    complete, its weight may be cut short). A malformed complete line is an error."""
    rows: list[tuple[float, float]] = []
    for number, line in enumerate(text.split("\n")[:-1], start=1):
        parsed = _parse_line(line)
        if parsed is None:
            raise EmberError(f"{source}: line {number} is not 'value,weight': {line!r}")
        rows.append(parsed)
    return rows


def read_metric_log(path: str | os.PathLike[str]) -> list[tuple[float, float]]:
    """The `(value, weight)` lines of a metric log. An unterminated last line (left by
    a kill mid-write) is ignored; a malformed complete line is an error."""
    return parse_lines(Path(path).read_text(encoding="utf-8", errors="replace"), path)


def truncate_log(path: Path, keep: int) -> list[tuple[float, float]]:
    """Keep the first `keep` lines of the metric log at `path`; return their rows. A
    missing log has none."""
    if not path.exists():
        return []
    lines = path.read_text(encoding="utf-8").split("\n")[:-1][:keep]
    text = "".join(line + "\n" for line in lines)
    path.write_text(text, encoding="utf-8")
    return parse_lines(text, path)


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
