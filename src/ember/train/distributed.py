"""Several devices: one process per device on torch.distributed (DDP).

`devices([d0, d1, ...])` with several devices makes the process that calls `fit` rank
0; it starts one more process per extra device by running the same command again
(`sys.orig_argv`) with the usual torch.distributed variables set, so a user changes
neither the script nor the launcher. Under `torchrun` (one node or several) the
variables are already there and every process simply joins the group.

Rank 0 alone writes the artifact directory, renders and checkpoints. The other
ranks' standard error is copied into rank 0's `experiment.log` (with a `[rank N]`
prefix) and shown when one of them fails.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Sequence

import torch
import torch.distributed as dist
from torch import nn

from ember.environment import from_environment, in_notebook
from ember.errors import TrainingError

log = logging.getLogger(__name__)
_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


class StepRouter(nn.Module):
    """Routes DDP's forward to the model's `train_step`, so gradients are synchronised
    even though the loop calls a step method rather than `forward`."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.module = module

    def forward(self, batch: Any) -> Any:
        return self.module.train_step(batch)  # type: ignore[operator]


@dataclass
class Child:
    """A process started by ember for one extra rank."""

    rank: int
    process: subprocess.Popen[bytes]
    tail: collections.deque[str] = field(default_factory=lambda: collections.deque(maxlen=60))
    reader: threading.Thread | None = None


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

    @property
    def main(self) -> bool:
        return self.rank == 0

    def _flag_device(self) -> torch.device:
        return self.device if self.backend == "nccl" else torch.device("cpu")

    def all_gather(self, value: Any) -> list[Any]:
        """Every rank's `value`, in rank order (host objects, e.g. metric rows)."""
        gathered: list[Any] = [None] * self.world
        dist.all_gather_object(gathered, value)
        return gathered

    def broadcast(self, value: Any) -> Any:
        """Rank 0's `value` on every rank."""
        box = [value if self.main else None]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def any(self, flag: bool) -> bool:
        """True on every rank when `flag` is true on any rank."""
        tensor = torch.tensor([1 if flag else 0], dtype=torch.int32, device=self._flag_device())
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
        return bool(tensor.item())

    def barrier(self) -> None:
        dist.barrier()

    def failures(self, wait: float = 0.0) -> str:
        """What the failed child ranks printed last (their tracebacks); waits up to
        `wait` seconds for a failing child to exit."""
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline and all(c.process.poll() is None for c in self.children):
            time.sleep(0.05)
        reports = []
        for child in self.children:
            code = child.process.poll()
            if code not in (None, 0):
                if child.reader is not None:
                    child.reader.join(timeout=2)
                reports.append(
                    f"rank {child.rank} exited with code {code}:\n" + "\n".join(child.tail)
                )
        return "\n".join(reports)

    def close(self, failed: bool) -> None:
        """Leave the group; wait for (or, after a failure, stop) the ranks ember started."""
        self.finished = True
        if dist.is_initialized():
            if not failed:
                try:
                    dist.barrier()
                except Exception:  # a rank died at the very end: reported below
                    failed = True
            dist.destroy_process_group()
        deadline = time.monotonic() + (5 if failed else 120)
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


def setup(devices: Sequence[torch.device] | None, timeout: float) -> Distributed | None:
    """Join (or start, then join) the process group; None for a single process."""
    placement = from_environment()
    children: list[Child] = []
    saved: dict[str, str | None] = {}
    if placement is None:
        if devices is None or len(devices) <= 1:
            return None
        children, saved = _launch(len(devices))
        placement = (0, len(devices), 0)
    rank, world, local_rank = placement
    device = process_device(devices, local_rank)
    backend = "nccl" if device.type == "cuda" else "gloo"
    if device.type == "cuda":
        torch.cuda.set_device(device)
    context = Distributed(rank, world, local_rank, device, backend, children, saved)
    if children:
        threading.Thread(target=_watch, args=(context,), name="ember-ranks", daemon=True).start()
    try:
        dist.init_process_group(
            backend, rank=rank, world_size=world, timeout=timedelta(seconds=timeout)
        )
    except Exception as error:
        context.close(failed=True)
        raise TrainingError(
            f"Joining the process group as rank {rank} of {world} failed: {error}. "
            f"{context.failures()}".strip()
        ) from error
    log.info("Rank %d of %d on %s (backend %s).", rank, world, device, backend)
    return context


def wrap(model: nn.Module, context: Distributed) -> nn.parallel.DistributedDataParallel:
    """The model behind DDP, with `train_step` as its forward."""
    ids = [context.device] if context.device.type == "cuda" else None
    return nn.parallel.DistributedDataParallel(StepRouter(model), device_ids=ids)


def process_device(devices: Sequence[torch.device] | None, local_rank: int) -> torch.device:
    """The device of the process with `local_rank` on its machine."""
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
    if len(argv) < 2 or argv[1] in ("-c", "-i") or sys.argv[0] in ("", "-c"):
        raise TrainingError(
            "Training on several devices starts one process per device by running your "
            "command again, which needs a script (`python train.py`, `python -m pkg`), not an "
            "interactive session or `python -c`. Run a script, or launch with torchrun."
        )
    return [sys.executable, *argv[1:]]


def _launch(world: int) -> tuple[list[Child], dict[str, str | None]]:
    command = _command()
    shared = {
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(_free_port()),
        "WORLD_SIZE": str(world),
        "LOCAL_WORLD_SIZE": str(world),
    }
    saved = {name: os.environ.get(name) for name in _VARIABLES}
    children = []
    for rank in range(1, world):
        env = {**os.environ, **shared, "RANK": str(rank), "LOCAL_RANK": str(rank)}
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
    """Copy a child's standard error into the log and our own standard error."""
    assert child.process.stderr is not None
    for raw in child.process.stderr:
        line = raw.decode("utf-8", errors="replace").rstrip("\n")
        child.tail.append(line)
        log.warning("[rank %d] %s", child.rank, line)
        sys.stderr.write(f"[rank {child.rank}] {line}\n")
    child.process.stderr.close()


def _watch(context: Distributed, grace: float = 10.0) -> None:
    """If a rank ember started fails, make sure rank 0 does not wait for it forever:
    give the main thread `grace` seconds to notice (a collective fails), then exit."""
    while not context.finished:
        for child in context.children:
            code = child.process.poll()
            if code not in (None, 0):
                deadline = time.monotonic() + grace
                while time.monotonic() < deadline and not context.finished:
                    time.sleep(0.1)
                if not context.finished:
                    log.error("Stopping: %s", context.failures())
                    for other in context.children:
                        if other.process.poll() is None:
                            other.process.kill()
                    logging.shutdown()
                    sys.stderr.write(f"ember: {context.failures()}\n")
                    os._exit(1)
                return
        time.sleep(0.2)


def join(ddp: Any) -> Any:
    """DDP's Join context: ranks with fewer batches keep answering the others' reductions."""
    if ddp is None:
        return contextlib.nullcontext()
    from torch.distributed.algorithms.join import Join

    return Join([ddp])


_NULL = contextlib.nullcontext()


def no_sync(ddp: Any, accumulate: bool) -> Any:
    """Skip DDP's gradient reduction on all but the last batch of a group."""
    return ddp.no_sync() if ddp is not None and accumulate else _NULL
