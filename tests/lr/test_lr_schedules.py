"""Each scheduler's rates against a formula written here and, where one exists, the
matching `torch.optim.lr_scheduler` run side by side on a dummy optimizer."""

from __future__ import annotations

import math
import warnings
from typing import Callable

import pytest
import torch
from torch.optim import lr_scheduler as torch_lr

from ember.errors import ConfigError
from ember.lr import (
    ComposedLrScheduler,
    ComposedLrSchedulerConfig,
    ConstantLr,
    ConstantLrConfig,
    CosineAnnealingLrSchedulerConfig,
    ExponentialLrSchedulerConfig,
    LinearLrSchedulerConfig,
    NoamLrSchedulerConfig,
    SequentialLrScheduler,
    SequentialLrSchedulerConfig,
    StepLrSchedulerConfig,
    WarmupLrSchedulerConfig,
    lr_at_steps,
)

N = 50
TOL = 1e-12


def torch_rates(
    make: Callable[[torch.optim.Optimizer], object], base_lr: float, n: int = N
) -> list[float]:
    """The rate torch's scheduler gives each of the first `n` optimizer steps."""
    param = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.SGD([param], lr=base_lr)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        scheduler = make(optimizer)
        rates = []
        for _ in range(n):
            rates.append(float(optimizer.param_groups[0]["lr"]))
            optimizer.step()
            scheduler.step()  # type: ignore[attr-defined]
    return rates


def assert_close(actual: list[float], expected: list[float], tol: float = TOL) -> None:
    assert len(actual) == len(expected)
    for step, (a, e) in enumerate(zip(actual, expected), start=1):
        assert abs(a - e) <= tol, f"step {step}: {a!r} != {e!r}"


# ---------------------------------------------------------------- Noam


@pytest.mark.parametrize("warmup, size", [(10, 512), (1, 64), (7, 1)])
def test_noam_follows_the_transformer_formula(warmup, size):
    config = NoamLrSchedulerConfig(init_lr=2.0, warmup_steps=warmup, model_size=size)
    expected = [
        2.0 / math.sqrt(size) * min(1.0 / math.sqrt(s), s / (warmup * math.sqrt(warmup)))
        for s in range(1, N + 1)
    ]
    rates = lr_at_steps(config.init(), N)
    assert_close(rates, expected)
    peak = max(range(N), key=lambda i: rates[i]) + 1
    assert peak == min(warmup, N)


def test_noam_defaults_follow_burn():
    config = NoamLrSchedulerConfig(init_lr=1.0)
    assert (config.warmup_steps, config.model_size) == (4000, 512)


# ---------------------------------------------------------------- Exponential


@pytest.mark.parametrize("gamma", [0.9, 0.5, 1.0, 1.05])
def test_exponential_matches_formula_and_torch(gamma):
    config = ExponentialLrSchedulerConfig(initial_lr=0.3, gamma=gamma)
    rates = lr_at_steps(config.init(), N)
    expected, rate = [], 0.3
    for _ in range(N):
        expected.append(rate)
        rate *= gamma
    assert_close(rates, expected)
    assert_close(rates, torch_rates(lambda o: torch_lr.ExponentialLR(o, gamma=gamma), 0.3))


# ---------------------------------------------------------------- Step


@pytest.mark.parametrize("step_size, gamma", [(7, 0.1), (1, 0.5), (3, 2.0), (60, 0.1)])
def test_step_matches_formula_and_torch(step_size, gamma):
    config = StepLrSchedulerConfig(initial_lr=0.8, step_size=step_size, gamma=gamma)
    rates = lr_at_steps(config.init(), N)
    expected, rate, held = [], 0.8, 0
    for _ in range(N):
        if held == step_size:
            rate, held = rate * gamma, 0
        expected.append(rate)
        held += 1
    assert_close(rates, expected)
    assert_close(
        rates, torch_rates(lambda o: torch_lr.StepLR(o, step_size=step_size, gamma=gamma), 0.8)
    )


def test_step_gamma_defaults_to_a_tenth():
    rates = lr_at_steps(StepLrSchedulerConfig(initial_lr=1.0, step_size=2).init(), 5)
    assert_close(rates, [1.0, 1.0, 0.1, 0.1, 0.01])


# ---------------------------------------------------------------- Cosine


@pytest.mark.parametrize("num_iters, min_lr", [(20, 0.0), (49, 0.001), (10, 0.05), (1, 0.0)])
def test_cosine_matches_formula_and_torch_over_the_first_cycle(num_iters, min_lr):
    config = CosineAnnealingLrSchedulerConfig(initial_lr=0.1, num_iters=num_iters, min_lr=min_lr)
    rates = lr_at_steps(config.init(), N)
    # (1 + cos x) / 2 == cos(x / 2) ** 2; the cycle restarts every num_iters + 1 steps.
    expected = [
        min_lr
        + (0.1 - min_lr) * math.cos(math.pi * ((s - 1) % (num_iters + 1)) / (2 * num_iters)) ** 2
        for s in range(1, N + 1)
    ]
    assert_close(rates, expected)
    first_cycle = min(num_iters + 1, N)
    reference = torch_rates(
        lambda o: torch_lr.CosineAnnealingLR(o, T_max=num_iters, eta_min=min_lr), 0.1, first_cycle
    )
    assert_close(rates[:first_cycle], reference)
    assert rates[0] == 0.1 and abs(rates[num_iters] - min_lr) <= TOL


def test_cosine_restarts_after_a_cycle_as_burn_does():
    rates = lr_at_steps(
        CosineAnnealingLrSchedulerConfig(initial_lr=0.5, num_iters=2, min_lr=0.1).init(), 7
    )
    assert_close(rates, [0.5, 0.3, 0.1, 0.5, 0.3, 0.1, 0.5])


# ---------------------------------------------------------------- Linear


@pytest.mark.parametrize(
    "initial, final, num_iters", [(0.5, 0.1, 20), (0.01, 0.1, 10), (0.2, 0.2, 5), (0.3, 0.0, 49)]
)
def test_linear_matches_formula_and_torch(initial, final, num_iters):
    config = LinearLrSchedulerConfig(initial_lr=initial, final_lr=final, num_iters=num_iters)
    rates = lr_at_steps(config.init(), N)
    expected = []
    for s in range(1, N + 1):
        t = min(s - 1, num_iters) / num_iters
        expected.append(initial * (1 - t) + final * t)
    assert_close(rates, expected)
    base = max(initial, final)  # torch's factors are relative to the optimizer's rate, in (0, 1]
    start, end = initial / base, final / base
    assert_close(
        rates,
        torch_rates(
            lambda o: torch_lr.LinearLR(
                o, start_factor=start, end_factor=end, total_iters=num_iters
            ),
            base,
        ),
    )
    assert rates[num_iters:] == [final] * (N - num_iters)


def test_linear_can_start_from_zero():
    rates = lr_at_steps(
        LinearLrSchedulerConfig(initial_lr=0.0, final_lr=0.4, num_iters=4).init(), 6
    )
    assert_close(rates, [0.0, 0.1, 0.2, 0.3, 0.4, 0.4])


# ---------------------------------------------------------------- Composed


@pytest.mark.parametrize("reduction", ["prod", "sum", "avg"])
def test_composed_combines_rates_of_schedulers_stepped_together(reduction):
    config = ComposedLrSchedulerConfig(
        schedulers=[
            ExponentialLrSchedulerConfig(initial_lr=0.2, gamma=0.95),
            StepLrSchedulerConfig(initial_lr=1.0, step_size=6, gamma=0.5),
            CosineAnnealingLrSchedulerConfig(initial_lr=0.3, num_iters=12, min_lr=0.01),
        ],
        reduction=reduction,
    )
    rates = lr_at_steps(config.init(), N)
    expected = []
    for s in range(1, N + 1):
        parts = [
            0.2 * 0.95 ** (s - 1),
            1.0 * 0.5 ** ((s - 1) // 6),
            0.01 + 0.29 * math.cos(math.pi * ((s - 1) % 13) / 24) ** 2,
        ]
        combined = {
            "prod": parts[0] * parts[1] * parts[2],
            "sum": sum(parts),
            "avg": sum(parts) / 3,
        }
        expected.append(combined[reduction])
    assert_close(rates, expected)


def test_composed_product_matches_torch_chained_scheduler():
    config = ComposedLrSchedulerConfig(
        schedulers=[
            ExponentialLrSchedulerConfig(initial_lr=0.1, gamma=0.97),
            StepLrSchedulerConfig(initial_lr=1.0, step_size=8, gamma=0.3),
        ]
    )
    assert config.reduction == "prod"
    reference = torch_rates(
        lambda o: torch_lr.ChainedScheduler(
            [torch_lr.ExponentialLR(o, gamma=0.97), torch_lr.StepLR(o, step_size=8, gamma=0.3)]
        ),
        0.1,
    )
    assert_close(lr_at_steps(config.init(), N), reference)


def test_composed_accepts_any_scheduler_object():
    scheduler = ComposedLrScheduler([ConstantLr(0.5), ConstantLr(0.25)], "sum")
    assert lr_at_steps(scheduler, 3) == [0.75, 0.75, 0.75]
    with pytest.raises(ConfigError, match="reduction"):
        ComposedLrScheduler([ConstantLr(0.5)], "max")  # type: ignore[arg-type]


# ---------------------------------------------------------------- Sequential


def test_sequential_switches_at_milestones_and_restarts_each_scheduler():
    config = SequentialLrSchedulerConfig(
        schedulers=[
            LinearLrSchedulerConfig(initial_lr=0.1, final_lr=0.3, num_iters=2),
            ExponentialLrSchedulerConfig(initial_lr=0.5, gamma=0.5),
            CosineAnnealingLrSchedulerConfig(initial_lr=0.8, num_iters=2),
        ],
        milestones=[2, 5],
    )
    assert_close(lr_at_steps(config.init(), 8), [0.1, 0.2, 0.5, 0.25, 0.125, 0.8, 0.4, 0.0])


def test_sequential_matches_torch_sequential_lr():
    base, warm, cycle = 0.1, 5, 20
    config = SequentialLrSchedulerConfig(
        schedulers=[
            LinearLrSchedulerConfig(initial_lr=0.01, final_lr=base, num_iters=warm),
            CosineAnnealingLrSchedulerConfig(initial_lr=base, num_iters=cycle, min_lr=0.001),
            ExponentialLrSchedulerConfig(initial_lr=base, gamma=0.9),
        ],
        milestones=[warm, warm + cycle + 1],
    )
    reference = torch_rates(
        lambda o: torch_lr.SequentialLR(
            o,
            [
                torch_lr.LinearLR(o, start_factor=0.1, end_factor=1.0, total_iters=warm),
                torch_lr.CosineAnnealingLR(o, T_max=cycle, eta_min=0.001),
                torch_lr.ExponentialLR(o, gamma=0.9),
            ],
            milestones=[warm, warm + cycle + 1],
        ),
        base,
    )
    rates = lr_at_steps(config.init(), N)
    assert_close(rates, reference)
    expected = (
        [0.01 + (base - 0.01) * i / warm for i in range(warm)]
        + [
            0.001 + (base - 0.001) * math.cos(math.pi * i / (2 * cycle)) ** 2
            for i in range(cycle + 1)
        ]
        + [base * 0.9**i for i in range(N - warm - cycle - 1)]
    )
    assert_close(rates, expected)


def test_sequential_of_one_scheduler_needs_no_milestone():
    config = SequentialLrSchedulerConfig(schedulers=[ConstantLrConfig(lr=0.3)])
    assert lr_at_steps(config.init(), 3) == [0.3, 0.3, 0.3]
    with pytest.raises(ConfigError, match="milestones"):
        SequentialLrScheduler([ConstantLr(0.1), ConstantLr(0.2)], [3, 3])


# ---------------------------------------------------------------- Warm-up


@pytest.mark.parametrize("start_factor", [0.0, 0.25, 1.0])
def test_warmup_ramps_into_a_scheduler_that_keeps_stepping(start_factor):
    warm = 8
    config = WarmupLrSchedulerConfig(
        scheduler=CosineAnnealingLrSchedulerConfig(initial_lr=0.2, num_iters=30, min_lr=0.02),
        warmup_steps=warm,
        start_factor=start_factor,
    )
    rates = lr_at_steps(config.init(), N)
    expected = []
    for s in range(1, N + 1):
        inner = 0.02 + 0.18 * math.cos(math.pi * ((s - 1) % 31) / 60) ** 2
        factor = 1.0 if s > warm else start_factor + (1 - start_factor) * (s - 1) / warm
        expected.append(factor * inner)
    assert_close(rates, expected)
    if start_factor == 0.0:
        assert rates[0] == 0.0


def test_warmup_matches_torch_chained_linear_and_exponential():
    config = WarmupLrSchedulerConfig(
        scheduler=ExponentialLrSchedulerConfig(initial_lr=0.1, gamma=0.96),
        warmup_steps=10,
        start_factor=0.2,
    )
    reference = torch_rates(
        lambda o: torch_lr.ChainedScheduler(
            [
                torch_lr.LinearLR(o, start_factor=0.2, end_factor=1.0, total_iters=10),
                torch_lr.ExponentialLR(o, gamma=0.96),
            ]
        ),
        0.1,
    )
    assert_close(lr_at_steps(config.init(), N), reference)


# ---------------------------------------------------------------- helper


def test_lr_at_steps_advances_the_scheduler():
    scheduler = StepLrSchedulerConfig(initial_lr=1.0, step_size=1, gamma=0.5).init()
    assert lr_at_steps(scheduler, 2) == [1.0, 0.5]
    assert lr_at_steps(scheduler, 1) == [0.25]
    assert lr_at_steps(scheduler, 0) == []
    with pytest.raises(ConfigError):
        lr_at_steps(scheduler, -1)
