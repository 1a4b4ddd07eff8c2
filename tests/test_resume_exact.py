"""Stopping a run mid-epoch (SIGTERM, the interrupter) and resuming it is exact."""

from __future__ import annotations

import pytest
import torch
from ember_testing import assert_same_state, final_weights, stopped_and_resumed

from ember.train.logger import read_metric_log


@pytest.mark.parametrize(
    "options",
    [(), ("--workers", "2"), ("--accumulation", "3")],
    ids=["plain", "workers", "accumulation"],
)
def test_sigterm_mid_epoch_then_resume_latest_equals_an_uninterrupted_run(
    tmp_path, options, request
):
    reference = None if options else request.getfixturevalue("blob_straight")
    straight, resumed = stopped_and_resumed(tmp_path, *options, straight=reference)
    assert_same_state(final_weights(straight), final_weights(resumed))
    # the resumed epoch's logs continue where they stopped: same lines as the straight run
    for split, name in (("train", "Loss.log"), ("train", "Accuracy.log"), ("valid", "Loss.log")):
        for epoch in (1, 2, 3):
            assert read_metric_log(straight / split / f"epoch-{epoch}" / name) == read_metric_log(
                resumed / split / f"epoch-{epoch}" / name
            ), (
                split,
                epoch,
                name,
            )


@pytest.mark.slow
def test_a_run_with_an_ema_resumes_exactly_its_weights_its_ema_and_its_gradient_norms(tmp_path):
    """EMA (validating on the averaged weights) and GradNormMetric keep their state in the
    checkpoint: a run stopped by SIGTERM mid-epoch and resumed ends like one never stopped."""
    straight, resumed = stopped_and_resumed(tmp_path, "--ema")
    for name in ("final", "ema"):
        assert_same_state(final_weights(straight, name), final_weights(resumed, name))
    ema, final = final_weights(straight, "ema"), final_weights(straight)
    assert not all(torch.equal(ema[key], final[key]) for key in final)  # an average, not a copy
    for split, name in (("train", "Grad_Norm.log"), ("valid", "Loss.log")):
        for epoch in (1, 2, 3):
            lines = read_metric_log(straight / split / f"epoch-{epoch}" / name)
            assert lines and lines == read_metric_log(resumed / split / f"epoch-{epoch}" / name), (
                split,
                epoch,
                name,
            )
