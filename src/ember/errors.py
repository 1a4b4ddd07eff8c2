"""ember's exceptions: every error a user can act on derives from `EmberError`."""

from __future__ import annotations


class EmberError(Exception):
    """Base class of every error ember raises on purpose."""


class ConfigError(EmberError, ValueError):
    """A configuration value is missing, misspelled or of the wrong type."""


class RecordError(EmberError):
    """A record file cannot be read or does not fit its target."""


class RunRecordError(EmberError):
    """A record of a run (its history, sessions or hyperparameters) is damaged or missing:
    the message names the file, the line where it applies, and the fix."""

    problem: str | None = None
    """What is wrong, without the file and the fix ("line 7: ..."), when it is known."""
    path: object = None
    """The damaged or missing file (a `pathlib.Path`), when it is known."""


class TrainingError(EmberError):
    """The learner was set up wrongly or training cannot continue."""


class DatasetError(EmberError):
    """A dataset is missing, corrupt or malformed."""
