"""Meeting the other processes before the group is made: the store they share (rank 0's,
or the launcher's), every rank's arrival noted in it, all within the run's timeout.

A rendezvous that cannot complete (WORLD_SIZE=2 and one process started, a rank 0 that
never came up) ends after `devices(timeout=...)` seconds with a message naming what was
awaited and the fix, not after torch's own wait of many minutes. The group's keys live
under a prefix of their own (`scope`): torchrun keeps its store across the restarts of
`--max-restarts`, and a restarted rank must never read the address a rank of an earlier
attempt left there (its connection would be refused).
"""

from __future__ import annotations

import os
import re
import socket
import time
from datetime import timedelta
from typing import Any

import torch.distributed as dist

from ember.errors import TrainingError

_REACH_TRY = 1.0  # seconds of one try to reach the store's host
_JOINED = re.compile(r"(\d+)/(\d+) clients joined")  # torch's count, when rank 0 waited


class JoinError(TrainingError):
    """The processes did not all meet within the timeout (the message names who was
    awaited, where, and the fix)."""


def meet(rank: int, world: int, timeout: float, scope: str, launched_by: str) -> Any:
    """The store of the group this process joins, under the keys of `scope`, once every
    rank arrived; a `JoinError` when they do not all arrive within `timeout` seconds."""
    host, port = os.environ.get("MASTER_ADDR", ""), os.environ.get("MASTER_PORT", "")
    where = Where(rank, world, timeout, f"{host}:{port}", launched_by)
    deadline = time.monotonic() + timeout
    agent = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    if rank != 0 or agent:  # a client: the store's host must be there first
        reach(host, int(port), deadline, where)
    wait = timedelta(seconds=max(deadline - time.monotonic(), 1.0))
    try:
        base, _, _ = next(dist.rendezvous("env://", rank=rank, world_size=world, timeout=wait))
    except (RuntimeError, ValueError) as error:  # DistError is a RuntimeError
        raise JoinError(where.not_all_came(None, error)) from None
    store = dist.PrefixStore(f"ember/{scope}group", base)  # keys "PREFIX/KEY"
    store.set(f"arrived/{rank}", "1")
    keys = [f"arrived/{other}" for other in range(world)]
    try:
        store.wait(keys, timedelta(seconds=max(deadline - time.monotonic(), 0.5)))
    except RuntimeError as error:
        try:
            missing = [other for other in range(world) if not store.check([keys[other]])]
        except RuntimeError:  # the store's host is gone too
            missing = None
        raise JoinError(where.not_all_came(missing, error)) from None
    return store


def reach(host: str, port: int, deadline: float, where: Where) -> None:
    """Wait until `host:port` accepts a connection, or raise `JoinError` at `deadline`
    (torch's own client waits past its timeout, retrying)."""
    while True:
        left = deadline - time.monotonic()
        try:
            with socket.create_connection((host, port), timeout=max(min(left, _REACH_TRY), 0.1)):
                return
        except OSError as error:
            if time.monotonic() + 0.2 >= deadline:
                raise JoinError(where.unreachable(error)) from None
            time.sleep(0.2)


class Where:
    """What a message about a rendezvous that did not complete says: who waited, how
    long, at which address, under which launcher."""

    def __init__(self, rank: int, world: int, timeout: float, address: str, by: str) -> None:
        self.rank, self.world, self.timeout = rank, world, timeout
        self.address, self.by = address, by

    def _start(self) -> str:
        return f"Rank {self.rank} of {self.world} (launched by {self.by}) waited {self.timeout:g} s"

    def _fix(self) -> str:
        return (
            f"WORLD_SIZE={self.world} asks for ranks 0 to {self.world - 1}, all started with "
            "the same MASTER_ADDR and MASTER_PORT: start the missing ones (under torchrun, "
            "the same command on every node, --nnodes telling how many), or set the world "
            "size to the processes started; when they start late, raise devices(timeout=...)."
        )

    def unreachable(self, error: OSError) -> str:
        holder = "torchrun's agent of node 0" if self.rank == 0 else "rank 0"
        return (
            f"{self._start()} to reach the process group's store at {self.address}, which "
            f"{holder} holds, and could not ({error.strerror or error}). It must be started "
            "too, on a machine this one reaches at that address (no firewall in between). "
            f"{self._fix()}"
        )

    def not_all_came(self, missing: list[int] | None, error: BaseException) -> str:
        line = next(iter(str(error).strip().splitlines()), type(error).__name__)[:300]
        counted = _JOINED.search(line)
        if missing:
            names = ", ".join(map(str, missing))
            came = self.world - len(missing)
            who = f"rank{'s' if len(missing) > 1 else ''} {names} did not ({came} of {self.world} came)"
        elif counted:
            who = f"only {counted.group(1)} of {counted.group(2)} came"
        else:
            who = f"not every rank came ({line})"
        return (
            f"{self._start()} at {self.address} for the other processes to join the "
            f"process group, and {who}. {self._fix()}"
        )
