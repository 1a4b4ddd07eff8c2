"""Walking state trees: nested dicts, lists and tuples with tensors among their leaves."""

from __future__ import annotations

from typing import Any, Callable

import torch


def _same(value: Any) -> Any:
    return value


def map_tensors(
    tree: Any,
    fn: Callable[[torch.Tensor], Any],
    other: Callable[[Any], Any] = _same,
) -> Any:
    """Rebuild `tree` with `fn` applied to every tensor and `other` to every other leaf.

    Dicts keep their type (an OrderedDict stays one) and key order; lists and tuples,
    subclasses included, come back as plain lists and tuples. Anything that is not a
    tensor, dict, list or tuple is a leaf: by default it is kept as it is.
    """
    if isinstance(tree, torch.Tensor):
        return fn(tree)
    if isinstance(tree, dict):
        return type(tree)((key, map_tensors(value, fn, other)) for key, value in tree.items())
    if isinstance(tree, list):
        return [map_tensors(value, fn, other) for value in tree]
    if isinstance(tree, tuple):
        return tuple(map_tensors(value, fn, other) for value in tree)
    return other(tree)
