"""Starting the ranks: one process per extra device, running the same command again, with
its standard error copied into this process's standard error and log."""

from __future__ import annotations

import collections
import logging
import os
import socket
import subprocess
import sys
import threading
from dataclasses import dataclass, field

from ember.environment import in_notebook
from ember.errors import TrainingError

log = logging.getLogger("ember.train.distributed")  # the package's one logger
_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
LAUNCHER_VARIABLE = "EMBER_LAUNCHER_PID"
"""Set in the processes ember starts: the pid of the process that started them."""
COPIED_FROM = "ember_rank"
"""On a log record that copies the output of a process ember started: its rank (a
rank's own log, `rank-N.log`, leaves such records out)."""


@dataclass
class Child:
    """A process started by ember for one extra rank."""

    rank: int
    process: subprocess.Popen[bytes]
    tail: collections.deque[str] = field(default_factory=lambda: collections.deque(maxlen=60))
    reader: threading.Thread | None = None
    logged: bool = False
    """Rank 0 logged this rank's failure record: its further output, which repeats the
    traceback, goes to standard error only."""


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _command() -> list[str]:
    if in_notebook():  # running the command again would start more kernels
        raise TrainingError(
            "Training on several devices starts one process per device, which a notebook "
            "cannot do. Put the training in a script and run it (`python train.py` starts "
            "one process per device), or launch it with torchrun; in the notebook, train on "
            "one device."
        )
    argv = list(getattr(sys, "orig_argv", []) or [sys.executable, *sys.argv])
    if len(argv) < 2 or argv[1] in ("-c", "-i") or sys.argv[0] in ("", "-c", "-"):
        raise TrainingError(
            "Training on several devices starts one process per device by running your "
            "command again, which needs a script (`python train.py`, `python -m pkg`), not an "
            "interactive session, `python -c` or a script on standard input. Run a script, "
            "or launch with torchrun."
        )
    return [sys.executable, *argv[1:]]


# Run before the command in the processes ember starts, on Linux: they get SIGKILL when
# the thread that started them ends (the process that called fit, killed or not).
_BOOTSTRAP = (
    "import ctypes, os, signal, sys\n"
    "ctypes.CDLL(None).prctl(1, signal.SIGKILL, 0, 0, 0)\n"  # PR_SET_PDEATHSIG
    f"if os.getppid() != int(os.environ['{LAUNCHER_VARIABLE}']): os._exit(1)\n"
    "os.execv(sys.argv[1], sys.argv[1:])\n"
)


def launch_ranks(world: int) -> tuple[list[Child], dict[str, str | None]]:
    """Start ranks 1 to `world - 1`, each running this process's command again, and make
    this process rank 0: the ranks started, and the environment variables as they were
    (to put back when the group ends)."""
    command = _command()
    if sys.platform.startswith("linux"):
        command = [sys.executable, "-I", "-S", "-c", _BOOTSTRAP, *command]
    shared = {
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(_free_port()),
        "WORLD_SIZE": str(world),
        "LOCAL_WORLD_SIZE": str(world),
    }
    saved = {name: os.environ.get(name) for name in _VARIABLES}
    children: list[Child] = []
    try:
        for rank in range(1, world):
            child = _start(rank, command, shared)
            children.append(child)
            if child.reader is not None:  # (always: _start makes it)
                child.reader.start()
    except BaseException:  # a Ctrl-C (or a failed start) half way: end those started
        _end(children)
        raise
    os.environ.update({**shared, "RANK": "0", "LOCAL_RANK": "0"})
    return children, saved


def _start(rank: int, command: list[str], shared: dict[str, str]) -> Child:
    """The process of `rank`, and the thread that will copy its standard error."""
    env = {
        **os.environ,
        **shared,
        "RANK": str(rank),
        "LOCAL_RANK": str(rank),
        LAUNCHER_VARIABLE: str(os.getpid()),
    }
    process = subprocess.Popen(
        command,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
    )
    child = Child(rank, process)
    child.reader = threading.Thread(
        target=_forward, args=(child,), name=f"ember-rank-{rank}", daemon=True
    )
    return child


def _end(children: list[Child]) -> None:
    """Kill the ranks started so far and wait for them: none outlives a start that
    did not finish."""
    for child in children:
        if child.process.poll() is None:
            child.process.kill()
    for child in children:
        child.process.wait()


def end_started(children: list[Child], saved: dict[str, str | None]) -> None:
    """Joining failed before the group was set up: end the ranks started and put the
    environment variables `launch_ranks` set back as they were (`saved`)."""
    _end(children)
    restore_environment(saved)


def restore_environment(saved: dict[str, str | None]) -> None:
    """The variables of `saved` back to their saved values (None: unset)."""
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


def _forward(child: Child) -> None:
    """Copy a child's standard error into our own standard error and the log."""
    assert child.process.stderr is not None
    for raw in child.process.stderr:
        line = raw.decode("utf-8", errors="replace").rstrip("\n")
        child.tail.append(line)
        if not child.logged:
            log.info("[rank %d] %s", child.rank, line, extra={COPIED_FROM: child.rank})
        sys.stderr.write(f"[rank {child.rank}] {line}\n")
    child.process.stderr.close()
