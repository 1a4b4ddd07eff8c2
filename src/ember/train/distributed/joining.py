"""Joining the process group (after starting the other ranks, when ember starts them),
and the device of each process."""

from __future__ import annotations

import itertools
import logging
import os
import sys
from datetime import timedelta
from typing import Sequence

import torch
import torch.distributed as dist

from ember.environment import from_environment
from ember.environment import placement as find_placement
from ember.errors import TrainingError
from ember.train.distributed.failures import EXIT_ACCOUNT, RankLog, install_excepthook
from ember.train.distributed.group import Distributed
from ember.train.distributed.launch import LAUNCHER_VARIABLE, Child, end_started, launch_ranks
from ember.train.distributed.meeting import JoinError, meet
from ember.train.distributed.where import name_wait

log = logging.getLogger("ember.train.distributed")  # the package's one logger

_SLACK = 10.0  # the group's own timeout exceeds `timeout` by this, so ember reports first
_GROUPS = itertools.count(1)  # numbers the process groups this process joins: keys apart


def setup(devices: Sequence[torch.device] | None, timeout: float) -> Distributed | None:
    """Join (or start, then join) the process group; None for a single process. A
    default group the user's script made already is used as it is, and left to it."""
    adopted = dist.is_available() and dist.is_initialized()
    if adopted and dist.get_world_size() <= 1:
        return None
    placement = from_environment()
    children: list[Child] = []
    saved: dict[str, str | None] = {}
    launched_by = "the script's process group" if adopted else "ember"
    if placement is not None and not adopted:
        found = find_placement()
        if found is not None:
            launched_by = found.launcher
            os.environ.update(found.variables)  # for torch.distributed, as torchrun sets them
    if placement is None:
        if devices is None or len(devices) <= 1:
            return None
        process_device(devices, 0)  # a device list a launcher's processes do not match
        children, saved = launch_ranks(len(devices))
        placement = (0, len(devices), 0)
    rank, world, local_rank = placement
    context: Distributed | None = None
    hook = sys.excepthook
    try:  # (a Ctrl-C too) whatever ends the joining ends the ranks started for it
        device = process_device(devices, local_rank)
        backend = "nccl" if device.type == "cuda" else "gloo"
        if adopted:
            backend = check_backend(str(dist.get_backend()), device)
        if device.type == "cuda":
            torch.cuda.set_device(device)
        variable = os.environ.get(LAUNCHER_VARIABLE)
        launcher = int(variable) if variable is not None else None
        ours = not adopted and (bool(children) or launcher is not None)
        prefix = "" if ours else f"[rank{rank}]: "
        context = Distributed(
            rank,
            world,
            local_rank,
            device,
            backend,
            children,
            saved,
            timeout=timeout,
            launcher=launcher,
            prefix=prefix,
            owns_group=not adopted,
        )
        context.launched_by = launched_by
        scope = group_scope(ours)
        EXIT_ACCOUNT.explained.clear()
        context.listen_to_signals()
        if ours:
            context.start_watchdog()  # watch the started ranks (or our starter) from now on
        try:
            if not adopted:
                store = meet(rank, world, timeout, scope, launched_by)
                store.set_timeout(timedelta(seconds=timeout + _SLACK))
                dist.init_process_group(
                    backend,
                    store=store,
                    rank=rank,
                    world_size=world,
                    timeout=timedelta(seconds=timeout + _SLACK),
                )
        except Exception as error:
            report = context.health.exits(wait=2.0)
            context.close(failed=True)
            if isinstance(error, JoinError):
                raise JoinError(f"{error} {report}".rstrip()) from None
            raise TrainingError(
                f"Joining the process group as rank {rank} of {world} failed: {error}. {report}"
            ) from error
        context.open_host_group()
        # torch prefixes uncaught errors with the rank; the ranks ember starts are
        # prefixed by rank 0 already
        install_excepthook(hook if ours else sys.excepthook, prefix)
        context.attach_board(scope)
        if not ours:
            context.start_watchdog()
        ember_log = logging.getLogger("ember")
        if not context.main and not ember_log.hasHandlers():
            context.handler = RankLog(context.caused_elsewhere, prefix)
            ember_log.addHandler(context.handler)
    except BaseException:
        if context is None:
            end_started(children, saved)
        elif not context.finished:
            context.close(failed=True)
        raise
    log.info(
        "Rank %d of %d on %s (backend %s; launched by %s).",
        rank,
        world,
        device,
        backend,
        launched_by,
    )
    return context


def group_scope(ours: bool) -> str:
    """The keys of the group this process joins in the store it meets the others at:
    torchrun keeps its store across restarts (`--max-restarts`), and srun's or
    Kubeflow's processes may make a second group at the same address, so each restart
    and each group has keys of its own. The processes ember starts meet at a port
    chosen for them alone (and rank 0 may have made groups before they were born)."""
    number = next(_GROUPS)
    if ours:
        return ""
    run = os.environ.get("TORCHELASTIC_RUN_ID", "")
    return f"{run}/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}/{number}/"


def check_backend(backend: str, device: torch.device) -> str:
    """The backend of the user's process group, checked against this process's device."""
    if device.type == "cuda" and "nccl" not in backend:
        log.info(
            "The process group's backend is %s: tensors on %s are reduced by it.", backend, device
        )
    if device.type == "cpu" and backend == "nccl":
        raise TrainingError(
            "The process group was made with the nccl backend, which reduces CUDA tensors "
            "only, and this process trains on the CPU. Make the group with "
            "init_process_group('gloo') (or 'cpu:gloo,cuda:nccl'), or train on CUDA "
            "(devices(['cuda']))."
        )
    return "nccl" if "nccl" in backend and device.type == "cuda" else "gloo"


def process_device(devices: Sequence[torch.device] | None, local_rank: int) -> torch.device:
    """The device of the process with `local_rank` on its machine. Under a launcher, a
    list of several devices must list one per process it started on this machine."""
    launched = os.environ.get("LOCAL_WORLD_SIZE")
    if devices and len(devices) > 1 and launched is not None and int(launched) != len(devices):
        raise TrainingError(
            f"devices() lists {len(devices)} devices, but the launcher started {launched} "
            f"processes on this machine (LOCAL_WORLD_SIZE={launched}). List one device per "
            f"process ({launched}), or a single device name such as ['cuda'] or ['cpu'], "
            "which every process uses ('cuda' is cuda:LOCAL_RANK)."
        )
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


# What the group's own waits are called in the hang reports
for _code, _label in {
    Distributed.any.__code__: "the vote on stopping",
    Distributed.vote.__code__: "the vote on stopping",
    Distributed.barrier.__code__: "a barrier",
    Distributed.all_gather.__code__: "an exchange of values between the ranks",
    Distributed.broadcast.__code__: "a broadcast from rank 0",
    Distributed.close.__code__: "the end of training",
    setup.__code__: "joining the process group",
}.items():
    name_wait(_code, _label)


# The loop's helpers ----------------------------------------------------------------
def world_size(devices: Sequence[torch.device] | None) -> int:
    """How many processes a run will have: torchrun's world, or one per listed device."""
    placement = from_environment()
    if placement is not None:
        return placement[1]
    return len(devices) if devices is not None and len(devices) > 1 else 1
