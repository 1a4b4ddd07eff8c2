"""Tied parameters under FSDP: one parameter used by several modules (a language
model's embedding and its output head), which must be sharded in one unit.

FSDP gives each parameter to the first unit it shards; a parameter tied across two
units, or between a unit and the root, would be sharded twice and the tie broken
(FSDP2 refuses it at the first forward). `unit_groups` keeps each tie in one unit: the
units that hold a tied parameter, and the modules outside any unit that use it, are
sharded together as one unit (`fully_shard([embed, head])`). Where that cannot be (a
unit nested in another that shares its parameter, or the root module using the
parameter itself), the units involved are dissolved and the parameter stays in the
root unit.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn


@dataclass(frozen=True)
class Tie:
    """One parameter and the names under which modules use it."""

    names: tuple[str, ...]
    owners: tuple[nn.Module, ...]
    """The module of each name (distinct modules)."""


def tied_parameters(model: nn.Module) -> list[Tie]:
    """The parameters of `model` that several modules hold (each tie once)."""
    found: dict[int, list[tuple[str, nn.Module]]] = {}
    for prefix, module in model.named_modules():
        for name, parameter in module.named_parameters(prefix=prefix, recurse=False):
            found.setdefault(id(parameter), []).append((name, module))
    ties = []
    for uses in found.values():
        modules: dict[int, nn.Module] = {id(module): module for _, module in uses}
        if len(modules) > 1:
            ties.append(Tie(tuple(name for name, _ in uses), tuple(m for _, m in uses)))
    return ties


@dataclass(frozen=True)
class Groups:
    """The FSDP units, innermost first: each a tuple of modules sharded together."""

    units: list[tuple[nn.Module, ...]]
    notes: list[str]
    """What the ties changed, one line each."""


def unit_groups(model: nn.Module, chosen: list[nn.Module]) -> Groups:
    """The units to shard, from the `chosen` modules (innermost first), with every tied
    parameter in one unit."""
    ties = tied_parameters(model)
    names = {id(module): name or "the model" for name, module in model.named_modules()}
    notes: list[str] = []
    while True:
        inside: dict[int, int] = {}  # a module -> the innermost chosen unit holding it
        for index, unit in enumerate(chosen):
            for module in unit.modules():
                inside.setdefault(id(module), index)
        merges: list[tuple[list[int], list[nn.Module], Tie]] = []
        dissolved: set[int] = set()
        for tie in ties:
            holders = {inside.get(id(owner)) for owner in tie.owners}
            if len(holders) == 1:
                continue  # in one unit, or all in the root
            held = sorted(h for h in holders if h is not None)
            loose = _distinct([owner for owner in tie.owners if id(owner) not in inside])
            if _nested([chosen[h] for h in held]) or any(
                owner is model or any(id(m) in inside for m in owner.modules()) for owner in loose
            ):
                dissolved.update(held)
                apart = _listed([names[id(chosen[h])] for h in held])
                notes.append(
                    f"{_listed(list(tie.names))} are one parameter: {apart} not sharded as "
                    f"{'a unit of its own' if len(held) == 1 else 'units of their own'} (the "
                    "parameter stays in the root unit)"
                )
            else:
                merges.append((held, loose, tie))
        if not dissolved:
            break
        chosen = [unit for index, unit in enumerate(chosen) if index not in dissolved]
    return Groups(_merged(chosen, merges, names, notes), notes)


def _merged(
    chosen: list[nn.Module],
    merges: list[tuple[list[int], list[nn.Module], Tie]],
    names: dict[int, str],
    notes: list[str],
) -> list[tuple[nn.Module, ...]]:
    """The chosen units with each tie's units and loose modules joined into one group,
    placed where its innermost-last unit was (so every unit inside it comes first)."""
    group_of = list(range(len(chosen)))  # a unit -> the unit standing for its group
    extra: dict[int, list[nn.Module]] = {}  # a group's modules outside every unit

    def find(index: int) -> int:
        while group_of[index] != index:
            index = group_of[index]
        return index

    loose_group: dict[int, int] = {}
    for held, loose, tie in merges:
        roots = {find(h) for h in held}
        roots.update(find(loose_group[id(m)]) for m in loose if id(m) in loose_group)
        target = max(roots)
        for other in roots:
            group_of[other] = target
            if other != target:
                extra.setdefault(target, []).extend(extra.pop(other, []))
        for module in loose:
            if id(module) not in loose_group:
                loose_group[id(module)] = target
                extra.setdefault(target, []).append(module)
        together = [chosen[h] for h in held] + loose
        notes.append(
            f"{_listed(list(tie.names))} are one parameter: "
            f"{_listed([names[id(m)] for m in together])} sharded as one unit"
        )
    groups: dict[int, list[nn.Module]] = {}
    for index, unit in enumerate(chosen):
        groups.setdefault(find(index), []).append(unit)
    return [
        tuple(groups[index] + extra.get(index, []))
        for index in range(len(chosen))
        if index in groups and find(index) == index
    ]


def _listed(names: list[str]) -> str:
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


def _distinct(modules: list[nn.Module]) -> list[nn.Module]:
    return list({id(module): module for module in modules}.values())


def _nested(units: list[nn.Module]) -> bool:
    """Whether one of `units` holds another."""
    return any(
        inner is not outer and any(m is inner for m in outer.modules())
        for outer in units
        for inner in units
    )
