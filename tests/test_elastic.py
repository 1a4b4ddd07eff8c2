"""Outgrowing one machine: an elastic restart under `torchrun --max-restarts 1` resumes
exactly from the newest checkpoint, and a rendezvous that cannot complete ends within
`devices(timeout=...)` with a message naming what was awaited and the fix.

The restart test runs the configuration a user types (torchrun's default static
rendezvous, `--master-addr`/`--master-port`) with ember making the process group: torchrun
keeps its store across restarts, and ember keeps each attempt's keys apart in it.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import torch

from ember.record import DefaultRecorder

SCRIPT = Path(__file__).parent / "scripts" / "train_recipe.py"
EVERY = 8  # checkpoint_every(steps=EVERY)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def torchrun(directory: Path, *args: str, restarts: int = 0, sink=None) -> subprocess.Popen:
    """The recipe on 2 processes under torchrun, ember making the group (`sink`: a
    file for everything printed, else pipes)."""
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        "2",
        "--max-restarts",
        str(restarts),
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        str(free_port()),
        str(SCRIPT),
        str(directory),
        "--loader",
        "builder",
        "--no-group",
        *args,
    ]
    return subprocess.Popen(
        command,
        stdout=subprocess.PIPE if sink is None else sink,
        stderr=subprocess.PIPE if sink is None else subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def end(process: subprocess.Popen) -> None:
    """End a launch that is still running, workers included (torchrun starts each
    worker in a session of its own, which killing torchrun's group would leave)."""
    if process.poll() is not None:
        return
    try:
        workers = psutil.Process(process.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        workers = []
    for worker in workers:
        try:
            worker.kill()
        except psutil.NoSuchProcess:
            pass
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()


def weights(directory: Path) -> dict[str, torch.Tensor]:
    return DefaultRecorder().load(None, directory / "final")


def wait_for(path: Path, text: str, process: subprocess.Popen, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and process.poll() is None:
        if path.exists() and text in path.read_text():
            return
        time.sleep(0.02)
    raise AssertionError(f"{text!r} not in {path} within {seconds} s")


@pytest.mark.slow
def test_a_worker_killed_mid_run_comes_back_through_an_elastic_restart_exactly(
    tmp_path, record_property
):
    """SIGKILL to rank 1 in epoch 2, after the checkpoint of its 8th step: torchrun
    restarts both workers, checkpoint("auto") resumes from that checkpoint, at most 8
    steps are trained again, and the final weights equal a run never killed."""
    straight = tmp_path / "straight"
    reference = torchrun(straight, "--epochs", "2")
    try:
        out, err = reference.communicate(timeout=240)
    finally:
        end(reference)
    assert reference.returncode == 0, err[-3000:]
    run, pids, output = tmp_path / "run", tmp_path / "pids", tmp_path / "output.txt"
    pids.mkdir()
    args = ("--epochs", "2", "--auto", "--every", str(EVERY), "--slow", "0.1", "--pids", str(pids))
    with output.open("w") as sink:  # (a pipe left unread would fill and stop the launch)
        process = torchrun(run, *args, restarts=1, sink=sink)
    log = run / "experiment.log"
    try:
        wait_for(log, f"Checkpoint of epoch 2, iteration {EVERY} written", process, 180)
        time.sleep(0.2)
        os.kill(int((pids / "pid-1").read_text()), signal.SIGKILL)
        process.wait(timeout=240)
    finally:
        end(process)
    assert process.returncode == 0, output.read_text()[-4000:]
    text = log.read_text()
    assert "rank 1 did not answer: it died, or is stuck outside Python" in text
    killed = re.search(r"Training stopped at epoch 2, iteration (\d+)\.", text)
    resumed = re.search(r"Resumed from the checkpoint of epoch 2, iteration (\d+)\.", text)
    assert killed is not None and resumed is not None, text[-3000:]
    lost = int(killed.group(1)) - int(resumed.group(1))
    record_property("steps_lost", lost)
    print(f"steps trained again after the restart: {lost} (of at most {EVERY})")
    assert int(resumed.group(1)) == EVERY and 0 <= lost <= EVERY
    assert text.rstrip().endswith("Training completed after epoch 2.")
    report = json.loads([line for line in out.splitlines() if line.startswith("{")][-1])
    assert report["outcome"] == "completed"
    ours = weights(run)
    for name, value in weights(straight).items():
        assert torch.equal(ours[name], value), name


def clean_env() -> dict[str, str]:
    drop = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
    return {key: value for key, value in os.environ.items() if key not in drop}


@pytest.mark.parametrize(
    ("rank", "words"),
    [
        (0, "waited 3 s at 127.0.0.1:{port} for the other processes to join the process"),
        (1, "waited 3 s to reach the process group's store at 127.0.0.1:{port}, which rank 0"),
    ],
)
def test_one_process_of_two_ends_within_the_timeout_naming_what_it_waited_for(
    tmp_path, rank, words
):
    """WORLD_SIZE=2, one process started: it waits `devices(timeout=3)`, not torch's
    minutes, and says what it waited for and the fix."""
    port = free_port()
    env = {
        **clean_env(),
        "RANK": str(rank),
        "WORLD_SIZE": "2",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
    }
    command = [sys.executable, str(SCRIPT), str(tmp_path), "--loader", "builder", "--no-group"]
    started = time.monotonic()
    done = subprocess.run(
        [*command, "--timeout", "3"], capture_output=True, text=True, env=env, timeout=120
    )
    took = time.monotonic() - started
    assert done.returncode == 1
    message = done.stderr.strip().splitlines()[-1]
    assert message.startswith("ember.train.distributed.meeting.JoinError: Rank")
    assert words.format(port=port) in message
    assert "WORLD_SIZE=2 asks for ranks 0 to 1" in message
    assert "start the missing ones" in message and "raise devices(timeout=...)" in message
    if rank == 0:
        assert "only 1 of 2 came" in message
    assert took < 3 + 30  # the interpreter's start and torch's import, then 3 s
    assert not (tmp_path / "experiment.log").exists()  # nothing written


def test_under_torchruns_store_the_ranks_that_did_not_come_are_named(monkeypatch):
    """torchrun's agent holds the store (every worker is its client): the ranks that
    did not note their arrival within the timeout are named."""
    from datetime import timedelta

    import torch.distributed as dist

    from ember.train.distributed.meeting import JoinError, meet

    agent = dist.TCPStore(
        "127.0.0.1", 0, is_master=True, timeout=timedelta(seconds=5), wait_for_workers=False
    )
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(agent.port))
    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "True")
    started = time.monotonic()
    with pytest.raises(JoinError) as error:
        meet(0, 3, 1.0, "run/1/1/", "torchrun")
    assert time.monotonic() - started < 1.0 + 2.0
    message = str(error.value)
    assert message.startswith("Rank 0 of 3 (launched by torchrun) waited 1 s at 127.0.0.1:")
    assert "ranks 1, 2 did not (1 of 3 came)" in message
    # an earlier attempt's arrivals (other keys of the same store) never count
    assert agent.check(["ember/run/1/1/group/arrived/0"])
    assert not agent.check(["ember/run/0/1/group/arrived/0"])
