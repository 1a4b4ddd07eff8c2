"""`LearnerBuilder`: collects and validates a run's options, then builds a `Learner`."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Sequence

import torch

from ember.errors import ConfigError
from ember.train.adapters.steps import attach_steps
from ember.train.build.state import BuilderState
from ember.train.build.values import (
    batch_limit,
    check_accumulation,
    check_clipping,
    checkpoint_error_policy,
    checkpoint_interval,
    every_in_steps_or_count,
    lr_monitor_split,
    nonfinite_policy,
    parse_devices,
    positive_int,
    resume_point,
    summary_depth,
    train_length,
    valid_cadence,
)
from ember.train.callbacks.base import check_callback, is_callback
from ember.train.checkpoint.base import Checkpointer
from ember.train.checkpoint.strategy import CheckpointingStrategy
from ember.train.distributed import world_size
from ember.train.early_stopping import EarlyStoppingStrategy, PruningStrategy
from ember.train.events import Listener
from ember.train.length.cadence import time_limit
from ember.train.length.duration import Duration
from ember.train.length.interrupter import Interrupter
from ember.train.logger.base import MetricLogger
from ember.train.metric.base import Metric
from ember.train.optimization import check_mixed_precision
from ember.train.options import RegisteredMetric
from ember.train.parallel import FsdpOptions, choose
from ember.train.plugins import check_plugin
from ember.train.renderer.base import Renderer

if TYPE_CHECKING:
    from ember.train.learner import Learner


class LearnerBuilder:
    """Options of a training run, as chained calls; `build(model, optimizer, lr)`.

    Everything a run writes goes under `artifact_dir`. A directory that already holds
    a run is refused unless you resume (`checkpoint(n)`) or pass `overwrite=True`.
    """

    def __init__(self, artifact_dir: str | os.PathLike[str], *, overwrite: bool = False) -> None:
        self._state = BuilderState(Path(artifact_dir), overwrite)

    # Metrics -----------------------------------------------------------------
    def _add_metric(self, split: str, metric: Any, numeric: bool) -> LearnerBuilder:
        check_plugin(metric, Metric, "a metric")
        name = str(metric.name)
        if is_callback(metric):  # it measures training through the callback hooks
            if split != "train":
                raise ConfigError(
                    f"{type(metric).__name__} measures training steps: register it with "
                    "metric_train(...) or metric_train_numeric(...), not for validation."
                )
            if not any(known is metric for known in self._state.callbacks):
                self._state.callbacks.append(metric)
        if any(existing.name == name for existing in self._state.metrics[split]):
            raise ConfigError(
                f"The metric {name!r} is registered twice for {split}: register each metric "
                "once per split (a numeric metric is also shown as text)."
            )
        self._state.metrics[split].append(RegisteredMetric(metric, numeric))
        return self

    def metric_train(self, metric: Any) -> LearnerBuilder:
        """A training metric, shown as text and logged."""
        return self._add_metric("train", metric, numeric=False)

    def metric_valid(self, metric: Any) -> LearnerBuilder:
        """A validation metric, shown as text and logged."""
        return self._add_metric("valid", metric, numeric=False)

    def metric_train_numeric(self, metric: Any) -> LearnerBuilder:
        """A training metric, shown, logged and plotted."""
        return self._add_metric("train", metric, numeric=True)

    def metric_valid_numeric(self, metric: Any) -> LearnerBuilder:
        """A validation metric, shown, logged and plotted."""
        return self._add_metric("valid", metric, numeric=True)

    # Output ------------------------------------------------------------------
    def metric_loggers(
        self,
        train: MetricLogger | Sequence[MetricLogger],
        valid: MetricLogger | Sequence[MetricLogger],
    ) -> LearnerBuilder:
        """Extra metric loggers per split, beside the files under `train/` and `valid/`
        (which are always written: `ember plot` and custom tools read them)."""
        for split, given in (("train", train), ("valid", valid)):
            loggers: list[Any] = list(given) if isinstance(given, (list, tuple)) else [given]
            for logger in loggers:
                check_plugin(logger, MetricLogger, "a metric logger")
            self._state.loggers[split].extend(loggers)
        return self

    def renderer(self, renderer: Any) -> LearnerBuilder:
        """How progress is shown (default: a live display in a notebook cell, the live
        dashboard on a terminal, plain text lines otherwise: when output is piped, `CI`
        is set or `TERM=dumb`)."""
        check_plugin(renderer, Renderer, "a renderer")
        self._state.renderer = renderer
        return self

    def with_application_logger(self, enabled: bool = True) -> LearnerBuilder:
        """Write Python logging of the run to `experiment.log` (default on)."""
        self._state.application_log = bool(enabled)
        return self

    def summary(self) -> LearnerBuilder:
        """Print (and log) a table of each metric's min and max epoch values at the end."""
        self._state.summary = True
        return self

    def hparams(self, hparams: Any) -> LearnerBuilder:
        """The run's hyperparameters: a dict, a dataclass or a pydantic model (an ember
        `Config`). They are recorded once per `fit`: in `hparams.json` and
        `experiment.log`, and by the metric loggers that keep them (TensorBoard's
        HPARAMS table, MLflow params, W&B config). Values must be JSON values (paths
        and enums are converted); anything else is refused here, naming its key."""
        from ember.train.files.run_record import to_hparams

        self._state.hparams = to_hparams(hparams)
        return self

    def listener(self, listener: Any) -> LearnerBuilder:
        """Register an object with `on_event(event)` to hook into the loop."""
        check_plugin(listener, Listener, "a listener")
        self._state.listeners.append(listener)
        return self

    def callback(self, callback: Any) -> LearnerBuilder:
        """Register a callback (`ember.train.callbacks.Callback`): hooks that may change
        training (gradients, weights), whose `state_dict()` every checkpoint keeps and a
        resumed run gets back. Callbacks are called in the order they are registered."""
        check_callback(callback)
        if any(known is callback for known in self._state.callbacks):
            raise ConfigError(
                f"This {type(callback).__name__} is registered twice: register each callback "
                "once (a metric that is a callback, like GradNormMetric, is registered by "
                "metric_train)."
            )
        self._state.callbacks.append(callback)
        return self

    # Training ----------------------------------------------------------------
    def grads_accumulation(self, steps: int | Literal["auto"]) -> LearnerBuilder:
        """Step the optimizer every `steps` batches (gradients summed as a mean).

        `"auto"`: one optimizer step per batch, and a step that raises
        `torch.OutOfMemoryError` is run again with every batch split into twice as
        many micro-batches (along the first dimension), until it fits; the update is
        the same, and the split stays for the rest of the run (checkpoints keep it).
        One process only, automatic optimization only."""
        check_accumulation(steps)
        if self._state.global_batch is not None:
            raise ConfigError(
                f"grads_accumulation({steps!r}) after global_batch("
                f"{self._state.global_batch}): the global batch sets the accumulation of "
                "each process. Give one of the two."
            )
        self._state.micro_auto = steps == "auto"
        self._state.grads_accumulation = (
            1 if self._state.micro_auto else positive_int(steps, "grads_accumulation")
        )
        return self

    def global_batch(self, samples: int) -> LearnerBuilder:
        """Fix the samples of each optimizer step over every process: each process
        takes `samples / processes` a step, in as few micro-batches (gradient
        accumulation) as keep each one within the training loader's batch size. A run
        resumed on another number of processes keeps it (see docs/devices.md). Without
        it, the global batch is the loader's batch size x processes x accumulation of
        the run's first launch, and is kept the same way."""
        if self._state.grads_accumulation != 1 or self._state.micro_auto:
            raise ConfigError(
                f"global_batch({samples!r}) after grads_accumulation(...): the global batch "
                "sets the accumulation of each process. Give one of the two."
            )
        self._state.global_batch = positive_int(samples, "global_batch")
        return self

    def memory_history(self, max_entries: int = 100_000) -> LearnerBuilder:
        """Out-of-memory post-mortem (CUDA only): record the allocations and their stacks
        (the last `max_entries` events) from the start of `fit`; when
        `torch.OutOfMemoryError` ends the run, write PyTorch's snapshot to
        `memory-snapshot.pickle` in the artifact directory (open it at
        https://pytorch.org/memory_viz) and name the largest live allocations in the
        error. Recording slows allocations a little."""
        self._state.memory_history = positive_int(max_entries, "memory_history's max_entries")
        return self

    def valid_every(self, every: int | str | Duration) -> LearnerBuilder:
        """Also validate inside each epoch on the whole validation loader; the
        end-of-epoch validation stays as it is. An int (or a duration in steps,
        "500steps") validates every that many optimizer steps of each epoch; a duration
        in samples or tokens ("500k samples", "1B tokens") each time the run's count
        passes a multiple of it."""
        self._state.valid_every = valid_cadence(every)
        return self

    def train_for(self, duration: int | str | Duration) -> LearnerBuilder:
        """Train for `duration`: epochs, optimizer steps, samples or tokens (a
        `Duration`, or text such as "10ep", "5000steps", "2M samples", "1B tokens"; an
        int is epochs, as `num_epochs`). The run ends at the first optimizer step
        boundary at or past it; an end inside an epoch is treated as an epoch end: the
        epoch's training values, a validation on the whole loader, a checkpoint and a
        history record, and the outcome "completed"."""
        duration = train_length(duration)
        if duration.unit == "epochs":
            self._state.num_epochs, self._state.train_for = duration.value, None
        else:
            self._state.train_for = duration
        return self

    def limit_batches(
        self, train: int | float | None = None, valid: int | float | None = None
    ) -> LearnerBuilder:
        """Use only the first batches of each epoch: a count (an int >= 1) or a fraction
        of the loader's batches (a float in (0, 1]); None leaves a split whole."""
        for split, limit in (("train", train), ("valid", valid)):
            self._state.limits[split] = batch_limit(limit, split)
        return self

    def num_epochs(self, epochs: int) -> LearnerBuilder:
        self._state.num_epochs = positive_int(epochs, "num_epochs")
        self._state.train_for = None
        return self

    def devices(
        self,
        devices: Sequence[str | torch.device],
        *,
        timeout: float = 300.0,
        strategy: str | FsdpOptions = "ddp",
        rank_logs: bool = False,
        **fsdp: Any,
    ) -> LearnerBuilder:
        """The devices to train on, e.g. `["cpu"]`, `["cuda:0"]`, or several
        (`["cuda:0", "cuda:1"]`: one process per device on torch.distributed, started by
        ember; under torchrun each process joins by itself). `timeout` bounds how long a
        process waits for the others (to join the group, in a collective); `rank_logs`
        has each process keep its own log lines in `rank-N.log` of the artifact directory.
        With several processes, `strategy` says how they share the model: "ddp" (each
        holds a whole copy; the default), "fsdp" (each holds a shard of the parameters,
        gradients and optimizer state) or "hsdp" (each machine's processes shard one
        copy, the machines hold a copy each; `shard_size=N` for groups of N processes),
        with `FsdpOptions` as keywords (`devices([...], strategy="fsdp",
        mixed_precision="bf16")`) or `strategy=FsdpOptions(...)`."""
        parsed = parse_devices(devices, timeout)
        self._state.fsdp = choose(strategy, fsdp, world_size(parsed))
        self._state.devices, self._state.rank_logs = parsed, bool(rank_logs)
        self._state.timeout = float(timeout)
        return self

    def with_file_checkpointer(
        self, recorder: Any, *, on_checkpoint_error: str = "stop"
    ) -> LearnerBuilder:
        """Save model, optimizer and scheduler states under `checkpoint/` after each epoch
        (and when a run is stopped mid-epoch). A failed write stops the run, or with
        `on_checkpoint_error="warn"` is logged and training goes on."""
        from ember.record.protocol import Recorder  # not at import: ember.record loads msgpack

        check_plugin(recorder, Recorder, "a recorder")
        self._state.on_checkpoint_error = checkpoint_error_policy(on_checkpoint_error)
        self._state.recorder, self._state.checkpointer = recorder, None
        return self

    def with_checkpointer(
        self, checkpointer: Checkpointer, *, on_checkpoint_error: str = "stop"
    ) -> LearnerBuilder:
        """Save checkpoints with any `Checkpointer` (see `ember.train.checkpoint.base`):
        the same saving, resuming and retention as the file checkpointer, in another
        storage."""
        check_plugin(checkpointer, Checkpointer, "a checkpointer")
        self._state.on_checkpoint_error = checkpoint_error_policy(on_checkpoint_error)
        self._state.checkpointer, self._state.recorder = checkpointer, None
        return self

    def with_checkpointing_strategy(self, strategy: Any) -> LearnerBuilder:
        """Which checkpoints to keep (default: the last 2 epochs and the best by valid loss)."""
        check_plugin(strategy, CheckpointingStrategy, "a checkpointing strategy")
        self._state.strategy = strategy
        return self

    def checkpoint(
        self, epoch: int | str, *, hyperparameters: str = "checkpoint"
    ) -> LearnerBuilder:
        """Resume from the checkpoint of `epoch` (or `"latest"`, the newest one that loads,
        which may be a run stopped mid-epoch) and continue right after it. `"auto"` starts
        a fresh run when the directory holds no checkpoint (replacing the logs of an
        attempt that saved none) and resumes as `"latest"` otherwise: the same command
        starts and resumes a run (see docs/long-runs.md). The optimizer
        must be of the checkpoint's class. Its hyperparameters (and a constant learning
        rate) are the checkpoint's unless `hyperparameters="new"`; every difference is
        logged either way."""
        self._state.checkpoint = resume_point(epoch, hyperparameters)
        self._state.resume_hyperparameters = hyperparameters
        return self

    def lr_monitor(self, metric: Any, split: str = "valid") -> LearnerBuilder:
        """The epoch value a metric-driven schedule (`ReduceLROnPlateau`) steps on
        (default: the validation Loss, or the training Loss without validation metrics)."""
        self._state.monitor = (
            lr_monitor_split(split),
            metric if isinstance(metric, str) else str(metric.name),
        )
        return self

    def model_summary(self, depth: int | None = 1) -> LearnerBuilder:
        """The table of the model's modules down to `depth` levels (parameters trainable
        and frozen, size, dtypes) that `fit` writes to experiment.log and shows at the
        top of the output when it starts; on by default at depth 1. None turns it off
        (the warnings about eval mode and frozen parameters are logged either way)."""
        self._state.model_summary = summary_depth(depth)
        return self

    def activation_checkpointing(self, module_classes: Any) -> LearnerBuilder:
        """Recompute the activations of every submodule of these classes (e.g. the
        model's transformer blocks) in the backward pass instead of keeping them: less
        memory for more compute. Uses PyTorch's non-reentrant checkpoint wrapper, which
        gives the same gradients (dropout included), works with mixed precision and DDP,
        and keeps the plain model's checkpoint keys."""
        from ember.train.activation_checkpointing import module_classes as checked

        self._state.recompute = checked(module_classes)
        return self

    def compile(self, **options: Any) -> LearnerBuilder:
        """Compile the model with `torch.compile` (`options` are its keyword arguments,
        e.g. `mode="max-autotune"`, `backend="inductor"`). The module is compiled in
        place (`nn.Module.compile`), so its steps run the compiled forward and its
        checkpoints keep the plain model's parameter names."""
        self._state.compile = dict(options)
        return self

    def mixed_precision(self, dtype: str) -> LearnerBuilder:
        """Run steps under `torch.autocast` in "bf16" or "fp16" (fp16 adds a GradScaler)."""
        self._state.mixed_precision = check_mixed_precision(dtype)
        return self

    def sync_batchnorm(self) -> LearnerBuilder:
        """Share the BatchNorm statistics between the processes (DDP or FSDP). On GPUs
        every BatchNorm becomes a `torch.nn.SyncBatchNorm`: each batch is normalized with
        the statistics of every process's batch. torch's SyncBatchNorm does not run on
        the CPU: there, every process keeps rank 0's running statistics (broadcast after
        each training forward), so all validate and end with the same ones."""
        self._state.sync_batchnorm = True
        return self

    def grad_clipping(
        self, *, norm: float | None = None, value: float | None = None
    ) -> LearnerBuilder:
        """Clip gradients before each optimizer step, by total norm and/or by value."""
        check_clipping(norm, value)
        self._state.clip_norm, self._state.clip_value = norm, value
        return self

    def nonfinite_loss(self, policy: str) -> LearnerBuilder:
        """What a NaN/inf loss does: "stop" the run (default) or "skip" that optimizer step."""
        self._state.nonfinite = nonfinite_policy(policy)
        return self

    def early_stopping(self, strategy: Any) -> LearnerBuilder:
        """Stop when the strategy says so, after that epoch's checkpoint."""
        check_plugin(strategy, EarlyStoppingStrategy, "an early stopping strategy")
        self._state.early_stopping = strategy
        return self

    def pruning(self, strategy: Any) -> LearnerBuilder:
        """Let a hyperparameter search prune this run: at each epoch end (after early
        stopping is asked) `strategy.should_prune(history)` may end the run, after that
        epoch's checkpoint, with the outcome "pruned: <why>" (see
        `ember.integrations.optuna.OptunaPruning`)."""
        check_plugin(strategy, PruningStrategy, "a pruning strategy")
        self._state.pruning = strategy
        return self

    def preemption(self, signal: str = "SIGTERM", *, requeue: bool = False) -> LearnerBuilder:
        """Run on a preemptible machine: `signal` ("SIGTERM" or "SIGUSR1", the one the
        scheduler sends before it takes the machine) stops the run at the next step
        boundary with a checkpoint. The outcome is "preempted: <signal>" (reason
        `StopReason.PREEMPTED`) and `exit_code` is 128 + the signal number (143 for
        SIGTERM, 138 for SIGUSR1): "preempted, requeue me". With `requeue=True` under
        SLURM (`SLURM_JOB_ID` set) rank 0 then runs `scontrol requeue $SLURM_JOB_ID`;
        with `checkpoint("auto")` the requeued job resumes where this one stopped."""
        from ember.train.length.preemption import Preemption

        self._state.preemption = Preemption.parse(signal, requeue)
        return self

    def checkpoint_every(
        self,
        every: str | Duration | None = None,
        *,
        steps: int | None = None,
        minutes: float | None = None,
    ) -> LearnerBuilder:
        """Also checkpoint inside an epoch, once `steps` optimizer steps or `minutes` of
        wall time passed since the last checkpoint (whichever comes first; an epoch end
        checkpoints too), or, with `every` a duration in samples or tokens ("1M
        samples", "500M tokens"), each time the run's count passes a multiple of it
        (a duration in steps is `steps=`). These are the mid-epoch checkpoints a stop
        writes: the same retention keeps them (each one replaces the epoch's previous),
        and `checkpoint("latest" | "auto")` resumes from them exactly. Each waits for its
        write. Under several processes rank 0's clock decides for all."""
        self._state.every_count = None
        steps, self._state.every_count = every_in_steps_or_count(every, steps)
        self._state.every = checkpoint_interval(steps, minutes, self._state.every_count)
        return self

    def max_time(
        self, *, hours: float = 0, minutes: float = 0, seconds: float = 0
    ) -> LearnerBuilder:
        """Stop at the first step boundary once `hours` + `minutes` + `seconds` of wall
        time passed since `fit` began, with a checkpoint (mid-epoch, or the epoch end's).
        The outcome is "stopped: time limit reached (max_time ...)" (`StopReason.TIME_LIMIT`) and
        `exit_code` 75 (EX_TEMPFAIL: run the same command again, with
        `checkpoint("auto")`, to go on). With `preemption(requeue=True)` under SLURM the
        job is requeued. Under several processes rank 0's clock decides for all."""
        self._state.max_time = time_limit(hours, minutes, seconds)
        return self

    def interrupter(self) -> Interrupter:
        """The handle that stops this run gracefully (`stop(message)`)."""
        return self._state.interrupter

    # Build -------------------------------------------------------------------
    def build(
        self, model: torch.nn.Module, optimizer: Any, lr: Any = None, *, steps: Any = None
    ) -> Learner:
        """The Learner for `model`. `optimizer` is a torch optimizer over the model's
        parameters or an ember optimizer config; `lr` a float, an ember scheduler or a
        `torch.optim.lr_scheduler` object. Left out, a torch optimizer trains at the
        rates of its param groups, constant (an ember optimizer config needs a rate).
        `steps`: a `LossFromModel` for a model without step methods (docs/libraries.md).

        Custom optimization: `optimizer` a dict of named optimizers (`{"gen": ...,
        "disc": ...}`), `lr` a dict with the same names (or one float for all), and the
        model's `train_step(batch, ctx)` steps them through `ctx`."""
        from ember.train.learner import Learner

        attach_steps(model, steps)
        return Learner(self._state.resolve(model, optimizer, lr))
