"""Preemptible machines: a signal that asks for a checkpoint and a requeue.

`LearnerBuilder.preemption(signal, requeue)` makes `signal` (SIGTERM or SIGUSR1, the one
a scheduler sends before it takes the machine back) stop the run at the next step
boundary with a checkpoint; the run ends `preempted` and exits with 128 + the signal
number (143 for SIGTERM, 138 for SIGUSR1). With `requeue=True` under SLURM
(`SLURM_JOB_ID` set), rank 0 then asks SLURM to queue the job again
(`scontrol requeue $SLURM_JOB_ID`); the new job resumes with `checkpoint("auto")`. A
run stopped by its time limit (`LearnerBuilder.max_time`) is requeued alike.
"""

from __future__ import annotations

import logging
import os
import signal as signals
import subprocess
from dataclasses import dataclass

from ember.errors import ConfigError

log = logging.getLogger(__name__)

SIGNALS = ("SIGTERM", "SIGUSR1")


@dataclass(frozen=True)
class Preemption:
    """The signal that means "you are about to be preempted", and whether to requeue."""

    signal: int
    requeue: bool = False

    @classmethod
    def parse(cls, signal: str, requeue: bool) -> Preemption:
        if signal not in SIGNALS:
            raise ConfigError(
                f"preemption(signal=...) takes {' or '.join(map(repr, SIGNALS))}, got {signal!r} "
                "(the signal your scheduler sends before it preempts the job; with SLURM, "
                "#SBATCH --signal=B:USR1@120 sends SIGUSR1 two minutes before)."
            )
        if not isinstance(requeue, bool):
            raise ConfigError(f"preemption(requeue=...) takes True or False, got {requeue!r}.")
        return cls(int(getattr(signals, signal)), requeue)

    @property
    def name(self) -> str:
        return signals.Signals(self.signal).name

    def after(self, unfinished: bool, main: bool) -> None:
        """The run ended: one preempted or stopped by its time limit (`unfinished`) is
        requeued under SLURM (rank 0 asks)."""
        if not (unfinished and self.requeue and main):
            return
        job = os.environ.get("SLURM_JOB_ID")
        if not job:
            log.warning(
                "preemption(requeue=True): SLURM_JOB_ID is not set, so no job is requeued; "
                "start the same command again to resume (checkpoint('auto'))."
            )
            return
        try:
            requeue_job(job)
        except Exception as error:
            log.error(
                "Requeuing SLURM job %s failed (%s: %s); the checkpoint is written: submit "
                "the job again to resume.",
                job,
                type(error).__name__,
                error,
            )
            return
        log.info("Requeued SLURM job %s (scontrol requeue).", job)


def requeue_job(job_id: str) -> None:
    """Ask SLURM to queue `job_id` again (`scontrol requeue`); raises when it fails.
    Tests replace this function."""
    subprocess.run(["scontrol", "requeue", job_id], check=True, capture_output=True, timeout=60)
