"""This process's place in the group: the collectives, the account of a failure, the
signals and the store the watchdog reads, and leaving the group."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from ember.train.distributed import failures as _failures
from ember.train.distributed.failures import (
    Failure,
    _Board,
    _communication_error,
    _exit_status,
    _explained,
    _missing,
)
from ember.train.distributed.launch import Child, restore_environment
from ember.train.distributed.watchdog import _ANSWER_WAIT, _GRACE, _Watchdog
from ember.train.distributed.where import _traceback_frames, _where

log = logging.getLogger("ember.train.distributed")  # the package's one logger

_ACK_WAIT = 2.0  # seconds a failing rank waits for the others to take note of it
_setups = 0  # process groups joined by this process; each keeps its keys apart


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
    shard of them (`ember.train.parallel.sharding.Sharding`); None when every rank holds
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
    _on_sigterm: Any = field(default=None, repr=False)

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
        error = sys.exc_info()[1]
        if error is None:
            return self._exits(wait)
        self.unwinding = _failures._run_failed = True
        try:
            return self._account(error, wait)
        except Exception as problem:  # never hide the error that ended the run
            log.debug("Could not compare notes with the other ranks: %s", problem)
            return ""

    def tell_on_sigterm(self, error: BaseException) -> None:
        """`error` ends this rank because another rank failed. torchrun ends the other
        ranks with SIGTERM as soon as one fails, which may come while this rank is
        still leaving the group: until `close` returns, the signal first prints `error`
        in the one line the exception hook would print, then ends the process as it
        would have."""
        if threading.current_thread() is not threading.main_thread():
            return
        if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
            return  # the program's own handler (a preemption checkpoint) decides
        text = "".join(traceback.format_exception_only(type(error), error)).rstrip("\n")
        prefix = self.prefix

        def on_sigterm(signum: int, frame: Any) -> None:
            sys.stderr.write("".join(f"{prefix}{line}\n" for line in text.splitlines()))
            sys.stderr.flush()
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)

        signal.signal(signal.SIGTERM, on_sigterm)
        self._on_sigterm = on_sigterm

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
        # (a Ctrl-C inside the watchdog's start leaves a thread that never started, or
        # that sees the stop at once: only a running one is waited for)
        if (
            watchdog is not None
            and watchdog.is_alive()
            and watchdog is not threading.current_thread()
        ):
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
        restore_environment(self.saved_env)
        if self._handler is not None:
            logging.getLogger("ember").removeHandler(self._handler)
            self._handler = None
        if self._on_sigterm is not None:
            if signal.getsignal(signal.SIGTERM) is self._on_sigterm:
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
            self._on_sigterm = None
