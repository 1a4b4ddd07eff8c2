"""Writing checkpoints in a background thread, so the loop pays only for a CPU snapshot."""

from __future__ import annotations

import copy
import threading
from typing import Any, Callable

import torch


def snapshot(tree: Any) -> Any:
    """A deep copy of a state tree with every tensor copied to the CPU, detached."""
    # Imported here: `import ember.train` stays free of ember.record (and msgpack).
    from ember.record.tree import map_tensors

    return map_tensors(tree, _to_cpu, copy.deepcopy)


def _to_cpu(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.detach().to("cpu", copy=True)


class AsyncWriter:
    """Runs one write job at a time in a daemon thread.

    `submit` waits for the previous job first (back-pressure: at most one pending
    checkpoint). A failed job's exception is raised by the next `submit` or `wait`,
    so the loop stops with the message instead of losing it.
    """

    def __init__(self) -> None:
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def submit(self, job: Callable[[], None]) -> None:
        self.wait()

        def run() -> None:
            try:
                job()
            except BaseException as error:  # surfaced on the loop's thread
                self._error = error

        self._thread = threading.Thread(target=run, name="ember-checkpoint", daemon=True)
        self._thread.start()

    @property
    def failed(self) -> bool:
        """Whether a finished job failed (its error is raised by the next `wait`)."""
        return self._error is not None

    def wait(self) -> None:
        """Block until the pending job is done; re-raise its error if it failed."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            error, self._error = self._error, None
            raise error
