"""Where the process runs: a terminal, a notebook kernel, CI, a torchrun launch.

Neutral ground: any module may ask, so this one imports only the standard library (and
ember's exceptions, which import nothing).
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from typing import IO, Mapping

from ember.errors import TrainingError

__all__ = [
    "LaunchError",
    "Placement",
    "from_environment",
    "in_notebook",
    "placement",
    "wants_dashboard",
]

_OFF = ("", "0", "false", "no", "off")


def wants_dashboard(
    stream: IO[str] | None = None, environ: Mapping[str, str] | None = None
) -> bool:
    """True when `stream` (default stdout) is a terminal that takes UTF-8, `CI` is not set
    and `TERM` is not `dumb`."""
    stream = stream if stream is not None else sys.stdout
    environ = environ if environ is not None else os.environ
    try:
        terminal = bool(stream is not None and stream.isatty())
    except (AttributeError, ValueError, OSError):
        terminal = False
    if not terminal:
        return False
    encoding = (getattr(stream, "encoding", None) or "utf-8").lower().replace("-", "")
    if encoding != "utf8":  # the dashboard draws with box and braille characters
        return False
    if environ.get("CI", "").strip().lower() not in _OFF:
        return False
    return environ.get("TERM", "").strip().lower() != "dumb"


def in_notebook() -> bool:
    """True inside a Jupyter kernel (JupyterLab, Notebook, VS Code, Colab): IPython is
    loaded and its shell has a kernel. A terminal IPython is not a notebook. Imports
    nothing: without IPython already loaded, this is False."""
    ipython = sys.modules.get("IPython")
    get_ipython = getattr(ipython, "get_ipython", None)
    if not callable(get_ipython):
        return False
    try:
        shell = get_ipython()
    except Exception:
        return False
    return shell is not None and getattr(shell, "kernel", None) is not None


def existing_group() -> tuple[int, int, int] | None:
    """(rank, world size, local rank) of a default process group of several processes
    that the user's script has already made (`torch.distributed.init_process_group`),
    else None. Asks torch.distributed only when something already imported it."""
    distributed = sys.modules.get("torch.distributed")
    if distributed is None or not distributed.is_available() or not distributed.is_initialized():
        return None
    world = int(distributed.get_world_size())
    if world <= 1:
        return None
    rank = int(distributed.get_rank())
    return rank, world, int(os.environ.get("LOCAL_RANK", rank))


class LaunchError(TrainingError):
    """The launcher's environment is partial or contradicts itself (the message names
    the variables and the fix)."""


@dataclass(frozen=True)
class Placement:
    """This process's place among several: its rank, the number of processes, its rank
    on its machine, the launcher that said so, and the torch.distributed variables to
    set before joining the group (for a launcher that does not set them: srun)."""

    rank: int
    world: int
    local_rank: int
    launcher: str
    variables: Mapping[str, str] = field(default_factory=dict)


def placement(environ: Mapping[str, str] | None = None) -> Placement | None:
    """Where this process stands, from its launcher's environment, or None for a plain
    `python` launch of one process. Recognised: torchrun (and TorchElastic), the
    processes ember starts, `srun` tasks (SLURM's variables), Kubeflow's PyTorchJob
    (torch's variables without LOCAL_RANK), SkyPilot with torchrun; an environment
    that is partial or contradicts itself raises `LaunchError`."""
    env = os.environ if environ is None else environ
    if "RANK" in env or "WORLD_SIZE" in env:
        return _torch_variables(env)
    if "SLURM_STEP_NUM_TASKS" in env and _int(env, "SLURM_STEP_NUM_TASKS", 1) > 1:
        return _srun(env)
    nodes = _int(env, "SKYPILOT_NUM_NODES", 1)
    if nodes > 1:
        raise LaunchError(
            f"SkyPilot started {nodes} nodes (SKYPILOT_NUM_NODES={nodes}), but this process "
            "was started without torchrun, so it would train alone. Start it on each node "
            "with torchrun --nnodes $SKYPILOT_NUM_NODES --node-rank $SKYPILOT_NODE_RANK "
            '--master-addr $(echo "$SKYPILOT_NODE_IPS" | head -n1) --master-port 29500 '
            "--nproc-per-node $SKYPILOT_NUM_GPUS_PER_NODE train.py."
        )
    return None


def _int(env: Mapping[str, str], name: str, default: int) -> int:
    text = env.get(name)
    if text is None:
        return default
    try:
        return int(text)
    except ValueError:
        raise LaunchError(f"{name}={text!r} is not a whole number: fix the launch.") from None


def _torch_variables(env: Mapping[str, str]) -> Placement | None:
    """torchrun, ember's own processes, or Kubeflow (the same variables, LOCAL_RANK
    left out)."""
    missing = [name for name in ("RANK", "WORLD_SIZE") if name not in env]
    if missing:
        given = "RANK" if "RANK" in env else "WORLD_SIZE"
        raise LaunchError(
            f"{given} is set but {missing[0]} is not: torch.distributed needs RANK, "
            "WORLD_SIZE, MASTER_ADDR and MASTER_PORT together. Launch with torchrun (which "
            f"sets them all), or unset {given} to train in one process."
        )
    rank, world = _int(env, "RANK", 0), _int(env, "WORLD_SIZE", 1)
    if world <= 1:
        return None
    if not 0 <= rank < world:
        raise LaunchError(
            f"{_outside('RANK', rank, 'WORLD_SIZE', world)} (ranks are 0 to {world - 1}): fix the launch."
        )
    launcher = "torchrun" if "TORCHELASTIC_RUN_ID" in env else "torch.distributed variables"
    if "EMBER_LAUNCHER_PID" in env:
        launcher = "ember"
    unset = [name for name in ("MASTER_ADDR", "MASTER_PORT") if name not in env]
    if unset:
        raise LaunchError(
            f"RANK={rank} and WORLD_SIZE={world} are set, but {_listed(unset)} not: every "
            "process must know where rank 0 "
            "listens. Launch with torchrun, or set MASTER_ADDR (rank 0's host) and "
            "MASTER_PORT (a free port) in every process."
        )
    if "LOCAL_RANK" in env:
        local = _int(env, "LOCAL_RANK", 0)
        local_world = _int(env, "LOCAL_WORLD_SIZE", world)
        if not 0 <= local < local_world:
            raise LaunchError(
                f"{_outside('LOCAL_RANK', local, 'LOCAL_WORLD_SIZE', local_world)}: fix the launch."
            )
        return Placement(rank, world, local, launcher)
    # Kubeflow's PyTorchJob: a pod per process, no LOCAL_RANK
    gpus = _cuda_devices()
    if gpus > 1:
        raise LaunchError(
            f"RANK={rank} and WORLD_SIZE={world} are set without LOCAL_RANK (a Kubeflow "
            f"PyTorchJob, one process per pod), and this machine has {gpus} GPUs: ember "
            "cannot tell which one is this process's. Give each pod one GPU, set "
            "LOCAL_RANK, or start the processes of each pod with torchrun."
        )
    return Placement(rank, world, 0, "Kubeflow (no LOCAL_RANK: one process per pod)")


def _listed(names: list[str]) -> str:
    """`A is` or `A and B are`: the variables a message names, with their verb."""
    return f"{' and '.join(names)} {'is' if len(names) == 1 else 'are'}"


def _outside(name: str, value: int, bound_name: str, bound: int) -> str:
    return f"{name}={value} is outside {bound_name}={bound}"


def _cuda_devices() -> int:
    """CUDA devices this process sees (0 when torch is not imported yet, or has none)."""
    torch = sys.modules.get("torch")
    try:
        return int(torch.cuda.device_count()) if torch is not None else 0
    except Exception:
        return 0


def _srun(env: Mapping[str, str]) -> Placement:
    """`srun` tasks: SLURM's variables give the rank, and rank 0's host the address."""
    world = _int(env, "SLURM_STEP_NUM_TASKS", 1)
    missing = [name for name in ("SLURM_PROCID", "SLURM_LOCALID") if name not in env]
    if missing:
        raise LaunchError(
            f"SLURM_STEP_NUM_TASKS={world}, but {_listed(missing)} not set: an srun task has "
            "them all. "
            "Start the processes with srun, or launch with torchrun."
        )
    rank, local = _int(env, "SLURM_PROCID", 0), _int(env, "SLURM_LOCALID", 0)
    if not 0 <= rank < world:
        raise LaunchError(
            f"{_outside('SLURM_PROCID', rank, 'SLURM_STEP_NUM_TASKS', world)}: fix the launch."
        )
    variables = {
        "RANK": str(rank),
        "WORLD_SIZE": str(world),
        "LOCAL_RANK": str(local),
        "MASTER_ADDR": env.get("MASTER_ADDR") or _first_host(env),
        "MASTER_PORT": env.get("MASTER_PORT") or str(_slurm_port(env)),
    }
    per_node = _tasks_per_node(env.get("SLURM_STEP_TASKS_PER_NODE", ""))
    if per_node is not None:
        variables["LOCAL_WORLD_SIZE"] = str(per_node)
    return Placement(rank, world, local, "srun", variables)


def _first_host(env: Mapping[str, str]) -> str:
    """The first host of the step's node list (`node[03-05,9],gpu1` gives `node03`)."""
    nodes = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or ""
    if not nodes:
        raise LaunchError(
            "srun tasks: neither MASTER_ADDR nor SLURM_STEP_NODELIST is set, so the processes "
            "cannot find rank 0. Set MASTER_ADDR to the first node's host name."
        )
    prefix, bracket, ranges = nodes.partition("[")
    if "," in prefix or not bracket:  # a plain name comes first
        return prefix.split(",")[0]
    return prefix + ranges.split("]")[0].split(",")[0].split("-")[0]


def _slurm_port(env: Mapping[str, str]) -> int:
    """A port every task of the job computes alike: from the job's number."""
    return 15000 + _int(env, "SLURM_JOB_ID", 0) % 20000


def _tasks_per_node(text: str) -> int | None:
    """The tasks on the first node, from SLURM's `2(x3),1` form."""
    head = text.split(",")[0].split("(")[0]
    return int(head) if head.isdigit() else None


def from_environment() -> tuple[int, int, int] | None:
    """(rank, world size, local rank) when the process group exists already, or when a
    launcher started several processes (`placement`), else None."""
    group = existing_group()
    if group is not None:
        return group
    found = placement()
    return None if found is None else (found.rank, found.world, found.local_rank)
