"""The default metric logger: `<dir>/epoch-N/<Metric>.log`, one `value,weight` line per iteration."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path
from typing import IO, Sequence

from ember.errors import EmberError
from ember.train.files.metric_files import (
    add_lines,
    format_value,
    format_weight,
    last_check,
    metric_file_name,
    metric_log_path,
    read_metric_log,
)
from ember.train.logger.base import MetricRecord, RunStart
from ember.train.metric.base import weighted_mean

__all__ = [
    "FileMetricLogger",
    "format_value",
    "format_weight",
    "metric_file_name",
    "read_metric_log",
    "weighted_mean",
]

_EPOCH_DIR = re.compile(r"epoch-(\d+)")
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


class FileMetricLogger:
    """Writes each metric's iteration values under `directory/epoch-N/<name>.log`.

    Lines are appended and flushed at every call, so the files follow the run within
    the renderer's tick. A file cut short by a kill has at most one torn last line,
    which `read_metric_log` ignores.

    A resumed run (`start_run`) removes the `epoch-N` folders after the epoch it
    resumes in (all of that epoch's too when it resumes at its start). The lines of an
    epoch resumed in its middle are cut by the learner, which knows from the
    checkpoint how many lines each of its own files had.
    """

    def __init__(self, directory: str | os.PathLike[str], then: str | None = None) -> None:
        self.directory = Path(directory)
        self.then = then
        """What to do once a failed write is fixed (e.g. how to resume), said in its error."""
        self._files: dict[tuple[int, str], IO[str]] = {}
        self._chains: dict[int, dict[str, int]] = {}
        """Per epoch, each open file's last check, where its next line chains on."""

    def path(self, epoch: int, name: str) -> Path:
        return metric_log_path(self.directory, epoch, name)

    def _file(self, epoch: int, name: str) -> IO[str]:
        key = (epoch, name)
        handle = self._files.get(key)
        if handle is None:
            path = self.path(epoch, name)
            path.parent.mkdir(parents=True, exist_ok=True)
            # a link put in the file's place is refused, never followed out of the run
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | _NOFOLLOW, 0o644)
            handle = open(fd, "a", encoding="utf-8")  # noqa: SIM115 - kept open for the epoch
            self._files[key] = handle
            self._chains.setdefault(epoch, {})[name] = last_check(path)  # a resumed epoch
        return handle

    def start_run(self, run: RunStart) -> None:
        """A resumed run: remove the epoch folders that came after its checkpoint."""
        if not run.resumed:
            return
        self.close()
        if not self.directory.is_dir():
            return
        for entry in self.directory.iterdir():
            match = _EPOCH_DIR.fullmatch(entry.name)
            if match and int(match.group(1)) > run.kept_epochs() and entry.is_dir():
                shutil.rmtree(entry)

    def log(self, split: str, epoch: int, records: Sequence[MetricRecord]) -> None:
        try:
            for name in {record.name for record in records}:  # open, its chain known
                if (epoch, name) not in self._files:
                    self._file(epoch, name)
            lines = add_lines({}, records, self._chains.setdefault(epoch, {}))
            for name, text in lines.items():  # one write and one flush per file
                handle = self._file(epoch, name)
                handle.write("".join(text))
                handle.flush()
        except OSError as error:
            then = f"; then {self.then}" if self.then else ""
            raise EmberError(
                f"Writing the metric logs under {self.path(epoch, '').parent} failed: "
                f"{error.strerror or error}. Free disk space or fix permissions{then}."
            ) from error

    def checks(self, epoch: int) -> dict[str, int]:
        """The check of each open log's last line in `epoch`, by metric name: what a
        checkpoint notes beside the line counts, so a resume can tell the same file."""
        return dict(self._chains.get(epoch, {}))

    def end_epoch(self, split: str, epoch: int, aggregates: dict[str, float]) -> None:
        for file_epoch, name in [key for key in self._files if key[0] == epoch]:
            self._files.pop((file_epoch, name)).close()
        self._chains.pop(epoch, None)

    def close(self) -> None:
        for handle in self._files.values():
            handle.close()
        self._files.clear()
        self._chains.clear()
