"""The loss's curvature where the model stands, and the largest stable rate it implies.

A rate is stable when no direction of the loss is amplified by the steps. For plain
gradient descent on a quadratic that is a rate below 2 / lambda, lambda the largest
eigenvalue of the loss's Hessian; momentum widens the range, an adaptive optimizer
(Adam) divides each coordinate's step by the root of its second moment, so its
curvature is that of the Hessian preconditioned the same way. The rising-rate curve of
the range test cannot see this limit: while the rate rises, the steep directions
converge before the rate passes their limit, and the steps' gains read the flat ones.
So the limit is measured directly: `largest_eigenvalue` runs Lanczos iteration on
Hessian-vector products (a gradient's gradient, `torch.autograd.grad` twice) of the
mean loss over a few training batches, and `StabilityRule` turns the eigenvalue into
a rate for the optimizer at hand.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch

from ember.rng import capture_rng_state, restore_rng_state

LANCZOS_STEPS = 20
"""Lanczos steps (one Hessian-vector product on every batch each). All are taken: the
largest Ritz value may rest for several steps near a lower eigenvalue before it finds
a larger one that the start vector barely touched."""

ADAM_SHARE = 0.25
"""Adam's limit is this share of its bound with frozen second moments, 2 (1 + beta1) /
((1 - beta1) lambda): its first steps, taken before the second moments settle and with
momentum barely built up, overshoot at rates well inside that bound (measured against
a grid of training runs; see docs/training-controls.md)."""

Vectors = list[torch.Tensor]


@dataclass(frozen=True)
class StabilityRule:
    """How an optimizer's largest stable rate follows from the curvature: `factor /
    lambda`, lambda the largest eigenvalue of the loss's Hessian (plus the optimizer's
    L2 weight decay), of the Hessian preconditioned by Adam's second moments when
    `preconditioned`."""

    optimizer: str
    factor: float
    preconditioned: bool = False

    def limit(self, curvature: float) -> float | None:
        """The largest stable rate at `curvature`; None when the loss curves nowhere up."""
        return self.factor / curvature if curvature > 0 else None


def stability_rule(optimizer: torch.optim.Optimizer) -> StabilityRule | None:
    """The rule of `optimizer`: SGD (with momentum m and dampening d, stable below 2 (1 +
    m) / ((1 - d) lambda); with Nesterov's momentum 2 (1 + m) / ((1 + 2 m) lambda)), Adam
    and AdamW (`ADAM_SHARE` of 2 (1 + beta1) / ((1 - beta1) lambda), lambda of the
    preconditioned Hessian); None for another optimizer. Groups that differ take the
    most cautious."""
    groups = optimizer.param_groups
    if type(optimizer) is torch.optim.SGD:
        factors = []
        for group in groups:
            momentum, dampening = float(group["momentum"]), float(group["dampening"])
            if group["nesterov"]:
                factors.append(2 * (1 + momentum) / (1 + 2 * momentum))
            elif dampening < 1:
                factors.append(2 * (1 + momentum) / (1 - dampening))
            else:
                return None  # the momentum never takes a gradient in: no rate moves it
        name = "SGD" if not any(g["momentum"] for g in groups) else "SGD with momentum"
        return StabilityRule(name, min(factors))
    if type(optimizer) in (torch.optim.Adam, torch.optim.AdamW):
        beta = max(float(group["betas"][0]) for group in groups)
        factor = ADAM_SHARE * 2 * (1 + beta) / (1 - beta)
        return StabilityRule(type(optimizer).__name__, factor, preconditioned=True)
    return None


def largest_eigenvalue(
    apply: Callable[[Vectors], Vectors], start: Vectors, steps: int = LANCZOS_STEPS
) -> float:
    """The largest eigenvalue of the symmetric operator `apply` (on lists of tensors)
    by Lanczos iteration from `start`: the largest Ritz value, which approaches it from
    below. Three vectors are kept (no reorthogonalisation: in floating point it brings
    back copies of converged eigenvalues, never larger ones)."""
    norm = math.sqrt(_dot(start, start))
    if not norm > 0:
        raise ValueError("Lanczos needs a start vector that is not zero")
    q = [v / norm for v in start]
    previous: Vectors | None = None
    alphas: list[float] = []
    betas: list[float] = []
    for _ in range(steps):
        w = apply(q)
        alpha = _dot(w, q)
        w = [a - alpha * b for a, b in zip(w, q)]
        if previous is not None:
            w = [a - betas[-1] * b for a, b in zip(w, previous)]
        again = _dot(w, q)  # once more against q: the step's own rounding
        w = [a - again * b for a, b in zip(w, q)]
        alphas.append(alpha + again)
        beta = math.sqrt(_dot(w, w))
        if not beta > 1e-7 * max(abs(a) for a in alphas):
            break  # the vectors span an invariant subspace: its eigenvalues are exact
        betas.append(beta)
        previous, q = q, [a / beta for a in w]
    return _largest_ritz(alphas, betas)


def _largest_ritz(alphas: Sequence[float], betas: Sequence[float]) -> float:
    size = len(alphas)
    tridiagonal = torch.diag(torch.tensor(alphas, dtype=torch.float64))
    if size > 1:
        off = torch.tensor(betas[: size - 1], dtype=torch.float64)
        tridiagonal += torch.diag(off, 1) + torch.diag(off, -1)
    return float(torch.linalg.eigvalsh(tridiagonal)[-1])


def _dot(a: Vectors, b: Vectors) -> float:
    return float(sum(torch.sum(x.double() * y.double()) for x, y in zip(a, b)))


def curvature(
    forward: Callable[[Any], torch.Tensor],
    params: Vectors,
    batches: Sequence[Any],
    optimizer: torch.optim.Optimizer,
    rule: StabilityRule,
    scale: float = 1.0,
    steps: int = LANCZOS_STEPS,
) -> float:
    """The largest eigenvalue of the Hessian of the mean loss over `batches` (`forward`
    gives a batch's loss, times `scale`: the loss scale under fp16) with respect to
    `params`, plus the L2 weight decay of `optimizer`'s groups; preconditioned when
    `rule` says so, by D = sqrt(v) + eps, v the mean of the batches' squared gradients
    (Adam's second moment after as many steps). Each batch runs with the same random
    numbers every time (the same dropout masks); the generators, the parameters and
    their gradients are left as they were."""
    coupled = type(optimizer) is not torch.optim.AdamW  # AdamW's decay is no gradient
    decay: dict[int, float] = {}
    epsilon: dict[int, float] = {}
    for group in optimizer.param_groups:
        for p in group["params"]:
            decay[id(p)] = float(group.get("weight_decay", 0.0)) if coupled else 0.0
            epsilon[id(p)] = float(group.get("eps", 0.0))
    count = len(batches)
    outer = capture_rng_state()
    states: list[dict[str, Any]] = []

    def loss_of(index: int) -> torch.Tensor:
        if index < len(states):
            restore_rng_state(states[index])
        else:
            states.append(capture_rng_state())
        return forward(batches[index])

    try:
        precondition: Vectors | None = None
        if rule.preconditioned:
            squares = [torch.zeros_like(p) for p in params]
            for index in range(count):
                grads = _grad(loss_of(index), params, create_graph=False)
                for total, g in zip(squares, grads):
                    total.add_((g / scale) ** 2, alpha=1 / count)
            precondition = [
                (s.sqrt() + epsilon.get(id(p), 0.0)).rsqrt() for s, p in zip(squares, params)
            ]

        def hessian_times(vectors: Vectors) -> Vectors:
            if precondition is not None:
                vectors = [v * s for v, s in zip(vectors, precondition)]
            total = [decay.get(id(p), 0.0) * v for p, v in zip(params, vectors)]
            for index in range(count):
                grads = _grad(loss_of(index), params, create_graph=True)
                dot = sum(torch.sum(g * v) for g, v in zip(grads, vectors))
                if isinstance(dot, torch.Tensor) and dot.requires_grad:
                    products = _grad(dot, params, create_graph=False)
                    for t, h in zip(total, products):
                        t.add_(h, alpha=1 / (count * scale))
            if precondition is not None:
                total = [t * s for t, s in zip(total, precondition)]
            return total

        generator = torch.Generator().manual_seed(0)
        start = [
            torch.randn(p.shape, generator=generator, dtype=torch.float32).to(p.device, p.dtype)
            for p in params
        ]
        return largest_eigenvalue(hessian_times, start, steps)
    finally:
        restore_rng_state(outer)


def _grad(loss: torch.Tensor, params: Vectors, *, create_graph: bool) -> Vectors:
    grads = torch.autograd.grad(loss, params, create_graph=create_graph, allow_unused=True)
    return [torch.zeros_like(p) if g is None else g for g, p in zip(grads, params)]
