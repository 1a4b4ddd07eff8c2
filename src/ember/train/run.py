"""Preparing an artifact directory for a run: refuse to mix runs, clear replaced epochs."""

from __future__ import annotations

import logging
import os
import re
import shutil
import socket
from pathlib import Path

from ember.errors import TrainingError

_EPOCH_DIR = re.compile(r"^epoch-(\d+)$")
_TEMPORARY = re.compile(r"^\..+\.[0-9a-f]{12}\.tmp$")
log = logging.getLogger("ember")


def epoch_dirs(split_dir: Path) -> dict[int, Path]:
    """The `epoch-N` folders of a split directory, by epoch."""
    found: dict[int, Path] = {}
    if split_dir.is_dir():
        for entry in split_dir.iterdir():
            match = _EPOCH_DIR.match(entry.name)
            if match and entry.is_dir():
                found[int(match.group(1))] = entry
    return found


def prepare_artifact_dir(
    directory: Path, resume_epoch: int | None, overwrite: bool, check_only: bool = False
) -> None:
    """Make `directory` ready: a fresh run needs it free of an earlier run (or
    `overwrite=True`); a resumed run keeps logs of epochs <= `resume_epoch` only.
    With `check_only`, just create it and check that it is writable."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise TrainingError(f"Cannot create the artifact directory {directory}: {error}.") from None
    if not os.access(directory, os.W_OK | os.X_OK):
        raise TrainingError(
            f"The artifact directory {directory} is not writable: fix its permissions or "
            "choose another directory."
        )
    if check_only:
        return
    splits = [directory / "train", directory / "valid"]
    if resume_epoch is None:
        previous = [p for split in splits for p in epoch_dirs(split).values()]
        checkpoints = directory / "checkpoint"
        has_checkpoints = checkpoints.is_dir() and any(checkpoints.iterdir())
        if previous or has_checkpoints:
            if not overwrite:
                raise TrainingError(
                    f"{directory} already holds a run ({len(previous)} epoch log folder(s)"
                    f"{', checkpoints' if has_checkpoints else ''}). Resume it with "
                    "checkpoint(n), replace it with LearnerBuilder(dir, overwrite=True), or "
                    "choose a new directory."
                )
            for path in [*splits, checkpoints]:
                shutil.rmtree(path, ignore_errors=True)
            (directory / "experiment.log").unlink(missing_ok=True)
        return
    for split in splits:
        for epoch, path in epoch_dirs(split).items():
            if epoch > resume_epoch:
                shutil.rmtree(path)


def remove_stale_temporaries(directory: Path) -> None:
    """Delete temp files left by a write that a kill interrupted (never a final file)."""
    if directory.is_dir():
        for entry in directory.iterdir():
            if _TEMPORARY.match(entry.name) and entry.is_file():
                entry.unlink(missing_ok=True)


class RunLock:
    """`ARTIFACT_DIR/.lock` holds the pid and host of the run using the directory.

    A second run on the same directory fails at once; a lock left by a process that
    no longer exists (killed) is taken over.
    """

    def __init__(self, directory: Path) -> None:
        self.path = directory / ".lock"
        self.owned = False

    def acquire(self) -> None:
        me = f"{os.getpid()} {socket.gethostname()}\n"
        for _ in range(2):
            try:
                fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            except FileExistsError:
                if not self._stale():
                    return self._busy()
                log.warning("Taking over %s, left by a process that no longer runs.", self.path)
                self.path.unlink(missing_ok=True)
                continue
            except OSError as error:
                raise TrainingError(
                    f"Cannot write in the artifact directory {self.path.parent}: {error}. "
                    "Check its permissions and free space, or choose another directory."
                ) from None
            with os.fdopen(fd, "w") as handle:
                handle.write(me)
            self.owned = True
            return None
        return self._busy()

    def _owner(self) -> tuple[int, str] | None:
        try:
            pid, host = self.path.read_text().split()
            return int(pid), host
        except (OSError, ValueError):
            return None

    def _stale(self) -> bool:
        owner = self._owner()
        if owner is None:
            return True  # empty or torn: its writer died before finishing it
        pid, host = owner
        if host != socket.gethostname():
            return False
        if pid == os.getpid():
            return False
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False
        return False

    def _busy(self) -> None:
        owner = self._owner()
        who = f"process {owner[0]} on {owner[1]}" if owner else "another run"
        raise TrainingError(
            f"{self.path.parent} is in use by {who} (lock file {self.path}). Wait for that run "
            "to end, stop it, or train in another directory."
        )

    def release(self) -> None:
        if self.owned:
            self.path.unlink(missing_ok=True)
            self.owned = False
