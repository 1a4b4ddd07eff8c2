"""The default metric logger: `<dir>/epoch-N/<Metric>.log`, one `value,weight` line per iteration."""

from __future__ import annotations

import math
import os
import re
from pathlib import Path
from typing import IO, Sequence

from ember.errors import EmberError
from ember.train.logger.base import MetricRecord

_UNSAFE = re.compile(r"[^A-Za-z0-9._+\-=@%()\[\]]")


def metric_file_name(name: str) -> str:
    """A metric's log file name: spaces become `_`, anything unsafe on common file
    systems becomes `_`, and no name can climb out of its folder (`..`, `/`)."""
    safe = _UNSAFE.sub("_", name.strip().replace(" ", "_"))
    safe = safe.lstrip(".") or "metric"
    return f"{safe}.log"


def format_value(value: float) -> str:
    """Shortest exact text of a float (round-trips), so aggregates read from disk match."""
    return repr(float(value))


def format_weight(weight: float) -> str:
    return str(int(weight)) if float(weight).is_integer() else repr(float(weight))


class FileMetricLogger:
    """Writes each metric's iteration values under `directory/epoch-N/<name>.log`.

    Lines are appended and flushed at every call, so the files follow the run within
    the renderer's tick. A file cut short by a kill has at most one torn last line,
    which `read_metric_log` ignores.
    """

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory)
        self._files: dict[tuple[int, str], IO[str]] = {}

    def path(self, epoch: int, name: str) -> Path:
        return self.directory / f"epoch-{epoch}" / metric_file_name(name)

    def _file(self, epoch: int, name: str) -> IO[str]:
        key = (epoch, name)
        handle = self._files.get(key)
        if handle is None:
            path = self.path(epoch, name)
            path.parent.mkdir(parents=True, exist_ok=True)
            handle = open(path, "a", encoding="utf-8")  # noqa: SIM115 - kept open for the epoch
            self._files[key] = handle
        return handle

    def log(self, split: str, epoch: int, records: Sequence[MetricRecord]) -> None:
        lines: dict[str, list[str]] = {}
        for record in records:
            text = lines.get(record.name)
            if text is None:
                text = lines[record.name] = []
            text.append(f"{format_value(record.value)},{format_weight(record.weight)}\n")
        try:
            for name, text in lines.items():  # one write and one flush per file
                handle = self._file(epoch, name)
                handle.write("".join(text))
                handle.flush()
        except OSError as error:
            raise EmberError(
                f"Writing the metric logs under {self.directory / f'epoch-{epoch}'} failed: "
                f"{error.strerror or error}. Free disk space or fix permissions; resume with "
                "checkpoint('latest')."
            ) from error

    def end_epoch(self, split: str, epoch: int, aggregates: dict[str, float]) -> None:
        for file_epoch, name in [key for key in self._files if key[0] == epoch]:
            self._files.pop((file_epoch, name)).close()

    def close(self) -> None:
        for handle in self._files.values():
            handle.close()
        self._files.clear()


def read_metric_log(path: str | os.PathLike[str]) -> list[tuple[float, float]]:
    """The `(value, weight)` lines of a metric log. An unterminated last line (left by
    a kill mid-write) is ignored; a malformed complete line is an error."""
    text = Path(path).read_text(encoding="utf-8", errors="replace")
    # Only newline-terminated lines count: whatever follows the last "\n" is a line
    # torn by a kill (even if it looks complete, its weight may be cut short).
    rows: list[tuple[float, float]] = []
    for number, line in enumerate(text.split("\n")[:-1], start=1):
        parsed = _parse_line(line)
        if parsed is None:
            raise EmberError(f"{path}: line {number} is not 'value,weight': {line!r}")
        rows.append(parsed)
    return rows


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


def weighted_mean(rows: Sequence[tuple[float, float]]) -> float:
    """The epoch aggregate of a metric log: the weight-weighted mean of its values."""
    total = math.fsum(weight for _, weight in rows)
    if total == 0:
        return math.nan
    return math.fsum(value * weight for value, weight in rows) / total
