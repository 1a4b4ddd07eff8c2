"""CER and WER against NLTK's edit distance, BLEU against sacreBLEU, ROUGE against the
rouge-score package, per iteration and per epoch."""

from __future__ import annotations

import random

import pytest
import sacrebleu
import torch
from nltk.metrics.distance import edit_distance as nltk_edit_distance
from rouge_score import rouge_scorer

from ember.errors import ConfigError, TrainingError
from ember.train import TextOutput
from ember.train.metric import BleuMetric, CerMetric, RougeMetric, WerMetric
from ember.train.metric.text import edit_distance

SIZES = [8, 8, 8, 3]  # an uneven last batch
WORDS = [
    "the",
    "cat",
    "sat",
    "on",
    "a",
    "mat",
    "and",
    "dog",
    "ran",
    "to",
    "big",
    "red",
    "house,",
    "it",
    "was",
    "warm",
]


def _corpus(seed: int) -> tuple[list[str], list[str]]:
    """References, and predictions made from them by dropping, swapping and adding
    words (so every n-gram order has matches)."""
    rng = random.Random(seed)
    references, predictions = [], []
    for _ in range(sum(SIZES)):
        reference = [rng.choice(WORDS) for _ in range(rng.randint(4, 14))]
        prediction = []
        for word in reference:
            roll = rng.random()
            if roll < 0.1:
                continue
            prediction.append(rng.choice(WORDS) if roll < 0.25 else word)
            if roll > 0.93:
                prediction.append(rng.choice(WORDS))
        references.append(" ".join(reference))
        predictions.append(" ".join(prediction) if rng.random() > 0.05 else "")
    return predictions, references


def _batches(predictions, references):
    out, start = [], 0
    for size in SIZES:
        out.append(TextOutput(predictions[start : start + size], references[start : start + size]))
        start += size
    return out


def _slices(*lists):
    start = 0
    for size in SIZES:
        yield [items[start : start + size] for items in lists]
        start += size


def _error_rate(predictions, references, split):
    edits = sum(nltk_edit_distance(split(p), split(r)) for p, r in zip(predictions, references))
    return edits / sum(len(split(r)) for r in references)


@pytest.mark.parametrize(("metric_type", "split"), [(CerMetric, list), (WerMetric, str.split)])
def test_error_rates_are_total_edits_over_reference_length(drive, metric_type, split):
    predictions, references = _corpus(1)
    value, values = drive(
        metric_type(), _batches(predictions, references), warmup=_batches(references, references)
    )
    assert value == pytest.approx(_error_rate(predictions, references, split), rel=1e-12)
    for (p, r), iteration in zip(_slices(predictions, references), values):
        value, weight = iteration.resolve()
        assert value == pytest.approx(_error_rate(p, r, split), rel=1e-12)
        assert weight == sum(len(split(text)) for text in r)  # the batch's reference length


def test_edit_distance_against_nltk_on_random_pairs():
    rng = random.Random(7)
    for _ in range(300):
        a = "".join(rng.choice("ab c") for _ in range(rng.randint(0, 15)))
        b = "".join(rng.choice("ab c") for _ in range(rng.randint(0, 15)))
        assert edit_distance(a, b) == nltk_edit_distance(a, b), (a, b)
        assert edit_distance(a.split(), b.split()) == nltk_edit_distance(a.split(), b.split())


def test_wer_worked_example(drive):
    # 1 substitution (sat -> sit), 1 deletion (the), 1 insertion (down): 3 edits / 6 words.
    output = TextOutput(["the cat sit on mat down"], ["the cat sat on the mat"])
    value, _ = drive(WerMetric(), [output])
    assert value == 0.5


def test_bleu_is_sacrebleus_corpus_bleu(drive):
    predictions, references = _corpus(2)
    value, values = drive(BleuMetric(), _batches(predictions, references))

    def reference(p, r):
        return sacrebleu.corpus_bleu(p, [r], tokenize="none", smooth_method="none").score

    assert value == pytest.approx(reference(predictions, references), rel=1e-9)
    for (p, r), iteration in zip(_slices(predictions, references), values):
        assert float(iteration.value) == pytest.approx(reference(p, r), rel=1e-9)


def test_bleu_with_sacrebleus_tokenizer_and_brevity_penalty(drive):
    from sacrebleu.tokenizers.tokenizer_13a import Tokenizer13a

    tokenizer = Tokenizer13a()
    references = ["The cat sat on the mat, didn't it?", "A dog ran to the big red house."]
    predictions = ["The cat sat on the mat, didn't it", "A dog ran to the house."]  # shorter
    value, _ = drive(
        BleuMetric(tokenize=lambda text: tokenizer(text).split()),
        [TextOutput(predictions, references)],
    )
    expected = sacrebleu.corpus_bleu(predictions, [references], smooth_method="none")
    assert expected.bp < 1
    assert value == pytest.approx(expected.score, rel=1e-9)


def test_bleu_states_merge_as_one_corpus(drive):
    predictions, references = _corpus(3)
    whole, _ = drive(BleuMetric(), [TextOutput(predictions, references)])
    first, second = BleuMetric(), BleuMetric()
    drive(first, [TextOutput(predictions[:10], references[:10])])
    drive(second, [TextOutput(predictions[10:], references[10:])])
    first.merge_epoch_states([second.epoch_state()])
    assert first.epoch_value() == whole


@pytest.mark.parametrize("variant", ["rouge1", "rouge2", "rougeL"])
def test_rouge_against_rouge_score(drive, variant):
    predictions, references = _corpus(4)
    predictions[3] = predictions[3].upper() + "!"  # case and punctuation are not words
    scorer = rouge_scorer.RougeScorer([variant], use_stemmer=False)

    def reference(p, r):
        scores = [scorer.score(ref, pred)[variant].fmeasure for pred, ref in zip(p, r)]
        return sum(scores) / len(scores)

    metric = RougeMetric(variant)
    value, values = drive(metric, _batches(predictions, references))
    assert metric.name == {"rouge1": "ROUGE-1", "rouge2": "ROUGE-2", "rougeL": "ROUGE-L"}[variant]
    assert value == pytest.approx(reference(predictions, references), rel=1e-12)
    for (p, r), iteration in zip(_slices(predictions, references), values):
        assert iteration.resolve() == (pytest.approx(reference(p, r), rel=1e-12), len(p))


def test_token_ids_are_decoded_without_padding(drive):
    vocabulary = ["<pad>", "the", "cat", "sat", "mat"]

    def decode(ids: list[int]) -> str:
        return " ".join(vocabulary[i] for i in ids)

    predictions = torch.tensor([[1, 2, 3, 0], [1, 4, 0, 0]])
    references = torch.tensor([[1, 2, 3, 4], [1, 4, 0, 0]])
    output = TextOutput(predictions, references, decode=decode, pad_token=0)
    value, _ = drive(WerMetric(), [output])
    assert value == pytest.approx(1 / 6)  # "mat" missing from 6 reference words


def test_bad_text_inputs_are_named(drive):
    with pytest.raises(TrainingError, match="pass decode="):
        drive(WerMetric(), [TextOutput(torch.ones(2, 3, dtype=torch.long), ["a", "b"])])
    with pytest.raises(TrainingError, match="one reference per prediction"):
        drive(WerMetric(), [TextOutput(["a"], ["a", "b"])])
    with pytest.raises(TrainingError, match="one string"):
        drive(CerMetric(), [TextOutput("a cat", "a cat")])
    with pytest.raises(ConfigError, match="variant must be one of"):
        RougeMetric("rougeLsum")  # type: ignore[arg-type]
