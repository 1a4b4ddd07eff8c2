"""The model at a glance when `fit` starts: its modules down to a depth, their trainable
and frozen parameters, size and dtypes, and warnings about a model that will not train
as its author expects (modules in eval mode, no parameter requiring grad)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import torch

from ember.train.activation_checkpointing import WRAPPED as _WRAPPED

_MB = 1e6


def _unwrap(module: torch.nn.Module) -> tuple[torch.nn.Module, bool]:
    """The module a checkpoint wrapper holds (and True), or the module itself."""
    inner = getattr(module, _WRAPPED, None)
    return (inner, True) if isinstance(inner, torch.nn.Module) else (module, False)


def _children(module: torch.nn.Module) -> Iterator[tuple[str, torch.nn.Module, bool]]:
    for name, child in _unwrap(module)[0].named_children():
        inner, wrapped = _unwrap(child)
        yield name, inner, wrapped


@dataclass(frozen=True)
class ModuleRow:
    """One module of the summary (`name` is its dotted path; `depth` 1 is a child of
    the model)."""

    name: str
    kind: str
    depth: int
    trainable: int
    frozen: int
    size_mb: float
    """Parameters and buffers, in MB (10^6 bytes)."""
    dtypes: tuple[str, ...]
    checkpointed: bool = False
    """Wrapped for activation checkpointing."""


def _row(name: str, module: torch.nn.Module, depth: int, checkpointed: bool) -> ModuleRow:
    trainable = frozen = size = 0
    dtypes: dict[str, None] = {}
    for parameter in module.parameters():
        if parameter.requires_grad:
            trainable += parameter.numel()
        else:
            frozen += parameter.numel()
    for tensor in [*module.parameters(), *module.buffers()]:
        size += tensor.numel() * tensor.element_size()
        dtypes[str(tensor.dtype).removeprefix("torch.")] = None
    return ModuleRow(
        name,
        type(module).__name__,
        depth,
        trainable,
        frozen,
        size / _MB,
        tuple(dtypes),
        checkpointed,
    )


@dataclass(frozen=True)
class ModelSummary:
    """`ModelSummary.of(model, depth=1)`: the model's modules down to `depth` levels
    and the whole model's totals, as a table (`table()`) and `warnings()`."""

    model: str
    rows: tuple[ModuleRow, ...]
    total: ModuleRow
    eval_modules: tuple[str, ...]
    """Modules (the model itself as "(model)") in eval mode."""

    @classmethod
    def of(cls, model: torch.nn.Module, depth: int = 1) -> ModelSummary:
        rows: list[ModuleRow] = []

        def visit(module: torch.nn.Module, prefix: str, level: int) -> None:
            if level > depth:
                return
            for name, child, wrapped in _children(module):
                path = f"{prefix}{name}"
                rows.append(_row(path, child, level, wrapped))
                visit(child, f"{path}.", level + 1)

        visit(model, "", 1)
        inner = _unwrap(model)[0]
        eval_modules: list[str] = []  # the outermost ones: their submodules follow them
        for name, module in model.named_modules():
            path = ".".join(part for part in name.split(".") if part != _WRAPPED)
            if module.training or hasattr(module, _WRAPPED):
                continue
            if any(path == e or path.startswith(f"{e}.") or e == "(model)" for e in eval_modules):
                continue
            eval_modules.append(path or "(model)")
        return cls(
            type(inner).__name__, tuple(rows), _row("", inner, 0, False), tuple(eval_modules)
        )

    def table(self) -> str:
        """A plain-text table: one row per module, then the totals."""
        header = ("Module", "Type", "Trainable", "Frozen", "Size (MB)", "Dtypes")

        def cells(row: ModuleRow, name: str) -> tuple[str, ...]:
            kind = f"{row.kind} (checkpointed)" if row.checkpointed else row.kind
            return (
                name,
                kind,
                f"{row.trainable:,}",
                f"{row.frozen:,}",
                f"{row.size_mb:.3f}" if row.size_mb >= 0.001 or not row.size_mb else "<0.001",
                ", ".join(row.dtypes) or "-",
            )

        body = [cells(row, "  " * (row.depth - 1) + row.name) for row in self.rows]
        body.append(cells(self.total, "Total"))
        widths = [max(len(line[i]) for line in [header, *body]) for i in range(len(header))]
        numeric = {2, 3, 4}

        def line(values: tuple[str, ...]) -> str:
            padded = [
                v.rjust(w) if i in numeric else v.ljust(w)
                for i, (v, w) in enumerate(zip(values, widths))
            ]
            return "| " + " | ".join(padded) + " |"

        rule = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
        lines = [f"Model {self.model}:", line(header), rule]
        lines += [line(values) for values in body[:-1]]
        lines += [rule, line(body[-1])]
        return "\n".join(lines)

    def warnings(self) -> list[str]:
        """What would make the model train otherwise than its author expects."""
        notes = []
        if self.eval_modules:
            shown = ", ".join(self.eval_modules[:8])
            more = f" and {len(self.eval_modules) - 8} more" if len(self.eval_modules) > 8 else ""
            notes.append(
                f"The model has modules in eval mode when fit starts: {shown}{more}. fit() "
                "calls model.train() before every training epoch, so they will train in "
                "training mode (dropout active, batch norm statistics updated). To keep a "
                "module in eval mode while training, override the model's train(mode): call "
                "super().train(mode), then module.eval(). To freeze its weights, use "
                "requires_grad_(False)."
            )
        if self.total.trainable == 0:
            notes.append(
                "No parameter of the model requires grad: the optimizer has nothing to "
                "train. Unfreeze the parameters to train (module.requires_grad_(True))."
            )
        return notes


def summarize_model(model: torch.nn.Module, depth: int | None) -> str:
    """Log the summary (at `depth`; None: none) and its warnings (always); return the
    text a renderer shows at the top of its output."""
    import logging

    log = logging.getLogger(__name__)
    summary = ModelSummary.of(model, depth or 1)
    parts = []
    if depth is not None:
        table = summary.table()
        log.info("%s", table)
        parts.append(table)
    for warning in summary.warnings():
        log.warning("%s", warning)
        parts.append(f"warning: {warning}")
    return "\n".join(parts)
