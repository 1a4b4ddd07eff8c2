"""A word-level LSTM language model with truncated backpropagation through time.

Run `python examples/ported/word_lm.py [--num-epochs 10 --learning-rate 20 ...]`.

The classic recipe: the text becomes one stream of word ids, cut into `batch_size`
columns ([N, B], time-major); each batch is the next `bptt` rows of every column
([T, B]), the target the same rows one word later. The LSTM carries its hidden state
from one batch to the next within a split (detached, so gradients stop at the batch
boundary) and starts each split from zeros. Plain SGD with gradient clipping; the
learning rate is divided by 4 whenever the validation loss stops improving
(`ReduceLROnPlateau(factor=0.25, patience=0, threshold=0)`). The figure that matters is the
perplexity, exp of the mean loss per word, on the validation and test text.

The text is the bundled `data/sentences.txt` (sentences of a small grammar, made by
`data/make_corpus.py`) unless `--corpus FILE` names another, one sentence per line:
the last tenth of the lines is the test text, the tenth before it the validation text.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import torch
import torch.nn.functional as F
from torch import nn

import ember
from ember import Config
from ember.record import DefaultRecorder
from ember.train import LearnerBuilder, TrainOutput
from ember.train.metric import (
    LearningRateMetric,
    LossInput,
    LossMetric,
    PerplexityMetric,
    SequenceInput,
)

BUNDLED_CORPUS = Path(__file__).resolve().parent / "data" / "sentences.txt"
EOS = "<eos>"


class TrainingConfig(Config):
    corpus: str | None = None  # a text file, one sentence per line; None: the bundled one
    embedding_size: int = 64
    hidden_size: int = 64
    num_layers: int = 2
    dropout: float = 0.2
    batch_size: int = 10
    eval_batch_size: int = 10
    bptt: int = 20  # time steps per batch
    learning_rate: float = 20.0
    clip: float = 0.25  # the largest gradient norm of a step
    num_epochs: int = 10
    seed: int = 1111
    restore_best: bool = True  # hand back the weights of the best validation epoch


# The text ----------------------------------------------------------------------------


class Corpus:
    """Word ids of the training, validation and test text, with one vocabulary.

    Every line ends with an end-of-sentence token. Words are numbered in the order
    they first appear in the training, then validation, then test text.
    """

    def __init__(self, lines: list[str], valid_fraction: float = 0.1, test_fraction: float = 0.1):
        n_valid, n_test = round(len(lines) * valid_fraction), round(len(lines) * test_fraction)
        n_train = len(lines) - n_valid - n_test
        if min(n_train, n_valid, n_test) < 1:
            raise ValueError(f"{len(lines)} lines are too few to split three ways")
        self.words: list[str] = []
        self.index: dict[str, int] = {}
        self.train = self.tokenize(lines[:n_train])
        self.valid = self.tokenize(lines[n_train : n_train + n_valid])
        self.test = self.tokenize(lines[n_train + n_valid :])

    @classmethod
    def load(cls, path: str | Path | None = None) -> Corpus:
        text = Path(path or BUNDLED_CORPUS).read_text(encoding="utf-8")
        return cls([line for line in text.splitlines() if line.strip()])

    def tokenize(self, lines: list[str]) -> torch.Tensor:
        ids = []
        for line in lines:
            for word in [*line.split(), EOS]:
                if word not in self.index:
                    self.index[word] = len(self.words)
                    self.words.append(word)
                ids.append(self.index[word])
        return torch.tensor(ids, dtype=torch.int64)

    def __len__(self) -> int:
        """The size of the vocabulary."""
        return len(self.words)


@dataclass
class LmBatch:
    inputs: torch.Tensor  # [T, B] word ids
    targets: torch.Tensor  # [T, B] the next word of each input

    @property
    def num_items(self) -> int:
        """A [T, B] batch holds B sequences (ember counts items by it)."""
        return int(self.inputs.shape[1])


def batchify(ids: torch.Tensor, batch_size: int) -> torch.Tensor:
    """The stream cut into `batch_size` columns, [N, B]; the words that do not fill a
    last row are dropped."""
    rows = ids.numel() // batch_size
    return ids[: rows * batch_size].view(batch_size, rows).t().contiguous()


class BpttBatches:
    """The [T, B] batches of one text, in order, `bptt` rows each (the last may be
    shorter). Iterable any number of times, with a length, so it serves as a data
    loader for ember and for a plain loop alike."""

    def __init__(self, ids: torch.Tensor, batch_size: int, bptt: int) -> None:
        self.data = batchify(ids, batch_size)
        self.bptt = bptt

    def __len__(self) -> int:
        return len(range(0, self.data.shape[0] - 1, self.bptt))

    def __iter__(self) -> Iterator[LmBatch]:
        for start in range(0, self.data.shape[0] - 1, self.bptt):
            length = min(self.bptt, self.data.shape[0] - 1 - start)
            yield LmBatch(
                self.data[start : start + length], self.data[start + 1 : start + 1 + length]
            )


def loaders(corpus: Corpus, config: TrainingConfig) -> tuple[BpttBatches, BpttBatches]:
    """Training and validation batches."""
    return (
        BpttBatches(corpus.train, config.batch_size, config.bptt),
        BpttBatches(corpus.valid, config.eval_batch_size, config.bptt),
    )


# The model ---------------------------------------------------------------------------


@dataclass
class LmOutput:
    """A step's mean loss per word, its logits [T, B, V] and targets [T, B].

    The loss counts for as many items as the batch has words, so the epoch's Loss is
    the mean loss per word even when the last batch is shorter, and its exp is the
    perplexity."""

    loss: torch.Tensor
    logits: torch.Tensor
    targets: torch.Tensor

    def adapt(self, input_type: type) -> Any:
        if input_type is SequenceInput:
            return SequenceInput(self.logits, self.targets)
        if input_type is LossInput:
            return LossInput(self.loss, self.targets.numel())
        return None


Hidden = tuple[torch.Tensor, torch.Tensor]


class RnnLanguageModel(nn.Module):
    """Embedding, a stacked LSTM and a linear decoder over the vocabulary.

    `forward(inputs, hidden)` is the plain function of one batch. The step methods
    keep the hidden state between batches themselves: `on_split_start`, which ember
    calls when the training or validation split or an evaluation begins, resets it,
    and each step stores it detached (truncated backpropagation through time).
    """

    def __init__(self, config: TrainingConfig, vocab_size: int) -> None:
        super().__init__()
        self.vocab_size = vocab_size
        self.drop = nn.Dropout(config.dropout)
        self.encoder = nn.Embedding(vocab_size, config.embedding_size)
        self.rnn = nn.LSTM(
            config.embedding_size,
            config.hidden_size,
            config.num_layers,
            dropout=config.dropout if config.num_layers > 1 else 0.0,
        )
        self.decoder = nn.Linear(config.hidden_size, vocab_size)
        nn.init.uniform_(self.encoder.weight, -0.1, 0.1)
        nn.init.uniform_(self.decoder.weight, -0.1, 0.1)
        nn.init.zeros_(self.decoder.bias)
        self.hidden: Hidden | None = None

    def init_hidden(self, batch_size: int) -> Hidden:
        weight = self.decoder.weight
        shape = (self.rnn.num_layers, batch_size, self.rnn.hidden_size)
        return weight.new_zeros(shape), weight.new_zeros(shape)

    def forward(self, inputs: torch.Tensor, hidden: Hidden) -> tuple[torch.Tensor, Hidden]:
        """Word ids [T, B] and the state before them -> logits [T, B, V] and the state after."""
        embedded = self.drop(self.encoder(inputs))
        output, hidden = self.rnn(embedded, hidden)
        return self.decoder(self.drop(output)), hidden

    def on_split_start(self, split: str) -> None:
        self.hidden = None  # every split starts from a zero state

    def predict(self, batch: LmBatch) -> LmOutput:
        hidden = self.hidden
        if hidden is None:
            hidden = self.init_hidden(batch.num_items)
        logits, hidden = self(batch.inputs, hidden)
        self.hidden = (hidden[0].detach(), hidden[1].detach())
        loss = F.cross_entropy(logits.reshape(-1, self.vocab_size), batch.targets.reshape(-1))
        return LmOutput(loss, logits, batch.targets)

    def train_step(self, batch: LmBatch) -> TrainOutput[LmOutput]:
        return TrainOutput(self.predict(batch))

    def valid_step(self, batch: LmBatch) -> LmOutput:
        return self.predict(batch)


# Training ----------------------------------------------------------------------------


def train(
    artifact_dir: str,
    config: TrainingConfig,
    device: str = "cpu",
    *,
    resume: bool = False,
    configure: Callable[[LearnerBuilder], LearnerBuilder] | None = None,
) -> tuple[RnnLanguageModel, Any]:
    """Train and return `(model, learner)`. `resume=True` continues the run in
    `artifact_dir` from its latest checkpoint; `configure` may add options to the
    `LearnerBuilder` (listeners, loggers) before the learner is built."""
    Path(artifact_dir).mkdir(parents=True, exist_ok=True)
    config.save(f"{artifact_dir}/config.json")
    ember.seed(config.seed)
    corpus = Corpus.load(config.corpus)
    train_batches, valid_batches = loaders(corpus, config)
    model = RnnLanguageModel(config, len(corpus))
    optimizer = torch.optim.SGD(model.parameters(), lr=config.learning_rate)
    # Stepped by ember at each epoch's end on the validation Loss, before the checkpoint.
    # threshold=0: any lower loss is an improvement, as the script's `val_loss < best`.
    plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(
        optimizer, factor=0.25, patience=0, threshold=0
    )
    builder = (
        LearnerBuilder(artifact_dir, overwrite=not resume)
        .metric_train_numeric(LossMetric())
        .metric_valid_numeric(LossMetric())
        .metric_train_numeric(PerplexityMetric())
        .metric_valid_numeric(PerplexityMetric())
        .metric_train(LearningRateMetric())
        .grad_clipping(norm=config.clip)
        .with_file_checkpointer(DefaultRecorder())
        .devices([device])
        .num_epochs(config.num_epochs)
    )
    if resume:
        builder = builder.checkpoint("latest")
    if configure is not None:
        builder = configure(builder)
    learner = builder.build(model, optimizer, plateau)
    model = learner.fit(train_batches, valid_batches, restore_best=config.restore_best)
    return model, learner


def evaluate_test(learner: Any, config: TrainingConfig) -> dict[str, float]:
    """The trained model's Loss and Perplexity on the test text (`test/test/` in the
    artifact directory), from a zero state: the evaluation calls the model's
    `on_split_start("test")` before its first batch, as the script's `evaluate()`
    begins with `model.init_hidden`."""
    corpus = Corpus.load(config.corpus)
    return learner.evaluate("test", BpttBatches(corpus.test, config.eval_batch_size, config.bptt))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog=TrainingConfig().args_help(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--artifact-dir", default="artifacts/word-lm")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--resume", action="store_true", help="continue from the latest checkpoint")
    known, overrides = parser.parse_known_args(argv)
    config = TrainingConfig().with_args(overrides)
    _, learner = train(known.artifact_dir, config, known.device, resume=known.resume)
    values = evaluate_test(learner, config)
    results = {"test_loss": values["Loss"], "test_perplexity": values["Perplexity"]}
    Path(f"{known.artifact_dir}/results.json").write_text(json.dumps(results, indent=2) + "\n")
    print(f"test loss {values['Loss']:.3f}, test perplexity {values['Perplexity']:.2f}")
    return learner.exit_code


if __name__ == "__main__":
    sys.exit(main())
