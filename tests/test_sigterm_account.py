"""A rank stopped by another rank's failure, killed by torchrun's SIGTERM while it is
still leaving the group, says why on standard error before it dies (the exit status
stays the signal's); once it has left the group, SIGTERM is the default again, and a
program's own SIGTERM handler is never replaced."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent(
    """
    import signal, sys, time
    import torch
    from ember.errors import TrainingError
    from ember.train.distributed.group import Distributed

    mode = sys.argv[1]
    if mode == "own-handler":
        signal.signal(signal.SIGTERM, lambda *args: (print("own handler", flush=True), sys.exit(3)))
    rank = Distributed(1, 2, 1, torch.device("cpu"), "gloo", prefix="[rank1]: ")
    rank.tell_on_sigterm(
        TrainingError("Training stopped because another rank failed. Rank 0 failed at epoch 1")
    )
    if mode == "left":
        rank.close(failed=True)
    print("ready", flush=True)
    time.sleep(60)
    """
)
ACCOUNT = (
    "[rank1]: ember.errors.TrainingError: Training stopped because another rank failed. "
    "Rank 0 failed at epoch 1\n"
)


def killed(mode: str) -> subprocess.CompletedProcess:
    process = subprocess.Popen(
        [sys.executable, "-c", SCRIPT, mode],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None
    assert process.stdout.readline() == "ready\n", process.communicate(timeout=30)
    process.send_signal(signal.SIGTERM)
    out, err = process.communicate(timeout=30)
    return subprocess.CompletedProcess(process.args, process.returncode, out, err)


@pytest.mark.parametrize(
    "mode, status, says",
    [
        ("leaving", -signal.SIGTERM, True),
        ("left", -signal.SIGTERM, False),
        ("own-handler", 3, False),
    ],
)
def test_sigterm_while_leaving_the_group_says_why(mode, status, says):
    run = killed(mode)
    assert run.returncode == status, run.stderr
    assert (ACCOUNT in run.stderr) is says, run.stderr
    if mode == "own-handler":
        assert run.stdout == "own handler\n"
