"""The standard DDP recipe on 2 CPU processes under torchrun: the script makes the
process group, then trains with the loader it has (a DistributedSampler, a plain or
shuffled DataLoader, a subclass). Each equals the DataLoaderBuilder run; no
collective per step beyond DDP's own gradient reduction; a stop asked on one rank
stops every rank at the same step, and the run resumes exactly."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ember.record import DefaultRecorder

SCRIPT = Path(__file__).parent / "scripts" / "train_recipe.py"


def torchrun(directory: Path, *args: str, processes: int = 2) -> dict:
    """The recipe under torchrun; rank 0's report."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        str(processes),
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        str(port),
        str(SCRIPT),
        str(directory),
        *args,
    ]
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        out, err = process.communicate(timeout=240)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    assert process.returncode == 0, err[-3000:]
    lines = [line for line in out.splitlines() if line.startswith("{")]
    assert lines, (out, err)
    return json.loads(lines[-1])


def weights(directory: Path) -> dict[str, torch.Tensor]:
    return DefaultRecorder().load(None, directory / "final")


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> tuple[Path, dict]:
    """The DataLoaderBuilder run, ember making the process group."""
    directory = tmp_path_factory.mktemp("builder")
    return directory, torchrun(directory, "--loader", "builder", "--no-group")


@pytest.mark.parametrize("loader", ["distributed", "plain", "subclass"])
def test_the_standard_recipe_trains_like_dataloaderbuilder(tmp_path, reference, loader):
    directory, built = reference
    report = torchrun(tmp_path, "--loader", loader)
    assert report["outcome"] == "completed"
    assert report["group_kept"] is True  # the user's group is left to the user
    assert report["collectives"] == 0 and report["window"] == 14
    assert report["stops"] == [[2, 16], [2, 16]]
    ours = weights(tmp_path)
    for name, value in weights(directory).items():
        torch.testing.assert_close(ours[name], value, rtol=0, atol=1e-6)
    assert built["collectives"] == 0 and built["group_kept"] is False


def test_a_shuffled_loader_is_split_exactly_with_rank_0s_order(tmp_path):
    """ember gives a shuffled DataLoader a sampler of its own, shuffling with rank 0's
    seed: in each epoch the two processes read disjoint halves of the data, every
    sample once, in an order that changes from epoch to epoch."""
    record = tmp_path / "indices"
    report = torchrun(tmp_path / "run", "--loader", "shuffled", "--record", str(record))
    assert report["outcome"] == "completed"
    reads = [
        [int(line) for line in Path(f"{record}-{rank}.txt").read_text().split()] for rank in (0, 1)
    ]
    epochs = [[read[:256], read[256:]] for read in reads]  # 512 samples, 256 each an epoch
    assert all(len(read) == 512 for read in reads)
    for epoch in (0, 1):
        first, second = epochs[0][epoch], epochs[1][epoch]
        assert sorted(first + second) == list(range(512))
    assert epochs[0][0] != epochs[0][1] and epochs[0][0] != sorted(epochs[0][0])


@pytest.mark.slow
def test_a_stop_on_one_rank_stops_both_at_the_same_step_and_resumes_exactly(tmp_path):
    straight = tmp_path / "straight"
    torchrun(straight, "--loader", "distributed", "--epochs", "2")
    run = tmp_path / "run"
    stopped = torchrun(run, "--loader", "distributed", "--stop-at", "3", "--slow", "0.06")
    assert stopped["outcome"].startswith("stopped")
    first, second = stopped["stops"]
    assert first == second  # the same step on both ranks
    assert first[1] >= 3
    resumed = torchrun(run, "--loader", "distributed", "--resume")
    assert resumed["outcome"] == "completed"
    ours = weights(run)
    for name, value in weights(straight).items():
        assert torch.equal(ours[name], value), name
