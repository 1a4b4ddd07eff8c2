"""The `--help` text of a config: an option per field with its default, the fields of
a nested config dotted below it, and a group per other type of a union field."""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from pydantic import BaseModel
from pydantic_core import to_jsonable_python

from ember.config_cli.shapes import _dotted, _flag, _metavar, _shape
from ember.config_cli.values import _tag_of

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


def _shown(value: Any) -> str:
    data = to_jsonable_python(value)
    if isinstance(data, str) and data:
        return data
    return json.dumps(data)
