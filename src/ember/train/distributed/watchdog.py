"""The watchdog thread of every process: reads the failure board, answers "where are
you?", notices a wait that exceeds the timeout, and ends a process that cannot end
by itself."""

from __future__ import annotations

import contextlib
import logging
import os
import select
import signal
import sys
import time
from typing import TYPE_CHECKING

from ember.train.distributed.failures import _Board, _missing
from ember.train.distributed.where import _frame_of, _stack, _waiting, _where

if TYPE_CHECKING:
    from ember.train.distributed.group import Distributed

log = logging.getLogger("ember.train.distributed")  # the package's one logger

_POLL = 0.2  # seconds between two looks of a watchdog
_GRACE = 2.0  # seconds a rank has to end by itself once another rank failed
_ANSWER_WAIT = 2.0  # seconds a rank waits for the others to say where they are


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
