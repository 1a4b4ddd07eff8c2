"""What a fit tells the outside: listeners get frozen events (`ember.train.events`),
callbacks get their hooks, with the context updated first (`FitEvents`)."""

from __future__ import annotations

from typing import Any, Sequence

from ember.train.callbacks.base import Callbacks
from ember.train.events import Event


class FitEvents:
    """The run's listeners and callbacks, as the loop reaches them."""

    def __init__(self, listeners: Sequence[Any], callbacks: Callbacks | None) -> None:
        self.listeners = tuple(listeners)
        self.callbacks = callbacks
        self.any_listener = bool(self.listeners)

    def emit(self, event: Event) -> None:
        """Send `event` to every listener, in registration order."""
        for listener in self.listeners:
            listener.on_event(event)

    def hook(self, name: str, epoch: int) -> None:
        """Call a callback hook of the run's epochs and splits (none without callbacks)."""
        callbacks = self.callbacks
        if callbacks is not None and callbacks.has(name):
            callbacks.update(epoch=epoch)
            callbacks.call(name)

    def at(self, epoch: int, iteration: int) -> None:
        """The batch the next hooks belong to."""
        if self.callbacks is not None:
            self.callbacks.update(epoch=epoch, iteration=iteration)

    def output(self, output: Any) -> None:
        """The training step's output, which the backward hooks may read."""
        if self.callbacks is not None:
            self.callbacks.update(output=output)

    def epochs(self, num_epochs: int) -> None:
        """The run's epoch count (raised when a length in steps runs on)."""
        if self.callbacks is not None:
            self.callbacks.update(num_epochs=num_epochs)
