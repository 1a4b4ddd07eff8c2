"""What a fit tells the outside: listeners get frozen events (`ember.train.events`),
callbacks get their hooks, with the context updated first (`FitEvents`).

`EndEpoch` reaches the listeners after the epoch's checkpoint is written: a listener
whose state changes then (or that changes the learning-rate schedule's) makes a
decision no checkpoint holds, so a resumed run would not end like a straight one.
`FitEvents.end_epoch` compares their `state_dict()` (and the schedule's) before and
after each listener and says so once per run, naming that listener and the callback
hook that runs before the checkpoint."""

from __future__ import annotations

import logging
from typing import Any, Mapping, Sequence

import torch

from ember.train.callbacks.base import Callbacks
from ember.train.events import EndEpoch, Event

log = logging.getLogger("ember.train.learner")  # the run's own log, as the loop's


class FitEvents:
    """The run's listeners and callbacks, as the loop reaches them."""

    def __init__(self, listeners: Sequence[Any], callbacks: Callbacks | None) -> None:
        self.listeners = tuple(listeners)
        self.callbacks = callbacks
        self.any_listener = bool(self.listeners)
        self.watch_end_epoch = self.any_listener
        """Whether a listener's state is still compared around `EndEpoch` (until the
        first change is reported)."""

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

    def values(self, values: Mapping[str, Mapping[str, float]]) -> None:
        """The values of the epoch or validation that just ended, for the next hooks."""
        if self.callbacks is not None:
            self.callbacks.update(values={split: dict(v) for split, v in values.items()})

    def end_epoch(self, event: EndEpoch, schedule: Any) -> None:
        """Send `EndEpoch` (after the epoch's checkpoint); the first listener that changes
        its own state, or the learning-rate `schedule`'s, meanwhile is reported once,
        by its name: it is the one to move."""
        if not self.watch_end_epoch:
            self.emit(event)
            return
        if not callable(getattr(schedule, "state_dict", None)) or any(
            schedule is listener for listener in self.listeners
        ):
            schedule = None  # (a schedule that listens is watched as a listener)
        for listener in self.listeners:
            if not self.watch_end_epoch:
                listener.on_event(event)
                continue
            own = callable(getattr(listener, "state_dict", None))
            before = snapshot(listener.state_dict()) if own else None
            rate = snapshot(schedule.state_dict()) if schedule is not None else None
            listener.on_event(event)
            name = f"The listener {type(listener).__name__}"
            if own and not same_state(before, listener.state_dict()):
                self._report(f"{name} changed its state (state_dict)", event.epoch)
            elif schedule is not None and not same_state(rate, schedule.state_dict()):
                what = f"the learning-rate schedule {type(schedule).__name__}"
                self._report(f"{name} changed the state of {what} (its state_dict)", event.epoch)

    def _report(self, change: str, epoch: int) -> None:
        """Say once that a listener made a decision no checkpoint holds."""
        self.watch_end_epoch = False
        log.warning(
            "%s when the listeners received EndEpoch of epoch %d, which comes after the "
            "epoch's checkpoint: the checkpoint does not hold that change, so a run resumed "
            "from it would not end like one never stopped. Make the decision in a callback's "
            "on_epoch_end (LearnerBuilder.callback), which runs before the checkpoint and sees "
            "the epoch's values in ctx.values.",
            change,
            epoch,
        )

    def epochs(self, num_epochs: int) -> None:
        """The run's epoch count (raised when a length in steps runs on)."""
        if self.callbacks is not None:
            self.callbacks.update(num_epochs=num_epochs)


def snapshot(state: Any) -> Any:
    """A copy of a `state_dict()` that later changes to the live one cannot reach."""
    if isinstance(state, torch.Tensor):
        return state.detach().clone()
    if isinstance(state, Mapping):
        return {key: snapshot(value) for key, value in state.items()}
    if isinstance(state, (list, tuple)):
        return [snapshot(value) for value in state]
    return state


def same_state(saved: Any, state: Any) -> bool:
    """Whether `state` equals the `snapshot` `saved` (tensors exactly)."""
    if isinstance(saved, torch.Tensor) or isinstance(state, torch.Tensor):
        return (
            isinstance(saved, torch.Tensor)
            and isinstance(state, torch.Tensor)
            and saved.shape == state.shape
            and saved.dtype == state.dtype
            and torch.equal(saved, state.detach().to(saved.device))
        )
    if isinstance(saved, Mapping):
        return (
            isinstance(state, Mapping)
            and saved.keys() == state.keys()
            and all(same_state(saved[key], state[key]) for key in saved)
        )
    if isinstance(saved, list):
        return (
            isinstance(state, (list, tuple))
            and len(saved) == len(state)
            and all(same_state(a, b) for a, b in zip(saved, state))
        )
    try:
        return bool(saved == state)
    except Exception:
        return False
