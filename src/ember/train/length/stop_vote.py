"""When several processes agree on a graceful stop (`StopVote`).

A stop asked for on one process (Ctrl-C, SIGTERM, a listener's `stop`) must stop
every process after the same optimizer step, so they vote. A vote is a collective: one
after every step would cost what a small model's step costs, and under NCCL it would
make the host wait for the device at every step. So the processes vote at steps every
one of them knows in advance: after the first step of an epoch, then after as many
steps as take about `INTERVAL` seconds. Each vote carries, with the stop flags, how
long each process took since the last one; all take the largest, so all compute the
same next vote. A stop is therefore agreed on at most `INTERVAL` seconds, or one step
when steps are longer, after it was asked for. The vote also carries why: the
preemption signal wins over another signal, which wins over a plain stop, so every
process ends with the same outcome and exit code, whichever received the signal.
"""

from __future__ import annotations

import logging
import signal as signals
import time
from typing import Any, Callable

log = logging.getLogger("ember.train.learner")  # the run's own log
INTERVAL = 0.5
"""Seconds of training between two votes (at least one step)."""

MOST_STEPS = 10_000
"""Steps between two votes at most, however fast they are."""


RANKS = 1 << 16
"""Ranks a stop code can name."""


def stop_code(interrupter: Any, preemption: Any, rank: int) -> int:
    """This process's stop request as one number that orders the reasons (0: none; a
    plain stop; a signal; the preemption signal, which wins), with its signal and rank:
    the largest over the processes is the stop they all take."""
    if not interrupter.should_stop():
        return 0
    signum = interrupter.signal
    if signum is None:
        level = 1
    elif preemption is not None and signum == preemption.signal:
        level = 300 + signum
    else:
        level = 200 + signum
    return level * RANKS + rank


def take_stop(code: int, interrupter: Any, rank: int) -> None:
    """Take the stop of `code` (the largest over the processes) as this process's own:
    the same reason, signal and outcome on every process."""
    level, origin = divmod(int(code), RANKS)
    if origin == rank and interrupter.should_stop():
        return  # this process's own request
    if level >= 200:
        signum = level % 100
        name = signals.Signals(signum).name
        what = "preempted by" if level >= 300 else "stopped by"
        message = f"{what} {name} on rank {origin}"
        if level < 300 and signum == signals.SIGTERM:
            message = f"terminated by SIGTERM on rank {origin}"
        interrupter.stop(message, signal=signum)
    elif not interrupter.should_stop():
        message = f"stop requested on rank {origin}"
        interrupter.stop(message)
    else:
        return
    if rank == 0:  # the run's log says where the stop came from
        log.info("Every process stops after this step: %s.", message)


def agree_stop(
    dist: Any, interrupter: Any, preemption: Any, seconds: float = 0.0, flags: Any = ()
) -> tuple[bool, float, tuple[float, ...]]:
    """One vote (a collective): whether any process asked to stop, each then taking the
    winning request as its own (`take_stop`), the most `seconds` any gave, and the
    largest of each of `flags` (rank 0's clock decisions ride on it: `Cadence`)."""
    code, most, largest = dist.vote(stop_code(interrupter, preemption, dist.rank), seconds, flags)
    if code:
        take_stop(code, interrupter, dist.rank)
    return code > 0, most, largest


class StopVote:
    """The vote schedule of one fit on several processes."""

    def __init__(
        self, interval: float = INTERVAL, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.interval = interval
        self.clock = clock
        self._count = 0
        """Steps of this epoch that could vote (every process has them)."""
        self._next = 1
        """The step (of `_count`) that votes next."""
        self._since = clock()
        self._voted_at = 0
        self.votes = 0
        """Votes taken in this fit."""
        self.agreed: tuple[float, ...] | None = None
        """What the last step's vote carried besides the stop (None: it did not vote)."""

    def start_epoch(self) -> None:
        """A new epoch: its first step votes (the processes may have spent different
        times since, validating or checkpointing)."""
        self._count, self._next, self._voted_at = 0, 1, 0

    def agree(
        self, dist: Any, interrupter: Any, preemption: Any, flags: Callable[[], Any] | None = None
    ) -> bool:
        """After a step every process has: True on every process when one of them asked
        to stop by the last vote due (this step's, when it is one); each then stops for
        the same reason (`agree_stop`). `flags`: what else the vote carries (`Cadence`'s
        clock decisions on rank 0), read when a vote is due; the agreed values are then
        in `agreed` (None after a step that did not vote)."""
        self._count += 1
        self.agreed = None
        if self._count < self._next:
            return False
        now = self.clock()
        carried = flags() if flags is not None else ()
        stop, elapsed, agreed = agree_stop(
            dist, interrupter, preemption, now - self._since, carried
        )
        self.agreed = agreed if flags is not None else None
        self.votes += 1
        steps = self._count - self._voted_at
        self._since, self._voted_at = now, self._count
        per_step = elapsed / max(1, steps)
        gap = MOST_STEPS if per_step <= 0 else int(self.interval / per_step)
        self._next = self._count + max(1, min(MOST_STEPS, gap))
        return stop
