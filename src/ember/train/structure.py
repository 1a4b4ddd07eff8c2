"""How a model is put together, checked before it is trained or evaluated.

Two mistakes that torch lets through and that fail later, far from their cause:

- submodules kept in a plain Python list, tuple or dict (`self.layers = [...]`):
  torch registers only attributes that are modules, `nn.ModuleList` or
  `nn.ModuleDict`, so those layers' parameters are not the model's. They are not moved
  to the device, checkpointed or trained by an optimizer bound to the model.
  `loose_modules` finds them, `loose_module_problem` names the attribute and the fix;
- a `train` method of the model's own (`def train(self, x_pos, x_neg)`), which
  replaces torch's `train(mode=True)`: `model.train()` and `model.eval()` (which
  calls `train(False)` on every submodule) then fail. `check_train_methods` refuses
  it, naming the method and the fix.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, Iterator, Mapping

import torch
from torch import nn

from ember.errors import ConfigError

_TORCH_STATE = ("_modules", "_parameters", "_buffers")
_DEPTH = 3  # containers inside containers, as deep as this


@dataclass(frozen=True)
class LooseModules:
    """Modules kept in a plain container attribute, whose parameters torch does not
    register with the model."""

    owner: str
    """The attribute, as the user wrote it: "Net.layers", "Net.encoder.blocks"."""
    container: str
    """"list", "tuple" or "dict" (of the outermost container)."""
    modules: tuple[nn.Module, ...]
    parameters: tuple[torch.Tensor, ...]
    """Their parameters that are not the model's (each once)."""

    @property
    def trainable(self) -> int:
        return sum(1 for p in self.parameters if p.requires_grad)


def check_train_methods(model: nn.Module) -> None:
    """Refuse a model, or a submodule, whose class replaces `nn.Module.train` by a
    method that cannot be called as `train()` and `train(False)`."""
    seen: set[type] = set()
    for path, module in model.named_modules():
        kind = type(module)
        if kind in seen:
            continue
        seen.add(kind)
        method = getattr(kind, "train", None)
        if method is nn.Module.train or _switches_mode(getattr(module, "train", None)):
            continue
        signature = _signature(method)
        where = (
            f"{kind.__name__}"
            if not path
            else f"{kind.__name__} (the submodule {path!r} of {type(model).__name__})"
        )
        calls = (
            "ember calls model.train() and model.eval() to switch between training and evaluation"
            if not path
            else "model.train() and model.eval(), which ember calls to switch between "
            "training and evaluation, call it on every submodule"
        )
        raise ConfigError(
            f"{where} defines train{signature}, which replaces torch's "
            f"nn.Module.train(mode=True): {calls}, and yours cannot be called as "
            "train() or train(False). Rename the method (e.g. to fit_layers, and its calls), "
            "or give it torch's signature, train(self, mode=True), calling "
            "super().train(mode)."
        )


def _switches_mode(bound: Any) -> bool:
    """Whether `bound` can be called as `train()` and as `train(False)` (a method
    whose signature cannot be read is given the benefit of the doubt)."""
    if not callable(bound):
        return False
    try:
        signature = inspect.signature(bound)
    except (TypeError, ValueError):
        return True
    try:
        signature.bind()
        signature.bind(False)
    except TypeError:
        return False
    return True


def _signature(method: Any) -> str:
    try:
        return str(inspect.signature(method))
    except (TypeError, ValueError):
        return "(...)"


def loose_modules(model: nn.Module) -> list[LooseModules]:
    """Every attribute of the model or a registered submodule that is a plain list,
    tuple or dict holding modules with parameters the model does not have."""
    registered = {id(module) for module in model.modules()}
    owned = {id(parameter) for parameter in model.parameters()}
    found: list[LooseModules] = []
    for path, module in model.named_modules():
        for name, value in vars(module).items():
            if name in _TORCH_STATE or not isinstance(value, (list, tuple, dict)):
                continue
            modules = [m for m in _modules_in(value, _DEPTH) if id(m) not in registered]
            parameters: dict[int, torch.Tensor] = {}
            for loose in modules:
                for parameter in loose.parameters():
                    if id(parameter) not in owned:
                        parameters.setdefault(id(parameter), parameter)
            if parameters:
                owner = ".".join([type(model).__name__, *([path] if path else []), name])
                found.append(
                    LooseModules(
                        owner, _base(value), tuple(_unique(modules)), tuple(parameters.values())
                    )
                )
    return found


def _base(value: Any) -> str:
    return "dict" if isinstance(value, dict) else "tuple" if isinstance(value, tuple) else "list"


def _unique(modules: list[nn.Module]) -> Iterator[nn.Module]:
    seen: set[int] = set()
    for module in modules:
        if id(module) not in seen:
            seen.add(id(module))
            yield module


def _modules_in(value: Any, depth: int) -> Iterator[nn.Module]:
    """The modules in a container (and in the containers inside it, `depth` deep)."""
    if depth == 0:
        return
    items = value.values() if isinstance(value, Mapping) else value
    for item in items:
        if isinstance(item, nn.Module):
            yield item
        elif isinstance(item, (list, tuple, dict)):
            yield from _modules_in(item, depth - 1)


def loose_module_problem(loose: LooseModules, optimizer_holds: bool) -> str:
    """What is wrong with `loose` and the fix, in words; `optimizer_holds`: the
    optimizer given to build() updates some of those parameters."""
    names = [type(module).__name__ for module in loose.modules]
    count = len(names)
    listed = ", ".join(names[:4]) + (", ..." if count > 4 else "")
    what = f"{count} module{'s' if count != 1 else ''} ({listed})"
    model = loose.owner.split(".", 1)[0]
    attribute = loose.owner.rsplit(".", 1)[1]
    wrapper = "nn.ModuleDict({...})" if loose.container == "dict" else "nn.ModuleList([...])"
    number = len(loose.parameters)
    head = (
        f"{loose.owner} is a plain Python {loose.container} of {what}, and torch registers "
        f"only modules, nn.ModuleList and nn.ModuleDict as parts of a model: their {number} "
        f"parameter tensor{'s are' if number != 1 else ' is'} not {model}'s"
    )
    if optimizer_holds:
        body = (
            ", though the optimizer given to build() updates them. ember would not move them "
            "to the device, checkpoint them or count them as the model's."
        )
    else:
        body = (
            ", so they are not trained (the optimizer is bound to the model's parameters), "
            "moved to the device or checkpointed."
        )
    fix = f" Wrap the {loose.container}: self.{attribute} = {wrapper}."
    if not optimizer_holds:
        fix += (
            " A module kept out of the model on purpose (a frozen teacher) needs "
            "requires_grad=False on its parameters."
        )
    return head + body + fix


def check_loose_modules(model: nn.Module, optimizer: Any) -> list[str]:
    """Refuse a model whose unregistered layers the optimizer updates, or that has no
    trainable parameter but theirs (a `ConfigError` naming the attribute and the
    fix); return a warning for each other container whose unregistered layers have
    trainable parameters (they would silently never train)."""
    found = loose_modules(model)
    if not found:
        return []
    held = _optimizer_parameters(optimizer)
    warnings: list[str] = []
    for loose in found:
        if any(id(parameter) in held for parameter in loose.parameters):
            raise ConfigError(loose_module_problem(loose, optimizer_holds=True))
    own = any(parameter.requires_grad for parameter in model.parameters())
    for loose in found:
        if loose.trainable and not own:  # nothing else would train: refused, not warned
            raise ConfigError(loose_module_problem(loose, optimizer_holds=False))
        if loose.trainable:
            warnings.append(loose_module_problem(loose, optimizer_holds=False))
    return warnings


def _optimizer_parameters(optimizer: Any) -> set[int]:
    optimizers = optimizer.values() if isinstance(optimizer, Mapping) else [optimizer]
    return {
        id(parameter)
        for one in optimizers
        if isinstance(one, torch.optim.Optimizer)
        for group in one.param_groups
        for parameter in group["params"]
    }
