"""The watchdog thread of every process: reads the failure board, answers "where are
you?", notices a wait that exceeds the timeout, and ends a process that cannot end
by itself. It watches the process's `Health`, which the group's collectives update."""

from __future__ import annotations

import contextlib
import logging
import os
import select
import signal
import sys
import threading
import time
from dataclasses import dataclass, field

from ember.train.distributed.failures import Board, Failure, exit_status, missing_ranks
from ember.train.distributed.launch import Child
from ember.train.distributed.where import frame_of, stack, waiting_in, whereabouts

log = logging.getLogger("ember.train.distributed")  # the package's one logger

_POLL = 0.2  # seconds between two looks of a watchdog
GRACE = 2.0  # seconds a rank has to end by itself once another rank failed
ANSWER_WAIT = 2.0  # seconds a rank waits for the others to say where they are


@dataclass
class Health:
    """What the watchdog of a process watches and tells, shared with its training
    thread (through `Distributed.health`): the rank, the ranks it started, the board,
    how far the collectives got, and the failure that explains this rank's errors."""

    rank: int
    children: list[Child] = field(default_factory=list)
    timeout: float = 300.0
    """Seconds a rank waits in a collective before the others are asked where they are."""
    launcher: int | None = None
    """The pid of the process that started this one, when ember started it."""
    prefix: str = ""
    """Before the lines this rank prints: torch's `[rankN]: ` under torchrun, nothing in
    the ranks ember starts (rank 0 prefixes what the others print)."""
    thread: int = field(default_factory=threading.get_ident)
    """The thread that trains (the one that called `fit`)."""
    progress: int = 0
    """Bumped by every step and collective: the hang detection watches it."""
    board: Board | None = field(default=None, repr=False)
    cause: Failure | None = None
    """The failure that explains this rank's communication errors: another rank's record,
    or this rank's own report of a hang or a lost rank."""
    failed_at: float | None = None
    unwinding: bool = False
    finished: bool = False
    reported: set[int] = field(default_factory=set)
    """The ranks whose own failure this rank has heard of."""
    signals: int | None = field(default=None, repr=False)
    """Where the signals this process receives are written (`signal.set_wakeup_fd`), so
    the watchdog hears of a Ctrl-C even while the main thread is blocked in a collective."""
    stop: threading.Event = field(default_factory=threading.Event, repr=False)
    """Set when the group ends: the watchdog stops."""

    @property
    def main(self) -> bool:
        return self.rank == 0

    def learn(self, failure: Failure) -> None:
        if self.cause is None:
            self.cause = failure
            self.failed_at = time.monotonic()

    def exits(self, wait: float) -> str:
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
                    f"Rank {child.rank} exited with {exit_status(code)} before the run ended, "
                    "without reporting an error (its output is above)"
                )
        return "; ".join(reports)


class Watchdog:
    """One per process: reads the board, watches the started ranks (rank 0) or the
    process that started this one, notices a wait that exceeds the timeout, and ends
    the process when its training thread cannot end after another rank failed."""

    def __init__(self, health: Health) -> None:
        self.health = health
        self.events = 0
        self.answered = 0
        self.progress = -1
        self.waiting_since: float | None = None
        self.lost_at: float | None = None
        self.interrupted_at: float | None = None
        self.handled: set[int] = set()

    def run(self) -> None:
        health = self.health
        while not health.stop.is_set():
            try:
                self._wait()
                if not health.stop.is_set():
                    self._look()
            except Exception as error:  # keep watching: the next look may do better
                log.debug("Watchdog: %s", error)

    def _wait(self) -> None:
        """Sleep one poll, or less when a signal arrives."""
        fd = self.health.signals
        if fd is None:
            self.health.stop.wait(_POLL)
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
        health = self.health
        if health.launcher is not None and os.getppid() != health.launcher:
            os._exit(1)  # the process that started this rank is gone, and the run with it
        if self.lost_at is None and any(c.process.poll() is not None for c in health.children):
            self.lost_at = time.monotonic()
        board = health.board
        if board is not None and health.cause is None and not health.finished:
            try:
                events = board.events()
                if events != self.events:
                    self.events = events
                    self._read(board)
                if health.cause is None and not health.unwinding:
                    self._check_progress(board)
            except Exception as error:  # the store's host is gone: stop asking it
                log.debug("Rank %d lost the group's store: %s", health.rank, error)
                health.board = None
        self._check_grace()

    def _read(self, board: Board) -> None:
        health = self.health
        question = board.question()
        if question > self.answered:
            self.answered = question
            board.answer(question, whereabouts(stack(frame_of(health.thread))))
        for failure in board.failures():
            if failure.rank == health.rank or failure.rank in self.handled:
                continue
            self.handled.add(failure.rank)
            if failure.kind in ("error", "interrupted"):
                health.reported.add(failure.rank)
            health.learn(failure)
            if health.main:
                log.error("%s", failure.log_text())
                for child in health.children:
                    if child.rank == failure.rank:
                        child.logged = True
            board.acknowledge(failure.rank)
            if health.rank in failure.culprits:
                ours = health.launcher is not None  # rank 0 prints the report at its end
                _abort(
                    health,
                    1,
                    f"rank {health.rank} stopped: the other ranks waited {health.timeout:g} s "
                    f"for it (rank {failure.rank} reports where)."
                    if ours
                    else failure.report(),
                )

    def _check_progress(self, board: Board) -> None:
        """A wait in a collective with no progress for `timeout` seconds: find out who
        did not arrive, and tell everyone."""
        health = self.health
        progress = health.progress
        if progress != self.progress:
            self.progress, self.waiting_since = progress, None
            return
        if waiting_in(stack(frame_of(health.thread))) is None:
            self.waiting_since = None
            return
        now = time.monotonic()
        if self.waiting_since is None:
            self.waiting_since = now
            return
        if now - self.waiting_since < health.timeout:
            return
        self.waiting_since = None
        if not board.elect("hang"):
            return  # another rank reports it
        mine = whereabouts(stack(frame_of(health.thread)))
        answers = board.answers(board.ask(), ANSWER_WAIT)
        if health.progress != progress:  # it arrived after all
            board.store.compare_set("hang", str(health.rank), "")
            return
        failure = missing_ranks(health.rank, mine, answers, health.timeout)
        health.learn(failure)
        if health.main:
            log.error("%s", failure.log_text())
        board.publish(failure)

    def _check_grace(self) -> None:
        health = self.health
        if health.finished or health.unwinding:
            return
        now = time.monotonic()
        if self.interrupted_at is not None and now - self.interrupted_at > GRACE / 2:
            _abort(health, 128 + signal.SIGINT, "interrupted (KeyboardInterrupt).")
        if health.failed_at is not None and now - health.failed_at > GRACE:
            waiting = waiting_in(stack(frame_of(health.thread))) is not None
            if waiting or now - health.failed_at > 10 * GRACE:
                cause = health.cause
                text = cause.report() if cause is not None else "another rank failed."
                _abort(health, 1, f"Training stopped because another rank failed. {text}")
        if self.lost_at is not None and now - self.lost_at > GRACE and health.cause is None:
            codes = [c.process.poll() for c in health.children]
            signals = [-code for code in codes if code is not None and code < 0]
            status = 128 + signals[0] if signals else 1
            _abort(health, status, f"Training stopped: {health.exits(0)}.")


def _abort(health: Health, status: int, message: str) -> None:
    """End this process now (its training thread cannot end by itself); the ranks it
    started go with it."""
    for child in health.children:
        if child.process.poll() is None:
            child.process.kill()
    with contextlib.suppress(Exception):
        sys.stderr.write(f"{health.prefix}ember: {message}\n")
        sys.stderr.flush()
    for handler in logging.getLogger("ember").handlers:
        with contextlib.suppress(Exception):
            handler.flush()
    os._exit(status)
