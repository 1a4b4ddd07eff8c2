"""SIGKILL at random moments: whatever is on disk stays readable, and resuming finishes
the run with the same weights as a run never killed."""

from __future__ import annotations

import random
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
from ember_testing import BLOBS_SCRIPT, ForkedRun, ScriptForks, final_weights

from ember.record import load
from ember.train.logger import read_metric_log

SCRIPT = BLOBS_SCRIPT


@pytest.fixture(scope="module")
def forks():
    """The runs are forked from one process that imported torch and ember once: a
    kill's moment is counted from the first training step either way, and the start of
    a fresh interpreter would only cost seconds of import per run."""
    with ScriptForks(SCRIPT) as forks:
        yield forks


def start(forks: ScriptForks, directory: Path, *extra: str) -> ForkedRun:
    stderr = directory.with_name(f"{directory.name}.{len(extra)}.stderr")
    return forks.start([str(directory), "--sleep", "0.004", *extra], stderr)


@pytest.fixture(scope="module")
def reference(blob_straight) -> dict[str, torch.Tensor]:
    """The final weights of the same run, never killed."""
    return final_weights(blob_straight)


def check_disk(directory: Path) -> int:
    """Every checkpoint file loads; every metric log parses. Returns the files checked."""
    checked = 0
    for path in (
        sorted((directory / "checkpoint").glob("*")) if (directory / "checkpoint").exists() else []
    ):
        if path.name.startswith("."):
            continue  # a temp file of an interrupted write is never under a final name
        load(None, path)
        checked += 1
    for log in directory.glob("*/epoch-*/*.log"):
        for _value, weight in read_metric_log(log):
            assert weight > 0
        checked += 1
    return checked


def kill_and_resume(forks: ScriptForks, directory: Path, delay: float) -> None:
    """Kill the run `delay` seconds after its first training step (counted from there,
    not from its start, so that a busy machine's slow imports do not move every kill
    before the training), check the disk, then resume it to the end."""
    ready = directory.with_name(directory.name + ".ready")
    process = start(forks, directory, "--ready", str(ready))
    deadline = time.monotonic() + 120
    while not ready.exists():
        assert process.poll() is None, process.stderr()
        assert time.monotonic() < deadline, "the run never started training"
        time.sleep(0.01)
    time.sleep(delay)
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=30)
    check_disk(directory)
    resumed = start(forks, directory, "--resume-or-start")
    code = resumed.wait(timeout=120)
    assert code == 0, resumed.stderr()


def run_chaos(forks: ScriptForks, tmp_path: Path, reference, runs: int, seed: int) -> None:
    """`runs` runs, each killed at a random moment then resumed; two at a time, each in a
    directory of its own (a run's subprocesses leave the other core mostly idle)."""
    rng = random.Random(seed)
    delays = [rng.uniform(0.0, 2.0) for _ in range(runs)]

    def one(run: int) -> None:
        directory = tmp_path / f"run-{run}"
        kill_and_resume(forks, directory, delays[run])
        assert check_disk(directory) > 0
        final = final_weights(directory)
        for name, value in reference.items():
            assert torch.equal(final[name], value), (run, name)
        leftovers = [p.name for p in directory.rglob("*") if p.name.startswith(".") and p.is_file()]
        assert leftovers == []

    with ThreadPoolExecutor(max_workers=2) as pool:
        for done in [pool.submit(one, run) for run in range(runs)]:
            done.result()  # re-raises a failed run's assertion


def test_sigkill_at_random_moments_loses_nothing(forks, tmp_path, reference):
    run_chaos(forks, tmp_path, reference, runs=5, seed=1)


@pytest.mark.slow
def test_sigkill_chaos_many_runs(forks, tmp_path, reference):
    run_chaos(forks, tmp_path, reference, runs=20, seed=2)
