"""Training on several CPU processes (gloo), driven by tests in a subprocess.

Usage: python train_ddp.py DIR [--processes N] [--batch B] [--epochs E] [--fail-rank R]
    [--hang-rank R] [--slow SECONDS] [--events FILE] [--timeout SECONDS] [--resume]
    [--strategy ddp|fsdp|hsdp [--shard-size N]] [--sharded-checkpoints] [--mlp] [--adam] [--accumulate K]
    [--clip NORM] [--device cpu|cuda] [--recompute]
    [--valid-every N] [--limit-train N] [--nan-rank R --nan-step S] [--skip-nonfinite]
    [--save-every-rank] [--token-mean] [--train-for DURATION] [--fits N [--oom-rank R]]
    [--direct] [--lm] [--samples N] [--sync-bn] [--rank-logs]
Under torchrun, pass --processes 1: torchrun provides the processes.

--strategy fsdp shards the model (each hidden block of --mlp is a unit of its own),
hsdp shards it within groups of --shard-size processes (default: all of them),
--sharded-checkpoints has each process write its own shards; --sync-bn shares the
BatchNorm statistics (sync_batchnorm()); --samples sets the training samples (203);
--mlp trains two hidden blocks instead of one linear layer (--norm: a BatchNorm1d
before it), --direct has the steps call that layer themselves instead of the model's
forward; --lm trains a language model whose head is tied to its embedding (with
--strategy fsdp the embedding is a unit too), --adam uses Adam (whose
state is sharded too), --accumulate and --clip set gradient accumulation and clipping.

--fail-rank raises in the third training step of that rank, --hang-rank sleeps there
for an hour; --slow sleeps in every step; --recompute turns on activation
checkpointing of the model's Linear layer. --nan-rank makes the loss of that rank's
--nan-step-th training step NaN; --skip-nonfinite trains with nonfinite_loss("skip");
--save-every-rank has every process save its own weights (DIR/rank-R; under FSDP its
shards and buffers); --token-mean
reports each loss as a mean over tokens (each sample stands for 1 to 5 of them).
--fits raises torch.OutOfMemoryError on a training batch of more than N samples (on
rank R only with --oom-rank); --accumulate auto splits batches that do not fit. --events appends "<what> <rank> <time>" lines
to FILE (each step, the failure, the hang), so a test can time what follows. The
process exits with `learner.exit_code`.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # ember_testing

import torch
import torch.nn.functional as F
from ember_testing import Batch, BlobBatcher, BlobDataset
from torch import nn

import ember
from ember.data import DataLoaderBuilder
from ember.optim import AdamConfig, SgdConfig
from ember.record import DefaultRecorder
from ember.train import ClassificationOutput, LearnerBuilder, TrainOutput
from ember.train.metric import AccuracyMetric, LossMetric
from ember.train.renderer import PlainRenderer


def note(events: str | None, what: str) -> None:
    if events:
        with open(events, "a") as handle:
            handle.write(f"{what} {os.environ.get('RANK', '0')} {time.time()}\n")


class Block(nn.Module):
    def __init__(self, inputs: int, outputs: int):
        super().__init__()
        self.linear = nn.Linear(inputs, outputs)

    def forward(self, x):
        return torch.tanh(self.linear(x))


class Tokens(torch.utils.data.Dataset):
    """Sequences of 7 tokens (of 11) drawn from a fixed Markov chain, for --lm."""

    def __init__(self, size: int, seed: int = 0):
        generator = torch.Generator().manual_seed(seed)
        chain = torch.softmax(
            torch.randn(11, 11, generator=torch.Generator().manual_seed(5)) * 3, 1
        )
        tokens = [torch.randint(0, 11, (size,), generator=generator)]
        for _ in range(6):
            tokens.append(torch.multinomial(chain[tokens[-1]], 1, generator=generator)[:, 0])
        self.sequences = torch.stack(tokens, dim=1)

    def __len__(self) -> int:
        return len(self.sequences)

    def __getitem__(self, index: int):
        return self.sequences[index]


class TokenBatcher:
    def batch(self, items):
        sequences = torch.stack(list(items))
        return Batch(sequences[:, :-1], sequences[:, 1:])


class Linear(nn.Module):
    def __init__(self, args: argparse.Namespace):
        super().__init__()
        if args.lm:  # a language model whose output head is its embedding (tied weights)
            self.embed = nn.Embedding(11, 16)
            self.layer = nn.Sequential(Block(16, 16), Block(16, 16))
            self.head = nn.Linear(16, 11, bias=False)
            self.head.weight = self.embed.weight
        elif args.mlp:
            self.layer: nn.Module = nn.Sequential(Block(8, 16), Block(16, 16), nn.Linear(16, 3))
        elif args.norm:
            self.layer = nn.Sequential(nn.BatchNorm1d(8), nn.Linear(8, 3))
        else:
            self.layer = nn.Linear(8, 3)
        self.args, self.steps = args, 0

    def forward(self, x):
        return self.layer(x)

    def classify(self, batch):
        if self.args.lm:  # the next token at each position, calling the submodules
            logits = self.head(self.layer(self.embed(batch.inputs))).reshape(-1, 11)
            targets = batch.targets.reshape(-1)
            return ClassificationOutput(F.cross_entropy(logits, targets), logits, targets)
        # --direct: the step calls the submodule itself, never the model's forward
        output = self.layer(batch.inputs) if self.args.direct else self(batch.inputs)
        if self.args.token_mean:  # each sample stands for 1 to 5 tokens of the same loss
            tokens = 1 + (batch.inputs[:, 0].abs() * 10).long() % 5
            losses = F.cross_entropy(output, batch.targets, reduction="none")
            loss = (losses * tokens).sum() / tokens.sum()
            return ClassificationOutput(
                loss, output, batch.targets, loss_reduction="token_mean", tokens=tokens.sum()
            )
        return ClassificationOutput(F.cross_entropy(output, batch.targets), output, batch.targets)

    def train_step(self, batch):
        self.steps += 1
        rank, args = int(os.environ.get("RANK", "0")), self.args
        note(args.events, "step")
        if self.steps == 3 and rank == args.fail_rank:
            note(args.events, "fail")
            raise RuntimeError(f"deliberate failure on rank {rank}")
        if self.steps == 3 and rank == args.hang_rank:
            note(args.events, "hang")
            time.sleep(3600)
        if args.slow:
            time.sleep(args.slow)
        size = batch.inputs.shape[0]
        if args.fits is not None and args.oom_rank in (None, rank) and size > args.fits:
            note(args.events, f"oom-{size}")
            raise torch.OutOfMemoryError(f"CUDA out of memory (a batch of {size} on rank {rank})")
        output = self.classify(batch)
        if self.steps == args.nan_step and rank == args.nan_rank:
            output.loss = output.loss * float("nan")
        return TrainOutput(output)

    def valid_step(self, batch):
        return self.classify(batch)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("dir")
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--fail-rank", type=int, default=None)
    parser.add_argument("--hang-rank", type=int, default=None)
    parser.add_argument("--slow", type=float, default=0.0)
    parser.add_argument("--events", default=None)
    parser.add_argument("--timeout", type=float, default=60.0)
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--strategy", default="ddp")
    parser.add_argument("--mlp", action="store_true")
    parser.add_argument("--adam", action="store_true")
    parser.add_argument("--accumulate", type=lambda text: text if text == "auto" else int(text))
    parser.add_argument("--fits", type=int, default=None)
    parser.add_argument("--norm", action="store_true")
    parser.add_argument("--oom-rank", type=int, default=None)
    parser.add_argument("--clip", type=float, default=None)
    parser.add_argument("--sharded-checkpoints", action="store_true")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--valid-every", type=int, default=None)
    parser.add_argument("--limit-train", type=int, default=None)
    parser.add_argument("--recompute", action="store_true")
    parser.add_argument("--every-minutes", type=float, default=None)
    parser.add_argument("--max-minutes", type=float, default=None)
    parser.add_argument("--nan-rank", type=int, default=None)
    parser.add_argument("--nan-step", type=int, default=None)
    parser.add_argument("--skip-nonfinite", action="store_true")
    parser.add_argument("--save-every-rank", action="store_true")
    parser.add_argument("--token-mean", action="store_true")
    parser.add_argument("--direct", action="store_true")
    parser.add_argument("--lm", action="store_true")
    parser.add_argument("--samples", type=int, default=203)
    parser.add_argument("--sync-bn", action="store_true")
    parser.add_argument("--shard-size", type=int, default=None)
    parser.add_argument("--train-for", default=None)
    parser.add_argument("--rank-logs", action="store_true")
    args = parser.parse_args(argv)

    torch.set_num_threads(1)
    ember.seed(3)
    batcher, train_set = BlobBatcher(), BlobDataset(args.samples)
    valid_set: torch.utils.data.Dataset = BlobDataset(61, seed=1)
    if args.lm:
        batcher, train_set, valid_set = TokenBatcher(), Tokens(args.samples), Tokens(61, seed=1)
    train = DataLoaderBuilder(batcher).batch_size(args.batch).shuffle(3).build(train_set)
    valid = DataLoaderBuilder(batcher).batch_size(args.batch).build(valid_set)
    builder = LearnerBuilder(args.dir)
    devices = ["cpu"] * args.processes
    if args.device == "cuda":  # one GPU per process (under torchrun: cuda:LOCAL_RANK)
        devices = [f"cuda:{i}" for i in range(args.processes)] if args.processes > 1 else ["cuda"]
    strategy = {}
    if args.strategy in ("fsdp", "hsdp"):
        units = [Block, nn.Embedding] if args.lm else [Block]
        strategy = {"strategy": args.strategy, "modules": units}
        if args.shard_size is not None:
            strategy["shard_size"] = args.shard_size
        if args.sharded_checkpoints:
            strategy["sharded_checkpoints"] = True
    if args.rank_logs:  # each process's own lines in rank-N.log
        strategy["rank_logs"] = True
    if args.resume:
        builder = builder.checkpoint("latest")
    if args.valid_every is not None:
        builder = builder.valid_every(args.valid_every)
    if args.limit_train is not None:
        builder = builder.limit_batches(train=args.limit_train)
    if args.skip_nonfinite:
        builder = builder.nonfinite_loss("skip")
    if args.recompute:
        builder = builder.activation_checkpointing(nn.Linear)
    if args.sync_bn:
        builder = builder.sync_batchnorm()
    if args.every_minutes is not None:
        builder = builder.checkpoint_every(minutes=args.every_minutes)
    if args.max_minutes is not None:
        builder = builder.max_time(minutes=args.max_minutes)
    learner = (
        builder.metric_train_numeric(AccuracyMetric())
        .metric_train_numeric(LossMetric())
        .metric_valid_numeric(AccuracyMetric())
        .metric_valid_numeric(LossMetric())
        .with_file_checkpointer(DefaultRecorder())
        .devices(devices, timeout=args.timeout, **strategy)
        .num_epochs(args.epochs)
        .grads_accumulation(args.accumulate or 1)
        .renderer(PlainRenderer(interval=3600))
    )
    if args.clip is not None:
        learner = learner.grad_clipping(norm=args.clip)
    if args.train_for is not None:  # a length in steps, samples or tokens
        learner = learner.train_for(args.train_for)
    optimizer = AdamConfig().init() if args.adam else SgdConfig().init()
    learner = learner.build(Linear(args), optimizer, 0.01 if args.adam else 0.5)
    learner.fit(train, valid)
    state = learner.model_state_dict()  # gathered on rank 0 under FSDP
    if int(os.environ.get("RANK", "0")) == 0 and learner.outcome == "completed":
        DefaultRecorder().save(state, Path(args.dir) / "final", kind="module")
    if args.save_every_rank:  # each replica's own weights (FSDP: its shards), to compare
        rank = int(os.environ.get("RANK", "0"))
        own = {
            key: (value.to_local() if hasattr(value, "to_local") else value).cpu()
            for key, value in learner.model.state_dict().items()
        }
        DefaultRecorder().save(own, Path(args.dir) / f"rank-{rank}", kind="module")
    sys.exit(learner.exit_code)


if __name__ == "__main__":
    main()
