"""Several devices: one process per device on torch.distributed.

`devices([d0, d1, ...])` with several devices makes the process that calls `fit` rank
0; it starts one more process per extra device by running the same command again
(`sys.orig_argv`) with the usual torch.distributed variables set, so a user changes
neither the script nor the launcher. Under `torchrun` (one node or several) the
variables are already there and every process simply joins the group.

Rank 0 alone writes the artifact directory, renders and checkpoints. The other
ranks' standard error is copied into rank 0's standard error and `experiment.log`
(with a `[rank N]` prefix). How the processes share the model (DDP replicas or FSDP
shards) is `ember.train.parallel`'s business.

When something goes wrong the ranks tell each other through the group's key-value
store (the c10d TCPStore), which a watchdog thread in every process reads:

- A rank whose run raises publishes a failure record (rank, position, traceback)
  before it leaves the group, and waits a moment for the others to take note. Rank 0
  logs the record; the other ranks, whose collectives then fail with "connection
  closed", report it in one line instead of their own traceback.
- A rank that has waited in a collective for `timeout` seconds asks the others where
  they are and publishes which ranks did not arrive and where they were; those ranks
  stop at once, which ends the others' wait.
- A rank whose main thread cannot end after another rank failed (it waits in a
  collective that does not fail) is ended by its watchdog.
- The processes ember starts die with the process that started them (on Linux through
  a parent-death signal set before the command runs, elsewhere by the watchdog).
"""

from __future__ import annotations

import collections
import contextlib
import functools
import gc
import json
import linecache
import logging
import os
import select
import signal
import socket
import subprocess
import sys
import sysconfig
import threading
import time
import traceback
import types
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
import torch.distributed as dist

from ember.environment import from_environment, in_notebook
from ember.errors import TrainingError

log = logging.getLogger(__name__)
_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
_LAUNCHER = "EMBER_LAUNCHER_PID"
"""Set in the processes ember starts: the pid of the process that started them."""

_POLL = 0.2  # seconds between two looks of a watchdog
_GRACE = 2.0  # seconds a rank has to end by itself once another rank failed
_ACK_WAIT = 2.0  # seconds a failing rank waits for the others to take note of it
_ANSWER_WAIT = 2.0  # seconds a rank waits for the others to say where they are
_SLACK = 10.0  # the group's own timeout exceeds `timeout` by this, so ember reports first
_setups = 0  # process groups joined by this process; each keeps its keys apart

# Errors on this rank that only reflect a failure elsewhere, with their one-line account:
# the exception hook prints those in one line.
_explained: list[tuple[BaseException, str]] = []
_run_failed = False  # a run of this process failed: it is about to exit


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


@dataclass
class Failure:
    """What a rank publishes when the run cannot go on: `kind` is "error" (an exception
    on `rank`), "interrupted", "hang" (reported by `rank`: `culprits` did not arrive) or
    "lost" (reported by `rank`: a rank vanished)."""

    rank: int
    kind: str
    summary: str
    details: str = ""
    culprits: tuple[int, ...] = ()

    @classmethod
    def from_error(cls, rank: int, error: BaseException) -> Failure:
        where = _position(_traceback_frames(error.__traceback__))
        at = f" at {where}" if where else ""
        if isinstance(error, KeyboardInterrupt):
            return cls(rank, "interrupted", f"Rank {rank} was interrupted{at} (KeyboardInterrupt)")
        line = next(iter(str(error).strip().splitlines()), "")[:300]
        summary = f"Rank {rank} failed{at}: {type(error).__name__}" + (f": {line}" if line else "")
        details = "".join(traceback.format_exception(type(error), error, error.__traceback__))
        return cls(rank, "error", summary, details[-20000:].rstrip("\n"))

    def report(self) -> str:
        """One paragraph, for errors on the other ranks."""
        if self.kind == "error":
            return (
                f"{self.summary} (its traceback is in rank {self.rank}'s output and in "
                "experiment.log)."
            )
        return f"{self.summary}."

    def log_text(self) -> str:
        return f"{self.summary}:\n{self.details}" if self.details else f"{self.summary}."

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str | bytes) -> Failure:
        data = json.loads(text)
        data["culprits"] = tuple(data.get("culprits", ()))
        return cls(**data)


class _Board:
    """This process group's keys in the c10d store: failure records, their
    acknowledgements, and questions "where are you?" with the ranks' answers."""

    def __init__(self, store: Any, rank: int, world: int) -> None:
        self.store = store
        self.rank = rank
        self.world = world

    def events(self) -> int:
        """A counter bumped by every publication, so one cheap call tells if anything is new."""
        return int(self.store.add("events", 0))

    def publish(self, failure: Failure) -> None:
        self.store.set(f"failure/{failure.rank}", failure.to_json())
        self.store.append("failed", f"{failure.rank},")
        self.store.add("events", 1)

    def failures(self) -> list[Failure]:
        if not self.store.check(["failed"]):
            return []
        ranks = [int(r) for r in self.store.get("failed").decode().split(",") if r]
        return [Failure.from_json(self.store.get(f"failure/{r}")) for r in dict.fromkeys(ranks)]

    def acknowledge(self, rank: int) -> None:
        self.store.add(f"ack/{rank}", 1)

    def wait_acknowledged(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while int(self.store.add(f"ack/{self.rank}", 0)) < self.world - 1:
            if time.monotonic() > deadline:
                return
            time.sleep(0.02)

    def elect(self, key: str) -> bool:
        """True for the first rank to ask for `key`."""
        me = str(self.rank)
        return bool(self.store.compare_set(key, "", me) == me.encode())

    def ask(self) -> int:
        question = int(self.store.add("question", 1))
        self.store.add("events", 1)
        return question

    def question(self) -> int:
        return int(self.store.add("question", 0))

    def answer(self, question: int, where: dict[str, Any]) -> None:
        self.store.set(f"where/{question}/{self.rank}", json.dumps(where))

    def answers(self, question: int, timeout: float) -> dict[int, dict[str, Any] | None]:
        """The other ranks' answers (None: no answer within `timeout` seconds)."""
        keys = {rank: f"where/{question}/{rank}" for rank in range(self.world) if rank != self.rank}
        deadline = time.monotonic() + timeout
        while not self.store.check(list(keys.values())) and time.monotonic() < deadline:
            time.sleep(0.05)
        return {
            rank: json.loads(self.store.get(key)) if self.store.check([key]) else None
            for rank, key in keys.items()
        }


@dataclass
class Distributed:
    """This process's place in the group, and the group's collective helpers."""

    rank: int
    world: int
    local_rank: int
    device: torch.device
    backend: str
    children: list[Child] = field(default_factory=list)
    saved_env: dict[str, str | None] = field(default_factory=dict)
    finished: bool = False
    timeout: float = 300.0
    launcher: int | None = None
    """The pid of the process that started this one, when ember started it."""
    thread: int = field(default_factory=threading.get_ident)
    """The thread that trains (the one that called `fit`)."""
    progress: int = 0
    """Bumped by every step and collective: the hang detection watches it."""
    sharding: Any = None
    """How the model and optimizer states are read and written when each rank holds a
    shard of them (`ember.train.parallel.fsdp.Sharding`); None when every rank holds
    the whole model (one process, DDP)."""
    cause: Failure | None = None
    """The failure that explains this rank's communication errors: another rank's record,
    or this rank's own report of a hang or a lost rank."""
    failed_at: float | None = None
    unwinding: bool = False
    reported: set[int] = field(default_factory=set)
    """The ranks whose own failure this rank has heard of."""
    prefix: str = ""
    """Before the lines this rank prints: torch's `[rankN]: ` under torchrun, nothing in
    the ranks ember starts (rank 0 prefixes what the others print)."""
    board: _Board | None = field(default=None, repr=False)
    signals: int | None = field(default=None, repr=False)
    """Where the signals this process receives are written (`signal.set_wakeup_fd`), so
    the watchdog hears of a Ctrl-C even while the main thread is blocked in a collective."""
    _watchdog: threading.Thread | None = field(default=None, repr=False)
    _stop: threading.Event = field(default_factory=threading.Event, repr=False)
    _handler: logging.Handler | None = field(default=None, repr=False)

    @property
    def main(self) -> bool:
        return self.rank == 0

    def _flag_device(self) -> torch.device:
        return self.device if self.backend == "nccl" else torch.device("cpu")

    def all_gather(self, value: Any) -> list[Any]:
        """Every rank's `value`, in rank order (host objects, e.g. metric rows)."""
        self.progress += 1
        gathered: list[Any] = [None] * self.world
        dist.all_gather_object(gathered, value)
        self.progress += 1
        return gathered

    def broadcast(self, value: Any) -> Any:
        """Rank 0's `value` on every rank."""
        self.progress += 1
        box = [value if self.main else None]
        dist.broadcast_object_list(box, src=0)
        self.progress += 1
        return box[0]

    def any(self, flag: bool) -> bool:
        """True on every rank when `flag` is true on any rank."""
        self.progress += 1
        tensor = torch.tensor([1 if flag else 0], dtype=torch.int32, device=self._flag_device())
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
        self.progress += 1
        return bool(tensor.item())

    def sum(self, value: torch.Tensor) -> torch.Tensor:
        """The sum over every rank of a float32 scalar `value` (one all-reduce)."""
        self.progress += 1
        tensor = value.detach().to(self._flag_device(), torch.float32).reshape(1).clone()
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
        self.progress += 1
        return tensor[0]

    def sum_and_any(self, count: int | torch.Tensor, flag: bool) -> tuple[int, bool]:
        """The sum over every rank of an integer `count` (an int or a tensor) and whether
        `flag` is true on any rank, in one all-reduce (a stop vote that also sums)."""
        self.progress += 1
        device = self._flag_device()
        tensor = torch.zeros(2, dtype=torch.int64, device=device)
        tensor[0] = count.detach().to(device, torch.int64) if torch.is_tensor(count) else count
        tensor[1] = 1 if flag else 0
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
        self.progress += 1
        total, flags = tensor.tolist()
        return int(total), flags > 0

    def barrier(self) -> None:
        self.progress += 1
        dist.barrier()
        self.progress += 1

    # Failures ----------------------------------------------------------------------
    def failures(self, wait: float = 0.0) -> str:
        """Called while an error is being handled on this rank. When the error only
        reflects another rank's failure (or a rank that hung or vanished), returns that
        failure in one paragraph; when it is this rank's own, publishes it for the others
        and returns "". `wait` bounds how long to wait for a started rank to exit when
        a rank vanished without a word."""
        global _run_failed
        error = sys.exc_info()[1]
        if error is None:
            return self._exits(wait)
        self.unwinding = _run_failed = True
        try:
            return self._account(error, wait)
        except Exception as problem:  # never hide the error that ended the run
            log.debug("Could not compare notes with the other ranks: %s", problem)
            return ""

    def caused_elsewhere(self, error: BaseException) -> str | None:
        """One line saying why `error` happened when it only reflects a failure elsewhere
        (a collective that failed because another rank failed, hung or vanished); None
        when it is this rank's own."""
        cause = self.cause
        if cause is None or not _communication_error(error):
            return None
        line = next(iter(str(error).strip().splitlines()), "")[:200]
        return f"{cause.report()} On rank {self.rank}: {type(error).__name__}: {line}"

    def _account(self, error: BaseException, wait: float) -> str:
        if _communication_error(error):
            cause = self.cause or self._failure_elsewhere()
            if cause is None:
                cause = self._lost(error, min(wait, _GRACE))
            if cause is None:
                return ""
            self.cause = self.cause or cause
            text = cause.report()
            _explained.append((error, text))
            return text
        own = Failure.from_error(self.rank, error)
        board = self.board
        if board is not None:
            board.publish(own)
            if self.cause is None:  # the others still listen: let them take note
                board.wait_acknowledged(_ACK_WAIT)
        return ""

    def _failure_elsewhere(self) -> Failure | None:
        if self.board is None:
            return None
        for failure in self.board.failures():
            if failure.rank != self.rank:
                return failure
        return None

    def _lost(self, error: BaseException, wait: float) -> Failure | None:
        """A collective failed and no rank published why: a started rank exited, or a
        rank vanished or hangs. Find out which, and tell the others."""
        report = self._exits(wait)
        board = self.board
        if report:
            failure = Failure(self.rank, "lost", report)
        elif board is not None and board.elect("lost"):
            mine = _where(_traceback_frames(error.__traceback__))
            failure = _missing(self.rank, mine, board.answers(board.ask(), _ANSWER_WAIT))
            if not failure.culprits:  # everyone is where this rank is: nothing to tell
                return None
        elif board is not None:  # another rank is finding out
            deadline = time.monotonic() + _ANSWER_WAIT + 1
            while time.monotonic() < deadline:
                found = self._failure_elsewhere()
                if found is not None:
                    return found
                time.sleep(0.05)
            return None
        else:
            return None
        if board is not None:
            board.publish(failure)
        return failure

    def _exits(self, wait: float) -> str:
        """The started ranks that exited before the end (waits up to `wait` seconds for
        one to exit)."""
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline and all(c.process.poll() is None for c in self.children):
            time.sleep(0.05)
        reports = []
        for child in self.children:
            code = child.process.poll()
            if code is not None:
                if child.reader is not None:
                    child.reader.join(timeout=2)
                reports.append(
                    f"Rank {child.rank} exited with {_exit_status(code)} before the run ended, "
                    "without reporting an error (its output is above)"
                )
        return "; ".join(reports)

    # Watchdog ------------------------------------------------------------------------
    def _learn(self, failure: Failure) -> None:
        if self.cause is None:
            self.cause = failure
            self.failed_at = time.monotonic()

    def _listen_to_signals(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        read, write = os.pipe()
        os.set_blocking(read, False)
        os.set_blocking(write, False)
        if signal.set_wakeup_fd(write, warn_on_full_buffer=False) != -1:  # someone else's
            signal.set_wakeup_fd(-1)
            os.close(read)
            os.close(write)
            return
        self.signals = read

    def _stop_listening(self) -> None:
        if self.signals is None or threading.current_thread() is not threading.main_thread():
            return
        write = signal.set_wakeup_fd(-1)
        for fd in (self.signals, write):
            with contextlib.suppress(OSError):
                os.close(fd)
        self.signals = None

    def _start_watchdog(self) -> None:
        self._watchdog = threading.Thread(
            target=_Watchdog(self).run, name="ember-watchdog", daemon=True
        )
        self._watchdog.start()

    def _attach_board(self) -> None:
        """A store client of our own (the watchdog's calls never wait behind the
        training thread's), under keys of this run, restart and group."""
        try:
            client = dist.TCPStore(
                os.environ["MASTER_ADDR"],
                int(os.environ["MASTER_PORT"]),
                is_master=False,
                timeout=timedelta(seconds=30),
                wait_for_workers=False,
            )
            run = os.environ.get("TORCHELASTIC_RUN_ID", "")
            restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
            store = dist.PrefixStore(f"ember/{run}/{restart}/{_setups}/", client)
            self.board = _Board(store, self.rank, self.world)
        except Exception as error:  # the run works without: failures are reported less well
            log.warning("Rank %d cannot reach the group's store (%s).", self.rank, error)

    def close(self, failed: bool) -> None:
        """Leave the group; wait for the ranks ember started (after a failure, for those
        that failed themselves, which print their error; the others are stopped)."""
        self.finished = True
        self._stop.set()
        watchdog = self._watchdog
        if watchdog is not None and watchdog is not threading.current_thread():
            watchdog.join(timeout=_ANSWER_WAIT + 1)
        self._stop_listening()
        if failed:  # the started ranks that did not fail wait on our connections: end them
            for child in self.children:
                if child.rank not in self.reported and child.process.poll() is None:
                    child.process.kill()
        if dist.is_initialized():
            if not failed:
                try:
                    dist.barrier()
                except Exception:  # a rank died at the very end: reported below
                    failed = True
            dist.destroy_process_group()
        deadline = time.monotonic() + (_GRACE + 1 if failed else 120)
        for child in self.children:
            try:
                child.process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                child.process.kill()
                child.process.wait()
            if child.reader is not None:
                child.reader.join(timeout=2)
        for name, value in self.saved_env.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        if self._handler is not None:
            logging.getLogger("ember").removeHandler(self._handler)
            self._handler = None


class _Watchdog:
    """One per process: reads the board, watches the started ranks (rank 0) or the
    process that started this one, notices a wait that exceeds the timeout, and ends
    the process when its training thread cannot end after another rank failed."""

    def __init__(self, context: Distributed) -> None:
        self.context = context
        self.events = 0
        self.answered = 0
        self.progress = -1
        self.waiting_since: float | None = None
        self.lost_at: float | None = None
        self.interrupted_at: float | None = None
        self.handled: set[int] = set()

    def run(self) -> None:
        context = self.context
        while not context._stop.is_set():
            try:
                self._wait()
                if not context._stop.is_set():
                    self._look()
            except Exception as error:  # keep watching: the next look may do better
                log.debug("Watchdog: %s", error)

    def _wait(self) -> None:
        """Sleep one poll, or less when a signal arrives."""
        fd = self.context.signals
        if fd is None:
            self.context._stop.wait(_POLL)
            return
        if not select.select([fd], [], [], _POLL)[0]:
            return
        with contextlib.suppress(BlockingIOError, OSError):
            received = os.read(fd, 64)
            # Ctrl-C raises KeyboardInterrupt, unless the loop's graceful stop handles it;
            # a main thread blocked in a collective raises it only once that returns
            if signal.SIGINT in received and signal.getsignal(signal.SIGINT) is (
                signal.default_int_handler
            ):
                self.interrupted_at = time.monotonic()

    def _look(self) -> None:
        context = self.context
        if context.launcher is not None and os.getppid() != context.launcher:
            os._exit(1)  # the process that started this rank is gone, and the run with it
        if self.lost_at is None and any(c.process.poll() is not None for c in context.children):
            self.lost_at = time.monotonic()
        board = context.board
        if board is not None and context.cause is None and not context.finished:
            try:
                events = board.events()
                if events != self.events:
                    self.events = events
                    self._read(board)
                if context.cause is None and not context.unwinding:
                    self._check_progress(board)
            except Exception as error:  # the store's host is gone: stop asking it
                log.debug("Rank %d lost the group's store: %s", context.rank, error)
                context.board = None
        self._check_grace()

    def _read(self, board: _Board) -> None:
        context = self.context
        question = board.question()
        if question > self.answered:
            self.answered = question
            board.answer(question, _where(_stack(_frame_of(context.thread))))
        for failure in board.failures():
            if failure.rank == context.rank or failure.rank in self.handled:
                continue
            self.handled.add(failure.rank)
            if failure.kind in ("error", "interrupted"):
                context.reported.add(failure.rank)
            context._learn(failure)
            if context.main:
                log.error("%s", failure.log_text())
                for child in context.children:
                    if child.rank == failure.rank:
                        child.logged = True
            board.acknowledge(failure.rank)
            if context.rank in failure.culprits:
                ours = context.launcher is not None  # rank 0 prints the report at its end
                _abort(
                    context,
                    1,
                    f"rank {context.rank} stopped: the other ranks waited {context.timeout:g} s "
                    f"for it (rank {failure.rank} reports where)."
                    if ours
                    else failure.report(),
                )

    def _check_progress(self, board: _Board) -> None:
        """A wait in a collective with no progress for `timeout` seconds: find out who
        did not arrive, and tell everyone."""
        context = self.context
        progress = context.progress
        if progress != self.progress:
            self.progress, self.waiting_since = progress, None
            return
        if _waiting(_stack(_frame_of(context.thread))) is None:
            self.waiting_since = None
            return
        now = time.monotonic()
        if self.waiting_since is None:
            self.waiting_since = now
            return
        if now - self.waiting_since < context.timeout:
            return
        self.waiting_since = None
        if not board.elect("hang"):
            return  # another rank reports it
        mine = _where(_stack(_frame_of(context.thread)))
        answers = board.answers(board.ask(), _ANSWER_WAIT)
        if context.progress != progress:  # it arrived after all
            board.store.compare_set("hang", str(context.rank), "")
            return
        failure = _missing(context.rank, mine, answers, context.timeout)
        context._learn(failure)
        if context.main:
            log.error("%s", failure.log_text())
        board.publish(failure)

    def _check_grace(self) -> None:
        context = self.context
        if context.finished or context.unwinding:
            return
        now = time.monotonic()
        if self.interrupted_at is not None and now - self.interrupted_at > _GRACE / 2:
            _abort(context, 128 + signal.SIGINT, "interrupted (KeyboardInterrupt).")
        if context.failed_at is not None and now - context.failed_at > _GRACE:
            waiting = _waiting(_stack(_frame_of(context.thread))) is not None
            if waiting or now - context.failed_at > 10 * _GRACE:
                cause = context.cause
                text = cause.report() if cause is not None else "another rank failed."
                _abort(context, 1, f"Training stopped because another rank failed. {text}")
        if self.lost_at is not None and now - self.lost_at > _GRACE and context.cause is None:
            codes = [c.process.poll() for c in context.children]
            signals = [-code for code in codes if code is not None and code < 0]
            status = 128 + signals[0] if signals else 1
            _abort(context, status, f"Training stopped: {context._exits(0)}.")


def _abort(context: Distributed, status: int, message: str) -> None:
    """End this process now (its training thread cannot end by itself); the ranks it
    started go with it."""
    for child in context.children:
        if child.process.poll() is None:
            child.process.kill()
    with contextlib.suppress(Exception):
        sys.stderr.write(f"{context.prefix}ember: {message}\n")
        sys.stderr.flush()
    for handler in logging.getLogger("ember").handlers:
        with contextlib.suppress(Exception):
            handler.flush()
    os._exit(status)


# Where a rank is ---------------------------------------------------------------------
_TORCH = os.path.dirname(torch.__file__) + os.sep
_EMBER = str(Path(__file__).resolve().parents[1]) + os.sep
_STDLIB = tuple(
    {sysconfig.get_paths()["stdlib"] + os.sep, sysconfig.get_paths()["platstdlib"] + os.sep}
)


def _frame_of(thread: int) -> types.FrameType | None:
    return sys._current_frames().get(thread)


def _stack(frame: types.FrameType | None, limit: int = 200) -> list[types.FrameType]:
    """`frame` and its callers, innermost first."""
    frames: list[types.FrameType] = []
    while frame is not None and len(frames) < limit:
        frames.append(frame)
        frame = frame.f_back
    return frames


def _traceback_frames(tb: types.TracebackType | None) -> list[types.FrameType]:
    """The frames a traceback went through, innermost first."""
    frames: list[types.FrameType] = []
    while tb is not None:
        frames.append(tb.tb_frame)
        tb = tb.tb_next
    return frames[::-1]


def _waiting(frames: list[types.FrameType]) -> str | None:
    """What the thread whose stack is `frames` waits in for the other ranks, or None
    when it runs code of its own (computing, loading data, sleeping)."""
    if not frames:
        return None
    if frames[0].f_code in _LABELS:  # e.g. waiting for a CUDA result of a collective
        return _LABELS[frames[0].f_code]
    if not frames[0].f_code.co_filename.startswith(_TORCH):
        return None
    for frame in frames:
        label = _LABELS.get(frame.f_code)
        if label is not None:
            return label
        path = frame.f_code.co_filename
        if path.startswith(_TORCH + "autograd" + os.sep):
            return "the gradient synchronisation"
        if path.startswith(_TORCH + os.path.join("distributed", "algorithms", "join")):
            return "the end of the epoch's batches (DDP join)"
        if not path.startswith((_TORCH, _EMBER)):
            break
    if frames[0].f_code.co_filename.startswith(_TORCH + "distributed" + os.sep):
        return f"a torch.distributed collective ({frames[0].f_code.co_name})"
    return None


def _location(frames: list[types.FrameType]) -> str:
    """The innermost frame of the user's code (else of ember, else any), as
    `path:line in function (source)`."""

    def own(path: str) -> bool:
        return not path.startswith((_TORCH, _EMBER, *_STDLIB)) and not path.startswith("<")

    for test in (own, lambda path: not path.startswith(_STDLIB), lambda path: True):
        for frame in frames:
            path = frame.f_code.co_filename
            if test(path):
                source = linecache.getline(path, frame.f_lineno).strip()
                try:
                    relative = os.path.relpath(path)
                except ValueError:  # another drive
                    relative = path
                shown = path if relative.startswith("..") else relative
                text = f"{shown}:{frame.f_lineno} in {frame.f_code.co_name}"
                return f"{text} ({source})" if source else text
    return "an unknown place"


def _position(frames: list[types.FrameType]) -> str | None:
    """The learner's epoch and iteration, read from the `Learner` on the stack."""
    validating = False
    for frame in frames:
        code = frame.f_code
        validating = validating or code.co_name == "_valid_epoch"
        if code.co_varnames[:1] != ("self",):
            continue
        owner = frame.f_locals.get("self")
        if not any(c.__name__ == "Learner" for c in type(owner).__mro__):
            continue
        epoch, iteration = getattr(owner, "epoch", None), getattr(owner, "iteration", None)
        if isinstance(epoch, int) and isinstance(iteration, int):
            if validating:
                return f"the validation of epoch {epoch}"
            return f"epoch {epoch}, iteration {iteration}"
    return None


def _where(frames: list[types.FrameType]) -> dict[str, Any]:
    """Where a thread is (its stack `frames`, innermost first), for the other ranks."""
    return {
        "waiting": _waiting(frames),
        "location": _location(frames),
        "position": _position(frames),
    }


def _missing(
    rank: int,
    mine: dict[str, Any],
    answers: dict[int, dict[str, Any] | None],
    timeout: float | None = None,
) -> Failure:
    """The report of rank `rank`, which waits (`mine`), given the others' answers: who
    did not arrive (and where they are), who did not answer."""
    here, behind, silent, elsewhere = [rank], [], [], []
    known = {other: where for other, where in answers.items() if where is not None}
    for other, where in sorted(answers.items()):
        if where is None:
            silent.append(other)
        elif where["waiting"] is None:
            behind.append(other)
        elif (where["waiting"], where["position"]) == (mine["waiting"], mine["position"]):
            here.append(other)
        else:
            elsewhere.append(other)

    def at(where: dict[str, Any]) -> str:
        return f" at {where['position']}" if where.get("position") else ""

    within = f" within {timeout:g} s" if timeout is not None else ""
    waiting = mine["waiting"] or "a collective"
    notes = [f"rank {r} was at {known[r]['location']}" for r in behind]
    notes += [f"rank {r} waited in {known[r]['waiting']}{at(known[r])}" for r in elsewhere]
    notes += [f"rank {r} did not answer: it died, or is stuck outside Python" for r in silent]
    missing = sorted(behind + silent)
    if missing:
        summary = (
            f"{_ranks(missing)} did not reach {waiting}{at(mine)}{within} "
            f"({_ranks(here).lower()} waited there)"
        )
        kind = "hang" if timeout is not None else "lost"
    elif elsewhere:
        summary = (
            f"The ranks waited for each other{within} in different places: rank {rank} in "
            f"{waiting}{at(mine)}. They do not reach the same collectives in the same order "
            "(code that runs on some ranks only?)"
        )
        kind = "hang"
    else:
        summary = f"All ranks waited{within} in {waiting}{at(mine)} without completing it"
        kind = "hang"
    if notes:
        summary += ": " + "; ".join(notes)
    culprits = tuple(r for r in answers if r not in here)
    return Failure(rank, kind, summary, culprits=culprits)


def _ranks(ranks: list[int]) -> str:
    if len(ranks) == 1:
        return f"Rank {ranks[0]}"
    return "Ranks " + ", ".join(map(str, ranks[:-1])) + f" and {ranks[-1]}"


def _exit_status(code: int) -> str:
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"code {code} ({signal.Signals(-code).name})"
    return f"code {code}"


_PEER_TROUBLE = (
    "connection closed by peer",
    "connection reset by peer",
    "gloo",
    "nccl",
    "processgroup",
    "c10d",
)


def _communication_error(error: BaseException) -> bool:
    """True when `error` comes from talking to the other ranks (a collective, the store)."""
    if isinstance(error, dist.DistError):
        return True
    text = str(error).lower()
    return isinstance(error, RuntimeError) and any(word in text for word in _PEER_TROUBLE)


# Output of the ranks ---------------------------------------------------------------
class _RankLog(logging.Handler):
    """The `ember` log of a rank other than 0 (which has no experiment.log): warnings
    and errors on standard error, one line each; the traceback of an error is printed
    once, when it ends the process, and not at all when it only reflects another
    rank's failure."""

    def __init__(self, context: Distributed, prefix: str) -> None:
        super().__init__(logging.WARNING)
        self.context = context
        self.prefix = prefix

    def emit(self, record: logging.LogRecord) -> None:
        error = record.exc_info[1] if record.exc_info else None
        if error is not None and self.context.caused_elsewhere(error) is not None:
            return
        try:
            sys.stderr.write(f"{self.prefix}{record.getMessage()}\n")
        except Exception:
            self.handleError(record)


def _excepthook(
    base: Callable[..., Any],
    prefix: str,
    kind: type[BaseException],
    value: BaseException,
    tb: types.TracebackType | None,
) -> None:
    """An error that ends the process and only reflects another rank's failure prints
    as one line (that rank's traceback is shown once, by that rank). After a failed run
    the objects left are exempted from the collections of the interpreter's exit, which
    would take seconds with torch loaded, while the other ranks wait for this one."""
    if _run_failed:
        gc.freeze()
    for error in (value, value.__cause__, value.__context__):
        if error is not None and any(error is known for known, _ in _explained):
            text = "".join(traceback.format_exception_only(kind, value)).rstrip("\n")
            sys.stderr.write("".join(f"{prefix}{line}\n" for line in text.splitlines()))
            sys.stderr.flush()
            return
    base(kind, value, tb)


def _install_excepthook(base: Callable[..., Any], prefix: str) -> None:
    while isinstance(base, functools.partial) and base.func is _excepthook:
        base = base.args[0]
    sys.excepthook = functools.partial(_excepthook, base, prefix)


# Joining ---------------------------------------------------------------------------
def setup(devices: Sequence[torch.device] | None, timeout: float) -> Distributed | None:
    """Join (or start, then join) the process group; None for a single process."""
    global _setups
    placement = from_environment()
    children: list[Child] = []
    saved: dict[str, str | None] = {}
    if placement is None:
        if devices is None or len(devices) <= 1:
            return None
        process_device(devices, 0)  # a device list a launcher's processes do not match
        children, saved = _launch(len(devices))
        placement = (0, len(devices), 0)
    rank, world, local_rank = placement
    device = process_device(devices, local_rank)
    backend = "nccl" if device.type == "cuda" else "gloo"
    if device.type == "cuda":
        torch.cuda.set_device(device)
    launcher = int(os.environ[_LAUNCHER]) if _LAUNCHER in os.environ else None
    context = Distributed(rank, world, local_rank, device, backend, children, saved)
    context.timeout, context.launcher = timeout, launcher
    ours = bool(children) or launcher is not None
    context.prefix = "" if ours else f"[rank{rank}]: "
    _setups += 1
    _explained.clear()
    context._listen_to_signals()
    if ours:
        context._start_watchdog()  # watch the started ranks (or our starter) from now on
    hook = sys.excepthook
    try:
        try:
            dist.init_process_group(
                backend, rank=rank, world_size=world, timeout=timedelta(seconds=timeout + _SLACK)
            )
        except Exception as error:
            report = context._exits(wait=2.0)
            context.close(failed=True)
            raise TrainingError(
                f"Joining the process group as rank {rank} of {world} failed: {error}. {report}"
            ) from error
        # torch prefixes uncaught errors with the rank; the ranks ember starts are
        # prefixed by rank 0 already
        _install_excepthook(hook if ours else sys.excepthook, context.prefix)
        context._attach_board()
        if not ours:
            context._start_watchdog()
        ember_log = logging.getLogger("ember")
        if not context.main and not ember_log.hasHandlers():
            context._handler = _RankLog(context, context.prefix)
            ember_log.addHandler(context._handler)
    except BaseException:
        if not context.finished:
            context.close(failed=True)
        raise
    log.info("Rank %d of %d on %s (backend %s).", rank, world, device, backend)
    return context


def process_device(devices: Sequence[torch.device] | None, local_rank: int) -> torch.device:
    """The device of the process with `local_rank` on its machine. Under a launcher, a
    list of several devices must list one per process it started on this machine."""
    launched = os.environ.get("LOCAL_WORLD_SIZE")
    if devices and len(devices) > 1 and launched is not None and int(launched) != len(devices):
        raise TrainingError(
            f"devices() lists {len(devices)} devices, but the launcher started {launched} "
            f"processes on this machine (LOCAL_WORLD_SIZE={launched}). List one device per "
            f"process ({launched}), or a single device name such as ['cuda'] or ['cpu'], "
            "which every process uses ('cuda' is cuda:LOCAL_RANK)."
        )
    if not devices:
        if torch.cuda.is_available():
            return torch.device("cuda", local_rank)
        return torch.device("cpu")
    if len(devices) == 1:
        device = devices[0]
        if device.type == "cuda" and device.index is None:
            return torch.device("cuda", local_rank)
        return device
    if local_rank >= len(devices):
        raise TrainingError(
            f"Local rank {local_rank} has no device: devices() lists {len(devices)}. List one "
            "device per process on this machine."
        )
    return devices[local_rank]


_LABELS: dict[types.CodeType, str] = {
    Distributed.any.__code__: "the vote on stopping",
    Distributed.barrier.__code__: "a barrier",
    Distributed.all_gather.__code__: "an exchange of values between the ranks",
    Distributed.broadcast.__code__: "a broadcast from rank 0",
    Distributed.close.__code__: "the end of training",
    setup.__code__: "joining the process group",
}


def name_wait(code: types.CodeType, label: str) -> None:
    """Name what a rank waits for while its thread runs `code` (e.g. the setup of a
    parallel strategy), for the hang reports."""
    _LABELS[code] = label


# Starting the ranks ----------------------------------------------------------------
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
    f"if os.getppid() != int(os.environ['{_LAUNCHER}']): os._exit(1)\n"
    "os.execv(sys.argv[1], sys.argv[1:])\n"
)


def _launch(world: int) -> tuple[list[Child], dict[str, str | None]]:
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
    children = []
    for rank in range(1, world):
        env = {
            **os.environ,
            **shared,
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            _LAUNCHER: str(os.getpid()),
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
        child.reader.start()
        children.append(child)
    os.environ.update({**shared, "RANK": "0", "LOCAL_RANK": "0"})
    return children, saved


def _forward(child: Child) -> None:
    """Copy a child's standard error into our own standard error and the log."""
    assert child.process.stderr is not None
    for raw in child.process.stderr:
        line = raw.decode("utf-8", errors="replace").rstrip("\n")
        child.tail.append(line)
        if not child.logged:
            log.info("[rank %d] %s", child.rank, line)
        sys.stderr.write(f"[rank {child.rank}] {line}\n")
    child.process.stderr.close()


# The loop's helpers ----------------------------------------------------------------
def world_size(devices: Sequence[torch.device] | None) -> int:
    """How many processes a run will have: torchrun's world, or one per listed device."""
    placement = from_environment()
    if placement is not None:
        return placement[1]
    return len(devices) if devices is not None and len(devices) > 1 else 1
