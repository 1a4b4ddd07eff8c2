"""`Config`: typed, validated experiment settings saved as pretty JSON."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Sequence, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

from ember.errors import ConfigError

C = TypeVar("C", bound="Config")


class Config(BaseModel):
    """Base class of ember configs: pydantic fields with defaults, nested configs,
    unknown keys refused. `save`/`load` use pretty JSON; `with_` returns a
    validated copy; `str(config)` is the JSON."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, frozen=False)

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write the config as indented JSON (atomically) and return the path."""
        from ember.record import atomic_write_bytes

        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(target, (self.to_json() + "\n").encode("utf-8"))
        return target

    def to_json(self) -> str:
        return self.model_dump_json(indent=2)

    @classmethod
    def load(cls: type[C], path: str | os.PathLike[str]) -> C:
        """Read a config saved with `save`; errors name the file and the field."""
        source = Path(path)
        try:
            data = source.read_bytes()
        except FileNotFoundError:
            raise ConfigError(f"{source}: no such config file.") from None
        except OSError as error:
            raise ConfigError(f"{source}: cannot read the config file ({error}).") from None
        return cls._from_bytes(data, str(source))

    @classmethod
    def load_binary(cls: type[C], data: bytes | str) -> C:
        """Read a config from JSON bytes (e.g. embedded in a record)."""
        raw = data.encode("utf-8") if isinstance(data, str) else bytes(data)
        return cls._from_bytes(raw, "<bytes>")

    @classmethod
    def from_dict(cls: type[C], values: dict[str, Any], source: str = "<dict>") -> C:
        """Validate a plain dict; errors name the field and `source`."""
        try:
            return cls.model_validate(values)
        except ValidationError as error:
            raise ConfigError(_describe(cls, error, source)) from None

    @classmethod
    def _from_bytes(cls: type[C], data: bytes, source: str) -> C:
        try:
            values = json.loads(data.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as error:
            raise ConfigError(f"{source}: not valid JSON ({error}).") from None
        if not isinstance(values, dict):
            raise ConfigError(
                f"{source}: expected a JSON object for {cls.__name__}, "
                f"found {type(values).__name__}."
            )
        return cls.from_dict(values, source)

    def with_(self: C, **changes: Any) -> C:
        """A validated copy with some fields changed (nested configs may be given as dicts)."""
        values = self.model_dump()
        for key in changes:
            if key not in type(self).model_fields:
                raise ConfigError(_unknown(type(self), key, "with_()"))
        values.update(
            {k: (v.model_dump() if isinstance(v, BaseModel) else v) for k, v in changes.items()}
        )
        return type(self).from_dict(values, f"{type(self).__name__}.with_()")

    def with_args(self: C, args: Sequence[str]) -> C:
        """A validated copy with fields set from command-line style arguments:
        `--num-epochs 2`, `--learning-rate=3e-4`, `--model.hidden-size 256`."""
        changes: dict[str, Any] = {}
        items = list(args)
        index = 0
        while index < len(items):
            flag = items[index]
            if not flag.startswith("--") or flag == "--":
                raise ConfigError(f"Unexpected argument {flag!r}: expected --field value.")
            if "=" in flag:
                key, value = flag[2:].split("=", 1)
                index += 1
            else:
                if index + 1 >= len(items):
                    raise ConfigError(f"{flag} needs a value, e.g. {flag} 2.")
                key, value = flag[2:], items[index + 1]
                index += 2
            _set_path(changes, type(self), key.replace("-", "_").split("."), value)
        values = _merge(self.model_dump(), changes)
        return type(self).from_dict(values, "command line")

    def __str__(self) -> str:
        return self.to_json()


def _set_path(changes: dict[str, Any], cls: type[BaseModel], path: list[str], value: str) -> None:
    head, rest = path[0], path[1:]
    if head not in cls.model_fields:
        raise ConfigError(_unknown(cls, head, "command line"))
    if not rest:
        changes[head] = value
        return
    annotation = cls.model_fields[head].annotation
    if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
        raise ConfigError(f"command line: field {head!r} of {cls.__name__} has no sub-fields.")
    _set_path(changes.setdefault(head, {}), annotation, rest, value)


def _merge(base: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in changes.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def _unknown(cls: type[BaseModel], key: str, source: str) -> str:
    import difflib

    fields = list(cls.model_fields)
    close = difflib.get_close_matches(key, fields, n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    return (
        f"{source}: unknown field {key!r} for {cls.__name__}.{hint} "
        f"Known fields: {', '.join(fields)}."
    )


def _describe(cls: type[BaseModel], error: ValidationError, source: str) -> str:
    """One message listing every problem, each naming the field path."""
    problems = []
    for item in error.errors():
        location = ".".join(str(part) for part in item["loc"]) or "<root>"
        kind = item["type"]
        if kind == "extra_forbidden":
            problems.append(f"unknown field {location!r} (remove it or check its spelling)")
        elif kind == "missing":
            problems.append(f"missing required field {location!r}")
        else:
            given = item.get("input")
            problems.append(f"field {location!r}: {item['msg']} (got {given!r})")
    listing = "; ".join(problems)
    return f"{source}: invalid {cls.__name__}: {listing}."
