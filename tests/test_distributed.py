"""Several processes on torch.distributed (gloo on CPU): started by ember or by torchrun."""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from ember_testing import load_example, run_script

from ember.record import DefaultRecorder
from ember.train.logger import read_metric_log
from ember.train.summary import LearnerSummary

SCRIPT = Path(__file__).parent / "scripts" / "train_ddp.py"


def run(directory: Path, *args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    return run_script(SCRIPT, str(directory), *args, timeout=timeout)


def run_here(directory: Path, *args: str) -> int:
    """The script's run in this process, for a one-process reference (no interpreter
    to start): the same code and seeds; its exit code. This process's thread count is
    restored after."""
    script = sys.modules.get("train_ddp_here") or load_example(SCRIPT, "train_ddp_here")
    threads = torch.get_num_threads()
    try:
        script.main([str(directory), "--processes", "1", *args])
    except SystemExit as end:
        return int(end.code or 0)
    finally:
        torch.set_num_threads(threads)
    return 0


def epoch_values(directory: Path) -> dict[tuple[str, str], tuple[float, float]]:
    return {
        (m.split, m.name): (m.minimum, m.maximum)
        for m in LearnerSummary.from_dir(directory).metrics
    }


def final(directory: Path) -> dict[str, torch.Tensor]:

    return DefaultRecorder().load(None, directory / "final")


@pytest.fixture(scope="module")
def one_process(tmp_path_factory) -> Path:
    """One process at batch 32 for the default 3 epochs: the reference of two
    processes at batch 16, made once for the tests of this module."""
    directory = tmp_path_factory.mktemp("one-process")
    assert run_here(directory, "--batch", "32", "--epochs", "3") == 0
    return directory


def test_two_processes_at_batch_b_match_one_process_at_batch_2b(tmp_path, one_process):
    two = run(tmp_path / "two", "--processes", "2", "--batch", "16")
    assert two.returncode == 0, two.stderr
    for split in ("train", "valid"):
        for epoch in (1, 2, 3):
            for name in ("Loss", "Accuracy"):
                lines = lambda d: read_metric_log(d / split / f"epoch-{epoch}" / f"{name}.log")
                a, b = lines(one_process), lines(tmp_path / "two")
                assert (
                    sum(w for _, w in a)
                    == sum(w for _, w in b)
                    == (203 if split == "train" else 61)
                )
                mean = lambda rows: sum(v * w for v, w in rows) / sum(w for _, w in rows)
                assert abs(mean(a) - mean(b)) <= 1e-5 * max(1.0, abs(mean(a))), (split, epoch, name)
    for name, value in final(one_process).items():
        torch.testing.assert_close(final(tmp_path / "two")[name], value, rtol=1e-5, atol=1e-6)
    log = (tmp_path / "two" / "experiment.log").read_text()
    assert "2 processes (gloo, launched by ember), rank 0 writes the artifacts" in log
    assert not (tmp_path / "two" / ".lock").exists()


def test_resume_with_a_different_number_of_processes(tmp_path, one_process):
    first = run(tmp_path / "resumed", "--processes", "2", "--batch", "16", "--epochs", "2")
    assert first.returncode == 0, first.stderr
    assert run_here(tmp_path / "resumed", "--batch", "32", "--epochs", "3", "--resume") == 0
    for name, value in final(one_process).items():
        torch.testing.assert_close(final(tmp_path / "resumed")[name], value, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "strategy",
    [
        ("--batch", "8", "--accumulate", "2"),
        pytest.param(("--batch", "16", "--strategy", "fsdp", "--mlp"), marks=pytest.mark.slow),
    ],
    ids=["ddp-accumulated", "fsdp"],
)
def test_token_means_on_two_processes_match_one_batch(tmp_path, strategy):
    # Losses are means over a varying number of tokens per batch: the gradient of the
    # token mean needs each batch weighted by its tokens over every process's total.
    mlp = ("--mlp",) if "--mlp" in strategy else ()
    assert run_here(tmp_path / "one", "--batch", "32", "--token-mean", *mlp) == 0
    two = run(tmp_path / "two", "--processes", "2", "--token-mean", *strategy)
    assert two.returncode == 0, two.stderr
    for name, value in final(tmp_path / "one").items():
        torch.testing.assert_close(final(tmp_path / "two")[name], value, rtol=0, atol=1e-6)
    a, b = epoch_values(tmp_path / "one"), epoch_values(tmp_path / "two")
    for key in (("train", "Loss"), ("valid", "Loss")):  # token-weighted on both sides
        for x, y in zip(a[key], b[key]):
            assert math.isclose(x, y, rel_tol=1e-5), key


def test_a_nan_on_one_rank_skips_the_step_on_every_rank(tmp_path):
    common = ("--skip-nonfinite", "--nan-step", "3", "--epochs", "1")
    # The reference: one process at batch 32 whose third step has the NaN (and is skipped).
    assert run_here(tmp_path / "one", "--batch", "32", "--nan-rank", "0", *common) == 0
    # Two processes at batch 16: only rank 1 sees the NaN in its third step.
    two = run(
        tmp_path / "two",
        "--processes",
        "2",
        "--batch",
        "16",
        "--nan-rank",
        "1",
        "--save-every-rank",
        *common,
    )
    assert two.returncode == 0, two.stderr
    ranks = [DefaultRecorder().load(None, tmp_path / "two" / f"rank-{r}") for r in (0, 1)]
    for name, value in final(tmp_path / "one").items():
        assert torch.isfinite(ranks[0][name]).all()
        torch.testing.assert_close(ranks[1][name], ranks[0][name], rtol=0, atol=0)
        torch.testing.assert_close(ranks[0][name], value, rtol=1e-5, atol=1e-6)
    log = (tmp_path / "two" / "experiment.log").read_text()
    # rank 0 writes the log: its own loss was finite, rank 1's was not
    assert (
        "Skipped the optimizer step at epoch 1, iteration 3: non-finite loss on another process"
        in log
    )
    assert "Skipped 1 optimizer step with a non-finite loss" in log
    assert (
        "Skipped 1 optimizer step with a non-finite loss"
        in (tmp_path / "one" / "experiment.log").read_text()
    )


@pytest.mark.parametrize("strategy", ["ddp", pytest.param("fsdp", marks=pytest.mark.slow)])
def test_two_torchrun_nodes_write_one_artifact_directory(tmp_path, strategy):
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    nodes = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--nnodes",
                "2",
                "--nproc-per-node",
                "1",
                "--node-rank",
                str(rank),
                "--master-addr",
                "127.0.0.1",
                "--master-port",
                str(port),
                str(SCRIPT),
                str(tmp_path / "run"),
                "--processes",
                "1",
                "--batch",
                "16",
                "--strategy",
                strategy,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        for rank in (0, 1)
    ]
    try:
        outputs = [node.communicate(timeout=240) for node in nodes]
    finally:  # a node left waiting for the other would otherwise outlive the test
        for node in nodes:
            if node.poll() is None:
                os.killpg(node.pid, signal.SIGKILL)
    assert [node.returncode for node in nodes] == [0, 0], outputs
    files = sorted(
        str(p.relative_to(tmp_path / "run")) for p in (tmp_path / "run").rglob("*") if p.is_file()
    )
    assert files.count("experiment.log") == 1
    assert "train/epoch-3/Loss.log" in files and "final.mpk" in files
    log = (tmp_path / "run" / "experiment.log").read_text()
    assert "2 processes (gloo, launched by torchrun)" in log
    assert ("parameters sharded (FSDP" in log) == (strategy == "fsdp")
    lines = (tmp_path / "run" / "train" / "epoch-1" / "Loss.log").read_text().splitlines()
    assert sum(int(line.split(",")[1]) for line in lines) == 203  # both nodes' samples, once each
