"""Failure records and how they are told: the record a rank publishes, the board in the
group's store that carries them, the one-line reports of a hang or a lost rank, and
the output of a rank whose error only reflects a failure elsewhere."""

from __future__ import annotations

import contextlib
import functools
import gc
import json
import logging
import signal
import sys
import time
import traceback
import types
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

import torch.distributed as dist

from ember.train.distributed.where import learner_position, traceback_frames


@dataclass
class ExitAccount:
    """What the exception hook knows when an error ends this process."""

    explained: list[tuple[BaseException, str]] = field(default_factory=list)
    """Errors on this rank that only reflect a failure elsewhere, with their one-line
    account: the exception hook prints those in one line."""
    run_failed: bool = False
    """A run of this process failed: it is about to exit."""


EXIT_ACCOUNT = ExitAccount()
"""This process's: the group adds to it as it fails, joining a group clears it."""


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
        where = learner_position(traceback_frames(error.__traceback__))
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


class Board:
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


def missing_ranks(
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


def exit_status(code: int) -> str:
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


def communication_error(error: BaseException) -> bool:
    """True when `error` comes from talking to the other ranks (a collective, the store)."""
    if isinstance(error, dist.DistError):
        return True
    text = str(error).lower()
    return isinstance(error, RuntimeError) and any(word in text for word in _PEER_TROUBLE)


# Output of the ranks ---------------------------------------------------------------
class RankLog(logging.Handler):
    """The `ember` log of a rank other than 0 (which has no experiment.log): warnings
    and errors on standard error, one line each; the traceback of an error is printed
    once, when it ends the process, and not at all when it only reflects another
    rank's failure."""

    def __init__(self, elsewhere: Callable[[BaseException], str | None], prefix: str) -> None:
        super().__init__(logging.WARNING)
        self.elsewhere = elsewhere
        """Why an error happened when it only reflects a failure elsewhere, else None
        (`Distributed.caused_elsewhere`)."""
        self.prefix = prefix

    def emit(self, record: logging.LogRecord) -> None:
        error = record.exc_info[1] if record.exc_info else None
        if error is not None and self.elsewhere(error) is not None:
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
    if EXIT_ACCOUNT.run_failed:
        gc.freeze()
    for error in (value, value.__cause__, value.__context__):
        if error is not None and any(error is known for known, _ in EXIT_ACCOUNT.explained):
            text = "".join(traceback.format_exception_only(kind, value)).rstrip("\n")
            sys.stderr.write("".join(f"{prefix}{line}\n" for line in text.splitlines()))
            sys.stderr.flush()
            return
    base(kind, value, tb)


def install_excepthook(base: Callable[..., Any], prefix: str) -> None:
    while isinstance(base, functools.partial) and base.func is _excepthook:
        base = base.args[0]
    sys.excepthook = functools.partial(_excepthook, base, prefix)
