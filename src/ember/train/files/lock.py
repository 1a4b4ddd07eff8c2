"""The run lock: one run at a time in an artifact directory.

`ARTIFACT_DIR/.lock` names the process that uses the directory, as one line of JSON:
its host, pid, the start time of the process and the boot id of the machine (both
read from `/proc` on Linux; absent elsewhere), when the run started, and a random
token that tells this lock from any other. The line is sealed (`ember.train.sealed`:
its CRC-32 as the last key), so a damaged lock reads as one holding no process record,
never as another process; a lock of an earlier version, without it, is read as it is.

- The lock is written whole to a temporary file first, which is then linked to the
  lock path (`os.link` fails if a lock is already there): no process ever sees a lock
  half written, so an empty or torn lock is never mistaken for one left by a dead run.
- A lock is stale only when its owner certainly no longer runs: same host and either
  a boot id that differs (the machine restarted), no process with that pid, a process
  that has ended (a zombie), or a process with that pid but another start time (the
  pid was reused, say after a container restart). A lock from another host is never
  judged stale: the busy message tells how to remove it by hand.
- A stale lock is taken over by renaming it to a unique name and checking that what
  was moved is the very lock judged stale; takeovers (and releases) hold an advisory
  `flock` on the directory where the system has one, so two processes taking over at
  once cannot both win, and a takeover never removes a lock that just replaced the
  stale one.
- `release` removes the lock only if it is still this run's own.

Temporary files are named like the directory's other temporaries
(`.NAME.<12 hex>.tmp`), so the clean-up at the start of the next run removes any that
a kill left behind.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import secrets
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, NoReturn

from ember.errors import TrainingError
from ember.train.sealed import SealBroken, seal, unseal

try:
    import fcntl
except ImportError:  # Windows: no flock
    fcntl = None  # type: ignore[assignment]

log = logging.getLogger(__name__)

# A lock that holds no readable owner record is taken over once it is this old: the
# locks written here are complete from the moment they appear, so only a crash of the
# machine before the data reached the disk (or an older writer) leaves one unreadable.
UNREADABLE_GRACE_S = 10.0
# How long a takeover waits for another process's takeover to finish.
_DIRECTORY_LOCK_WAIT_S = 5.0
_ATTEMPTS = 50
_LINK_UNSUPPORTED = {errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.ENOSYS, errno.EXDEV}


@dataclass(frozen=True)
class LockOwner:
    """The process recorded in a lock file."""

    host: str
    pid: int
    started: int | None = None  # /proc/<pid>/stat starttime, clock ticks after boot
    boot: str | None = None  # /proc/sys/kernel/random/boot_id
    since: str | None = None  # local wall-clock time the lock was taken, for people
    token: str | None = None

    @classmethod
    def current(cls) -> LockOwner:
        """This process, with a fresh token."""
        pid = os.getpid()
        stat = _process_stat(pid)
        return cls(
            host=socket.gethostname(),
            pid=pid,
            started=stat[1] if stat is not None else None,
            boot=_boot_id(),
            since=time.strftime("%Y-%m-%d %H:%M:%S %z"),
            token=secrets.token_hex(8),
        )

    def dumps(self) -> str:
        record = {
            "host": self.host,
            "pid": self.pid,
            "started": self.started,
            "boot": self.boot,
            "since": self.since,
            "token": self.token,
        }
        return seal(record).decode("utf-8") + "\n"

    @classmethod
    def parse(cls, text: str) -> LockOwner | None:
        """The owner in a lock file's text; None if it holds none. Also reads the
        `PID HOST` line of the locks written by earlier versions."""
        try:
            json.loads(text)
        except ValueError:
            parts = text.split()
            if len(parts) == 2 and parts[0].isdigit() and int(parts[0]) > 0:
                return cls(host=parts[1], pid=int(parts[0]))
            return None
        try:
            record: Any = unseal(text.encode("utf-8"))[0]
        except SealBroken:
            return None  # damaged: no owner can be read from it
        if not isinstance(record, dict):
            return None
        host, pid = record.get("host"), record.get("pid")
        started, boot = record.get("started"), record.get("boot")
        if not isinstance(host, str) or not host or type(pid) is not int or pid <= 0:
            return None
        return cls(
            host=host,
            pid=pid,
            started=started if type(started) is int else None,
            boot=boot if isinstance(boot, str) and boot else None,
            since=record.get("since") if isinstance(record.get("since"), str) else None,
            token=record.get("token") if isinstance(record.get("token"), str) else None,
        )

    def describe(self) -> str:
        since = f", running since {self.since}" if self.since else ""
        return f"process {self.pid} on {self.host}{since}"


@dataclass(frozen=True)
class _Seen:
    """A lock file as read once: its text, owner and identity on disk."""

    text: str
    owner: LockOwner | None
    identity: tuple[int, int]
    mtime: float

    def same(self, other: _Seen | None) -> bool:
        return other is not None and (self.text, self.identity) == (other.text, other.identity)

    @property
    def damaged(self) -> bool:
        """The file holds text but no readable owner: its checksum or its fields are
        broken (an empty file is one being written where there are no hard links)."""
        return self.owner is None and bool(self.text.strip())

    def unreadable(self, path: Path) -> str:
        """What a lock without a readable owner is, and when it is taken over."""
        at = self.mtime + UNREADABLE_GRACE_S
        left = max(0.0, at - time.time())
        when = time.strftime("%H:%M:%S", time.localtime(at))
        what = (
            f"the run lock {path} is damaged (it holds no readable process record)"
            if self.damaged
            else f"the run lock {path} holds no process record yet"
        )
        return (
            f"{what}; a run takes it over once it is {UNREADABLE_GRACE_S:.0f} s old, at "
            f"{when} (in {left:.0f} s)"
        )


class RunLock:
    """`ARTIFACT_DIR/.lock` holds the host, pid, process start time and boot id of the
    run using the directory.

    A second run on the same directory fails at once; a lock left by a process that
    certainly no longer runs (killed, its machine or container restarted) is taken
    over, and `takeover_message` then says whose lock it was and why it was stale (it
    is also logged as a warning).
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.owned = False
        self.takeover_message: str | None = None
        self._mine: LockOwner | None = None
        self._text = ""

    # Taking the lock -----------------------------------------------------------------
    def acquire(self) -> None:
        """Take the lock, or raise `TrainingError` saying who holds it."""
        if self.owned:
            return
        self.takeover_message = None
        mine = LockOwner.current()
        text = mine.dumps()
        seen: _Seen | None = None
        for _ in range(_ATTEMPTS):
            if self._publish(text):
                self._mine, self._text, self.owned = mine, text, True
                return
            seen = self._read(self.path)
            if seen is None:
                continue  # released meanwhile: try again
            reason = _stale_reason(seen)
            if reason is None:
                self._busy(seen)
            self._take_over(seen, reason)
        self._busy(seen)

    def _publish(self, text: str) -> bool:
        """Make the lock appear at the path, complete; False if one is there."""
        temp = self._temporary()
        try:
            fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                handle.write(text)
            try:
                os.link(temp, self.path)
            except FileExistsError:
                return False
            except FileNotFoundError:
                return False  # the temporary was cleaned away by the run holding the lock
            except OSError as error:
                if error.errno not in _LINK_UNSUPPORTED:
                    raise
                return self._publish_without_link(text)
            return True
        except OSError as error:
            raise TrainingError(
                f"Cannot write in the artifact directory {self.path.parent}: {error}. "
                "Check its permissions and free space, or choose another directory."
            ) from None
        finally:
            with contextlib.suppress(OSError):
                os.unlink(temp)

    def _publish_without_link(self, text: str) -> bool:
        """For file systems without hard links: create the lock exclusively and write it.
        A reader may then see it empty for a moment, which counts as busy (it is young)."""
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            return False
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        return True

    def _take_over(self, seen: _Seen, reason: str) -> None:
        """Remove the stale lock `seen`, if it is still the one at the path."""
        with _directory_lock(self.path.parent) as locked:
            if not locked:
                self._busy(seen)  # another process has been taking it over for long
            if not seen.same(self._read(self.path)):
                return  # the lock changed meanwhile: judge again
            aside = self._temporary()
            try:
                os.rename(self.path, aside)
            except FileNotFoundError:
                return
            moved = self._read(aside)
            if seen.same(moved):
                with contextlib.suppress(OSError):
                    os.unlink(aside)
                self._note_takeover(seen, reason)
                return
            if moved is not None:
                self._put_back(aside)

    def _put_back(self, aside: Path) -> None:
        """Return a lock moved by mistake (only without `flock`: a lock that replaced the
        stale one between the check and the rename)."""
        try:
            os.link(aside, self.path)
        except FileExistsError:
            log.warning(
                "The run lock %s changed while it was being taken over; the run that "
                "wrote it may now share the directory with another.",
                self.path,
            )
        except OSError:
            with contextlib.suppress(OSError):
                os.rename(aside, self.path)
            return
        with contextlib.suppress(OSError):
            os.unlink(aside)

    def _note_takeover(self, seen: _Seen, reason: str) -> None:
        who = seen.owner.describe() if seen.owner is not None else "an unknown run"
        self.takeover_message = (
            f"Took over the run lock {self.path}, left by {who}, which no longer runs: {reason}."
        )
        log.warning("%s", self.takeover_message)

    def _busy(self, seen: _Seen | None) -> NoReturn:
        if seen is not None and seen.owner is None:
            what = seen.unreadable(self.path)
            raise TrainingError(
                f"{what[0].upper()}{what[1:]}: try again then. If no process trains in "
                f"this directory, you may delete {self.path} by hand now."
            )
        if seen is not None and seen.owner is not None:
            who = seen.owner.describe()
        else:
            who = "another run"
        raise TrainingError(
            f"{self.path.parent} is in use by {who} (lock file {self.path}). Wait for that "
            "run to end, stop it, or train in another directory. If that run is no longer "
            f"going on (for example it ran on another machine or in a container that is "
            f"gone), delete {self.path} by hand; that is safe only once no process trains "
            "in this directory."
        )

    # Giving it back ------------------------------------------------------------------
    def release(self) -> None:
        """Remove the lock if it is still this run's own (a lock that is no longer ours
        is left in place, with a warning). A forked copy of the process never removes
        its parent's lock."""
        mine = self._mine
        if not self.owned or mine is None or mine.pid != os.getpid():
            return
        self.owned = False
        try:
            with _directory_lock(self.path.parent):
                seen = self._read(self.path)
                if seen is not None and seen.text == self._text:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(self.path)
                    return
        except (OSError, TrainingError) as error:
            log.warning("Could not remove the run lock %s: %s", self.path, error)
            return
        if seen is None:
            log.warning("The run lock %s was removed while the run held it.", self.path)
        else:
            who = seen.owner.describe() if seen.owner is not None else "another run"
            log.warning(
                "The run lock %s now belongs to %s, not to this run: it is left in place.",
                self.path,
                who,
            )

    # Helpers -------------------------------------------------------------------------
    def _temporary(self) -> Path:
        return self.path.with_name(f".{self.path.name}.{secrets.token_hex(6)}.tmp")

    def _read(self, path: Path) -> _Seen | None:
        """The lock file at `path` as it is now; None if there is none."""
        try:
            with open(path, "rb") as handle:
                stat = os.fstat(handle.fileno())
                data = handle.read(64 * 1024)
        except FileNotFoundError:
            return None
        except OSError as error:
            raise TrainingError(
                f"Cannot read the run lock {path}: {error}. Check the permissions of the "
                "artifact directory, or choose another directory."
            ) from None
        text = data.decode("utf-8", errors="replace")
        return _Seen(text, LockOwner.parse(text), (stat.st_dev, stat.st_ino), stat.st_mtime)


def _stale_reason(seen: _Seen) -> str | None:
    """Why the owner of `seen` certainly no longer runs; None when it may still run."""
    owner = seen.owner
    if owner is None:
        age = time.time() - seen.mtime
        if age > UNREADABLE_GRACE_S:
            return f"the lock file holds no process record and is {age:.0f} s old"
        return None
    if owner.host != socket.gethostname():
        return None  # another machine's processes cannot be seen from here
    boot = _boot_id()
    if owner.boot is not None and boot is not None and owner.boot != boot:
        return "this machine has restarted since (its boot id differs)"
    if os.name == "nt":
        return None  # no safe way to probe a pid here
    try:
        os.kill(owner.pid, 0)
    except ProcessLookupError:
        return f"no process {owner.pid} runs any more"
    except PermissionError:
        pass  # it exists, under another user
    except OSError:
        return None
    stat = _process_stat(owner.pid)
    if stat is None:
        return None
    state, started = stat
    if state in ("Z", "X"):
        return f"process {owner.pid} has ended"
    if owner.started is not None and started != owner.started:
        return (
            f"process {owner.pid} is now another process, started at another time "
            "(the pid was reused)"
        )
    return None


def _process_stat(pid: int) -> tuple[str, int] | None:
    """The state and start time (clock ticks after boot) of a process, from
    `/proc/<pid>/stat`; None where there is no such file (not Linux, no such pid)."""
    try:
        data = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    # "pid (comm) state ppid ...": comm may hold spaces and parentheses
    fields = data[data.rfind(b")") + 2 :].split()
    try:
        return fields[0].decode(), int(fields[19])
    except (IndexError, ValueError):
        return None


@lru_cache(maxsize=1)
def _boot_id() -> str | None:
    """This machine's boot id (Linux); None elsewhere."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip() or None
    except OSError:
        return None


@contextlib.contextmanager
def _directory_lock(directory: Path) -> Iterator[bool]:
    """Hold an advisory `flock` on `directory`; yields False if another process held it
    for too long. Where there is no `flock` (or the file system refuses it), yields True
    without one."""
    if fcntl is None:
        yield True
        return
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        yield True
        return
    try:
        deadline = time.monotonic() + _DIRECTORY_LOCK_WAIT_S
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                locked = True
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    locked = False
                    break
                time.sleep(0.001)
            except OSError:
                locked = True  # no flock on this file system: go on without
                break
        yield locked
    finally:
        os.close(fd)  # closing drops the flock


@dataclass(frozen=True)
class LockState:
    """A run lock as a reader sees it: who holds it and whether that process still runs."""

    owner: LockOwner | None
    running: bool
    stale_reason: str | None
    unreadable: str | None = None
    """For a lock without a readable owner (damaged, or being written): what it is and
    when a run takes it over; None for a lock naming its owner."""


def read_lock(path: str | os.PathLike[str]) -> LockState | None:
    """The lock at `path` (None when there is none): its owner and whether the owner
    may still run (a lock from another machine counts as running). Only reads."""
    seen = RunLock(Path(path))._read(Path(path))
    if seen is None:
        return None
    reason = _stale_reason(seen)
    unreadable = seen.unreadable(Path(path)) if seen.owner is None else None
    return LockState(seen.owner, reason is None, reason, unreadable)
