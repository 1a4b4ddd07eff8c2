"""Checking a plug-in (metric, logger, renderer, strategy, checkpointer...) against the
one Protocol of its contract, with a message that names what is missing."""

from __future__ import annotations

import inspect
from typing import Any

from ember.errors import ConfigError


def protocol_members(protocol: type) -> dict[str, bool]:
    """A Protocol's members: name -> whether it must be callable (a method)."""
    members: dict[str, bool] = {}
    for klass in reversed(protocol.__mro__):
        if klass is object or not getattr(klass, "_is_protocol", False):
            continue
        for name in getattr(klass, "__annotations__", {}):
            members[name] = False
        for name, value in vars(klass).items():
            if name.startswith("_"):
                continue
            if isinstance(value, property):
                members[name] = False
            elif inspect.isfunction(value):
                members[name] = True
    return members


def check_plugin(plugin: Any, protocol: type, what: str) -> None:
    """Raise `ConfigError` unless `plugin` has every member of `protocol`."""
    if isinstance(plugin, type):
        raise ConfigError(
            f"{plugin.__name__} is a class, not {what}: pass an instance, e.g. "
            f"{plugin.__name__}() with its arguments."
        )
    members = protocol_members(protocol)
    missing = [
        name
        for name, method in members.items()
        if not hasattr(plugin, name) or (method and not callable(getattr(plugin, name)))
    ]
    if missing:
        wanted = ", ".join(f"`{name}{'()' if method else ''}`" for name, method in members.items())
        raise ConfigError(
            f"{type(plugin).__name__} is not {what}: it has no "
            f"{', '.join(f'`{name}`' for name in missing)}. {what[0].upper()}{what[1:]} has "
            f"{wanted} (the protocol {protocol.__module__}.{protocol.__qualname__})."
        )
