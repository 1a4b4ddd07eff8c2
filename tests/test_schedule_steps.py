"""A schedule sized "auto" ends on the run's last optimizer step, whatever the number
of processes and the gradient accumulation; the learner tells the step counts."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest
from ember_testing import run_script

from ember.errors import ConfigError
from ember.lr import CosineAnnealingLrSchedulerConfig

SCRIPT = Path(__file__).parent / "scripts" / "train_schedule.py"


@pytest.mark.parametrize(
    ("processes", "accumulation", "per_epoch"),
    [
        (1, 1, 13),  # 200 samples in batches of 16: 13 batches
        (1, 3, 5),  # 13 batches in groups of 3: 5 optimizer steps
        (2, 1, 7),  # 100 samples per process: 7 batches each
    ],
    ids=["one-process", "accumulation", "two-processes"],
)
def test_an_auto_schedule_reaches_its_final_rate_on_the_last_step(
    tmp_path, processes, accumulation, per_epoch
):
    done = run_script(
        SCRIPT,
        str(tmp_path / "run"),
        "--processes",
        str(processes),
        "--accumulation",
        str(accumulation),
        "--epochs",
        "2",
        timeout=180,
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["before_fit"] == [per_epoch, 2 * per_epoch]  # known before fit
    assert (result["steps_per_epoch"], result["total_steps"]) == (per_epoch, 2 * per_epoch)
    rates = result["rates"]
    assert len(rates) == 2 * per_epoch  # one rate per optimizer step
    assert rates[0] == 0.5 and rates[-1] == 0.01  # from initial_lr down to min_lr, exactly
    assert all(a > b for a, b in itertools.pairwise(rates))  # never restarting


def test_auto_outside_a_learner_asks_for_the_step_count():
    config = CosineAnnealingLrSchedulerConfig(initial_lr=0.5, num_iters="auto")
    with pytest.raises(ConfigError, match=r"num_iters='auto'.*init\(total_steps=N\)"):
        config.init()
    scheduler = config.init(total_steps=4)
    assert [scheduler.step() for _ in range(4)][-1] == 0.0
