"""The values given to `LearnerBuilder`'s options: each one checked, in the form the
builder keeps. A value that cannot work is refused here, when the option is set."""

from __future__ import annotations

from typing import Any

import torch

from ember.errors import ConfigError
from ember.train.length.duration import Duration


def positive_int(value: Any, what: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ConfigError(f"{what} must be an int >= 1, got {value!r}.")
    return value


def duration_every(value: Any, what: str) -> Duration:
    """A cadence given as a `Duration` or its text, in steps, samples or tokens."""
    from ember.train.length.duration import FORMS

    hint = (
        f"{what} takes a number of optimizer steps, an int >= 1, or a duration in steps, "
        f"samples or tokens ({FORMS}), got {value!r}"
    )
    if isinstance(value, int) and not isinstance(value, bool):
        raise ConfigError(f"{hint}.")
    try:
        duration = Duration.parse(value, what)
    except ConfigError:
        raise ConfigError(f"{hint}.") from None
    if duration.unit == "epochs":
        raise ConfigError(
            f"{what}({str(value)!r}): every epoch end already does this; give steps, samples "
            "or tokens, e.g. '500steps' or '100k samples'."
        )
    return duration


def check_accumulation(steps: Any) -> None:
    """`grads_accumulation` takes an int or "auto" (the int is checked when kept)."""
    if isinstance(steps, str) and steps != "auto":
        raise ConfigError(
            f"grads_accumulation takes a number of batches (an int >= 1) or 'auto', got {steps!r}."
        )


def valid_cadence(every: Any) -> int | Duration:
    """`valid_every`'s value: optimizer steps (an int), or a duration in samples or tokens."""
    if isinstance(every, int) and not isinstance(every, bool) and every >= 1:
        return every
    duration = duration_every(every, "valid_every")
    if duration.unit == "steps":
        return duration.value
    return duration


def train_length(duration: Any) -> Duration:
    """`train_for`'s value as a `Duration` (an int is epochs)."""
    if isinstance(duration, int) and not isinstance(duration, bool):
        duration = Duration(epochs=positive_int(duration, "train_for"))
    return Duration.parse(duration, "train_for")


def batch_limit(limit: Any, split: str) -> int | float | None:
    """A checked `limit_batches` value: None, an int >= 1 or a float in (0, 1]."""
    if limit is None:
        return None
    if isinstance(limit, int) and not isinstance(limit, bool):
        if limit >= 1:
            return limit
        raise ConfigError(
            f"limit_batches({split}={limit!r}): a number of batches must be >= 1 (leave "
            f"{split} out, or None, to use every batch)."
        )
    if isinstance(limit, float):
        if 0.0 < limit <= 1.0:
            return limit
        raise ConfigError(
            f"limit_batches({split}={limit!r}): a fraction of the batches must be in (0, 1]; "
            f"for a number of batches give an int, e.g. limit_batches({split}=10)."
        )
    raise ConfigError(
        f"limit_batches({split}=...) takes an int (batches) or a float in (0, 1] (a fraction "
        f"of the loader's batches), got {type(limit).__name__} {limit!r}."
    )


def parse_devices(devices: Any, timeout: float) -> list[torch.device]:
    """`devices(...)`'s devices, each one on this machine, and a timeout > 0."""
    if isinstance(devices, (str, torch.device)):
        devices = [devices]
    if not devices:
        raise ConfigError("devices() needs at least one device, e.g. devices(['cpu']).")
    try:
        parsed = [torch.device(device) for device in devices]
    except (RuntimeError, TypeError) as error:
        raise ConfigError(f"devices(): {error}") from None
    if not timeout > 0:
        raise ConfigError(f"devices(timeout=...) must be > 0 seconds, got {timeout!r}.")
    for device in parsed:
        check_available(device)
    return parsed


def check_available(device: torch.device) -> None:
    """A device that this machine does not have is named at once, with those it has."""
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        names = ", ".join(["cpu", *(f"cuda:{index}" for index in range(count))])
        if count == 0:
            raise ConfigError(
                f"devices(): {device} is not available: torch sees no CUDA device on this "
                f"machine (torch {torch.__version__}). Devices here: {names}."
            )
        if device.index is not None and device.index >= count:
            raise ConfigError(
                f"devices(): {device} does not exist: this machine has {count} CUDA "
                f"device(s). Devices here: {names}."
            )
    elif device.type == "mps" and not torch.backends.mps.is_available():
        raise ConfigError(f"devices(): {device} is not available on this machine. Use 'cpu'.")


def checkpoint_error_policy(value: str) -> str:
    if value not in ("stop", "warn"):
        raise ConfigError(f"on_checkpoint_error must be 'stop' or 'warn', got {value!r}.")
    return value


def resume_point(epoch: Any, hyperparameters: str) -> int | str:
    """`checkpoint(...)`'s epoch: a number, "latest" or "auto"; and its hyperparameters
    policy: "checkpoint" or "new"."""
    if isinstance(epoch, str) and epoch not in ("latest", "auto"):
        hint = " (did you mean 'latest'?)" if epoch.lower() in ("last", "newest", "recent") else ""
        raise ConfigError(
            f"checkpoint() takes an epoch number, 'latest' or 'auto', got {epoch!r}{hint}."
        )
    if hyperparameters not in ("checkpoint", "new"):
        raise ConfigError(
            "checkpoint(hyperparameters=...) takes 'checkpoint' (the checkpoint's "
            f"optimizer settings win) or 'new' (this run's win), got {hyperparameters!r}."
        )
    return epoch if epoch in ("latest", "auto") else positive_int(epoch, "checkpoint")


def lr_monitor_split(split: str) -> str:
    if split not in ("train", "valid"):
        raise ConfigError(f"lr_monitor(split=...) takes 'train' or 'valid', got {split!r}.")
    return split


def summary_depth(depth: Any) -> int | None:
    """`model_summary`'s depth: an int >= 1, or None for no summary."""
    if depth is not None and (isinstance(depth, bool) or not isinstance(depth, int) or depth < 1):
        raise ConfigError(
            f"model_summary(depth=...) takes an int >= 1, or None for no summary; got {depth!r}."
        )
    return depth


def check_clipping(norm: Any, value: Any) -> None:
    """`grad_clipping`'s limits: each a number > 0, and at least one of them."""
    for name, limit in (("norm", norm), ("value", value)):
        if limit is not None and (not isinstance(limit, (int, float)) or not limit > 0):
            raise ConfigError(f"grad_clipping({name}=...) must be a number > 0, got {limit!r}.")
    if norm is None and value is None:
        raise ConfigError("grad_clipping() needs norm=... or value=....")


def nonfinite_policy(policy: str) -> str:
    if policy not in ("stop", "skip"):
        raise ConfigError(f"nonfinite_loss takes 'stop' or 'skip', got {policy!r}.")
    return policy


def every_in_steps_or_count(every: Any, steps: int | None) -> tuple[int | None, Duration | None]:
    """`checkpoint_every(every, steps=...)`: the optimizer steps (`every` in steps, or
    `steps`), and `every` when it is a count of samples or tokens."""
    if every is None:
        return steps, None
    duration = duration_every(every, "checkpoint_every")
    if duration.unit != "steps":
        return steps, duration
    if steps is not None:
        raise ConfigError(
            f"checkpoint_every({str(every)!r}, steps={steps!r}): give the optimizer steps once."
        )
    return duration.value, None


def checkpoint_interval(
    steps: int | None, minutes: float | None, count: Duration | None
) -> tuple[int | None, float | None]:
    """`checkpoint_every`'s optimizer steps and seconds (either may be None)."""
    from ember.train.length.cadence import positive_number

    if steps is None and minutes is None and count is None:
        raise ConfigError(
            "checkpoint_every() needs steps=N (optimizer steps) or minutes=M (wall time), "
            "or a duration in samples or tokens, e.g. checkpoint_every(minutes=30) or "
            "checkpoint_every('1M samples')."
        )
    every = None if steps is None else positive_int(steps, "checkpoint_every(steps=...)")
    seconds = (
        None if minutes is None else 60 * positive_number(minutes, "checkpoint_every(minutes=...)")
    )
    return every, seconds
