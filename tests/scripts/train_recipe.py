"""The standard DDP recipe under torchrun: the script makes the process group itself,
then trains with the loader it already has. Run by tests with
`python -m torch.distributed.run --nproc-per-node N train_recipe.py DIR --loader KIND`.

KIND: `builder` (DataLoaderBuilder, the reference), `distributed` (a torch DataLoader
over a DistributedSampler), `plain` (a torch DataLoader, unshuffled), `shuffled` (a
shuffled torch DataLoader), `subclass` (a DataLoader subclass). `--no-group` leaves
the process group to ember. `--stop-at N` asks rank 1 to stop after its N-th step of
an epoch, `--slow S` sleeps S seconds after each step, `--resume` resumes from the
latest checkpoint, `--auto` with checkpoint("auto"), `--every K` checkpoints every K
steps, `--preemption SIG` sets preemption(SIG, requeue=True), `--pids D` has each
process write D/pid-RANK at its second step and D/exit-RANK at its end, `--fail-at N`
has rank 1 raise at its N-th step of epoch 1, `--timeout T` and `--rank-logs` give
devices(["cpu"], timeout=T, rank_logs=True).
Every collective torch.distributed is asked for is counted, and rank 0 prints one
JSON line: the steps of the first epoch and the collectives issued between its
second step and its last (DDP's gradient reduction, made by its C++ reducer, is not
among them), whether the process group is still there after `fit`, the stop's epoch
and iteration on every rank.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # ember_testing

import torch
import torch.distributed as dist
from ember_testing import Classifier
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

import ember
from ember.data import DataLoaderBuilder
from ember.environment import placement
from ember.optim import SgdConfig
from ember.record import DefaultRecorder
from ember.train import LearnerBuilder, ProcessedItem
from ember.train.metric import AccuracyMetric, LossMetric
from ember.train.renderer import PlainRenderer

COLLECTIVES = (
    "all_reduce",
    "broadcast",
    "all_gather",
    "all_gather_object",
    "broadcast_object_list",
    "barrier",
    "reduce_scatter_tensor",
    "all_gather_into_tensor",
)
CALLS = {"count": 0}


def count_collectives() -> None:
    for name in COLLECTIVES:
        original = getattr(dist, name)

        def counted(*args, _original=original, **kwargs):
            CALLS["count"] += 1
            return _original(*args, **kwargs)

        setattr(dist, name, counted)


class Points(torch.utils.data.Dataset):
    """Blob points as (features, class) pairs."""

    def __init__(self, size: int, record: str | None = None) -> None:
        self.record = record
        generator = torch.Generator().manual_seed(0)
        centers = torch.randn(3, 8, generator=torch.Generator().manual_seed(99)) * 3
        self.targets = torch.randint(0, 3, (size,), generator=generator)
        self.inputs = centers[self.targets] + torch.randn(size, 8, generator=generator)

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, index: int):
        if self.record is not None:  # the indices this process reads, in order
            with open(f"{self.record}-{os.environ.get('RANK', '0')}.txt", "a") as handle:
                handle.write(f"{index}\n")
        return self.inputs[index], self.targets[index]


class Loader(DataLoader):
    """A DataLoader subclass, as libraries make them."""


def collate(items):
    from ember_testing import Batch

    return Batch(torch.stack([x for x, _ in items]), torch.stack([y for _, y in items]))


class Window:
    """Counts the collectives between the second and the last step of epoch 1, and
    stops on rank 1 after its `stop_at`-th step."""

    def __init__(
        self, steps: int, interrupter, stop_at: int | None, slow: float, pids: str | None
    ) -> None:
        self.steps, self.interrupter, self.stop_at = steps, interrupter, stop_at
        self.slow, self.pids = slow, pids
        self.fail_at: int | None = None
        self.first = self.last = None
        self.stopped: tuple[int, int] | None = None

    def on_event(self, event) -> None:
        if not (isinstance(event, ProcessedItem) and event.split == "train"):
            return
        if event.epoch == 1 and event.iteration == 2:
            self.first = CALLS["count"]
        if event.epoch == 1 and event.iteration == self.steps:
            self.last = CALLS["count"]
        self.stopped = (event.epoch, event.iteration)
        if self.pids is not None and event.iteration == 2:  # training: signals are handled
            Path(self.pids, f"pid-{os.environ['RANK']}").write_text(str(os.getpid()))
        time.sleep(self.slow)
        rank = dist.get_rank() if dist.is_initialized() else 0
        if self.stop_at is not None and rank == 1 and event.iteration == self.stop_at:
            self.interrupter.stop("asked on rank 1")
        if rank == 1 and (event.epoch, event.iteration) == (1, self.fail_at):
            raise RuntimeError(f"a failure made on purpose at step {self.fail_at}")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("dir")
    parser.add_argument("--loader", default="builder")
    parser.add_argument("--samples", type=int, default=512)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--no-group", action="store_true")
    parser.add_argument("--stop-at", type=int)
    parser.add_argument("--slow", type=float, default=0.0)
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--every", type=int, help="checkpoint_every(steps=EVERY)")
    parser.add_argument("--every-minutes", type=float, help="checkpoint_every(minutes=...)")
    parser.add_argument("--max-minutes", type=float, help="max_time(minutes=...)")
    parser.add_argument("--auto", action="store_true", help='checkpoint("auto")')
    parser.add_argument("--preemption", help="SIGUSR1 or SIGTERM: preemption(signal, requeue=True)")
    parser.add_argument(
        "--pids", help="each process writes DIR/pid-RANK at its 2nd step, exit-RANK"
    )
    parser.add_argument(
        "--record", help="each process appends the indices it reads to RECORD-RANK.txt"
    )
    parser.add_argument("--fail-at", type=int, help="rank 1 raises at its N-th step of epoch 1")
    parser.add_argument("--timeout", type=float, help='devices(["cpu"], timeout=TIMEOUT)')
    parser.add_argument("--rank-logs", action="store_true", help="devices(..., rank_logs=True)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    count_collectives()
    if not args.no_group:
        dist.init_process_group("gloo")
    ember.seed(0)
    data = Points(args.samples, args.record)
    if args.loader == "builder":
        train = DataLoaderBuilder(collate).batch_size(args.batch).build(data)
    elif args.loader == "distributed":
        sampler = DistributedSampler(data, shuffle=False)
        train = DataLoader(data, batch_size=args.batch, sampler=sampler, collate_fn=collate)
    elif args.loader == "plain":
        train = DataLoader(data, batch_size=args.batch, collate_fn=collate)
    elif args.loader == "shuffled":
        train = DataLoader(data, batch_size=args.batch, shuffle=True, collate_fn=collate)
    elif args.loader == "subclass":
        train = Loader(data, batch_size=args.batch, collate_fn=collate)
    else:
        raise SystemExit(f"unknown loader {args.loader}")
    found = placement()  # torchrun's, srun's or Kubeflow's processes
    world = found.world if found is not None else 1
    steps = len(data) // (args.batch * world)
    builder = (
        LearnerBuilder(args.dir, overwrite=not (args.stop_at or args.resume or args.auto))
        .metric_train_numeric(LossMetric())
        .metric_train(AccuracyMetric())
        .with_file_checkpointer(DefaultRecorder())
        .num_epochs(args.epochs)
        .renderer(PlainRenderer(interval=3600))
    )
    if args.resume:
        builder = builder.checkpoint("latest")
    if args.auto:
        builder = builder.checkpoint("auto")
    if args.every:
        builder = builder.checkpoint_every(steps=args.every)
    if args.every_minutes:
        builder = builder.checkpoint_every(minutes=args.every_minutes)
    if args.max_minutes:
        builder = builder.max_time(minutes=args.max_minutes)
    if args.preemption:
        builder = builder.preemption(args.preemption, requeue=True)
    if args.timeout is not None or args.rank_logs:
        timeout = args.timeout if args.timeout is not None else 300.0
        builder = builder.devices(["cpu"], timeout=timeout, rank_logs=args.rank_logs)
    window = Window(steps, builder.interrupter(), args.stop_at, args.slow, args.pids)
    window.fail_at = args.fail_at
    learner = builder.listener(window).build(Classifier(dropout=0.0), SgdConfig().init(), 0.1)
    model = learner.fit(train)
    group_kept = dist.is_initialized()
    stops = [window.stopped]
    if group_kept:
        stops = [None] * world
        dist.all_gather_object(stops, window.stopped)
    if ember.is_main_process():
        DefaultRecorder().save(model, Path(args.dir) / "final")
        report = {
            "steps": steps,
            "collectives": (
                None if None in (window.first, window.last) else window.last - window.first
            ),
            "window": steps - 2,
            "group_kept": group_kept,
            "outcome": str(learner.outcome),
            "stops": stops,
        }
        print(json.dumps(report))
    if group_kept:
        dist.destroy_process_group()
    if args.pids is not None:
        Path(args.pids, f"exit-{os.environ['RANK']}").write_text(str(learner.exit_code))
    return learner.exit_code


if __name__ == "__main__":
    sys.exit(main())
