"""A metric logger writing every split, iteration value and epoch aggregate to one CSV file."""

from __future__ import annotations

import csv
import io
import os
from pathlib import Path
from typing import IO, Any, Sequence

from ember.durable import atomic_write_bytes
from ember.errors import EmberError
from ember.train.files.metric_files import format_value, format_weight
from ember.train.logger.base import MetricRecord, RunStart

CSV_HEADER = ("split", "epoch", "iteration", "metric", "value", "weight", "kind")


class CsvMetricLogger:
    """Appends rows `split,epoch,iteration,metric,value,weight,kind` to one CSV file.

    Each iteration value is a row of kind `iteration`; each epoch aggregate a row of kind
    `epoch` with `iteration` and `weight` empty. Values are written exactly (they read
    back as the same floats). Rows are flushed at every call. An existing file with the
    same header is continued (a last row torn by a kill is dropped first); a file with
    another header is refused rather than mixed into.

    A resumed run (`start_run`) first cuts the file back to the rows logged before its
    checkpoint, so the rows it logs again are not repeated: the kept rows are written
    to a temporary file that then replaces the file, so a kill leaves either file
    whole. Under several processes each iteration has one row per process, every one
    with the iteration's number.
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

    def start_run(self, run: RunStart) -> None:
        """A resumed run: drop the rows that came after its checkpoint."""
        if not run.resumed:
            return
        self.close()
        self._check_existing()
        if not self.path.exists() or self.path.stat().st_size == 0:
            return
        data = self.path.read_bytes()
        data = data[: data.rfind(b"\n") + 1]  # without a last row torn by a kill
        text = data.decode("utf-8", errors="surrogateescape")
        lines = csv.reader(io.StringIO(text, newline=""))
        header = next(lines, None)
        kept = [row for row in lines if _kept(row, run)]
        out = io.StringIO()
        rows = csv.writer(out, lineterminator="\n")
        rows.writerow(header or CSV_HEADER)
        rows.writerows(kept)
        if out.getvalue() != text or len(data) != self.path.stat().st_size:
            atomic_write_bytes(self.path, out.getvalue().encode("utf-8", errors="surrogateescape"))

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


def _kept(row: list[str], run: RunStart) -> bool:
    """Whether a row written before a resumed run stays (a row that does not parse stays)."""
    if len(row) != len(CSV_HEADER):
        return True
    split, epoch, iteration, kind = row[0], row[1], row[2], row[6]
    try:
        return run.keeps(split, int(epoch), int(iteration) if kind == "iteration" else None)
    except ValueError:
        return True


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
