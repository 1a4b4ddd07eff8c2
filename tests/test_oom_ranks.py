"""grads_accumulation("auto") on two processes (gloo): out of memory on one rank splits
the step on every rank, and the replicas stay equal."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import torch

from ember.record import DefaultRecorder
from ember.train.logger import read_metric_log

SCRIPT = Path(__file__).parent / "scripts" / "train_ddp.py"


def start(directory: Path, *args: str) -> subprocess.Popen[str]:
    """tests/scripts/train_ddp.py on two processes, in the background."""
    command = [sys.executable, str(SCRIPT), str(directory), "--processes", "2", *args]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(*runs: subprocess.Popen[str]) -> list[tuple[int, str]]:
    """Each run's exit code and standard error."""
    results = []
    for run in runs:
        _, err = run.communicate(timeout=240)
        results.append((run.returncode, err))
    return results


def weights(path: Path) -> dict[str, torch.Tensor]:
    return DefaultRecorder().load(None, path)


def epoch_lines(directory: Path, name: str) -> list[tuple[float, float]]:
    return read_metric_log(directory / "train" / "epoch-1" / f"{name}.log")


def test_out_of_memory_on_rank_1_splits_every_rank_and_keeps_the_update(tmp_path):
    common = ("--batch", "16", "--epochs", "2", "--save-every-rank")
    auto = ("--accumulate", "auto", "--fits", "4")
    one, both, whole = (tmp_path / name for name in ("one", "both", "whole"))
    results = finish(
        start(one, *common, *auto, "--oom-rank", "1"),  # rank 1 alone runs out of memory
        start(both, *common, *auto),  # both ranks do: the split from the start
        start(whole, *common),  # enough memory: no split
    )
    for code, err in results:
        assert code == 0, err
    ranks = [weights(one / f"rank-{rank}") for rank in (0, 1)]
    for name, value in weights(whole / "final").items():
        torch.testing.assert_close(ranks[1][name], ranks[0][name], rtol=0, atol=0)
        torch.testing.assert_close(ranks[0][name], weights(both / "final")[name], rtol=0, atol=0)
        torch.testing.assert_close(ranks[0][name], value, rtol=0, atol=1e-6)
    log = (one / "experiment.log").read_text()
    assert log.count("Out of memory at iteration") == 2  # logged once, by rank 0
    assert (
        "Out of memory at iteration 1 on rank 1: every batch is now split into 2 micro-batches "
        "on every process" in log
    )
    assert "on rank 1: every batch is now split into 4 micro-batches" in log
    # rank 0's finished micro-batches of the dropped attempts are not counted
    for metric in ("Loss", "Accuracy"):
        split, unsplit = epoch_lines(one, metric), epoch_lines(whole, metric)
        assert sum(w for _, w in split) == sum(w for _, w in unsplit) == 203
        mean = lambda rows: sum(v * w for v, w in rows) / sum(w for _, w in rows)
        assert abs(mean(split) - mean(unsplit)) < 1e-6


def test_the_replicas_share_their_buffers_as_under_ddp(tmp_path):
    # BatchNorm's running statistics: each rank updates its own; after every step all
    # take rank 0's, so the replicas hold the same buffers and parameters.
    args = ("--batch", "16", "--epochs", "1", "--norm", "--save-every-rank")
    ((code, err),) = finish(
        start(tmp_path, *args, "--accumulate", "auto", "--fits", "8", "--oom-rank", "1")
    )
    assert code == 0, err
    ranks = [weights(tmp_path / f"rank-{rank}") for rank in (0, 1)]
    assert "layer.0.running_mean" in ranks[0]
    for name, value in ranks[0].items():
        torch.testing.assert_close(ranks[1][name], value, rtol=0, atol=0)


def test_uneven_shards_and_a_resumed_run_keep_the_agreed_split(tmp_path):
    # 203 samples in batches of 101: rank 0 has a second step that rank 1 has not,
    # so rank 1 answers rank 0's agreement alone in every epoch.
    common = ("--batch", "101", "--save-every-rank")
    auto = ("--accumulate", "auto", "--fits", "50", "--oom-rank", "1")
    split, whole = tmp_path / "split", tmp_path / "whole"
    first, reference = finish(
        start(split, *common, *auto, "--epochs", "1"), start(whole, *common, "--epochs", "2")
    )
    assert first[0] == 0, first[1]
    assert reference[0] == 0, reference[1]
    (resumed,) = finish(start(split, *common, *auto, "--epochs", "2", "--resume"))
    assert resumed[0] == 0, resumed[1]
    log = (split / "experiment.log").read_text()
    assert "gradient accumulation auto (batches in 4)" in log
    assert "split into 4 micro-batches, as in the checkpoint's run" in log
    assert log.count("Out of memory at iteration") == 2  # the first run's; none after
    ranks = [weights(split / f"rank-{rank}") for rank in (0, 1)]
    for name, value in weights(whole / "final").items():
        torch.testing.assert_close(ranks[1][name], ranks[0][name], rtol=0, atol=0)
        torch.testing.assert_close(ranks[0][name], value, rtol=0, atol=1e-6)


def test_out_of_memory_for_one_sample_on_one_rank_ends_the_run_on_both(tmp_path):
    args = ("--batch", "4", "--epochs", "1", "--accumulate", "auto", "--fits", "0")
    ((code, err),) = finish(start(tmp_path, *args, "--oom-rank", "1"))
    assert code != 0
    assert (
        "Training stopped because another rank failed. Rank 1 failed at epoch 1, iteration 1: "
        "OutOfMemoryError" in err
    )
    assert "micro-batches of one sample (4 per batch) on this process" in err
