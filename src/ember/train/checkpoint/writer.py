"""Writing checkpoints in a background thread, so the loop pays only for a CPU snapshot."""

from __future__ import annotations

import copy
import itertools
import threading
from typing import Any, Callable

import torch

from ember.train import host


class Snapshots:
    """Copies state trees to the host for a background write, waiting once for them all.

    A tensor on an accelerator is copied without blocking into a pinned host buffer
    kept from the previous snapshot (reused while its shape and dtype stay the same,
    so a run allocates its pinned memory once: the size of the state); `wait()` then
    waits once per device for every copy (`ember.train.host`). A CPU tensor is copied
    plainly. The buffers are overwritten by the next snapshot: take it only once the
    write of the previous one is done.
    """

    def __init__(self) -> None:
        self._buffers: dict[tuple[str, int], torch.Tensor] = {}
        self._used: set[tuple[str, int]] = set()
        self._devices: list[torch.device] = []

    def take(self, part: str, tree: Any) -> Any:
        """A deep copy of `tree` (named `part` among the trees of one snapshot) with its
        tensors copied to the host; valid once `wait()` returns."""
        # Imported here: `import ember.train` stays free of ember.record (and msgpack).
        from ember.record.tree import map_tensors

        count = itertools.count()

        def to_host(tensor: torch.Tensor) -> torch.Tensor:
            tensor = tensor.detach()
            if host.on_host(tensor):
                return tensor.to("cpu", copy=True)
            key = (part, next(count))
            buffer = self._buffers.get(key)
            if buffer is None or buffer.shape != tensor.shape or buffer.dtype != tensor.dtype:
                flat = host.host_buffer(tensor.numel(), tensor.dtype, tensor.device)
                buffer = flat.view(tensor.shape)
                self._buffers[key] = buffer
            self._used.add(key)
            buffer.copy_(tensor, non_blocking=True)
            if tensor.device not in self._devices:
                self._devices.append(tensor.device)
            return buffer

        return map_tensors(tree, to_host, copy.deepcopy)

    def wait(self) -> None:
        """Wait for the copies of the trees taken since the last wait (once per device);
        free the buffers this snapshot did not use."""
        devices, self._devices = self._devices, []
        for event in map(host.record_event, devices):
            if event is not None:
                event.synchronize()
        for key in [key for key in self._buffers if key not in self._used]:
            del self._buffers[key]
        self._used = set()


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
