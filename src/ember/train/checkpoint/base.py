"""The checkpointer protocol: where a run's checkpoints go and come back from.

A checkpoint of an epoch has three parts: `model` (the module's state), `optim` (the
optimizer's state) and `scheduler` (a state tree: the learning-rate schedule, the loop
position, random generator states). The run's checkpoint policy (`policy.py`) decides
when to save, what to keep and what to resume; a checkpointer only stores. A new
storage (memory, object store, another format) is one class with these methods,
passed to `LearnerBuilder.with_checkpointer(...)`.
"""

from __future__ import annotations

from typing import Any, Callable, Protocol, runtime_checkable

PARTS = ("model", "optim", "scheduler")


@runtime_checkable
class Checkpointer(Protocol):
    def save(
        self,
        epoch: int,
        model: Any,
        optimizer: Any,
        state: dict[str, Any],
        *,
        on_saved: Callable[[list[str]], None] | None = None,
    ) -> None:
        """Store the three parts of `epoch`. Take what is needed from `model` and
        `optimizer` before returning (training goes on and changes them); the write may
        finish later, in another thread, which then calls `on_saved(names written)`.

        A checkpointer may also take `before_write`, a function to call once the parts
        are taken and before the write starts: a checkpoint inside an epoch then writes
        the metric lines it counts while its own snapshot is taken, in the one wait
        for both. What it returns (a dict, or None) is added to `state` before the
        write: what is known only once the lines are written (each log's last check).
        One without it gets the lines written before `save` is called."""
        ...

    def load(self, epoch: int, part: str, target: Any) -> Any:
        """Load a part of `epoch` into `target` (a module or an optimizer) and return
        it; with `target=None`, return the stored state tree."""
        ...

    def epochs(self) -> list[int]:
        """The epochs with a complete checkpoint, oldest first."""
        ...

    def latest(self) -> int | None:
        """The newest complete checkpoint's epoch, or None."""
        ...

    def delete(self, epoch: int) -> None:
        """Remove every part of `epoch` (missing parts are fine)."""
        ...

    def wait(self) -> None:
        """Block until every pending write is done; raise its error if one failed."""
        ...

    @property
    def failed(self) -> bool:
        """A write failed in the background (`wait()` raises its error)."""
        ...

    def location(self, epoch: int) -> str:
        """Where the checkpoint of `epoch` is, for messages (e.g. a file path)."""
        ...
