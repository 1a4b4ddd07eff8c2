"""Mid-epoch checkpoints by steps or time, and a wall-time limit.

`LearnerBuilder.checkpoint_every(steps=N | minutes=M)` writes a checkpoint inside an
epoch once N optimizer steps or M minutes passed since the last checkpoint (an epoch
end's included): the same mid-epoch checkpoint a stop writes, under the same retention,
that `checkpoint("latest" | "auto")` resumes exactly. `LearnerBuilder.max_time(...)`
stops the run at the first step boundary past its wall time, with a checkpoint; the
outcome is "stopped: time limit ..." (`StopReason.TIME_LIMIT`) and the exit code 75.
Under several processes each counts the steps alike and decides a checkpoint by steps
itself; rank 0's clock decides a checkpoint by time and the time limit, and its
decisions ride on the processes' stop vote (`StopVote`), so they cost no collective of
their own: they are taken at most about `stop_vote.INTERVAL` seconds (or one step)
after they are due, at a step every process has. Where the steps are voted on one by
one anyway (counting tokens), rank 0's decisions are broadcast at each step.
"""

from __future__ import annotations

import math
import time
from typing import Any, Callable

from ember.errors import ConfigError


def duration_text(seconds: float) -> str:
    """`seconds` as "2h 30m", "45m" or "30s"."""
    minutes, secs = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    parts = [f"{hours}h"] if hours else []
    if minutes:
        parts.append(f"{minutes}m")
    if secs or not parts:
        parts.append(f"{secs}s")
    return " ".join(parts)


def positive_number(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ConfigError(f"{what} must be a positive number, got {value!r}.")
    if not math.isfinite(value):
        raise ConfigError(f"{what} must be finite, got {value!r}.")
    return float(value)


def time_limit(hours: Any = 0, minutes: Any = 0, seconds: Any = 0) -> float:
    """`max_time`'s limit in seconds: `hours` + `minutes` + `seconds`, each a number >= 0,
    together more than none."""
    for value, what in ((hours, "hours"), (minutes, "minutes"), (seconds, "seconds")):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
            raise ConfigError(f"max_time({what}=...) must be a number >= 0, got {value!r}.")
    return positive_number(
        3600 * hours + 60 * minutes + seconds,
        "max_time(hours=..., minutes=..., seconds=...) in seconds",
    )


class Cadence:
    """When to checkpoint inside an epoch (`steps`, `seconds` since the last checkpoint)
    and when to stop (`limit`: seconds since `start`). None: never."""

    def __init__(
        self,
        steps: int | None = None,
        seconds: float | None = None,
        limit: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.steps, self.seconds, self.limit = steps, seconds, limit
        self.clock = clock
        self.expired = False
        """True once the time limit was reached (on every process alike)."""
        self._started = self._saved_at = clock()
        self._count = 0
        self._epoch: int | None = None

    @property
    def limit_text(self) -> str:
        assert self.limit is not None
        return f"time limit reached (max_time {duration_text(self.limit)})"

    def start(self) -> None:
        """`fit` begins: the wall time counts from now."""
        self._started = self._saved_at = self.clock()
        self._count, self._epoch, self.expired = 0, None, False

    @property
    def timed(self) -> bool:
        """Some of its decisions read the clock (a checkpoint by time, a time limit)."""
        return self.seconds is not None or self.limit is not None

    def after_step(
        self,
        epoch: int,
        may_vote: bool,
        last: bool,
        dist: Any,
        interrupter: Any,
        on_vote: bool = False,
    ) -> bool:
        """A step of `epoch` is done (`last`: the epoch's last, whose end checkpoints
        anyway, the same on every process); True when a mid-epoch checkpoint is due now.
        Past the time limit, the interrupter is asked to stop (on every process at the
        same step). `on_vote`: several processes whose clock decisions ride on the stop
        vote (`clock_flags`, `agreed`); this step then decides by its steps alone."""
        if epoch != self._epoch:  # a new epoch follows the previous one's checkpoint
            self._epoch, self._count, self._saved_at = epoch, 0, self.clock()
        self._count += 1
        if dist is not None and not may_vote:
            return False
        if dist is None:
            save, expired = self._decide(last)
        elif on_vote:  # every process counts the same steps
            save, expired = self.steps is not None and self._count >= self.steps and not last, False
        else:  # rank 0 decides for everyone, at this step (its clock)
            save, expired = dist.broadcast(self._decide(last) if dist.main else None)
        return self._take(save, expired, interrupter)

    def clock_flags(self, main: bool) -> tuple[float, float]:
        """What this process's clock says, for the stop vote to carry: a checkpoint due by
        time, the time limit reached (rank 0's; the others say nothing)."""
        if not main:
            return 0.0, 0.0
        now = self.clock()
        due = self.seconds is not None and now - self._saved_at >= self.seconds
        expired = self.limit is not None and now - self._started >= self.limit
        return float(due), float(expired)

    def agreed(self, flags: tuple[float, ...], last: bool, interrupter: Any) -> bool:
        """The vote after this step carried rank 0's `clock_flags`: True when a
        checkpoint is due now (`last` as in `after_step`)."""
        due, expired = flags
        return self._take(bool(due) and not last, bool(expired), interrupter)

    def _take(self, save: bool, expired: bool, interrupter: Any) -> bool:
        if expired:
            self.expired = True
            interrupter.stop(self.limit_text)
            return False
        if save:
            self._count, self._saved_at = 0, self.clock()
        return save

    def _decide(self, last: bool) -> tuple[bool, bool]:
        now = self.clock()
        expired = self.limit is not None and now - self._started >= self.limit
        due = (self.steps is not None and self._count >= self.steps) or (
            self.seconds is not None and now - self._saved_at >= self.seconds
        )
        return (due and not last, expired)
