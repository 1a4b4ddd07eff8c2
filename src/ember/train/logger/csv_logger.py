"""A metric logger writing every split, iteration value and epoch aggregate to one CSV file."""

from __future__ import annotations

import csv
import os
from pathlib import Path
from typing import IO, Any, Sequence

from ember.errors import EmberError
from ember.train.artifacts import format_value, format_weight
from ember.train.logger.base import MetricRecord

CSV_HEADER = ("split", "epoch", "iteration", "metric", "value", "weight", "kind")


class CsvMetricLogger:
    """Appends rows `split,epoch,iteration,metric,value,weight,kind` to one CSV file.

    Each iteration value is a row of kind `iteration`; each epoch aggregate a row of kind
    `epoch` with `iteration` and `weight` empty. Values are written exactly (they read
    back as the same floats). Rows are flushed at every call. An existing file with the
    same header is continued (a last row torn by a kill is dropped first); a file with
    another header is refused rather than mixed into.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._handle: IO[str] | None = None
        self._rows: Any = None
        self._check_existing()

    def _check_existing(self) -> None:
        if not self.path.exists() or self.path.stat().st_size == 0:
            return
        with open(self.path, encoding="utf-8", errors="replace", newline="") as handle:
            line = handle.readline()
        first, header = line.rstrip("\r\n"), ",".join(CSV_HEADER)
        torn_header = not line.endswith("\n") and header.startswith(first)
        if first != header and not torn_header:
            raise EmberError(
                f"{self.path}: exists with another header ({first[:80]!r}); expected "
                f"{','.join(CSV_HEADER)!r}. Choose another file or remove it."
            )

    def _open(self) -> IO[str]:
        if self._handle is not None:
            return self._handle
        self._check_existing()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        _drop_torn_row(self.path)
        fresh = not self.path.exists() or self.path.stat().st_size == 0
        handle = open(self.path, "a", encoding="utf-8", newline="")  # noqa: SIM115 - kept open
        self._handle = handle
        self._rows = csv.writer(handle, lineterminator="\n")
        if fresh:
            self._rows.writerow(CSV_HEADER)
        return handle

    def log(self, split: str, epoch: int, records: Sequence[MetricRecord]) -> None:
        """Write one `iteration` row per record and flush."""
        handle = self._open()
        self._rows.writerows(
            (
                split,
                epoch,
                record.iteration,
                record.name,
                format_value(record.value),
                format_weight(record.weight),
                "iteration",
            )
            for record in records
        )
        handle.flush()

    def end_epoch(self, split: str, epoch: int, aggregates: dict[str, float]) -> None:
        """Write one `epoch` row per aggregate and flush."""
        handle = self._open()
        self._rows.writerows(
            (split, epoch, "", name, format_value(value), "", "epoch")
            for name, value in aggregates.items()
        )
        handle.flush()

    def close(self) -> None:
        """Close the file (a later call reopens it and appends)."""
        if self._handle is not None:
            self._handle.close()
            self._handle, self._rows = None, None


def _drop_torn_row(path: Path) -> None:
    """Cut an unterminated last line (left by a kill mid-write) so appends start clean."""
    if not path.exists():
        return
    with open(path, "rb+") as handle:
        size = handle.seek(0, os.SEEK_END)
        if size == 0:
            return
        handle.seek(size - 1)
        if handle.read(1) == b"\n":
            return
        # Scan back for the last newline, a block at a time.
        end, block = size, 4096
        while end > 0:
            start = max(0, end - block)
            handle.seek(start)
            chunk = handle.read(end - start)
            cut = chunk.rfind(b"\n")
            if cut >= 0:
                handle.truncate(start + cut + 1)
                return
            end = start
        handle.truncate(0)
