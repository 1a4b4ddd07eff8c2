"""The command line's options: `--flag value...` tokens grouped into options naming a
field path."""

from __future__ import annotations

from dataclasses import dataclass

from ember.errors import ConfigError

_SOURCE = "command line"


@dataclass
class _Option:
    """One `--flag value...` of the command line."""

    flag: str  # as written, without `=value`: "--lr.min-lr"
    path: tuple[str, ...]  # field names: ("lr", "min_lr")
    values: list[str]


def _parse_args(items: list[str]) -> list[_Option]:
    options: list[_Option] = []
    index = 0
    while index < len(items):
        token = items[index]
        if not token.startswith("--") or token == "--":
            after = f" after {options[-1].flag}" if options else ""
            raise ConfigError(
                f"{_SOURCE}: unexpected argument {token!r}{after}: expected --field value."
            )
        index += 1
        if "=" in token:
            flag, value = token.split("=", 1)
            values = [value]
        else:
            flag, values = token, []
            while index < len(items) and not items[index].startswith("--"):
                values.append(items[index])
                index += 1
        path = tuple(flag[2:].replace("-", "_").split("."))
        options.append(_Option(flag, path, values))
        if "=" in token and index < len(items) and not items[index].startswith("--"):
            raise ConfigError(
                f"{_SOURCE}: unexpected argument {items[index]!r} after {token}: "
                f"give a list as {flag} A B or {flag}='[A, B]'."
            )
    return options
