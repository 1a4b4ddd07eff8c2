"""The ported word language model: ember's run does the arithmetic of a plain truncated
BPTT loop (hidden state carried across batches and reset per split, clipping,
ReduceLROnPlateau on the validation loss), and a run stopped after epoch 1 and
resumed ends with the same weights as one never stopped."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from ember_testing import load_example

from ember.train import EvaluatorBuilder, StartSplit
from ember.train.metric import LossMetric, PerplexityMetric
from ember.train.renderer import PlainRenderer

ROOT = Path(__file__).resolve().parents[1]
PORTED = ROOT / "examples" / "ported"


def load(name: str):
    """An example of examples/ported as a module of its own name."""
    return load_example(ROOT / "examples" / "ported" / f"{name}.py", f"ported_{name}")


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def lm():
    return load("word_lm")


def tiny(lm, epochs: int = 3):
    # At a rate of 20 the validation loss of epoch 2 is worse than epoch 1's, so the
    # plateau divides the rate by 4 for epoch 3.
    return lm.TrainingConfig(
        embedding_size=24, hidden_size=24, num_epochs=epochs, restore_best=False
    )


def plain_loop(lm, config):
    """The script's loop, written out: the same seed, batches and steps, and its own
    rule for the rate: divided by 4 after an epoch whose validation loss is not lower
    than the best so far."""
    torch.manual_seed(config.seed)
    corpus = lm.Corpus.load(config.corpus)
    train_batches, valid_batches = lm.loaders(corpus, config)
    model = lm.RnnLanguageModel(config, len(corpus))
    optimizer = torch.optim.SGD(model.parameters(), lr=config.learning_rate)
    vocab = len(corpus)
    best = None

    def run(batches, batch_size, training):
        model.train(training)
        hidden = model.init_hidden(batch_size)  # every split starts from zeros
        rows = []
        for batch in batches:
            hidden = tuple(h.detach() for h in hidden)  # truncated BPTT
            with torch.set_grad_enabled(training):
                logits, hidden = model(batch.inputs, hidden)
                loss = F.cross_entropy(logits.reshape(-1, vocab), batch.targets.reshape(-1))
            if training:
                optimizer.zero_grad()
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), config.clip)
                optimizer.step()
            rows.append((float(loss.detach()), batch.targets.numel()))
        return math.fsum(v * n for v, n in rows) / math.fsum(n for _, n in rows)

    history = []
    for _ in range(config.num_epochs):
        rate = optimizer.param_groups[0]["lr"]
        train_loss = run(train_batches, config.batch_size, True)
        valid_loss = run(valid_batches, config.eval_batch_size, False)
        if best is None or valid_loss < best:  # the script's own rule
            best = valid_loss
        else:  # "Anneal the learning rate if no improvement has been seen"
            for group in optimizer.param_groups:
                group["lr"] /= 4.0
        history.append({"train": {"Loss": train_loss, "Learning Rate": rate}, "valid": valid_loss})
    return model, history


def test_ember_trains_the_model_as_the_plain_loop_does(lm, tmp_path):
    config = tiny(lm)
    model, learner = lm.train(str(tmp_path / "run"), config)
    reference, expected = plain_loop(lm, config)

    assert [e["train"]["Learning Rate"] for e in expected] == [20.0, 20.0, 5.0]  # a plateau
    assert len(learner.history) == len(expected) == 3
    for (epoch, values), want in zip(learner.history, expected):
        train, valid = values["train"], values["valid"]
        # The same fsum of the same floats; the plateau read this very validation Loss.
        assert train["Loss"] == want["train"]["Loss"], epoch
        assert train["Learning Rate"] == want["train"]["Learning Rate"], epoch
        assert valid["Loss"] == want["valid"], epoch
        # Perplexity sums the NLL per token itself: exp of the loss up to float32 rounding.
        for got, loss in ((train, want["train"]["Loss"]), (valid, want["valid"])):
            torch.testing.assert_close(got["Perplexity"], math.exp(loss), rtol=1e-5, atol=0)
    for name, value in reference.state_dict().items():
        assert torch.equal(model.state_dict()[name], value), name


def plain_evaluate(model, batches, hidden):
    """The script's `evaluate()`, written out: eval mode, no gradients, the state
    `hidden` first (the script's: `model.init_hidden(batch_size)`, zeros), carried from
    batch to batch; the mean loss per word (the fsum of each batch's loss times its
    words) and the perplexity, exp of the summed negative log-likelihood over the words."""
    model.eval()
    rows, nll, words = [], None, 0
    with torch.no_grad():
        for batch in batches:
            logits, hidden = model(batch.inputs, hidden)
            flat = logits.reshape(-1, model.vocab_size)
            targets = batch.targets.reshape(-1)
            rows.append((float(F.cross_entropy(flat, targets)), targets.numel()))
            summed = F.cross_entropy(flat, targets, reduction="sum").double()
            nll = summed if nll is None else nll + summed
            words += targets.numel()
    model.train()
    loss = math.fsum(v * n for v, n in rows) / math.fsum(n for _, n in rows)
    return loss, float(torch.exp(nll / words))


def test_the_test_text_is_evaluated_from_a_zero_state_as_the_script_evaluates_it(lm, tmp_path):
    config = tiny(lm, epochs=2)
    model, learner = lm.train(str(tmp_path / "run"), config)
    corpus = lm.Corpus.load()
    test = lm.BpttBatches(corpus.test, config.eval_batch_size, config.bptt)
    reference = copy.deepcopy(model)
    loss, perplexity = plain_evaluate(reference, test, reference.init_hidden(10))

    # The run ended with validation: the model holds the state of the last validation
    # batch. The evaluation starts from zeros all the same (on_split_start("test")).
    assert model.hidden is not None
    values = lm.evaluate_test(learner, config)
    assert values == {"Loss": loss, "Perplexity": perplexity}  # exactly
    saved = json.loads((tmp_path / "run" / "test" / "test" / "values.json").read_text())
    assert saved["values"] == values

    # An Evaluator of the same model, built apart from the learner, agrees exactly.
    evaluator = (
        EvaluatorBuilder(tmp_path / "eval")
        .metric_numeric(LossMetric())
        .metric_numeric(PerplexityMetric())
        .renderer(PlainRenderer(interval=3600))
        .build(model)
    )
    assert evaluator.eval("test", test) == values
    # Started from the state a pass leaves, the figures would differ.
    assert plain_evaluate(reference, test, model.hidden)[0] != loss


class StopAfterEpoch:
    """Asks for a graceful stop once training of `epoch` is over: validation finishes
    and the run stops with that epoch's checkpoint."""

    def __init__(self, epoch: int) -> None:
        self.epoch = epoch
        self.interrupter = None

    def configure(self, builder):
        self.interrupter = builder.interrupter()
        return builder.listener(self)

    def on_event(self, event) -> None:
        if isinstance(event, StartSplit) and event.split == "valid" and event.epoch == self.epoch:
            self.interrupter.stop("stopped after epoch 1")


def test_a_run_stopped_after_epoch_1_resumes_to_the_same_weights(lm, tmp_path):
    config = tiny(lm)
    whole, whole_learner = lm.train(str(tmp_path / "whole"), config)

    stop = StopAfterEpoch(1)
    _, first = lm.train(str(tmp_path / "resumed"), config, configure=stop.configure)
    assert first.outcome == "stopped: stopped after epoch 1"
    assert [epoch for epoch, _ in first.history] == [1]

    resumed, second = lm.train(str(tmp_path / "resumed"), config, resume=True)
    assert second.outcome == "completed"
    # The plateau's best loss came back with the checkpoint: epoch 2 is worse than
    # epoch 1, so epoch 3 runs at a quarter of the rate, as in the run never stopped.
    assert second.history == whole_learner.history
    assert [values["train"]["Learning Rate"] for _, values in second.history] == [20.0, 20.0, 5.0]
    for name, value in whole.state_dict().items():
        assert torch.equal(resumed.state_dict()[name], value), name


def test_batches_are_time_major_and_count_their_sequences(lm):
    corpus = lm.Corpus.load()
    batches = lm.BpttBatches(corpus.train, batch_size=10, bptt=20)
    listed = list(batches)
    assert len(listed) == len(batches)
    first, last = listed[0], listed[-1]
    assert first.inputs.shape == (20, 10) and first.num_items == 10
    assert torch.equal(first.targets[:-1], first.inputs[1:])  # the next word, one row later
    assert 1 <= last.inputs.shape[0] <= 20
    # Column b is the b-th slice of the stream, read top to bottom.
    column = torch.cat([batch.inputs[:, 3] for batch in listed])
    rows = corpus.train.numel() // 10
    assert torch.equal(column, corpus.train[3 * rows : 4 * rows][: column.numel()])


def test_the_bundled_corpus_is_what_its_generator_writes():
    module = load_example(PORTED / "data" / "make_corpus.py", "ported_make_corpus")
    text = (PORTED / "data" / "sentences.txt").read_text(encoding="utf-8")
    assert text == module.corpus()
    assert 4000 < len(text.split()) < 8000
