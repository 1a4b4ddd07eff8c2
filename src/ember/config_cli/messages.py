"""The messages of an unknown field and of a config that fails validation, naming the
field path and, on the command line, the option that sets it."""

from __future__ import annotations

import difflib
from typing import Any, Sequence

from pydantic import BaseModel, ValidationError

from ember.config_cli.shapes import _dotted, _flag, _Shape, _shape


def _unknown(
    cls: type[BaseModel],
    key: str,
    source: str,
    prefix: tuple[str, ...] | None = None,
    holder: str | None = None,
) -> str:
    """An unknown field `key` of `cls`, with the closest known one; given `prefix` (the
    path of `cls` on the command line), names fields as options too."""
    fields = list(cls.model_fields)
    close = difflib.get_close_matches(key, fields, n=1)
    hint = ""
    if close:
        option = f" ({_flag(prefix + (close[0],))})" if prefix is not None else ""
        hint = f" Did you mean {close[0]!r}{option}?"
    where = ""
    if prefix:
        what = f"the {holder} that" if holder else "what"
        where = f" ({what} field {_dotted(prefix)!r} holds)"
    return (
        f"{source}: unknown field {key!r} for {cls.__name__}{where}.{hint} "
        f"Known fields: {', '.join(fields)}."
    )


def _describe(
    cls: type[BaseModel],
    error: ValidationError,
    source: str,
    prefix: tuple[str, ...] = (),
    flags: bool = False,
    subject: str | None = None,
) -> str:
    """One message listing every problem, each naming the field path (below `prefix`);
    with `flags`, also the command-line option that sets the field."""
    problems = []
    for item in error.errors():
        parts = prefix + tuple(item["loc"])
        location = ".".join(str(part) for part in parts) or "<root>"
        option = ""
        if flags and parts:
            named = []
            for part in parts:
                if not isinstance(part, str):
                    break
                named.append(part)
            option = f", set with {_flag(named)}" if named else ""
        kind = item["type"]
        if kind == "extra_forbidden":
            problems.append(f"unknown field {location!r} (remove it or check its spelling)")
        elif kind == "missing":
            fix = f" (give {_missing_fix(cls, parts[len(prefix) :], named)})" if option else ""
            problems.append(f"missing required field {location!r}{fix}")
        else:
            given = item.get("input")
            problems.append(f"field {location!r}: {item['msg']} (got {given!r}{option})")
    listing = "; ".join(problems)
    return f"{source}: invalid {subject or cls.__name__}: {listing}."


def _missing_fix(cls: type[BaseModel], loc: Sequence[Any], named: list[str]) -> str:
    """The options that set the missing field at `loc` of `cls` (named `named`)."""
    flag = _flag(named)
    shape: _Shape | None = None
    for part in loc:
        if shape is not None:
            if shape.kind != "model" or shape.model is None:
                return flag
            cls = shape.model
        info = cls.model_fields.get(part) if isinstance(part, str) else None
        if info is None:
            return flag
        shape = _shape(info.annotation, [*info.metadata, info.discriminator])
    if shape is not None and shape.kind == "union":
        members = ", ".join(shape.members)
        return f"{flag}.{shape.key} (one of {members}) and its fields, or {flag} JSON"
    if shape is not None and shape.kind == "model":
        return f"its fields {flag}.FIELD, or {flag} JSON"
    return flag
