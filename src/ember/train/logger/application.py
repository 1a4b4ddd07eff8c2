"""The application logger: Python logging of a run into `experiment.log`."""

from __future__ import annotations

import logging
import os
from pathlib import Path

from ember.errors import EmberError

LOGGER_NAME = "ember"
FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class FileApplicationLogger:
    """Attaches a file handler at INFO to the `ember` logger for the length of a run."""

    def __init__(self, path: str | os.PathLike[str], level: int = logging.INFO) -> None:
        self.path = Path(path)
        self.level = level
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

    def install(self) -> None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            handler = logging.FileHandler(self.path, mode="a", encoding="utf-8")
        except OSError as error:
            raise self._cannot(error) from None
        handler.setLevel(self.level)
        handler.setFormatter(logging.Formatter(FORMAT))
        logger = logging.getLogger(LOGGER_NAME)
        self._previous_level = logger.level
        if logger.level == logging.NOTSET or logger.level > self.level:
            logger.setLevel(self.level)
        logger.addHandler(handler)
        self._handler = handler

    def _cannot(self, error: OSError) -> EmberError:
        return EmberError(
            f"Cannot write the run's log {self.path}: {error.strerror or error}. Fix the "
            "file's permissions (or remove it), free disk space, or train in another "
            "directory."
        )

    def uninstall(self) -> None:
        if self._handler is None:
            return
        logger = logging.getLogger(LOGGER_NAME)
        logger.removeHandler(self._handler)
        self._handler.close()
        self._handler = None
        if self._previous_level is not None:
            logger.setLevel(self._previous_level)
