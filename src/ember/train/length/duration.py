"""Lengths of training in epochs, optimizer steps, samples or tokens.

`Duration` is the value a user gives `LearnerBuilder.train_for`, `valid_every` and
`checkpoint_every`: a positive whole number of one unit. `Duration.parse` reads the
strings a config holds: a number (an int, a decimal or an exponent form such as
`1e9`, optionally with a multiplier `k`/`K`, `M`, `B`/`G` or `T`), then a unit, with
or without a space between them:

    "10ep", "10 epochs"            epochs
    "5000steps", "5000ba", "5k steps"   optimizer steps ("ba": batches, as an optimizer
                                   step takes its batches under accumulation)
    "2M samples", "2000000sp"      samples, over every process
    "1e9tok", "1B tokens"          tokens, over every process

`Counters` are the run's running totals of the same units (steps, samples and
tokens since the run began), which a checkpoint keeps; `crossed` tells whether a
cadence ("every 500k samples") has a multiple between two totals.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, NamedTuple

from ember.errors import ConfigError

UNITS = ("epochs", "steps", "samples", "tokens")

_ALIASES = {
    "ep": "epochs",
    "epoch": "epochs",
    "epochs": "epochs",
    "ba": "steps",
    "step": "steps",
    "steps": "steps",
    "sp": "samples",
    "sample": "samples",
    "samples": "samples",
    "tok": "tokens",
    "token": "tokens",
    "tokens": "tokens",
}
_SCALES = {"k": 10**3, "K": 10**3, "M": 10**6, "B": 10**9, "G": 10**9, "T": 10**12}
_GRAMMAR = re.compile(
    r"^\s*(?P<number>[0-9][0-9_]*(?:\.[0-9]+)?(?:[eE][+]?[0-9]+)?)\s*(?P<word>[A-Za-z]+)"
    r"(?:\s+(?P<unit>[A-Za-z]+))?\s*$"
)
FORMS = (
    "a number and a unit: '10ep' or '10 epochs', '5000steps' or '5000ba', '2M samples' "
    "or '2000000sp', '1e9tok' or '1B tokens' (multipliers k, M, B/G, T)"
)


@dataclass(frozen=True, init=False)
class Duration:
    """A positive whole number (`value`) of one unit (`unit`: "epochs", "steps",
    "samples" or "tokens"). Build one with a keyword, `Duration(samples=2_000_000)`,
    or from text, `Duration.parse("2M samples")`."""

    value: int
    unit: str

    def __init__(
        self,
        *,
        epochs: int | None = None,
        steps: int | None = None,
        samples: int | None = None,
        tokens: int | None = None,
    ) -> None:
        given = {
            unit: value
            for unit, value in zip(UNITS, (epochs, steps, samples, tokens))
            if value is not None
        }
        if len(given) != 1:
            raise ConfigError(
                "Duration takes exactly one of epochs=, steps=, samples= or tokens=, got "
                f"{', '.join(f'{u}={v!r}' for u, v in given.items()) or 'none'} "
                "(e.g. Duration(samples=2_000_000))."
            )
        ((unit, value),) = given.items()
        number: Any = value
        if isinstance(number, float) and number.is_integer():
            value = int(number)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"Duration({unit}=...) must be an int >= 1, got {value!r}.")
        object.__setattr__(self, "value", value)
        object.__setattr__(self, "unit", unit)

    @classmethod
    def of(cls, unit: str, value: int) -> Duration:
        return cls(**{unit: value})

    @classmethod
    def parse(cls, text: Any, what: str = "a duration") -> Duration:
        """`text` as a Duration: a `Duration` as it is, or a string of the grammar
        above; anything else is a `ConfigError` naming it and the accepted forms."""
        if isinstance(text, Duration):
            return text
        if not isinstance(text, str):
            raise ConfigError(f"{what} takes a Duration or a string, got {text!r}; write {FORMS}.")
        match = _GRAMMAR.match(text)
        scale, unit = (
            _scale_and_unit(match.group("word"), match.group("unit")) if match else (0, None)
        )
        if match is None or unit is None:
            raise ConfigError(f"{what}: cannot read {text!r} as a duration; write {FORMS}.")
        number = float(match.group("number").replace("_", "")) * scale
        if not math.isfinite(number) or not number.is_integer() or number < 1:
            raise ConfigError(
                f"{what}: {text!r} is not a whole number >= 1 of {unit}; write {FORMS}."
            )
        return cls.of(unit, int(number))

    def __str__(self) -> str:
        return f"{self.value:,} {self.unit if self.value != 1 else self.unit[:-1]}"


def _scale_and_unit(word: str, unit: str | None) -> tuple[int, str | None]:
    """The multiplier and the unit of "M samples", "Msamples" or "samples"."""
    if unit is not None:  # a multiplier, then the unit
        return _SCALES.get(word, 0), _ALIASES.get(unit.lower()) if word in _SCALES else None
    if word.lower() in _ALIASES:
        return 1, _ALIASES[word.lower()]
    if word[0] in _SCALES:
        return _SCALES[word[0]], _ALIASES.get(word[1:].lower())
    return 0, None


def short_count(value: int) -> str:
    """`value` in three significant digits: 950, 12.5k, 1.02M, 3B."""
    for scale, suffix in ((10**12, "T"), (10**9, "B"), (10**6, "M"), (10**3, "k")):
        if value >= scale - scale // 2000:  # 999,999 is 1M, not 1e+03k
            return f"{value / scale:.3g}{suffix}"
    return str(value)


class Counters(NamedTuple):
    """What the run has done since it began: optimizer steps, samples (every
    process's) and tokens (every process's; 0 when they are not counted). A named
    tuple: one is made per optimizer step."""

    steps: int = 0
    samples: int = 0
    tokens: int = 0

    def of(self, unit: str) -> int:
        return int(getattr(self, unit))

    def reached(self, duration: Duration) -> bool:
        return self.of(duration.unit) >= duration.value

    def state(self) -> dict[str, int]:
        return {"steps": self.steps, "samples": self.samples, "tokens": self.tokens}

    @classmethod
    def from_state(cls, state: Any) -> Counters:
        """The counters a checkpoint holds (zeros for one written before they were)."""
        if not isinstance(state, dict):
            return cls()
        return cls(*(int(state.get(key, 0)) for key in ("steps", "samples", "tokens")))


def crossed(every: Duration, before: Counters, after: Counters) -> bool:
    """A multiple of `every` lies in (before, after] of its unit."""
    return after.of(every.unit) // every.value > before.of(every.unit) // every.value
