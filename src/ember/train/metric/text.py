"""Text metrics: character and word error rates, corpus BLEU and ROUGE.

They read a `TextInput` (strings: a `TextOutput` decodes token ids first) and
compute on the host, where the strings are. Error rates are exact epoch ratios
(total edits over total reference length: the iteration weight is the batch's
reference length); BLEU keeps the epoch's n-gram counts (a few integers, merged
across processes) and scores the corpus at epoch end; ROUGE is the mean F-measure
over the epoch's pairs.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from typing import Callable, Hashable, Literal, Sequence

import numpy as np

from ember.errors import ConfigError, TrainingError
from ember.train.metric.base import MetricMetadata, MetricValue
from ember.train.metric.inputs import TextInput


def edit_distance(prediction: Sequence[Hashable], reference: Sequence[Hashable]) -> int:
    """Levenshtein distance: the fewest substitutions, deletions and insertions that
    turn `prediction` into `reference`.

    One row of the dynamic programme per item of the shorter sequence, each row a few
    vector operations (the chain of insertions is a running minimum), so long texts
    cost O(n m) cheap steps, not O(n m) Python steps.
    """
    if not prediction or not reference:
        return max(len(prediction), len(reference))
    codes: dict[Hashable, int] = {}
    short = np.array([codes.setdefault(item, len(codes)) for item in prediction])
    long = np.array([codes.setdefault(item, len(codes)) for item in reference])
    if len(short) > len(long):
        short, long = long, short
    offsets = np.arange(len(long) + 1)
    previous = offsets.copy()
    row = np.empty_like(previous)
    for i, item in enumerate(short.tolist(), start=1):
        row[0] = i
        # substitution (or a match) and deletion; insertions follow as a running minimum
        np.minimum(previous[1:] + 1, previous[:-1] + (long != item), out=row[1:])
        previous = np.minimum.accumulate(row - offsets) + offsets
    return int(previous[-1])


class _ErrorRate:
    """Total edits over total reference length (in the metric's units)."""

    unit = ""
    higher_is_better = False
    input_type = TextInput
    _label = ""

    def __init__(self, name: str | None = None) -> None:
        self.name = name if name is not None else self._label

    def units(self, text: str) -> Sequence[str]:
        raise NotImplementedError

    def update(self, input: TextInput, meta: MetricMetadata) -> MetricValue:
        check_texts(self.name, input)
        edits = length = 0
        for prediction, reference in zip(input.predictions, input.references):
            ref = self.units(reference)
            edits += edit_distance(self.units(prediction), ref)
            length += len(ref)
        # The exact ratio, taken on the host; the weight makes the epoch value the
        # epoch's total edits over its total reference length.
        return MetricValue(edits, length, divisor=max(length, 1))

    def clear(self) -> None:
        pass


class CerMetric(_ErrorRate):
    """Character error rate: character edits (Levenshtein) over reference characters,
    spaces included. The epoch value is the epoch's total edits over its total
    reference length (0 is perfect; it exceeds 1 when predictions are longer than
    references)."""

    _label = "CER"

    def units(self, text: str) -> Sequence[str]:
        return text


class WerMetric(_ErrorRate):
    """Word error rate: word edits (Levenshtein over words split on whitespace) over
    reference words. The epoch value is the epoch's total edits over its total number
    of reference words."""

    _label = "WER"

    def units(self, text: str) -> Sequence[str]:
        return text.split()


def _ngrams(tokens: Sequence[str], n: int) -> Counter[tuple[str, ...]]:
    return Counter(tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1))


class BleuMetric:
    """Corpus BLEU (Papineni et al.) of the whole epoch, in percent (0 to 100, as
    sacreBLEU reports it), with the brevity penalty and n-grams up to `max_order`
    (4), uniformly weighted, unsmoothed, one reference per prediction.

    Texts are split into tokens by `tokenize` (default: on whitespace; pass e.g.
    sacreBLEU's tokenizer for its standard "13a" scores). The epoch value is the BLEU
    of the epoch's corpus, from its summed clipped n-gram matches and lengths (not a
    mean of batch or sentence scores); the iteration value is the BLEU of the batch.
    A corpus without a match of some order scores 0.
    """

    name = "BLEU"
    unit = ""
    higher_is_better = True
    input_type = TextInput

    def __init__(
        self,
        max_order: int = 4,
        *,
        tokenize: Callable[[str], Sequence[str]] | None = None,
        name: str | None = None,
    ) -> None:
        if isinstance(max_order, bool) or not isinstance(max_order, int) or max_order < 1:
            raise ConfigError(
                f"BleuMetric: max_order must be a positive integer, got {max_order!r}."
            )
        if tokenize is not None and not callable(tokenize):
            raise ConfigError("BleuMetric: tokenize must be a function from a string to tokens.")
        self.max_order = max_order
        self.tokenize = tokenize if tokenize is not None else str.split
        if name is not None:
            self.name = name
        self._total: list[int] | None = None

    def update(self, input: TextInput, meta: MetricMetadata) -> MetricValue:
        check_texts(self.name, input)
        stats = [0] * (2 * self.max_order + 2)
        for prediction, reference in zip(input.predictions, input.references):
            hyp, ref = self.tokenize(prediction), self.tokenize(reference)
            stats[0] += len(hyp)
            stats[1] += len(ref)
            for n in range(1, self.max_order + 1):
                hyp_grams = _ngrams(hyp, n)
                stats[2 * n] += sum((hyp_grams & _ngrams(ref, n)).values())
                stats[2 * n + 1] += max(len(hyp) - n + 1, 0)
        self._total = stats if self._total is None else _added(self._total, stats)
        return MetricValue(self.score(stats), len(input.predictions))

    def score(self, stats: Sequence[int]) -> float:
        """BLEU from (prediction length, reference length, then matches and totals per
        order)."""
        hyp_len, ref_len = stats[0], stats[1]
        if hyp_len == 0:
            return 0.0
        log_precision = 0.0
        for n in range(1, self.max_order + 1):
            matches, total = stats[2 * n], stats[2 * n + 1]
            if matches == 0 or total == 0:
                return 0.0
            log_precision += math.log(matches / total) / self.max_order
        brevity = 0.0 if hyp_len >= ref_len else 1.0 - ref_len / hyp_len
        return 100.0 * math.exp(brevity + log_precision)

    def epoch_value(self) -> float:
        """The BLEU of every pair seen since the last `clear()`."""
        return math.nan if self._total is None else self.score(self._total)

    def clear(self) -> None:
        self._total = None

    def epoch_state(self) -> list[int] | None:
        """This process's counts (exchanged when training on several processes)."""
        return None if self._total is None else list(self._total)

    def merge_epoch_states(self, states: list[list[int] | None]) -> None:
        """Add other processes' counts, so `epoch_value` covers every pair."""
        for stats in states:
            if stats is not None:
                self._total = list(stats) if self._total is None else _added(self._total, stats)


def _added(a: Sequence[int], b: Sequence[int]) -> list[int]:
    return [x + y for x, y in zip(a, b)]


Variant = Literal["rouge1", "rouge2", "rougeL"]
_VARIANTS = {"rouge1": "ROUGE-1", "rouge2": "ROUGE-2", "rougeL": "ROUGE-L"}
_NON_ALPHANUMERIC = re.compile(r"[^a-z0-9]+")


def rouge_tokens(text: str) -> list[str]:
    """ROUGE's default tokens (as the rouge-score package, without stemming): lower
    case, runs of characters other than a-z and 0-9 as separators."""
    return _NON_ALPHANUMERIC.sub(" ", text.lower()).split()


def _lcs_length(a: Sequence[str], b: Sequence[str]) -> int:
    previous = [0] * (len(b) + 1)
    for item in a:
        current = [0]
        for j, other in enumerate(b, start=1):
            current.append(previous[j - 1] + 1 if item == other else max(previous[j], current[-1]))
        previous = current
    return previous[-1]


def _f_measure(overlap: int, predicted: int, reference: int) -> float:
    if overlap == 0:
        return 0.0
    precision, recall = overlap / predicted, overlap / reference
    return 2 * precision * recall / (precision + recall)


class RougeMetric:
    """ROUGE F-measure of one variant, averaged over the epoch's pairs, in [0, 1].

    `variant` picks the score: "rouge1" (unigram overlap, named "ROUGE-1"), "rouge2"
    (bigram overlap, "ROUGE-2") or "rougeL" (longest common subsequence, "ROUGE-L");
    register one metric per variant wanted. Texts are tokenized as the rouge-score
    package does without stemming (`tokenize` replaces it). The iteration value is
    the batch's mean F-measure, weighted by its number of pairs, so the epoch value is
    the mean over every pair of the epoch.
    """

    unit = ""
    higher_is_better = True
    input_type = TextInput

    def __init__(
        self,
        variant: Variant = "rougeL",
        *,
        tokenize: Callable[[str], Sequence[str]] | None = None,
        name: str | None = None,
    ) -> None:
        if variant not in _VARIANTS:
            raise ConfigError(
                f"RougeMetric: variant must be one of {tuple(_VARIANTS)}, got {variant!r}."
            )
        if tokenize is not None and not callable(tokenize):
            raise ConfigError("RougeMetric: tokenize must be a function from a string to tokens.")
        self.variant: Variant = variant
        self.tokenize = tokenize if tokenize is not None else rouge_tokens
        self.name = name if name is not None else _VARIANTS[variant]

    def pair_score(self, prediction: str, reference: str) -> float:
        """The F-measure of one prediction against its reference."""
        hyp, ref = self.tokenize(prediction), self.tokenize(reference)
        if self.variant == "rougeL":
            return _f_measure(_lcs_length(hyp, ref), len(hyp), len(ref))
        n = 1 if self.variant == "rouge1" else 2
        hyp_grams, ref_grams = _ngrams(hyp, n), _ngrams(ref, n)
        overlap = sum((hyp_grams & ref_grams).values())
        return _f_measure(overlap, sum(hyp_grams.values()), sum(ref_grams.values()))

    def update(self, input: TextInput, meta: MetricMetadata) -> MetricValue:
        check_texts(self.name, input)
        scores = [self.pair_score(p, r) for p, r in zip(input.predictions, input.references)]
        if not scores:
            return MetricValue(0.0, 0)  # an empty batch weighs nothing
        return MetricValue(math.fsum(scores), len(scores), divisor=len(scores))

    def clear(self) -> None:
        pass


def check_texts(metric: str, input: TextInput) -> None:
    """Raised early: a prediction list and a reference list of different lengths."""
    if len(input.predictions) != len(input.references):
        raise TrainingError(
            f"{metric} reads one reference per prediction; got {len(input.predictions)} "
            f"predictions and {len(input.references)} references."
        )
