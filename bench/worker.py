"""One benchmark measurement in a fresh process; `bench/run.py` starts these.

    python bench/worker.py VARIANT MODEL [--train N] [--valid N] [--threads T]
                           [--loader torch|ember]

VARIANT is one of raw, raw_again (the same loop), ember, ember_ckpt, lightning_min,
lightning_default, keras;
MODEL is mlp or cnn. The process imports what the variant needs, generates the
synthetic data, builds the model and its trainer, then times one training epoch
plus one validation pass. The last line it prints is one JSON object:

    {"variant", "model", "fit_s", "fit_cpu_s", "setup_s", "maxrss_mb", "train_loss", ...,
     "bytecode": {"dont_write", "prefix", "modules", "cached"}}

`fit_s` runs from just before the first batch (the call to fit, or the raw loop)
to the end of validation; imports, data generation and model construction are
outside it (`setup_s` is the trainer/learner construction alone). `fit_cpu_s` is
the process's CPU time over the same span; `maxrss_mb` the peak RSS of the process.
Every variant, ember's included, gets the same torch DataLoaders (`torch_loaders`);
`--loader ember` gives the ember variants ember's DataLoaderBuilder instead. ember
renders with the builder's default renderer (plain lines when stdout is a pipe).
`bytecode` tells whether the process could have read compiled byte code: of the
`modules` imported from .py sources, `cached` had a byte-code file where this process
looks for one (0 when it runs with an empty PYTHONPYCACHEPREFIX).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import sys
import tempfile
import time

VARIANTS = (
    "raw",
    "raw_again",
    "ember",
    "ember_ckpt",
    "lightning_min",
    "lightning_default",
    "keras",
)
"""`raw_again` is the raw loop once more, in its own process: paired with `raw`, it
shows the ratio the machine's noise alone gives."""
MODELS = ("mlp", "cnn")

BATCH_SIZE = 64
LR = 1e-3
ADAM_EPS = 1e-8  # torch's default, set explicitly in every variant (Keras defaults to 1e-7)
DATA_SEED = 1234
SHUFFLE_SEED = 7
MODEL_SEED = 0
MEAN, STD = 0.1307, 0.3081  # the guide's MNIST normalisation


# Data ------------------------------------------------------------------------------
def make_arrays(n: int, seed: int):
    """`n` MNIST-shaped uint8 images and int64 labels from a fixed generator.

    Each label owns a 6x6 patch of the 28x28 grid; an image is uniform noise in
    [0, 160) with its label's patch set to 255. 10% of the labels are then redrawn at
    random, so accuracy rises quickly to about 90% but not to 100%.
    """
    import numpy as np

    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 10, n, dtype=np.int64)
    images = rng.integers(0, 160, (n, 28, 28), dtype=np.uint8)
    templates = np.zeros((10, 28, 28), dtype=bool)
    for label in range(10):
        row, col = 3 + (label // 5) * 13, 1 + (label % 5) * 5
        templates[label, row : row + 6, col : col + 6] = True
    for start in range(0, n, 8192):  # in chunks: bounded temporary memory
        stop = min(n, start + 8192)
        chunk = images[start:stop]
        chunk[templates[labels[start:stop]]] = 255
    noisy = rng.random(n) < 0.1
    labels[noisy] = rng.integers(0, 10, int(noisy.sum()), dtype=np.int64)
    return images, labels


class SyntheticMnist:
    """A map-style dataset of (uint8 image [28, 28], int label) items."""

    def __init__(self, n: int, seed: int) -> None:
        self.images, self.labels = make_arrays(n, seed)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int):
        return self.images[index], int(self.labels[index])


class Batcher:
    """The guide's batching: stack, scale to [0, 1], standardise. A batch is the tuple
    (images float32 [B, 28, 28], targets int64 [B]), which every framework accepts.
    Usable as an ember Batcher (`batch`) and as a DataLoader `collate_fn` (call)."""

    def batch(self, items):
        import numpy as np
        import torch

        images = torch.from_numpy(np.stack([image for image, _ in items]))
        images = (images.float() / 255.0 - MEAN) / STD
        targets = torch.tensor([label for _, label in items], dtype=torch.int64)
        return images, targets

    __call__ = batch


class SeededOrder:
    """The order ember's ResumableSampler gives epoch `e`:
    `np.random.default_rng([seed, e]).permutation(n)`, as a plain torch Sampler
    would be written by hand (epoch 1 first, then one epoch per iteration)."""

    def __init__(self, n: int, seed: int) -> None:
        self.n, self.seed, self.epoch = n, seed, 0

    def __iter__(self):
        import numpy as np

        self.epoch += 1
        return iter(np.random.default_rng([self.seed, self.epoch]).permutation(self.n).tolist())

    def __len__(self) -> int:
        return self.n


def torch_loaders(train_set, valid_set):
    """Plain torch DataLoaders: seeded training order, num_workers=0, batch 64."""
    import torch
    from torch.utils.data import DataLoader

    train = DataLoader(
        train_set,
        batch_size=BATCH_SIZE,
        sampler=SeededOrder(len(train_set), SHUFFLE_SEED),
        collate_fn=Batcher(),
        num_workers=0,
        generator=torch.Generator().manual_seed(SHUFFLE_SEED),
    )
    valid = DataLoader(valid_set, batch_size=BATCH_SIZE, collate_fn=Batcher(), num_workers=0)
    return train, valid


def ember_loaders(train_set, valid_set):
    from ember.data import DataLoaderBuilder

    train = (
        DataLoaderBuilder(Batcher()).batch_size(BATCH_SIZE).shuffle(SHUFFLE_SEED).build(train_set)
    )
    valid = DataLoaderBuilder(Batcher()).batch_size(BATCH_SIZE).build(valid_set)
    return train, valid


# Models (torch) -------------------------------------------------------------------
def torch_net(name: str, mixin: type | None = None):
    """The network (a plain nn.Module, or a subclass adding `mixin`'s methods),
    initialised from MODEL_SEED."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    class Mlp(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Sequential(
                nn.Flatten(), nn.Linear(784, 128), nn.ReLU(), nn.Linear(128, 10)
            )

        def forward(self, images):
            return self.net(images)

    class Cnn(nn.Module):
        """The guide's model (examples/mnist/model.py), dropout 0.5 included."""

        def __init__(self) -> None:
            super().__init__()
            self.conv1 = nn.Conv2d(1, 8, kernel_size=3)
            self.conv2 = nn.Conv2d(8, 16, kernel_size=3)
            self.pool = nn.AdaptiveAvgPool2d((8, 8))
            self.dropout = nn.Dropout(0.5)
            self.linear1 = nn.Linear(16 * 8 * 8, 512)
            self.linear2 = nn.Linear(512, 10)

        def forward(self, images):
            x = images.unsqueeze(1)
            x = self.dropout(self.conv1(x))
            x = self.dropout(self.conv2(x))
            x = self.pool(F.relu(x))
            x = self.dropout(F.relu(self.linear1(x.flatten(1))))
            return self.linear2(x)

    cls = {"mlp": Mlp, "cnn": Cnn}[name]
    if mixin is not None:
        cls = type(cls.__name__, (mixin, cls), {})
    torch.manual_seed(MODEL_SEED)
    return cls()


# Variants ---------------------------------------------------------------------------
def raw_train_epoch(model, optimizer, batches):
    """One training epoch of the hand-written loop: the step, then accuracy and loss
    accumulated on the device. Returns (loss sum, correct count, samples), loss sum and
    count still tensors (read once, by the caller)."""
    import torch
    import torch.nn.functional as F

    model.train()
    loss_sum = torch.zeros((), dtype=torch.float64)
    correct = torch.zeros((), dtype=torch.int64)
    seen = 0
    for inputs, targets in batches:
        logits = model(inputs)
        loss = F.cross_entropy(logits, targets)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        with torch.no_grad():
            loss_sum += loss.detach() * targets.shape[0]
            correct += (logits.argmax(dim=1) == targets).sum()
        seen += targets.shape[0]
    return loss_sum, correct, seen


def run_raw(model_name: str, n_train: int, n_valid: int, scratch: str) -> dict:
    """A hand-written loop as a careful user writes it: metrics accumulate on the
    device and are read once at the end of each split; nothing is written per step."""
    import torch
    import torch.nn.functional as F

    train_loader, valid_loader = torch_loaders(
        SyntheticMnist(n_train, DATA_SEED), SyntheticMnist(n_valid, DATA_SEED + 1)
    )
    model = torch_net(model_name)
    t0 = time.perf_counter()
    optimizer = torch.optim.Adam(model.parameters(), lr=LR, eps=ADAM_EPS)
    setup = time.perf_counter() - t0

    start, start_cpu = time.perf_counter(), time.process_time()
    loss_sum, correct, seen = raw_train_epoch(model, optimizer, train_loader)
    train_loss, train_acc = loss_sum.item() / seen, 100.0 * correct.item() / seen

    model.eval()
    valid_loss_sum = torch.zeros((), dtype=torch.float64)
    valid_correct = torch.zeros((), dtype=torch.int64)
    valid_seen = 0
    with torch.inference_mode():
        for images, targets in valid_loader:
            logits = model(images)
            valid_loss_sum += F.cross_entropy(logits, targets) * targets.shape[0]
            valid_correct += (logits.argmax(dim=1) == targets).sum()
            valid_seen += targets.shape[0]
    valid_loss, valid_acc = (
        valid_loss_sum.item() / valid_seen,
        100.0 * valid_correct.item() / valid_seen,
    )
    model.train()
    fit, fit_cpu = time.perf_counter() - start, time.process_time() - start_cpu
    return dict(
        fit_s=fit,
        fit_cpu_s=fit_cpu,
        setup_s=setup,
        train_loss=train_loss,
        train_acc=train_acc,
        valid_loss=valid_loss,
        valid_acc=valid_acc,
    )


def ember_model(model_name: str):
    import torch.nn.functional as F

    from ember.train import ClassificationOutput, TrainOutput

    class Steps:  # ember's two step methods, mixed into the same network
        def classify(self, batch) -> ClassificationOutput:
            images, targets = batch
            output = self(images)
            return ClassificationOutput(F.cross_entropy(output, targets), output, targets)

        def train_step(self, batch) -> TrainOutput:
            return TrainOutput(self.classify(batch))

        def valid_step(self, batch) -> ClassificationOutput:
            return self.classify(batch)

    return torch_net(model_name, Steps)


def run_ember(
    model_name: str,
    n_train: int,
    n_valid: int,
    scratch: str,
    checkpoint: bool,
    loader: str = "torch",
    plain_interval: float | None = None,
) -> dict:
    """ember as a user runs it: the builder's default renderer (plain progress lines
    every 10 s when stdout is not a terminal), on the DataLoaders `loader` names
    ("torch": raw's `torch_loaders`; "ember": `ember_loaders`). `plain_interval`
    sets `PlainRenderer(interval=...)` instead (bench/attribution.py and
    bench/instructions.py, which time steps inside one process)."""
    import torch

    from ember.train import LearnerBuilder
    from ember.train.metric import AccuracyMetric, LossMetric

    loaders = torch_loaders if loader == "torch" else ember_loaders
    train_loader, valid_loader = loaders(
        SyntheticMnist(n_train, DATA_SEED), SyntheticMnist(n_valid, DATA_SEED + 1)
    )
    model = ember_model(model_name)
    t0 = time.perf_counter()
    builder = (
        LearnerBuilder(os.path.join(scratch, "artifacts"))
        .metric_train_numeric(AccuracyMetric())
        .metric_valid_numeric(AccuracyMetric())
        .metric_train_numeric(LossMetric())
        .metric_valid_numeric(LossMetric())
        .num_epochs(1)
    )
    if plain_interval is not None:
        from ember.train.renderer import PlainRenderer

        builder = builder.renderer(PlainRenderer(interval=plain_interval))
    if checkpoint:
        from ember.record import CompactRecorder  # only this variant's script imports it

        builder = builder.with_file_checkpointer(CompactRecorder())
    learner = builder.build(model, torch.optim.Adam(model.parameters(), lr=LR, eps=ADAM_EPS), LR)
    setup = time.perf_counter() - t0

    start, start_cpu = time.perf_counter(), time.process_time()
    learner.fit(train_loader, valid_loader)
    fit, fit_cpu = time.perf_counter() - start, time.process_time() - start_cpu
    _, aggregates = learner.history[-1]
    return dict(
        fit_s=fit,
        fit_cpu_s=fit_cpu,
        setup_s=setup,
        train_loss=aggregates["train"]["Loss"],
        train_acc=aggregates["train"]["Accuracy"],
        valid_loss=aggregates["valid"]["Loss"],
        valid_acc=aggregates["valid"]["Accuracy"],
    )


def run_lightning(model_name: str, n_train: int, n_valid: int, scratch: str, minimal: bool) -> dict:
    import lightning as L
    import torch
    import torch.nn.functional as F

    train_loader, valid_loader = torch_loaders(
        SyntheticMnist(n_train, DATA_SEED), SyntheticMnist(n_valid, DATA_SEED + 1)
    )

    class Module(L.LightningModule):
        def __init__(self, net) -> None:
            super().__init__()
            self.net = net

        def forward(self, images):
            return self.net(images)

        def training_step(self, batch, batch_idx):
            images, targets = batch
            logits = self(images)
            loss = F.cross_entropy(logits, targets)
            acc = (logits.argmax(dim=1) == targets).float().mean()
            self.log_dict(
                {"train_loss": loss, "train_acc": acc}, on_step=True, on_epoch=True, prog_bar=True
            )
            return loss

        def validation_step(self, batch, batch_idx):
            images, targets = batch
            logits = self(images)
            loss = F.cross_entropy(logits, targets)
            acc = (logits.argmax(dim=1) == targets).float().mean()
            self.log_dict({"val_loss": loss, "val_acc": acc}, prog_bar=True)

        def configure_optimizers(self):
            return torch.optim.Adam(self.parameters(), lr=LR, eps=ADAM_EPS)

    module = Module(torch_net(model_name))
    t0 = time.perf_counter()
    options: dict = dict(max_epochs=1, default_root_dir=os.path.join(scratch, "lightning"))
    if minimal:
        options.update(
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
        )
    trainer = L.Trainer(**options)
    setup = time.perf_counter() - t0

    start, start_cpu = time.perf_counter(), time.process_time()
    trainer.fit(module, train_loader, valid_loader)
    fit, fit_cpu = time.perf_counter() - start, time.process_time() - start_cpu
    metrics = trainer.callback_metrics
    return dict(
        fit_s=fit,
        fit_cpu_s=fit_cpu,
        setup_s=setup,
        train_loss=float(metrics["train_loss_epoch"]),
        train_acc=100.0 * float(metrics["train_acc_epoch"]),
        valid_loss=float(metrics["val_loss"]),
        valid_acc=100.0 * float(metrics["val_acc"]),
    )


def run_keras(model_name: str, n_train: int, n_valid: int, scratch: str) -> dict:
    import keras
    from keras import layers

    train_loader, valid_loader = torch_loaders(
        SyntheticMnist(n_train, DATA_SEED), SyntheticMnist(n_valid, DATA_SEED + 1)
    )
    keras.utils.set_random_seed(MODEL_SEED)
    if model_name == "mlp":
        stack = [layers.Flatten(), layers.Dense(128, activation="relu"), layers.Dense(10)]
    else:  # the guide's CNN; AveragePooling2D(3) is AdaptiveAvgPool2d((8, 8)) on 24x24
        stack = [
            layers.Reshape((28, 28, 1)),
            layers.Conv2D(8, 3),
            layers.Dropout(0.5),
            layers.Conv2D(16, 3),
            layers.Dropout(0.5),
            layers.ReLU(),
            layers.AveragePooling2D(3),
            layers.Flatten(),
            layers.Dense(512, activation="relu"),
            layers.Dropout(0.5),
            layers.Dense(10),
        ]
    model = keras.Sequential([keras.Input((28, 28)), *stack])
    t0 = time.perf_counter()
    model.compile(
        optimizer=keras.optimizers.Adam(learning_rate=LR, epsilon=ADAM_EPS),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    setup = time.perf_counter() - t0

    start, start_cpu = time.perf_counter(), time.process_time()
    history = model.fit(train_loader, validation_data=valid_loader, epochs=1)
    fit, fit_cpu = time.perf_counter() - start, time.process_time() - start_cpu
    h = history.history
    return dict(
        fit_s=fit,
        fit_cpu_s=fit_cpu,
        setup_s=setup,
        train_loss=float(h["loss"][-1]),
        train_acc=100.0 * float(h["accuracy"][-1]),
        valid_loss=float(h["val_loss"][-1]),
        valid_acc=100.0 * float(h["val_accuracy"][-1]),
    )


def bytecode_use() -> dict:
    """Whether compiled byte code could have been read: how many of the modules imported
    from .py sources have a byte-code file where this process looks for one (under
    `sys.pycache_prefix` when set, else in `__pycache__` beside the source)."""
    modules = cached = 0
    for module in list(sys.modules.values()):
        spec = getattr(module, "__spec__", None)
        origin = getattr(spec, "origin", None) or ""
        if not origin.endswith(".py"):
            continue
        modules += 1
        where = getattr(spec, "cached", None)
        cached += bool(where and os.path.exists(where))
    return dict(
        dont_write=bool(sys.flags.dont_write_bytecode),
        prefix=sys.pycache_prefix,
        modules=modules,
        cached=cached,
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("variant", choices=VARIANTS)
    parser.add_argument("model", choices=MODELS)
    parser.add_argument("--train", type=int, default=60_000)
    parser.add_argument("--valid", type=int, default=10_000)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--loader", choices=("torch", "ember"), default="torch")
    args = parser.parse_args(argv)

    if args.variant == "keras":
        os.environ["KERAS_BACKEND"] = "torch"
    import torch

    torch.set_num_threads(args.threads)
    # Each variant's framework is imported before the clock starts.
    if args.variant.startswith("ember"):
        import ember.train  # noqa: F401
    elif args.variant.startswith("lightning"):
        import lightning  # noqa: F401
    elif args.variant == "keras":
        import keras  # noqa: F401

    scratch = tempfile.mkdtemp(prefix=f"bench-{args.variant}-")
    try:
        if args.variant in ("raw", "raw_again"):
            result = run_raw(args.model, args.train, args.valid, scratch)
        elif args.variant in ("ember", "ember_ckpt"):
            result = run_ember(
                args.model,
                args.train,
                args.valid,
                scratch,
                checkpoint=args.variant == "ember_ckpt",
                loader=args.loader,
            )
        elif args.variant in ("lightning_min", "lightning_default"):
            result = run_lightning(
                args.model, args.train, args.valid, scratch, minimal=args.variant == "lightning_min"
            )
        else:
            result = run_keras(args.model, args.train, args.valid, scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    maxrss_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    result = dict(
        variant=args.variant,
        model=args.model,
        **result,
        maxrss_mb=maxrss_kb / 1024.0,
        threads=torch.get_num_threads(),
        n_train=args.train,
        n_valid=args.valid,
        loader=args.loader if args.variant.startswith("ember") else "torch",
        bytecode=bytecode_use(),
    )
    sys.stdout.flush()
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
