"""Where a run resumes: the checkpoint `resume_from` chooses ("latest" and "auto" skip
a damaged newest one, and say so), read into a `Resume`."""

from __future__ import annotations

from typing import Any

from ember.errors import TrainingError
from ember.train.checkpoint.base import PARTS, Checkpointer
from ember.train.length.position import Position


class Resume:
    """What a resumed run starts from: its position and the stored loop state."""

    def __init__(
        self,
        position: Position,
        state: dict[str, Any] | None = None,
        notes: list[str] | None = None,
        replace: bool = False,
    ) -> None:
        self.position = position
        self.state = state
        self.notes = notes or []
        """Warnings about the choice of checkpoint, logged once the run's log is open."""
        self.replace = replace
        """A fresh run of checkpoint("auto"): the logs of an earlier attempt that saved no
        checkpoint are replaced."""
        self.stream: dict[str, Any] | None = None
        """This process's random stream to go on from, when the column it runs was run
        by another process when the checkpoint was taken (`ColumnStreams`)."""

    def metric_states(self, dist: Any) -> list[dict[str, Any]]:
        """The whole-epoch metric states a mid-epoch checkpoint kept that this process
        takes back: its own rank's, or every rank's on rank 0 when the number of
        processes changed (the others then take none)."""
        if self.state is None:
            return []
        ranks = self.state["learner"].get("metric_states")
        if not ranks:
            return []
        if dist is None:
            return list(ranks)
        if len(ranks) == dist.world:
            return [ranks[dist.rank]]
        return list(ranks) if dist.main else []

    @property
    def log_lines(self) -> dict[str, int] | None:
        """Lines each training metric log had when a mid-epoch checkpoint was taken."""
        return None if self.state is None else self.state["learner"].get("log_lines")


def resume_point(checkpointer: Checkpointer | None, resume_from: int | str | None) -> Resume:
    """Where the run starts: after the checkpoint `resume_from` chooses, or epoch 1.
    "latest" is the newest checkpoint that loads: a damaged newer one is skipped, and
    said so."""
    if resume_from is None or checkpointer is None:
        return Resume(Position(1, fresh=True))
    notes: list[str] = []
    lead: list[str] = []
    if resume_from == "auto":
        if not checkpointer.epochs():
            where = f" in {checkpointer}"
            return Resume(
                Position(1, fresh=True),
                notes=[f"checkpoint('auto'): no checkpoint{where}, starting a fresh run."],
                replace=True,
            )
        lead.append(f"checkpoint('auto'): resuming the run in {checkpointer}.")
    if resume_from in ("latest", "auto"):
        epoch = None
        for candidate in reversed(checkpointer.epochs()):
            problem = damage(checkpointer, candidate)
            if problem is None:
                epoch = candidate
                break
            notes.append(
                f"The checkpoint of epoch {candidate} cannot be loaded ({problem}); "
                f"checkpoint({resume_from!r}) falls back to the one before it."
            )
        if epoch is None:
            raise TrainingError(
                f"checkpoint({resume_from!r}): no checkpoint loads. "
                + " ".join(notes or ["There is no complete checkpoint."])
                + " Start without checkpoint()."
            )
        if notes:
            notes.append(f"Resuming from the checkpoint of epoch {epoch}.")
    else:
        epoch = int(resume_from)
        problem = damage(checkpointer, epoch)
        if problem is not None:
            loadable = [e for e in checkpointer.epochs() if damage(checkpointer, e) is None]
            raise TrainingError(
                f"checkpoint({epoch}): the checkpoint cannot be loaded ({problem}). Epochs "
                f"that load: {', '.join(map(str, loadable)) or 'none'}."
            )
    state = checkpointer.load(epoch, "scheduler", None)
    return Resume(Position.from_state(state["learner"]), state, [*lead, *notes])


def damage(checkpointer: Checkpointer, epoch: int) -> str | None:
    """What is wrong with the checkpoint of `epoch` (every part is read), or None."""
    for part in PARTS:
        try:
            checkpointer.load(epoch, part, None)
        except Exception as error:
            return f"{type(error).__name__}: {error}"
    return None
