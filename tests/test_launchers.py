"""Every launcher recognised from its environment: torchrun, srun tasks, Kubeflow's
PyTorchJob, SkyPilot with torchrun, a plain `python`; a partial or contradictory
environment is refused naming the variables and the fix. The process tests start two
CPU processes (gloo) as each launcher would."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

import ember.environment as environment
from ember.environment import LaunchError, placement
from ember.errors import TrainingError

SCRIPT = Path(__file__).parent / "scripts" / "train_recipe.py"
TORCH = {"MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"}


def test_torchrun_and_embers_own_processes():
    env = {**TORCH, "RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}
    found = placement({**env, "TORCHELASTIC_RUN_ID": "job"})
    assert (found.rank, found.world, found.local_rank, found.launcher) == (3, 4, 1, "torchrun")
    assert found.variables == {}
    assert placement({**env, "EMBER_LAUNCHER_PID": "12"}).launcher == "ember"
    assert placement({}) is None  # a plain python launch
    assert placement({**TORCH, "RANK": "0", "WORLD_SIZE": "1"}) is None  # one process


def test_srun_tasks_get_torchs_variables_from_slurms():
    env = {
        "SLURM_JOB_ID": "4242",
        "SLURM_STEP_NUM_TASKS": "4",
        "SLURM_NTASKS": "4",
        "SLURM_PROCID": "3",
        "SLURM_LOCALID": "1",
        "SLURM_STEP_NODELIST": "gpu[07-08]",
        "SLURM_STEP_TASKS_PER_NODE": "2(x2)",
    }
    found = placement(env)
    assert (found.rank, found.world, found.local_rank, found.launcher) == (3, 4, 1, "srun")
    assert found.variables == {
        "RANK": "3",
        "WORLD_SIZE": "4",
        "LOCAL_RANK": "1",
        "MASTER_ADDR": "gpu07",
        "MASTER_PORT": str(15000 + 4242),
        "LOCAL_WORLD_SIZE": "2",
    }
    # torchrun started by srun (one task a node): torchrun's variables win
    both = {**env, **TORCH, "RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1"}
    assert placement(both).rank == 5
    # the batch script itself (no srun step): one process
    assert placement({"SLURM_JOB_ID": "4242", "SLURM_NTASKS": "4", "SLURM_PROCID": "0"}) is None
    with pytest.raises(LaunchError, match=r"SLURM_PROCID and SLURM_LOCALID are not set"):
        placement({"SLURM_STEP_NUM_TASKS": "2"})
    with pytest.raises(LaunchError, match=r"SLURM_PROCID=2 is outside SLURM_STEP_NUM_TASKS=2"):
        placement({**env, "SLURM_STEP_NUM_TASKS": "2", "SLURM_PROCID": "2"})


def test_kubeflow_without_local_rank_takes_the_pods_one_device_or_is_refused(monkeypatch):
    env = {**TORCH, "RANK": "1", "WORLD_SIZE": "2"}
    found = placement(env)
    assert (found.rank, found.world, found.local_rank) == (1, 2, 0)
    assert found.launcher.startswith("Kubeflow")
    monkeypatch.setattr(environment, "_cuda_devices", lambda: 4)
    with pytest.raises(LaunchError) as error:
        placement(env)
    message = str(error.value)
    assert "without LOCAL_RANK" in message and "this machine has 4 GPUs" in message
    assert "set LOCAL_RANK" in message and isinstance(error.value, TrainingError)


@pytest.mark.parametrize(
    ("env", "words"),
    [
        ({"RANK": "1"}, "RANK is set but WORLD_SIZE is not"),
        ({"WORLD_SIZE": "2"}, "WORLD_SIZE is set but RANK is not"),
        ({**TORCH, "RANK": "2", "WORLD_SIZE": "2"}, "RANK=2 is outside WORLD_SIZE=2"),
        ({"RANK": "1", "WORLD_SIZE": "2"}, "MASTER_ADDR and MASTER_PORT are not"),
        ({**TORCH, "RANK": "x", "WORLD_SIZE": "2"}, "RANK='x' is not a whole number"),
        (
            {**TORCH, "RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "2", "LOCAL_WORLD_SIZE": "2"},
            "LOCAL_RANK=2 is outside LOCAL_WORLD_SIZE=2",
        ),
        ({"SKYPILOT_NUM_NODES": "2", "SKYPILOT_NODE_RANK": "1"}, "started without torchrun"),
    ],
)
def test_a_partial_or_contradictory_environment_is_refused_with_the_fix(env, words):
    with pytest.raises(LaunchError) as error:
        placement(env)
    assert words in str(error.value)


# Two processes, started as each launcher starts them ------------------------------------------
def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_all(commands: list[tuple[list[str], dict[str, str]]]) -> list[tuple[int, str, str]]:
    processes = [
        subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            start_new_session=True,
        )
        for command, env in commands
    ]
    try:
        outputs = [process.communicate(timeout=240) for process in processes]
    finally:
        for process in processes:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
    return [(p.returncode, out, err) for p, (out, err) in zip(processes, outputs)]


def clean_env() -> dict[str, str]:
    drop = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "SLURM_JOB_ID")
    return {key: value for key, value in os.environ.items() if key not in drop}


def recipe(directory: Path) -> list[str]:
    return [sys.executable, str(SCRIPT), str(directory), "--loader", "builder", "--no-group"]


def report(results: list[tuple[int, str, str]]) -> dict:
    for code, _, err in results:
        assert code == 0, err[-3000:]
    out = results[0][1]
    return json.loads([line for line in out.splitlines() if line.startswith("{")][-1])


def test_srun_tasks_train_as_one_run(tmp_path):
    """Two processes with only SLURM's variables, as srun starts them."""
    port = free_port()
    common = {
        **clean_env(),
        "SLURM_JOB_ID": str(port - 15000),  # the port ember derives from the job
        "SLURM_NTASKS": "2",
        "SLURM_STEP_NUM_TASKS": "2",
        "SLURM_STEP_NODELIST": "localhost",
        "SLURM_STEP_TASKS_PER_NODE": "2",
    }
    results = start_all(
        [
            (recipe(tmp_path), {**common, "SLURM_PROCID": str(rank), "SLURM_LOCALID": str(rank)})
            for rank in (0, 1)
        ]
    )
    result = report(results)
    assert result["outcome"] == "completed" and result["stops"] == [[2, 16]]  # 16 = 512 / 2 / 16
    log = (tmp_path / "experiment.log").read_text()
    assert "2 processes (gloo, launched by srun), rank 0 writes the artifacts" in log
    assert not results[1][1].strip().startswith("{")  # only rank 0 reports


def test_kubeflow_processes_without_local_rank_train_as_one_run(tmp_path):
    port = free_port()
    common = {**clean_env(), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    results = start_all(
        [(recipe(tmp_path), {**common, "RANK": str(rank), "WORLD_SIZE": "2"}) for rank in (0, 1)]
    )
    assert report(results)["outcome"] == "completed"
    log = (tmp_path / "experiment.log").read_text()
    assert "2 processes (gloo, launched by Kubeflow (no LOCAL_RANK: one process per pod))" in log


@pytest.mark.slow
def test_skypilot_nodes_started_with_torchrun_as_the_docs_say(tmp_path):
    """Two nodes as SkyPilot describes them, each starting torchrun with the command
    devices.md gives."""
    port = free_port()
    command = (
        f'{sys.executable} -m torch.distributed.run --nnodes "$SKYPILOT_NUM_NODES" '
        '--node-rank "$SKYPILOT_NODE_RANK" '
        '--master-addr "$(echo "$SKYPILOT_NODE_IPS" | head -n1)" '
        f"--master-port {port} --nproc-per-node 1 {SCRIPT} {tmp_path} --loader builder --no-group"
    )
    env = {**clean_env(), "SKYPILOT_NUM_NODES": "2", "SKYPILOT_NODE_IPS": "127.0.0.1\n127.0.0.1"}
    results = start_all(
        [(["bash", "-c", command], {**env, "SKYPILOT_NODE_RANK": str(rank)}) for rank in (0, 1)]
    )
    assert report(results)["outcome"] == "completed"
    log = (tmp_path / "experiment.log").read_text()
    assert "2 processes (gloo, launched by torchrun)" in log


def test_skypilot_nodes_started_without_torchrun_are_refused(tmp_path):
    env = {**clean_env(), "SKYPILOT_NUM_NODES": "2", "SKYPILOT_NODE_RANK": "0"}
    done = subprocess.run(recipe(tmp_path), capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode != 0
    assert "SkyPilot started 2 nodes" in done.stderr and "torchrun --nnodes" in done.stderr
