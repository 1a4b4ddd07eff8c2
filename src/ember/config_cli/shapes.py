"""What a config field's annotation accepts on the command line (a value, a list, a
JSON mapping, a config or a union of configs), the option names of a field path, and
the metavar that shows what an option takes."""

from __future__ import annotations

import enum
import types
from collections import abc
from dataclasses import dataclass, field
from typing import Annotated, Any, Callable, Literal, Sequence, Union, get_args, get_origin

from pydantic import BaseModel, Discriminator, Tag


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


def _flag(path: Sequence[str | int]) -> str:
    return "--" + ".".join(str(part).replace("_", "-") for part in path)


def _dotted(path: Sequence[str]) -> str:
    return ".".join(path)
