"""When several processes agree on a graceful stop (`StopVote`).

A stop asked for on one process (Ctrl-C, SIGTERM, a listener's `stop`) must stop
every process after the same optimizer step, so they vote. A vote is a collective: one
after every step would cost what a small model's step costs, and under NCCL it would
make the host wait for the device at every step. So the processes vote at steps every
one of them knows in advance: after the first step of an epoch, then after as many
steps as take about `INTERVAL` seconds. Each vote carries, with the stop flags, how
long each process took since the last one; all take the largest, so all compute the
same next vote. A stop is therefore agreed on at most `INTERVAL` seconds, or one step
when steps are longer, after it was asked for.
"""

from __future__ import annotations

import time
from typing import Any, Callable

INTERVAL = 0.5
"""Seconds of training between two votes (at least one step)."""

MOST_STEPS = 10_000
"""Steps between two votes at most, however fast they are."""


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

    def start_epoch(self) -> None:
        """A new epoch: its first step votes (the processes may have spent different
        times since, validating or checkpointing)."""
        self._count, self._next, self._voted_at = 0, 1, 0

    def agree(self, dist: Any, flag: bool) -> bool:
        """After a step every process has: True on every process when one of them asked
        to stop by the last vote due (this step's, when it is one)."""
        self._count += 1
        if self._count < self._next:
            return False
        now = self.clock()
        stop, elapsed = dist.vote(flag, now - self._since)
        self.votes += 1
        steps = self._count - self._voted_at
        self._since, self._voted_at = now, self._count
        per_step = elapsed / max(1, steps)
        gap = MOST_STEPS if per_step <= 0 else int(self.interval / per_step)
        self._next = self._count + max(1, min(MOST_STEPS, gap))
        return stop
