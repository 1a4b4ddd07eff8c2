"""`Config`: typed, validated experiment settings saved as pretty JSON."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Sequence, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

from ember.config_cli import _describe, _help, _model_values, _parse_args, _unknown
from ember.durable import atomic_write_bytes
from ember.errors import ConfigError

C = TypeVar("C", bound="Config")


class Config(BaseModel):
    """Base class of ember configs: pydantic fields with defaults, nested configs,
    unknown keys refused. `save`/`load` use pretty JSON; `with_` returns a
    validated copy; `str(config)` is the JSON."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, frozen=False)

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write the config as indented JSON (atomically) and return the path."""
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
        """A validated copy with fields set from command-line arguments, argparse style.

        - `--num-epochs 2` or `--learning-rate=3e-4`; nested fields are dotted:
          `--model.hidden-size 256` (a `-` in a name stands for `_`).
        - A list field takes its values one after another, `--layers 64 128`, or one
          JSON array, `--layers '[64, 128]'` (`'[]'` empties it). Every value up to the
          next `--flag` belongs to the option; use `--name=value` for a value that
          itself starts with `--`.
        - A bool field given alone is true: `--amp` is `--amp true`. A field that
          accepts None takes `null` (or `none`).
        - A nested config may be given whole as a JSON object: `--model '{...}'`; its
          dotted options then apply on top of it.
        - A field holding one of several config types (a discriminated union such as
          `LrSchedulerConfig`) is chosen by its `type`, as JSON
          (`--lr '{"type": "linear", ...}'`) or dotted (`--lr.type linear
          --lr.final-lr 1e-3`). With a new type, its other fields start from their
          defaults; with the type the config already holds (or no `--lr.type`), from
          the current values, so `--lr.min-lr 1e-3` changes one field of the current
          scheduler.
        - `-h` or `--help` prints `args_help()` and exits with status 0.

        Errors raise `ConfigError` naming the option, the accepted values and, for a
        misspelt name, the closest one."""
        items = list(args)
        if any(item in ("-h", "--help") for item in items):
            print(self.args_help())
            raise SystemExit(0)
        cls = type(self)
        values = _model_values(cls, self.model_copy(deep=True), _parse_args(items), ())
        try:
            return cls.model_validate(values)
        except ValidationError as error:
            raise ConfigError(_describe(cls, error, "command line", flags=True)) from None

    def args_help(self) -> str:
        """The `--help` text of `with_args`: every option, nested ones dotted, with its
        type and its default (the value this config holds)."""
        return _help(self)

    def __str__(self) -> str:
        return self.to_json()
