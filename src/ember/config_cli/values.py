"""The command line's options applied to a config's fields: the raw values pydantic
then validates, the member of a union field the options choose, and the messages of
options that do not fit the field they set."""

from __future__ import annotations

import difflib
import json
from typing import Any

from pydantic import BaseModel, ValidationError

from ember.config_cli.messages import _describe, _unknown
from ember.config_cli.options import _SOURCE, _Option
from ember.config_cli.shapes import _dotted, _flag, _metavar, _Shape, _shape
from ember.errors import ConfigError

_NULLS = ("null", "none")


def _model_values(
    cls: type[BaseModel], current: Any, options: list[_Option], prefix: tuple[str, ...]
) -> dict[str, Any]:
    """The field values of a `cls` built from `current` (an instance, a dict or None)
    with `options` applied; validation is left to the caller."""
    if isinstance(current, BaseModel):
        values = {name: getattr(current, name) for name in type(current).model_fields}
    else:
        values = dict(current) if isinstance(current, dict) else {}
    groups: dict[str, list[_Option]] = {}
    for option in options:
        name = option.path[len(prefix)]
        if name not in cls.model_fields:
            raise ConfigError(_unknown(cls, name, _SOURCE, prefix=prefix))
        groups.setdefault(name, []).append(option)
    for name, group in groups.items():
        info = cls.model_fields[name]
        shape = _shape(info.annotation, [*info.metadata, info.discriminator])
        values[name] = _field_value(cls, shape, values.get(name), group, prefix + (name,))
    return values


def _field_value(
    owner: type[BaseModel],
    shape: _Shape,
    current: Any,
    options: list[_Option],
    path: tuple[str, ...],
) -> Any:
    depth = len(path)
    whole = [option for option in options if len(option.path) == depth]
    deeper = [option for option in options if len(option.path) > depth]
    last = whole[-1] if whole else None
    if shape.kind in ("value", "list", "json"):
        if deeper:
            raise ConfigError(
                f"{_SOURCE}: {deeper[0].flag}: field {_dotted(path)!r} of {owner.__name__} "
                "is not a config, it has no sub-fields; set it with "
                f"{_flag(path)} {_metavar(shape)}."
            )
        assert last is not None
        return _convert(shape, last)
    if shape.kind == "union":
        return _union_value(shape, current, last, deeper, path)
    assert shape.model is not None
    base = current
    if last is not None:
        base = None if _is_null(shape, last) else _json_object(last, shape.model.__name__)
    if not deeper:
        return base
    return _model_values(shape.model, base, deeper, path)


def _union_value(
    shape: _Shape,
    current: Any,
    last: _Option | None,
    deeper: list[_Option],
    path: tuple[str, ...],
) -> Any:
    """The config of a union field: the member named by `--path.type` (else the one
    `current` or the JSON value holds), with the dotted options applied."""
    depth, name = len(path), _dotted(path)
    choices = ", ".join(shape.members)
    chooser = [o for o in deeper if o.path[depth] == shape.key and len(o.path) == depth + 1]
    rest = [o for o in deeper if not any(o is c for c in chooser)]
    base = current
    if last is not None:
        if _is_null(shape, last):
            if not deeper:
                return None
            base = None
        else:
            base = _json_object(last, f"config of one of the types {choices}")
    base_tag = _tag_of(shape, base, last, name)
    if chooser:
        option = chooser[-1]
        if len(option.values) != 1:
            raise ConfigError(
                f"{_SOURCE}: {option.flag} takes one value, one of {choices}; "
                f"got {len(option.values)}."
            )
        tag = option.values[0]
        _check_tag(shape, tag, option.flag, name)
    elif base is None:
        raise ConfigError(
            f"{_SOURCE}: field {name!r} holds no config yet: choose its type with "
            f"{_flag(path + (shape.key,))} (one of {choices}) and its fields with "
            f"{_flag(path)}.FIELD, or give it whole as JSON: "
            f"{_flag(path)} '{{\"{shape.key}\": ..., ...}}'."
        )
    else:
        if base_tag is None:
            raise ConfigError(
                f"{_SOURCE}: {_flag(path)}: the JSON object names no {shape.key!r}; add "
                f'"{shape.key}": one of {choices}.'
            )
        tag = base_tag
    member = shape.members[tag]
    for option in rest:
        field_name = option.path[depth]
        if field_name in member.model_fields:
            continue
        owners = [t for t, m in shape.members.items() if field_name in m.model_fields]
        if not owners:
            raise ConfigError(
                _unknown(member, field_name, _SOURCE, prefix=path, holder=f"type {tag!r}")
            )
        raise ConfigError(
            f"{_SOURCE}: {option.flag}: field {name!r} holds a {tag!r} config "
            f"({member.__name__}), which has no field {field_name!r}; "
            + (
                f"the type {owners[0]!r} has it"
                if len(owners) == 1
                else f"the types {', '.join(owners)} have it"
            )
            + f": choose it with {_flag(path + (shape.key,))} {owners[0]}. "
            f"Fields of {tag!r}: {', '.join(member.model_fields)}."
        )
    start = base if base_tag == tag else None
    values = _model_values(member, start, rest, path)
    if shape.key in member.model_fields:
        values.setdefault(shape.key, tag)
    else:
        values.pop(shape.key, None)
    try:
        return member.model_validate(values)
    except ValidationError as error:
        raise ConfigError(
            _describe(
                member,
                error,
                _SOURCE,
                prefix=path,
                flags=True,
                subject=f"{member.__name__} for field {name!r} (type {tag!r})",
            )
        ) from None


def _tag_of(shape: _Shape, value: Any, option: _Option | None, name: str) -> str | None:
    """The type of `value` (a member instance, a dict or None) among the union's."""
    if value is None:
        return None
    if isinstance(value, BaseModel):
        named = getattr(value, shape.key, None)
        if isinstance(named, str) and shape.members.get(named) is type(value):
            return named
        for tag, member in shape.members.items():
            if type(value) is member:
                return tag
        return next((t for t, m in shape.members.items() if isinstance(value, m)), None)
    if not isinstance(value, dict):
        return None
    if shape.key in value:
        tag = value[shape.key]
        _check_tag(shape, tag, option.flag if option else _flag(name.split(".")), name)
        return str(tag)
    if shape.pick is not None:
        picked = shape.pick(value)
        return picked if isinstance(picked, str) and picked in shape.members else None
    return None


def _check_tag(shape: _Shape, tag: Any, flag: str, name: str) -> None:
    if isinstance(tag, str) and tag in shape.members:
        return
    close = difflib.get_close_matches(str(tag), list(shape.members), n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    raise ConfigError(
        f"{_SOURCE}: {flag}: unknown {shape.key} {tag!r} for field {name!r}.{hint} "
        f"Accepted: {', '.join(shape.members)}."
    )


def _is_null(shape: _Shape, option: _Option) -> bool:
    return shape.nullable and len(option.values) == 1 and option.values[0].lower() in _NULLS


def _json_object(option: _Option, what: str) -> dict[str, Any]:
    if len(option.values) != 1:
        raise ConfigError(
            f"{_SOURCE}: {option.flag} takes one JSON object (a {what}), quoted as one "
            f"argument, or dotted options such as {option.flag}.FIELD VALUE; "
            f"got {len(option.values)} arguments."
        )
    value = _json(option, option.values[0])
    if not isinstance(value, dict):
        raise ConfigError(
            f"{_SOURCE}: {option.flag} expects a JSON object (a {what}), "
            f"got {type(value).__name__}: {option.values[0]!r}."
        )
    return value


def _json(option: _Option, text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        raise ConfigError(
            f"{_SOURCE}: {option.flag}: {text!r} is not valid JSON ({error}); "
            "quote it for the shell, e.g. '{\"key\": 1}' or '[1, 2]'."
        ) from None


def _convert(shape: _Shape, option: _Option) -> Any:
    """The raw value of a "value", "list" or "json" field; pydantic converts the strings."""
    values = option.values
    if _is_null(shape, option):
        return None
    if shape.kind == "list":
        if not values:
            raise ConfigError(
                f"{_SOURCE}: {option.flag} needs values, e.g. {option.flag} 1 2 "
                f"(or {option.flag} '[]' for an empty list)."
            )
        if len(values) == 1 and values[0].lstrip().startswith("["):
            return _json(option, values[0])
        assert shape.item is not None
        if shape.item.kind == "value":
            return list(values)
        return [_json(option, value) for value in values]
    if shape.kind == "json":
        return _json_object(option, "mapping")
    if not values:
        if shape.annotation is bool:
            return True
        raise ConfigError(
            f"{_SOURCE}: {option.flag} needs a value: {option.flag} {_metavar(shape)}."
        )
    if len(values) > 1:
        raise ConfigError(
            f"{_SOURCE}: {option.flag} takes one value, got {len(values)}: "
            f"{' '.join(values)}. Only a list field takes several."
        )
    return values[0]
