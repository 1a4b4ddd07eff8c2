"""What a run records about itself beside its metrics: hyperparameters and sessions.

- `hparams.json`: the hyperparameters given to `LearnerBuilder.hparams(...)` (a dict,
  a dataclass or a pydantic model such as an ember `Config`), as indented JSON.
  Values must be JSON values (str, int, float, bool, None, lists and nested
  mappings); `pathlib` paths become their text and enums their value. Anything
  else is refused when the builder is called, naming the key and the fix.
- `sessions.json`: when each `fit` of the run started and ended (a resumed run adds
  a session), and how it ended; `ember compare` sums them into the run's wall time.

Both are written atomically; their paths belong to `artifacts.py`.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import logging
import math
import os
import time
from pathlib import PurePath
from typing import Any, Mapping

from ember.errors import ConfigError, EmberError
from ember.train.files.artifacts import Artifacts

log = logging.getLogger(__name__)
SESSIONS_FORMAT = "ember-sessions"
SESSIONS_VERSION = 1


# Hyperparameters ---------------------------------------------------------------------
def to_hparams(value: Any) -> dict[str, Any]:
    """`value` (a mapping, a dataclass instance or a pydantic model) as a JSON-ready
    dict; a value JSON cannot hold is a `ConfigError` naming its key."""
    if isinstance(value, type):
        raise ConfigError(
            f"hparams() got the class {value.__name__}: pass an instance of it (a dict, a "
            "dataclass or a pydantic model such as an ember Config)."
        )
    data = _as_mapping(value)
    if data is None:
        raise ConfigError(
            f"hparams() takes a dict, a dataclass or a pydantic model (e.g. an ember Config), "
            f"not {type(value).__name__}."
        )
    return _mapping(data, "")


def _as_mapping(value: Any) -> Mapping[Any, Any] | None:
    if isinstance(value, Mapping):
        return value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {field.name: getattr(value, field.name) for field in dataclasses.fields(value)}
    dump = getattr(value, "model_dump", None)  # pydantic v2 models, ember Configs included
    if callable(dump):
        return dump(mode="json")
    return None


def _mapping(data: Mapping[Any, Any], prefix: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, item in data.items():
        if not isinstance(key, str):
            raise ConfigError(
                f"hparams: the key {prefix}{key!r} is a {type(key).__name__}; JSON keys are "
                "text: use str keys."
            )
        out[key] = _value(item, f"{prefix}{key}")
    return out


def _value(item: Any, where: str) -> Any:
    if item is None or isinstance(item, (bool, str, int)):
        return item
    if isinstance(item, float):
        if not math.isfinite(item):
            raise ConfigError(
                f"hparams: {where} is {item!r}, which JSON cannot hold: give a finite number "
                "or a string."
            )
        return item
    if isinstance(item, enum.Enum):
        return _value(item.value, where)
    if isinstance(item, PurePath):
        return str(item)
    if isinstance(item, (list, tuple)):
        return [_value(element, f"{where}[{index}]") for index, element in enumerate(item)]
    nested = _as_mapping(item)
    if nested is not None:
        return _mapping(nested, f"{where}.")
    if hasattr(item, "item") and getattr(item, "ndim", None) == 0:  # a numpy or torch scalar
        return _value(item.item(), where)
    raise ConfigError(
        f"hparams: {where} is a {type(item).__name__} ({_short(item)}), which JSON cannot "
        f"hold. Give a str, number, bool, None, list or dict (str(value) for the text of "
        "an object), or leave it out."
    )


def _short(item: Any) -> str:
    text = repr(item)
    return text if len(text) <= 60 else text[:57] + "..."


def flatten_hparams(hparams: Mapping[str, Any]) -> dict[str, Any]:
    """Nested mappings as dotted keys (`model.width`); lists stay values."""
    flat: dict[str, Any] = {}

    def walk(data: Mapping[str, Any], prefix: str) -> None:
        for key, value in data.items():
            if isinstance(value, Mapping) and value:
                walk(value, f"{prefix}{key}.")
            else:
                flat[f"{prefix}{key}"] = value

    walk(hparams, "")
    return flat


def hparams_text(hparams: Mapping[str, Any]) -> str:
    """One line of JSON, for `experiment.log`."""
    return json.dumps(hparams, separators=(", ", ": "))


def write_hparams(artifacts: Artifacts, hparams: Mapping[str, Any]) -> list[str]:
    """Write `hparams.json` (atomically); returns the keys whose value differs from a
    file already there (a resumed run given other hyperparameters)."""
    from ember.record.atomic import atomic_write_bytes  # ember.record loads msgpack

    changed: list[str] = []
    previous = read_hparams(artifacts.root) if artifacts.hparams.exists() else None
    if previous is not None:
        old, new = flatten_hparams(previous), flatten_hparams(hparams)
        changed = sorted(k for k in old.keys() | new.keys() if old.get(k) != new.get(k))
    text = json.dumps(dict(hparams), indent=2, allow_nan=False) + "\n"
    artifacts.root.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(artifacts.hparams, text.encode("utf-8"))
    return changed


def read_hparams(directory: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The hyperparameters of the run in `directory`; None when it recorded none."""
    path = Artifacts(directory).hparams
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as error:
        raise EmberError(f"{path} cannot be read ({error}).") from None
    if not isinstance(data, dict):
        raise EmberError(f"{path} does not hold a JSON object of hyperparameters.")
    return data


def record_start(
    artifacts: Artifacts, start_epoch: int, resumed: bool, hparams: Mapping[str, Any] | None
) -> None:
    """At the start of a `fit` (rank 0): write `hparams.json`, describe the
    hyperparameters in `experiment.log`, and open a session in `sessions.json`."""
    if hparams is not None:
        changed = write_hparams(artifacts, hparams)
        log.info("Hyperparameters: %s", hparams_text(hparams))
        if changed:
            log.warning(
                "The hyperparameters differ from those the run was started with (%s): "
                "hparams.json now holds this run's.",
                ", ".join(changed),
            )
    start_session(artifacts, start_epoch, resumed)


# Sessions -----------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Session:
    """One `fit` of a run: its start and end (Unix time), first epoch and outcome."""

    started: float
    start_epoch: int
    ended: float | None = None
    outcome: str | None = None


def read_sessions(directory: str | os.PathLike[str]) -> list[Session]:
    """The sessions of the run in `directory`, oldest first; none for a run written by
    an ember that did not record them."""
    path = Artifacts(directory).sessions
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return []
    except (OSError, ValueError) as error:
        raise EmberError(f"{path} cannot be read ({error}).") from None
    if not isinstance(data, dict) or data.get("format") != SESSIONS_FORMAT:
        raise EmberError(f"{path} is not an ember sessions file.")
    try:
        return [
            Session(
                float(entry["started"]),
                int(entry["start_epoch"]),
                None if entry.get("ended") is None else float(entry["ended"]),
                entry.get("outcome"),
            )
            for entry in data["sessions"]
        ]
    except (KeyError, TypeError, ValueError) as error:
        raise EmberError(f"{path}: malformed sessions file ({error!r}).") from None


def _write_sessions(artifacts: Artifacts, sessions: list[Session]) -> None:
    from ember.record.atomic import atomic_write_bytes

    data = {
        "format": SESSIONS_FORMAT,
        "version": SESSIONS_VERSION,
        "sessions": [dataclasses.asdict(session) for session in sessions],
    }
    atomic_write_bytes(artifacts.sessions, (json.dumps(data, indent=1) + "\n").encode("utf-8"))


def start_session(artifacts: Artifacts, start_epoch: int, resumed: bool) -> None:
    """A `fit` starts at `start_epoch` (a fresh run starts the file again)."""
    sessions = read_sessions(artifacts.root) if resumed else []
    _write_sessions(artifacts, [*sessions, Session(time.time(), start_epoch)])


def end_session(artifacts: Artifacts, outcome: str) -> None:
    """The last `fit` ended with `outcome`."""
    sessions = read_sessions(artifacts.root)
    if sessions and sessions[-1].ended is None:
        last = sessions[-1]
        sessions[-1] = Session(last.started, last.start_epoch, time.time(), str(outcome))
        _write_sessions(artifacts, sessions)


def wall_time(sessions: list[Session], running: bool, last_write: float | None) -> float | None:
    """Seconds spent in `fit` over every session. An unfinished last session counts
    until now when the run is `running`, else until `last_write` (the last time the
    run wrote its history: it was killed after that); None without sessions."""
    if not sessions:
        return None
    total = 0.0
    for index, session in enumerate(sessions):
        end = session.ended
        last = index == len(sessions) - 1
        if end is None:
            if running and last:
                end = time.time()
            else:  # killed: it wrote last at `last_write`, before the next session began
                end = last_write if last_write is not None else session.started
                if not last:
                    end = min(end, sessions[index + 1].started)
        total += max(0.0, end - session.started)
    return total
