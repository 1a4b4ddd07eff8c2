"""The command line of a `Config` (`Config.with_args`, `Config.args_help`): options
parsed argparse style onto a config's fields, the `--help` text, and the messages of
invalid values that name the field and the option setting it."""

from __future__ import annotations

import difflib
import enum
import json
import os
import sys
import types
from collections import abc
from dataclasses import dataclass, field
from typing import Annotated, Any, Callable, Literal, Sequence, Union, get_args, get_origin

from pydantic import BaseModel, Discriminator, Tag, ValidationError
from pydantic_core import to_jsonable_python

from ember.errors import ConfigError

_SOURCE = "command line"
_NULLS = ("null", "none")


@dataclass
class _Option:
    """One `--flag value...` of the command line."""

    flag: str  # as written, without `=value`: "--lr.min-lr"
    path: tuple[str, ...]  # field names: ("lr", "min_lr")
    values: list[str]


@dataclass
class _Shape:
    """What a field's annotation accepts, as far as the command line is concerned."""

    kind: str  # "value", "list", "json" (a dict), "model" or "union"
    annotation: Any = None
    nullable: bool = False
    item: _Shape | None = None  # "list": the shape of one element
    model: type[BaseModel] | None = None  # "model"
    members: dict[str, type[BaseModel]] = field(default_factory=dict)  # "union": type -> class
    key: str = "type"  # "union": the field naming the type
    pick: Callable[[Any], Any] | None = None  # "union": tells the type of a dict without `key`


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


def _flag(path: Sequence[str | int]) -> str:
    return "--" + ".".join(str(part).replace("_", "-") for part in path)


def _dotted(path: Sequence[str]) -> str:
    return ".".join(path)


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


def _strip(annotation: Any, metadata: list[Any]) -> Any:
    while get_origin(annotation) is Annotated:
        metadata.extend(annotation.__metadata__)
        annotation = annotation.__origin__
    return annotation


def _is_union(annotation: Any) -> bool:
    return get_origin(annotation) in (Union, types.UnionType)


def _union_args(annotation: Any, metadata: list[Any], out: list[tuple[Any, str | None]]) -> None:
    for arg in get_args(annotation):
        inner: list[Any] = []
        arg = _strip(arg, inner)
        if _is_union(arg):
            metadata.extend(inner)
            _union_args(arg, metadata, out)
        else:
            out.append((arg, next((m.tag for m in inner if isinstance(m, Tag)), None)))


def _is_model(annotation: Any) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)


def _shape(annotation: Any, metadata: Sequence[Any] = ()) -> _Shape:
    found = [m for m in metadata if m is not None]
    annotation = _strip(annotation, found)
    if _is_union(annotation):
        args: list[tuple[Any, str | None]] = []
        _union_args(annotation, found, args)
        nullable = any(arg is type(None) for arg, _ in args)
        rest = [(arg, tag) for arg, tag in args if arg is not type(None)]
        if len(rest) == 1:
            shape = _shape(rest[0][0])
            shape.nullable = shape.nullable or nullable
            return shape
        if rest and all(_is_model(arg) for arg, _ in rest):
            return _union_shape(rest, found, nullable)
        return _Shape("value", annotation, nullable)
    if _is_model(annotation):
        return _Shape("model", annotation, model=annotation)
    origin = get_origin(annotation) or annotation
    if origin in (list, tuple, set, frozenset, abc.Sequence, abc.MutableSequence, abc.Set):
        items = [arg for arg in get_args(annotation) if arg is not Ellipsis]
        return _Shape("list", annotation, item=_shape(items[0] if items else Any))
    if origin in (dict, abc.Mapping, abc.MutableMapping):
        return _Shape("json", annotation)
    return _Shape("value", annotation)


def _union_shape(
    members: list[tuple[Any, str | None]], metadata: list[Any], nullable: bool
) -> _Shape:
    key, pick = "type", None
    for item in metadata:
        chosen = item.discriminator if isinstance(item, Discriminator) else item
        if isinstance(chosen, str):
            key = chosen
        elif callable(chosen):
            pick = chosen
    shape = _Shape("union", nullable=nullable, key=key, pick=pick)
    for member, tag in members:
        tags = [tag] if tag is not None else []
        if not tags and key in member.model_fields:
            literal = member.model_fields[key].annotation
            if get_origin(literal) is Literal:
                tags = [str(value) for value in get_args(literal)]
        for name in tags or [member.__name__]:
            shape.members.setdefault(name, member)
    return shape


def _simple_label(annotation: Any) -> str | None:
    """INT, FLOAT, {a,b}... for a plain annotation; "INT|auto" for a union of them."""
    if get_origin(annotation) is Annotated:
        annotation = get_args(annotation)[0]
    if get_origin(annotation) is Literal:
        return "|".join(str(value) for value in get_args(annotation))
    if get_origin(annotation) in (Union, types.UnionType):
        labels = [_simple_label(member) for member in get_args(annotation)]
        return None if None in labels else "|".join(label for label in labels if label)
    if isinstance(annotation, type) and annotation not in (object, bool):
        return annotation.__name__.upper()
    return None


def _metavar(shape: _Shape) -> str:
    if shape.kind == "list":
        assert shape.item is not None
        one = _metavar(shape.item)
        text = f"{one} [{one} ...]"
    elif shape.kind in ("json", "model", "union"):
        text = "JSON"
    else:
        annotation = shape.annotation
        if get_origin(annotation) is Literal:
            text = "{" + ",".join(str(value) for value in get_args(annotation)) + "}"
        elif isinstance(annotation, type) and issubclass(annotation, enum.Enum):
            text = "{" + ",".join(str(member.value) for member in annotation) + "}"
        elif annotation is bool:
            text = "[BOOL]"
        else:
            text = _simple_label(annotation) or "VALUE"
    return f"{text}|null" if shape.nullable and shape.kind != "list" else text


def _shown(value: Any) -> str:
    data = to_jsonable_python(value)
    if isinstance(data, str) and data:
        return data
    return json.dumps(data)


_Row = tuple[str, str]


def _help(config: BaseModel) -> str:
    rows: list[_Row] = [("-h, --help", "Show this help and exit.")]
    groups: list[tuple[str, list[_Row]]] = []
    _help_rows(type(config), config, (), rows, groups, expand=True, seen=())
    program = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "script.py"
    lines = [
        f"usage: {program} [-h] [--FIELD VALUE ...]",
        "",
        f"Options of {type(config).__name__}; a default is the value the config holds now.",
        "A list takes its values one after another (--FIELD 1 2) or one JSON array",
        "(--FIELD '[1, 2]'); a config, one JSON object (--FIELD '{...}') or dotted options.",
    ]
    if groups:
        lines += [
            "Another --FIELD.type starts the other fields of FIELD from the defaults listed",
            "below for that type.",
        ]
    lines += ["", "options:"]
    width = min(max(len(left) for left, _ in rows + [r for _, g in groups for r in g]) + 4, 34)
    lines += _help_lines(rows, width)
    for title, group in groups:
        lines += ["", title]
        lines += _help_lines(group, width)
    return "\n".join(lines)


def _help_lines(rows: list[_Row], width: int) -> list[str]:
    lines = []
    for left, right in rows:
        text = f"  {left}"
        if not right:
            lines.append(text)
        elif len(text) + 2 > width:
            lines += [text, " " * width + right]
        else:
            lines.append(text.ljust(width) + right)
    return lines


def _help_rows(
    cls: type[BaseModel],
    current: BaseModel | None,
    prefix: tuple[str, ...],
    rows: list[_Row],
    groups: list[tuple[str, list[_Row]]],
    expand: bool,
    seen: tuple[type[BaseModel], ...],
    skip: str | None = None,
) -> None:
    """Rows of `cls`'s options: defaults from `current`, or from the fields without it;
    `expand` also lists the fields of the other types of a union field."""
    for name, info in cls.model_fields.items():
        if name == skip:
            continue
        path = prefix + (name,)
        flag = _flag(path)
        shape = _shape(info.annotation, [*info.metadata, info.discriminator])
        about = f"{info.description} " if info.description else ""
        if current is not None:
            value = getattr(current, name)
            default = f"(default: {_shown(value)})"
        elif info.is_required():
            value, default = None, "(required)"
        else:
            value = info.get_default(call_default_factory=True)
            default = f"(default: {_shown(value)})"
        if shape.kind == "model":
            assert shape.model is not None
            model = shape.model
            whole = f"{about}The whole {model.__name__} as one JSON object; or its fields:"
            rows.append((f"{flag} JSON", whole if value is not None else f"{whole} {default}"))
            if model not in seen:
                inner = value if isinstance(value, BaseModel) else None
                _help_rows(model, inner, path, rows, groups, expand, seen + (model,))
        elif shape.kind == "union":
            choices = ",".join(shape.members)
            rows.append(
                (
                    f"{flag} JSON",
                    f"{about}The whole config as one JSON object with its {shape.key!r}; "
                    f"or its {shape.key} and fields:",
                )
            )
            tag = _tag_of(shape, value, None, _dotted(path)) if value is not None else None
            shown = f"(default: {tag})" if tag else default
            rows.append((f"{flag}.{shape.key} {{{choices}}}", shown))
            if tag is not None and isinstance(value, BaseModel):
                _help_rows(type(value), value, path, rows, groups, expand, seen, shape.key)
            if expand:
                for other, member in shape.members.items():
                    if other == tag:
                        continue
                    group: list[_Row] = []
                    _help_rows(member, None, path, group, groups, False, seen, shape.key)
                    title = f"with {flag}.{shape.key} {other} ({member.__name__}):"
                    groups.append((title, group or [("(no other fields)", "")]))
        else:
            rows.append((f"{flag} {_metavar(shape)}", f"{about}{default}"))


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
