"""The run lock: one run at a time in an artifact directory."""

from __future__ import annotations

import logging
import os
import socket
from pathlib import Path

from ember.errors import TrainingError

log = logging.getLogger(__name__)


class RunLock:
    """`ARTIFACT_DIR/.lock` holds the pid and host of the run using the directory.

    A second run on the same directory fails at once; a lock left by a process that
    no longer exists (killed) is taken over.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
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
