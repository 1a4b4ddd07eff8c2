"""The application logger: Python logging of a run into `experiment.log` (rank 0), and
each process's own lines into `rank-N.log` (`devices(..., rank_logs=True)`)."""

from __future__ import annotations

import logging
import os
from pathlib import Path

from ember.errors import EmberError
from ember.train.distributed.launch import COPIED_FROM

LOGGER_NAME = "ember"
FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class FileApplicationLogger:
    """Attaches a file handler at INFO to the `ember` logger for the length of a run
    (`install(main=True)`: `experiment.log`), and with `rank_log` (a `RankLogFile`)
    this process's own lines there too."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        level: int = logging.INFO,
        rank_log: RankLogFile | None = None,
    ) -> None:
        self.path = Path(path)
        self.level = level
        self.rank_log = rank_log
        self._handler: logging.Handler | None = None
        self._previous_level: int | None = None

    def check(self) -> None:
        """Raise the error `install` would, writing nothing: a run checks that its log
        can be written before it changes anything in its directory."""
        try:
            if self.path.exists():
                with open(self.path, "ab"):  # opening to append writes nothing
                    pass
            elif self.path.parent.is_dir() and not os.access(self.path.parent, os.W_OK | os.X_OK):
                raise PermissionError(f"cannot create a file in {self.path.parent}")
        except OSError as error:
            raise self._cannot(error) from None

    def install(self, main: bool = True) -> None:
        """Write `experiment.log` (when `main`) and take this process's lines for its
        rank log (written from `open_rank_log`)."""
        logger = logging.getLogger(LOGGER_NAME)
        if main:
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                handler = logging.FileHandler(self.path, mode="a", encoding="utf-8")
            except OSError as error:
                raise self._cannot(error) from None
            handler.setLevel(self.level)
            handler.setFormatter(logging.Formatter(FORMAT))
            logger.addHandler(handler)
            self._handler = handler
        if self.rank_log is not None:
            logger.addHandler(self.rank_log)
        if self._handler is not None or self.rank_log is not None:
            self._previous_level = logger.level
            if logger.level == logging.NOTSET or logger.level > self.level:
                logger.setLevel(self.level)

    def open_rank_log(self) -> None:
        """Every process knows the artifact directory is ready (rank 0 prepared it): the
        rank log writes the lines it took so far, then each line as it comes."""
        if self.rank_log is not None:
            self.rank_log.open()

    def _cannot(self, error: OSError) -> EmberError:
        return EmberError(
            f"Cannot write the run's log {self.path}: {error.strerror or error}. Fix the "
            "file's permissions (or remove it), free disk space, or train in another "
            "directory."
        )

    def uninstall(self) -> None:
        logger = logging.getLogger(LOGGER_NAME)
        for handler in (self._handler, self.rank_log):
            if handler is not None and handler in logger.handlers:
                logger.removeHandler(handler)
                handler.close()
        self._handler = None
        if self._previous_level is not None:
            logger.setLevel(self._previous_level)
            self._previous_level = None


class RankLogFile(logging.Handler):
    """`rank-N.log`: the records of this process (those `experiment.log` gets on rank 0,
    without the copies of other processes' output), at INFO. Lines taken before the
    directory is ready wait in memory (`open`); after, each record is appended to the
    file in one write, so a crash leaves whole lines, and a resumed run appends."""

    def __init__(self, path: str | os.PathLike[str], rank: int, level: int = logging.INFO) -> None:
        super().__init__(level)
        self.path = Path(path)
        self.rank = rank
        self.setFormatter(logging.Formatter(FORMAT))
        self._waiting: list[str] | None = []
        self._fd: int | None = None

    def open(self) -> None:
        """Open the file to append (never through a link) and write the lines waiting."""
        self.acquire()  # (the watchdog thread may log meanwhile)
        try:
            if self._fd is not None or self._waiting is None:
                return
            waiting, self._waiting = self._waiting, None
            error = self._open(waiting)
        finally:
            self.release()
        if error is not None:
            logging.getLogger(LOGGER_NAME).warning(
                "Cannot write this process's log %s (%s): its lines go to standard error only.",
                self.path,
                error.strerror or error,
            )

    def _open(self, waiting: list[str]) -> OSError | None:
        try:
            fd = self._fd = os.open(
                self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o644
            )
            size = os.fstat(fd).st_size
            if size and os.pread(fd, 1, size - 1) != b"\n":
                waiting.insert(0, "")  # a line cut short by a crash is ended before ours
            if waiting:
                self._write("\n".join(waiting) + "\n")
        except OSError as error:
            if self._fd is not None:
                os.close(self._fd)
            self._fd = None
            return error
        return None

    def _write(self, text: str) -> None:
        assert self._fd is not None
        data = text.encode("utf-8", errors="replace")
        while data:  # one write for a record, unless the system splits it
            data = data[os.write(self._fd, data) :]

    def emit(self, record: logging.LogRecord) -> None:
        if getattr(record, COPIED_FROM, self.rank) != self.rank:
            return  # another process's output, which its own log holds
        try:
            line = self.format(record)
            if self._waiting is not None:
                self._waiting.append(line)
            elif self._fd is not None:
                self._write(line + "\n")
        except Exception:
            self.handleError(record)

    def close(self) -> None:
        self.acquire()
        try:
            if self._fd is not None:
                os.close(self._fd)
            self._fd, self._waiting = None, None
        finally:
            self.release()
        super().close()
