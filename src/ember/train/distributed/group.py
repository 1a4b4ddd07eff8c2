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
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from ember.train.distributed.failures import (
    EXIT_ACCOUNT,
    Board,
    Failure,
    communication_error,
    missing_ranks,
)
from ember.train.distributed.launch import Child, restore_environment
from ember.train.distributed.watchdog import ANSWER_WAIT, GRACE, Health, Watchdog
from ember.train.distributed.where import traceback_frames, whereabouts

log = logging.getLogger("ember.train.distributed")  # the package's one logger

_ACK_WAIT = 2.0  # seconds a failing rank waits for the others to take note of it


class Distributed:
    """This process's place in the group, and the group's collective helpers."""

    def __init__(
        self,
        rank: int,
        world: int,
        local_rank: int,
        device: torch.device,
        backend: str,
        children: list[Child] | None = None,
        saved_env: dict[str, str | None] | None = None,
        *,
        timeout: float = 300.0,
        launcher: int | None = None,
        prefix: str = "",
        owns_group: bool = True,
    ) -> None:
        self.rank = rank
        self.owns_group = owns_group
        self.launched_by = "ember"
        """What started the processes (torchrun, srun, ...), as the run's log says it."""
        """ember made the process group (and destroys it at the end); False: the user's
        script made it, and keeps it."""
        self.world = world
        self.local_rank = local_rank
        self.device = device
        self.backend = backend
        self.children: list[Child] = [] if children is None else children
        self.saved_env: dict[str, str | None] = {} if saved_env is None else saved_env
        self.sharding: Any = None
        """How the model and optimizer states are read and written when each rank holds a
        shard of them (`ember.train.parallel.sharding.Sharding`); None when every rank holds
        the whole model (one process, DDP)."""
        self.health = Health(rank, self.children, timeout=timeout, launcher=launcher, prefix=prefix)
        """What this rank shares with its watchdog thread: the board, how far the
        collectives got, the failure that explains this rank's errors (`launcher`: the pid
        of the process that started this one, when ember started it; `prefix`: before the
        lines this rank prints)."""
        self.host_group: Any = None
        """The group for collectives of host values: the default one, or under NCCL a
        gloo group of the same processes (`open_host_group`)."""
        self.handler: logging.Handler | None = None
        """The `ember` log's handler of a rank other than 0, which has no experiment.log."""
        self._watchdog: threading.Thread | None = None
        self._wakeup: int | None = None
        """The write end of the signal pipe the watchdog waits on (`listen_to_signals`)."""
        self._on_sigterm: Any = None

    @property
    def main(self) -> bool:
        return self.rank == 0

    @property
    def progress(self) -> int:
        """Bumped by every step and collective: the hang detection watches it."""
        return self.health.progress

    @progress.setter
    def progress(self, value: int) -> None:
        self.health.progress = value

    @property
    def finished(self) -> bool:
        """The group was left (`close`)."""
        return self.health.finished

    def _flag_device(self) -> torch.device:
        return self.device if self.backend == "nccl" else torch.device("cpu")

    def all_gather(self, value: Any) -> list[Any]:
        """Every rank's `value`, in rank order (host objects, e.g. metric rows)."""
        self.health.progress += 1
        gathered: list[Any] = [None] * self.world
        dist.all_gather_object(gathered, value)
        self.health.progress += 1
        return gathered

    def broadcast(self, value: Any) -> Any:
        """Rank 0's `value` on every rank."""
        self.health.progress += 1
        box = [value if self.main else None]
        dist.broadcast_object_list(box, src=0)
        self.health.progress += 1
        return box[0]

    def any(self, flag: bool) -> bool:
        """True on every rank when `flag` is true on any rank."""
        self.health.progress += 1
        tensor = torch.tensor([1 if flag else 0], dtype=torch.int32, device=self._flag_device())
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
        self.health.progress += 1
        return bool(tensor.item())

    def vote(
        self, code: int, seconds: float, flags: tuple[float, ...] = ()
    ) -> tuple[int, float, tuple[float, ...]]:
        """The largest `code` (an int below 2**53), the most `seconds` and the largest of
        each of `flags` any rank gives, in one all-reduce of host memory (over a gloo
        group of its own under NCCL, so the vote never waits for the device)."""
        self.health.progress += 1
        values = [float(code), float(seconds), *map(float, flags)]
        tensor = torch.tensor(values, dtype=torch.float64)
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX, group=self.host_group)
        self.health.progress += 1
        most_code, most, *largest = tensor.tolist()
        return int(most_code), most, tuple(largest)

    def sum(self, value: torch.Tensor) -> torch.Tensor:
        """The sum over every rank of a float32 scalar `value` (one all-reduce)."""
        self.health.progress += 1
        tensor = value.detach().to(self._flag_device(), torch.float32).reshape(1).clone()
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
        self.health.progress += 1
        return tensor[0]

    def sum_and_any(self, count: int | torch.Tensor, flag: bool) -> tuple[int, bool]:
        """The sum over every rank of an integer `count` (an int or a tensor) and whether
        `flag` is true on any rank, in one all-reduce (a stop vote that also sums)."""
        self.health.progress += 1
        device = self._flag_device()
        tensor = torch.zeros(2, dtype=torch.int64, device=device)
        tensor[0] = count.detach().to(device, torch.int64) if torch.is_tensor(count) else count
        tensor[1] = 1 if flag else 0
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
        self.health.progress += 1
        total, flags = tensor.tolist()
        return int(total), flags > 0

    def barrier(self) -> None:
        self.health.progress += 1
        dist.barrier()
        self.health.progress += 1

    # Failures ----------------------------------------------------------------------
    def failures(self, wait: float = 0.0) -> str:
        """Called while an error is being handled on this rank. When the error only
        reflects another rank's failure (or a rank that hung or vanished), returns that
        failure in one paragraph; when it is this rank's own, publishes it for the others
        and returns "". `wait` bounds how long to wait for a started rank to exit when
        a rank vanished without a word."""
        error = sys.exc_info()[1]
        if error is None:
            return self.health.exits(wait)
        self.health.unwinding = EXIT_ACCOUNT.run_failed = True
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
        prefix = self.health.prefix

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
        cause = self.health.cause
        if cause is None or not communication_error(error):
            return None
        line = next(iter(str(error).strip().splitlines()), "")[:200]
        return f"{cause.report()} On rank {self.rank}: {type(error).__name__}: {line}"

    def lost_touch(self, error: BaseException) -> bool:
        """`error` came from talking to the other ranks (a collective, the store)."""
        return communication_error(error)

    def _account(self, error: BaseException, wait: float) -> str:
        health = self.health
        if communication_error(error):
            cause = health.cause or self._failure_elsewhere()
            if cause is None:
                cause = self._lost(error, min(wait, GRACE))
            if cause is None:
                return ""
            health.cause = health.cause or cause
            text = cause.report()
            EXIT_ACCOUNT.explained.append((error, text))
            return text
        own = Failure.from_error(self.rank, error)
        board = health.board
        if board is not None:
            board.publish(own)
            if health.cause is None:  # the others still listen: let them take note
                board.wait_acknowledged(_ACK_WAIT)
        return ""

    def _failure_elsewhere(self) -> Failure | None:
        board = self.health.board
        if board is None:
            return None
        for failure in board.failures():
            if failure.rank != self.rank:
                return failure
        return None

    def _lost(self, error: BaseException, wait: float) -> Failure | None:
        """A collective failed and no rank published why: a started rank exited, or a
        rank vanished or hangs. Find out which, and tell the others."""
        report = self.health.exits(wait)
        board = self.health.board
        if report:
            failure = Failure(self.rank, "lost", report)
        elif board is not None and board.elect("lost"):
            mine = whereabouts(traceback_frames(error.__traceback__))
            failure = missing_ranks(self.rank, mine, board.answers(board.ask(), ANSWER_WAIT))
            if not failure.culprits:  # everyone is where this rank is: nothing to tell
                return None
        elif board is not None:  # another rank is finding out
            deadline = time.monotonic() + ANSWER_WAIT + 1
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

    # Watchdog ------------------------------------------------------------------------
    def listen_to_signals(self) -> None:
        """Have the signals this process receives written where the watchdog reads them
        (from the main thread, unless the program already has them written elsewhere)."""
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
        self.health.signals, self._wakeup = read, write

    def _stop_listening(self) -> None:
        health = self.health
        if health.signals is None or threading.current_thread() is not threading.main_thread():
            return
        write = signal.set_wakeup_fd(-1)
        for fd in (health.signals, write):
            with contextlib.suppress(OSError):
                os.close(fd)
        health.signals = self._wakeup = None

    def start_watchdog(self) -> None:
        """Start the thread that watches this rank's `health`."""
        self._watchdog = threading.Thread(
            target=Watchdog(self.health).run, name="ember-watchdog", daemon=True
        )
        self._watchdog.start()

    def open_host_group(self) -> None:
        """Under NCCL, a gloo group of the same processes for host values (every rank
        makes it, once the default group exists)."""
        if self.backend == "nccl":
            self.host_group = dist.new_group(backend="gloo")

    def attach_board(self, scope: str) -> None:
        """A store client of our own (the watchdog's calls never wait behind the
        training thread's), under the keys of this group (`scope`: its run, restart and
        number, as `joining.group_scope` makes them)."""
        try:
            client = dist.TCPStore(
                os.environ["MASTER_ADDR"],
                int(os.environ["MASTER_PORT"]),
                is_master=False,
                timeout=timedelta(seconds=30),
                wait_for_workers=False,
            )
            store = dist.PrefixStore(f"ember/{scope}board", client)
            self.health.board = Board(store, self.rank, self.world)
        except Exception as error:  # the run works without: failures are reported less well
            log.warning("Rank %d cannot reach the group's store (%s).", self.rank, error)

    def close(self, failed: bool) -> None:
        """Leave the group; wait for the ranks ember started (after a failure, for those
        that failed themselves, which print their error; the others are stopped)."""
        self.health.finished = True
        self.health.stop.set()
        if self._wakeup is not None:  # a watchdog waiting for signals sees the stop at once
            with contextlib.suppress(OSError):
                os.write(self._wakeup, b"\0")
        watchdog = self._watchdog
        # (a Ctrl-C inside the watchdog's start leaves a thread that never started, or
        # that sees the stop at once: only a running one is waited for)
        if (
            watchdog is not None
            and watchdog.is_alive()
            and watchdog is not threading.current_thread()
        ):
            watchdog.join(timeout=ANSWER_WAIT + 1)
        self._stop_listening()
        if failed:  # the started ranks that did not fail wait on our connections: end them
            for child in self.children:
                if child.rank not in self.health.reported and child.process.poll() is None:
                    child.process.kill()
        if dist.is_initialized():
            if not failed:
                try:
                    dist.barrier()
                except Exception:  # a rank died at the very end: reported below
                    failed = True
            if self.owns_group:
                dist.destroy_process_group()
        deadline = time.monotonic() + (GRACE + 1 if failed else 120)
        for child in self.children:
            try:
                child.process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                child.process.kill()
                child.process.wait()
            if child.reader is not None:
                child.reader.join(timeout=2)
        restore_environment(self.saved_env)
        if self.handler is not None:
            logging.getLogger("ember").removeHandler(self.handler)
            self.handler = None
        if self._on_sigterm is not None:
            if signal.getsignal(signal.SIGTERM) is self._on_sigterm:
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
            self._on_sigterm = None
