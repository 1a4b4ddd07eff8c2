"""Device values on their way to the host, without stalling the loop.

The loop reads few things from an accelerator: metric values, the loss guard's
finiteness, checkpoint snapshots. Each read goes through this module. A `HostCopies`
launches non-blocking copies into pinned host buffers it reuses, and records a CUDA
event after them; a `Transfer` reports `ready()` once the event has passed
(`event.query()`, which never blocks), and `values()` then reads the buffers without
waiting. Only `values()` on a transfer still under way waits (one
`event.synchronize()` for everything launched before it on that stream).

Tensors already on the CPU are read at once. On an accelerator other than CUDA the
copy is a plain blocking one.

Three small functions are the seam a test replaces to drive a whole run on the CPU as
if its tensors lived on an accelerator, counting every wait: `on_host`,
`host_buffer` and `record_event`.
"""

from __future__ import annotations

import collections
import contextlib
from typing import Any, Generic, Iterator, Protocol, Sequence, TypeVar

import torch
from torch import Tensor

_at_once = 0


@contextlib.contextmanager
def at_once() -> Iterator[None]:
    """Within: checks that could wait for their values read them now (the first batch
    of a run, whose problems must stop it before the first optimizer step)."""
    global _at_once
    _at_once += 1
    try:
        yield
    finally:
        _at_once -= 1


def wanted_at_once() -> bool:
    """True inside `at_once()`."""
    return _at_once > 0


class Event(Protocol):
    """What a transfer needs of a CUDA event."""

    def query(self) -> bool: ...

    def synchronize(self) -> None: ...


def on_host(tensor: Tensor) -> bool:
    """True when reading `tensor` costs no wait (it lives in host memory)."""
    return tensor.device.type == "cpu"


def host_buffer(size: int, dtype: torch.dtype, device: torch.device) -> Tensor:
    """A host buffer for copies from `device`: page-locked for CUDA (the target of
    non-blocking copies), plain otherwise."""
    return torch.empty(size, dtype=dtype, pin_memory=device.type == "cuda")


def record_event(device: torch.device) -> Event | None:
    """An event marking the work queued so far on `device`'s current stream; None when
    the device has none (copies from it were blocking)."""
    if device.type != "cuda":
        return None
    event = torch.cuda.Event()
    event.record(torch.cuda.current_stream(device))
    return event


class Transfer:
    """Tensors copied (or being copied) to the host by `HostCopies.launch`."""

    def __init__(
        self,
        owner: HostCopies,
        results: list[Any],
        pending: list[tuple[list[int], list[torch.Size], Tensor, Any]],
        events: list[Event],
        scalars: bool = False,
    ) -> None:
        self._owner = owner
        self._scalars = scalars
        self._results = results
        self._pending = pending
        self._events = events

    def ready(self) -> bool:
        """True when every copy is done (never waits)."""
        return all(event.query() for event in self._events)

    def values(self) -> list[Any]:
        """The values, in the order given to `launch`: a float or int per 0-d tensor,
        nested lists for others, numbers as given. Waits if the copies are still
        under way."""
        if self._pending:
            for event in reversed(self._events):  # the last one covers those before it
                if not event.query():
                    event.synchronize()
                    break
            for indexes, shapes, buffer, key in self._pending:
                flat = buffer.tolist()
                start = 0
                for index, shape in zip(indexes, shapes):
                    count = shape.numel()
                    chunk = flat[start : start + count]
                    start += count
                    scalar = self._scalars or not shape
                    self._results[index] = chunk[0] if scalar else _nest(chunk, shape)
                self._owner.give_back(key, buffer)
            self._pending = []
            self._events = []
        return self._results


_About = TypeVar("_About")


class InFlight(Generic[_About]):
    """Transfers on their way to the host, each with what it is about, oldest first."""

    def __init__(self) -> None:
        self._queue: collections.deque[tuple[_About, Transfer]] = collections.deque()

    def __bool__(self) -> bool:
        return bool(self._queue)

    def add(self, about: _About, transfer: Transfer) -> None:
        self._queue.append((about, transfer))

    def waiting(self) -> list[_About]:
        """What the transfers not yet read are about, oldest first."""
        return [about for about, _ in self._queue]

    def arrived(self, wait: bool = False) -> Iterator[tuple[_About, list[Any]]]:
        """The transfers done, oldest first, with their values (`wait`: all of them,
        waiting once for the newest: its copies were queued after the others')."""
        if wait and self._queue:
            self._queue[-1][1].values()
        while self._queue and (wait or self._queue[0][1].ready()):
            about, transfer = self._queue.popleft()
            yield about, transfer.values()


def _nest(flat: list[Any], shape: torch.Size) -> list[Any]:
    if len(shape) == 1:
        return flat
    step = len(flat) // shape[0]
    return [_nest(flat[i * step : (i + 1) * step], shape[1:]) for i in range(shape[0])]


class HostCopies:
    """Launches copies of device tensors into reused pinned host buffers.

    Buffers are kept per device and dtype and handed out again once a transfer's
    values were read, so a run allocates its pinned memory once."""

    def __init__(self) -> None:
        self._free: dict[tuple[torch.device, torch.dtype], list[Tensor]] = {}

    def launch(self, values: Sequence[Any], scalars: bool = False) -> Transfer:
        """Start moving `values` (tensors and plain numbers) to the host (`scalars`:
        every tensor holds one number, read as that number whatever its shape)."""
        results: list[Any] = list(values)
        groups: dict[tuple[torch.device, torch.dtype], list[int]] = {}
        for index, value in enumerate(values):
            if isinstance(value, Tensor):
                if on_host(value):
                    scalar = scalars or value.dim() == 0
                    results[index] = value.item() if scalar else value.tolist()
                else:
                    groups.setdefault((value.device, value.dtype), []).append(index)
        pending: list[tuple[list[int], list[torch.Size], Tensor, Any]] = []
        devices: list[torch.device] = []
        for key, indexes in groups.items():
            device = key[0]
            parts = [values[i].detach() for i in indexes]
            shapes = [part.shape for part in parts]
            flat = (
                torch.cat([part.reshape(-1) for part in parts])
                if len(parts) > 1 or parts[0].dim() != 1
                else parts[0]
            )
            buffer = self._take(key, flat.numel())
            buffer.copy_(flat, non_blocking=True)
            pending.append((indexes, shapes, buffer, key))
            if device not in devices:
                devices.append(device)
        events = [event for event in map(record_event, devices) if event is not None]
        return Transfer(self, results, pending, events, scalars)

    def _take(self, key: tuple[torch.device, torch.dtype], size: int) -> Tensor:
        device, dtype = key
        free = self._free.setdefault(key, [])
        for index, buffer in enumerate(free):
            if buffer.numel() >= size:
                return free.pop(index)[:size]
        return host_buffer(max(size, 64), dtype, device)[:size]

    def give_back(self, key: tuple[torch.device, torch.dtype], view: Tensor) -> None:
        """A read transfer's buffer is free again (its whole storage, not the view)."""
        base = view._base if view._base is not None else view
        self._free.setdefault(key, []).append(base)
