"""A run directory written by an earlier ember (`tests/fixtures/stopped-run/`, made by
`tests/scripts/resume_fixture.py`: stopped inside epoch 2 with a mid-epoch checkpoint,
validation points, an EMA and the gradient norm) resumes with today's code exactly as
a straight run of today's code ends: the same weights, the same metric files."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from ember_testing import assert_same_state, final_weights

from ember.train.logger import read_metric_log

FIXTURE = Path(__file__).parent / "fixtures" / "stopped-run"
sys.path.insert(0, str(Path(__file__).parent / "scripts"))

from resume_fixture import run  # noqa: E402


def test_a_run_stopped_by_an_earlier_version_resumes_exactly_like_a_straight_run(tmp_path):
    resumed = tmp_path / "resumed"
    shutil.copytree(FIXTURE, resumed)
    learner = run(resumed, resume=True)
    assert learner.outcome == "completed"
    assert learner.epoch == 3
    straight = tmp_path / "straight"
    assert run(straight).outcome == "completed"
    assert_same_state(final_weights(straight), final_weights(resumed))
    logs = sorted(path.relative_to(straight) for path in straight.glob("*/epoch-*/**/*.log"))
    assert len(logs) == 3 * 3 + 3 * 2 + 3 * 2 * 2  # train, valid epoch ends, 2 points an epoch
    for relative in logs:
        assert read_metric_log(straight / relative) == read_metric_log(resumed / relative), relative
    history = [(epoch, values) for epoch, values in learner.history]
    assert [epoch for epoch, _ in history] == [1, 2, 3]
