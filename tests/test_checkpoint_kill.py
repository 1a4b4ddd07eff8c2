"""A SIGKILL at any instant of a mid-epoch checkpoint write loses at most the steps of
`checkpoint_every(steps=N)`: the previous checkpoint of the epoch stays until the new one
is whole. Each file operation of the write (and of the retention after it) is an
instant: the run is killed just before it, then the same command resumes it, and the
steps between the kill and the resumed checkpoint are counted."""

from __future__ import annotations

import re
import signal
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
from ember_testing import ScriptForks, final_weights

SCRIPT = Path(__file__).parent / "scripts" / "kill_in_checkpoint.py"
EVERY = 5
"""checkpoint_every(steps=EVERY)."""
STEPS_PER_EPOCH = 20  # 320 samples in batches of 16, no accumulation
SAVES_PER_EPOCH = STEPS_PER_EPOCH // EVERY - 1  # the epoch's last step writes none
RESUMED = re.compile(r"Resumed from the checkpoint of epoch (\d+)(?:, iteration (\d+))?\.")


@pytest.fixture(scope="module")
def forks():
    with ScriptForks(SCRIPT) as forks:
        yield forks


def run(forks: ScriptForks, directory: Path, save: int, kill_at: int, *extra: str) -> int:
    stderr = directory.with_name(f"{directory.name}.{kill_at}.{len(extra)}.stderr")
    argv = [str(directory), "--save", str(save), "--kill-at", str(kill_at)]
    process = forks.start([*argv, "--every-steps", str(EVERY), *extra], stderr)
    code = process.wait(timeout=180)
    assert code in (0, -signal.SIGKILL), process.stderr()
    return code


def step_of_save(save: int) -> int:
    """The run's optimizer step at its `save`-th mid-epoch checkpoint."""
    epoch, within = divmod(save - 1, SAVES_PER_EPOCH)
    return epoch * STEPS_PER_EPOCH + (within + 1) * EVERY


def resumed_step(experiment_log: str) -> int:
    """The step the last resume started from (0: it started afresh)."""
    found = RESUMED.findall(experiment_log)
    if not found:
        return 0
    epoch, iteration = found[-1]
    whole = int(epoch) if not iteration else int(epoch) - 1
    return whole * STEPS_PER_EPOCH + int(iteration or 0)


@pytest.fixture(scope="module")
def reference(forks, tmp_path_factory):
    """The final weights of the run never killed, and the file operations of the writes
    of the mid-epoch checkpoints that the test kills."""
    directory = tmp_path_factory.mktemp("straight") / "run"
    counts = {}
    for save in (2, 5):
        count = directory.with_name(f"count-{save}")
        target = directory.with_name(f"run-{save}")
        assert run(forks, target, save, 0, "--count", str(count)) == 0
        counts[save] = int(count.read_text())
    return final_weights(target), counts


@pytest.mark.parametrize(
    "save",
    [2, 5],
    ids=["epoch1-replacing-the-first", "epoch2-replacing-the-first"],
)
def test_a_kill_at_any_instant_of_a_mid_epoch_checkpoint_write_loses_at_most_n_steps(
    save, forks, tmp_path, reference
):
    weights, counts = reference
    killed_at = step_of_save(save)
    assert counts[save] >= 20  # staging, three parts written and moved, the old set's removal

    def one(kill_at: int) -> int:
        directory = tmp_path / f"run-{kill_at}"
        assert run(forks, directory, save, kill_at) == -signal.SIGKILL
        assert run(forks, directory, save, 0, "--resume-or-start") == 0
        final = final_weights(directory)
        for name, value in weights.items():
            assert torch.equal(final[name], value), (kill_at, name)
        return killed_at - resumed_step((directory / "experiment.log").read_text())

    with ThreadPoolExecutor(max_workers=2) as pool:
        lost = list(pool.map(one, range(1, counts[save] + 1)))
    assert max(lost) <= EVERY, lost
    assert min(lost) == 0  # killed once the new checkpoint was whole: nothing lost
