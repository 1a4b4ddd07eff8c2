"""`LearnerBuilder`: collects and validates a run's options, then builds a `Learner`."""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Mapping, Sequence

import torch

from ember.environment import from_environment
from ember.errors import ConfigError
from ember.lr.base import ConstantLr, LrDriver, StepsUnknown
from ember.train.artifacts import Artifacts
from ember.train.callbacks.base import Callbacks, Context, check_callback, is_callback
from ember.train.checkpoint.base import Checkpointer
from ember.train.checkpoint.file import FileCheckpointer, other_checkpoint_formats
from ember.train.checkpoint.strategy import (
    CheckpointingStrategy,
    ComposedCheckpointingStrategy,
    KeepLastNCheckpoints,
    MetricCheckpointingStrategy,
)
from ember.train.distributed import process_device, world_size
from ember.train.duration import Duration
from ember.train.early_stopping import EarlyStoppingStrategy, PruningStrategy
from ember.train.events import Listener
from ember.train.interrupter import Interrupter
from ember.train.logger.base import MetricLogger
from ember.train.manual import ManualOptimization, check_automatic, check_manual
from ember.train.metric.base import Metric
from ember.train.optimization import Optimization, check_mixed_precision
from ember.train.options import LearnerOptions, RegisteredMetric
from ember.train.parallel import FsdpOptions, choose
from ember.train.plugins import check_plugin
from ember.train.renderer.base import Renderer
from ember.train.step import check_steps

if TYPE_CHECKING:
    from ember.record.protocol import Recorder
    from ember.train.learner import Learner


def _positive_int(value: Any, what: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ConfigError(f"{what} must be an int >= 1, got {value!r}.")
    return value


def _duration_every(value: Any, what: str) -> Duration:
    """A cadence given as a `Duration` or its text, in steps, samples or tokens."""
    from ember.train.duration import FORMS

    hint = (
        f"{what} takes a number of optimizer steps, an int >= 1, or a duration in steps, "
        f"samples or tokens ({FORMS}), got {value!r}"
    )
    if isinstance(value, int) and not isinstance(value, bool):
        raise ConfigError(f"{hint}.")
    try:
        duration = Duration.parse(value, what)
    except ConfigError:
        raise ConfigError(f"{hint}.") from None
    if duration.unit == "epochs":
        raise ConfigError(
            f"{what}({str(value)!r}): every epoch end already does this; give steps, samples "
            "or tokens, e.g. '500steps' or '100k samples'."
        )
    return duration


class LearnerBuilder:
    """Options of a training run, as chained calls; `build(model, optimizer, lr)`.

    Everything a run writes goes under `artifact_dir`. A directory that already holds
    a run is refused unless you resume (`checkpoint(n)`) or pass `overwrite=True`.
    """

    def __init__(self, artifact_dir: str | os.PathLike[str], *, overwrite: bool = False) -> None:
        self._artifact_dir = Path(artifact_dir)
        self._overwrite = overwrite
        self._metrics: dict[str, list[RegisteredMetric]] = {"train": [], "valid": []}
        self._loggers: dict[str, list[MetricLogger]] = {"train": [], "valid": []}
        self._renderer: Renderer | None = None
        self._grads_accumulation = 1
        self._micro_auto = False
        self._memory_history: int | None = None
        self._recorder: Recorder | None = None
        self._checkpointer: Checkpointer | None = None
        self._num_epochs = 1
        self._devices: list[torch.device] | None = None
        self._timeout = 300.0
        self._fsdp: FsdpOptions | None = None
        self._checkpoint: int | str | None = None
        self._interrupter = Interrupter()
        self._listeners: list[Listener] = []
        self._callbacks: list[Any] = []
        self._application_log: bool = True
        self._summary = False
        self._mixed_precision: str | None = None
        self._clip_norm: float | None = None
        self._clip_value: float | None = None
        self._nonfinite = "stop"
        self._early_stopping: EarlyStoppingStrategy | None = None
        self._strategy: CheckpointingStrategy | None = None
        self._on_checkpoint_error = "stop"
        self._compile: dict[str, Any] | None = None
        self._resume_hyperparameters = "checkpoint"
        self._monitor: tuple[str, str] | None = None
        self._hparams: dict[str, Any] | None = None
        self._pruning: PruningStrategy | None = None
        self._preemption: Any = None
        self._every: tuple[int | None, float | None] = (None, None)  # steps, seconds
        self._max_time: float | None = None
        self._valid_every: int | Duration | None = None
        self._train_for: Duration | None = None
        self._every_count: Duration | None = None  # checkpoint_every in samples or tokens
        self._limits: dict[str, int | float | None] = {"train": None, "valid": None}
        self._model_summary: int | None = 1
        self._recompute: tuple[type, ...] = ()

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
            if not any(known is metric for known in self._callbacks):
                self._callbacks.append(metric)
        if any(existing.name == name for existing in self._metrics[split]):
            raise ConfigError(
                f"The metric {name!r} is registered twice for {split}: register each metric "
                "once per split (a numeric metric is also shown as text)."
            )
        self._metrics[split].append(RegisteredMetric(metric, numeric))
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
            self._loggers[split].extend(loggers)
        return self

    def renderer(self, renderer: Any) -> LearnerBuilder:
        """How progress is shown (default: a live display in a notebook cell, the live
        dashboard on a terminal, plain text lines otherwise: when output is piped, `CI`
        is set or `TERM=dumb`)."""
        check_plugin(renderer, Renderer, "a renderer")
        self._renderer = renderer
        return self

    def with_application_logger(self, enabled: bool = True) -> LearnerBuilder:
        """Write Python logging of the run to `experiment.log` (default on)."""
        self._application_log = bool(enabled)
        return self

    def summary(self) -> LearnerBuilder:
        """Print (and log) a table of each metric's min and max epoch values at the end."""
        self._summary = True
        return self

    def hparams(self, hparams: Any) -> LearnerBuilder:
        """The run's hyperparameters: a dict, a dataclass or a pydantic model (an ember
        `Config`). They are recorded once per `fit`: in `hparams.json` and
        `experiment.log`, and by the metric loggers that keep them (TensorBoard's
        HPARAMS table, MLflow params, W&B config). Values must be JSON values (paths
        and enums are converted); anything else is refused here, naming its key."""
        from ember.train.run_record import to_hparams

        self._hparams = to_hparams(hparams)
        return self

    def listener(self, listener: Any) -> LearnerBuilder:
        """Register an object with `on_event(event)` to hook into the loop."""
        check_plugin(listener, Listener, "a listener")
        self._listeners.append(listener)
        return self

    def callback(self, callback: Any) -> LearnerBuilder:
        """Register a callback (`ember.train.callbacks.Callback`): hooks that may change
        training (gradients, weights), whose `state_dict()` every checkpoint keeps and a
        resumed run gets back. Callbacks are called in the order they are registered."""
        check_callback(callback)
        if any(known is callback for known in self._callbacks):
            raise ConfigError(
                f"This {type(callback).__name__} is registered twice: register each callback "
                "once (a metric that is a callback, like GradNormMetric, is registered by "
                "metric_train)."
            )
        self._callbacks.append(callback)
        return self

    # Training ----------------------------------------------------------------
    def grads_accumulation(self, steps: int | Literal["auto"]) -> LearnerBuilder:
        """Step the optimizer every `steps` batches (gradients summed as a mean).

        `"auto"`: one optimizer step per batch, and a step that raises
        `torch.OutOfMemoryError` is run again with every batch split into twice as
        many micro-batches (along the first dimension), until it fits; the update is
        the same, and the split stays for the rest of the run (checkpoints keep it).
        One process only, automatic optimization only."""
        if isinstance(steps, str) and steps != "auto":
            raise ConfigError(
                f"grads_accumulation takes a number of batches (an int >= 1) or 'auto', got "
                f"{steps!r}."
            )
        self._micro_auto = steps == "auto"
        if self._micro_auto:
            self._grads_accumulation = 1
            return self
        self._grads_accumulation = _positive_int(steps, "grads_accumulation")
        return self

    def memory_history(self, max_entries: int = 100_000) -> LearnerBuilder:
        """Out-of-memory post-mortem (CUDA only): record the allocations and their stacks
        (the last `max_entries` events) from the start of `fit`; when
        `torch.OutOfMemoryError` ends the run, write PyTorch's snapshot to
        `memory-snapshot.pickle` in the artifact directory (open it at
        https://pytorch.org/memory_viz) and name the largest live allocations in the
        error. Recording slows allocations a little."""
        self._memory_history = _positive_int(max_entries, "memory_history's max_entries")
        return self

    def valid_every(self, every: int | str | Duration) -> LearnerBuilder:
        """Also validate inside each epoch on the whole validation loader; the
        end-of-epoch validation stays as it is. An int (or a duration in steps,
        "500steps") validates every that many optimizer steps of each epoch; a duration
        in samples or tokens ("500k samples", "1B tokens") each time the run's count
        passes a multiple of it."""
        if isinstance(every, int) and not isinstance(every, bool) and every >= 1:
            pass
        else:
            every = _duration_every(every, "valid_every")
            if every.unit == "steps":
                every = every.value
        self._valid_every = every
        return self

    def train_for(self, duration: int | str | Duration) -> LearnerBuilder:
        """Train for `duration`: epochs, optimizer steps, samples or tokens (a
        `Duration`, or text such as "10ep", "5000steps", "2M samples", "1B tokens"; an
        int is epochs, as `num_epochs`). The run ends at the first optimizer step
        boundary at or past it; an end inside an epoch is treated as an epoch end: the
        epoch's training values, a validation on the whole loader, a checkpoint and a
        history record, and the outcome "completed"."""
        if isinstance(duration, int) and not isinstance(duration, bool):
            duration = Duration(epochs=_positive_int(duration, "train_for"))
        duration = Duration.parse(duration, "train_for")
        if duration.unit == "epochs":
            self._num_epochs, self._train_for = duration.value, None
        else:
            self._train_for = duration
        return self

    def limit_batches(
        self, train: int | float | None = None, valid: int | float | None = None
    ) -> LearnerBuilder:
        """Use only the first batches of each epoch: a count (an int >= 1) or a fraction
        of the loader's batches (a float in (0, 1]); None leaves a split whole."""
        for split, limit in (("train", train), ("valid", valid)):
            self._limits[split] = _batch_limit(limit, split)
        return self

    def num_epochs(self, epochs: int) -> LearnerBuilder:
        self._num_epochs = _positive_int(epochs, "num_epochs")
        self._train_for = None
        return self

    def devices(
        self,
        devices: Sequence[str | torch.device],
        *,
        timeout: float = 300.0,
        strategy: str | FsdpOptions = "ddp",
        **fsdp: Any,
    ) -> LearnerBuilder:
        """The devices to train on, e.g. `["cpu"]`, `["cuda:0"]`, or several
        (`["cuda:0", "cuda:1"]`: one process per device on torch.distributed, started by
        ember; under torchrun each process joins by itself). `timeout` bounds how long a
        process waits for the others in a collective.

        With several processes, `strategy` says how they share the model: "ddp" (each
        holds a whole copy; the default) or "fsdp" (each holds a shard of the
        parameters, gradients and optimizer state), with the options of `FsdpOptions`
        as keywords (`devices([...], strategy="fsdp", mixed_precision="bf16")`) or
        `strategy=FsdpOptions(...)`."""
        if isinstance(devices, (str, torch.device)):
            devices = [devices]
        if not devices:
            raise ConfigError("devices() needs at least one device, e.g. devices(['cpu']).")
        try:
            parsed = [torch.device(device) for device in devices]
        except (RuntimeError, TypeError) as error:
            raise ConfigError(f"devices(): {error}") from None
        if not timeout > 0:
            raise ConfigError(f"devices(timeout=...) must be > 0 seconds, got {timeout!r}.")
        for device in parsed:
            _check_available(device)
        self._fsdp = choose(strategy, fsdp, world_size(parsed))
        self._devices = parsed
        self._timeout = float(timeout)
        return self

    def with_file_checkpointer(
        self, recorder: Any, *, on_checkpoint_error: str = "stop"
    ) -> LearnerBuilder:
        """Save model, optimizer and scheduler states under `checkpoint/` after each epoch
        (and when a run is stopped mid-epoch). A failed write stops the run, or with
        `on_checkpoint_error="warn"` is logged and training goes on."""
        from ember.record.protocol import Recorder  # not at import: ember.record loads msgpack

        check_plugin(recorder, Recorder, "a recorder")
        self._on_checkpoint_error = _checkpoint_error_policy(on_checkpoint_error)
        self._recorder, self._checkpointer = recorder, None
        return self

    def with_checkpointer(
        self, checkpointer: Checkpointer, *, on_checkpoint_error: str = "stop"
    ) -> LearnerBuilder:
        """Save checkpoints with any `Checkpointer` (see `ember.train.checkpoint.base`):
        the same saving, resuming and retention as the file checkpointer, in another
        storage."""
        check_plugin(checkpointer, Checkpointer, "a checkpointer")
        self._on_checkpoint_error = _checkpoint_error_policy(on_checkpoint_error)
        self._checkpointer, self._recorder = checkpointer, None
        return self

    def with_checkpointing_strategy(self, strategy: Any) -> LearnerBuilder:
        """Which checkpoints to keep (default: the last 2 epochs and the best by valid loss)."""
        check_plugin(strategy, CheckpointingStrategy, "a checkpointing strategy")
        self._strategy = strategy
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
        if isinstance(epoch, str) and epoch not in ("latest", "auto"):
            hint = (
                " (did you mean 'latest'?)" if epoch.lower() in ("last", "newest", "recent") else ""
            )
            raise ConfigError(
                f"checkpoint() takes an epoch number, 'latest' or 'auto', got {epoch!r}{hint}."
            )
        if hyperparameters not in ("checkpoint", "new"):
            raise ConfigError(
                "checkpoint(hyperparameters=...) takes 'checkpoint' (the checkpoint's "
                f"optimizer settings win) or 'new' (this run's win), got {hyperparameters!r}."
            )
        self._checkpoint = (
            epoch if epoch in ("latest", "auto") else _positive_int(epoch, "checkpoint")
        )
        self._resume_hyperparameters = hyperparameters
        return self

    def lr_monitor(self, metric: Any, split: str = "valid") -> LearnerBuilder:
        """The epoch value a metric-driven schedule (`ReduceLROnPlateau`) steps on
        (default: the validation Loss, or the training Loss without validation metrics)."""
        if split not in ("train", "valid"):
            raise ConfigError(f"lr_monitor(split=...) takes 'train' or 'valid', got {split!r}.")
        self._monitor = (split, metric if isinstance(metric, str) else str(metric.name))
        return self

    def model_summary(self, depth: int | None = 1) -> LearnerBuilder:
        """The table of the model's modules down to `depth` levels (parameters trainable
        and frozen, size, dtypes) that `fit` writes to experiment.log and shows at the
        top of the output when it starts; on by default at depth 1. None turns it off
        (the warnings about eval mode and frozen parameters are logged either way)."""
        if depth is not None and (
            isinstance(depth, bool) or not isinstance(depth, int) or depth < 1
        ):
            raise ConfigError(
                f"model_summary(depth=...) takes an int >= 1, or None for no summary; got {depth!r}."
            )
        self._model_summary = depth
        return self

    def activation_checkpointing(self, module_classes: Any) -> LearnerBuilder:
        """Recompute the activations of every submodule of these classes (e.g. the
        model's transformer blocks) in the backward pass instead of keeping them: less
        memory for more compute. Uses PyTorch's non-reentrant checkpoint wrapper, which
        gives the same gradients (dropout included), works with mixed precision and DDP,
        and keeps the plain model's checkpoint keys."""
        from ember.train.activation_checkpointing import module_classes as checked

        self._recompute = checked(module_classes)
        return self

    def compile(self, **options: Any) -> LearnerBuilder:
        """Compile the model with `torch.compile` (`options` are its keyword arguments,
        e.g. `mode="max-autotune"`, `backend="inductor"`). The module is compiled in
        place (`nn.Module.compile`), so its steps run the compiled forward and its
        checkpoints keep the plain model's parameter names."""
        self._compile = dict(options)
        return self

    def mixed_precision(self, dtype: str) -> LearnerBuilder:
        """Run steps under `torch.autocast` in "bf16" or "fp16" (fp16 adds a GradScaler)."""
        self._mixed_precision = check_mixed_precision(dtype)
        return self

    def grad_clipping(
        self, *, norm: float | None = None, value: float | None = None
    ) -> LearnerBuilder:
        """Clip gradients before each optimizer step, by total norm and/or by value."""
        for name, limit in (("norm", norm), ("value", value)):
            if limit is not None and (not isinstance(limit, (int, float)) or not limit > 0):
                raise ConfigError(f"grad_clipping({name}=...) must be a number > 0, got {limit!r}.")
        if norm is None and value is None:
            raise ConfigError("grad_clipping() needs norm=... or value=....")
        self._clip_norm, self._clip_value = norm, value
        return self

    def nonfinite_loss(self, policy: str) -> LearnerBuilder:
        """What a NaN/inf loss does: "stop" the run (default) or "skip" that optimizer step."""
        if policy not in ("stop", "skip"):
            raise ConfigError(f"nonfinite_loss takes 'stop' or 'skip', got {policy!r}.")
        self._nonfinite = policy
        return self

    def early_stopping(self, strategy: Any) -> LearnerBuilder:
        """Stop when the strategy says so, after that epoch's checkpoint."""
        check_plugin(strategy, EarlyStoppingStrategy, "an early stopping strategy")
        self._early_stopping = strategy
        return self

    def pruning(self, strategy: Any) -> LearnerBuilder:
        """Let a hyperparameter search prune this run: at each epoch end (after early
        stopping is asked) `strategy.should_prune(history)` may end the run, after that
        epoch's checkpoint, with the outcome "pruned: <why>" (see
        `ember.integrations.optuna.OptunaPruning`)."""
        check_plugin(strategy, PruningStrategy, "a pruning strategy")
        self._pruning = strategy
        return self

    def preemption(self, signal: str = "SIGTERM", *, requeue: bool = False) -> LearnerBuilder:
        """Run on a preemptible machine: `signal` ("SIGTERM" or "SIGUSR1", the one the
        scheduler sends before it takes the machine) stops the run at the next step
        boundary with a checkpoint. The outcome is "preempted: <signal>" (reason
        `StopReason.PREEMPTED`) and `exit_code` is 128 + the signal number (143 for
        SIGTERM, 138 for SIGUSR1): "preempted, requeue me". With `requeue=True` under
        SLURM (`SLURM_JOB_ID` set) rank 0 then runs `scontrol requeue $SLURM_JOB_ID`;
        with `checkpoint("auto")` the requeued job resumes where this one stopped."""
        from ember.train.preemption import Preemption

        self._preemption = Preemption.parse(signal, requeue)
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
        from ember.train.cadence import positive_number

        self._every_count = None
        if every is not None:
            duration = _duration_every(every, "checkpoint_every")
            if duration.unit == "steps":
                if steps is not None:
                    raise ConfigError(
                        f"checkpoint_every({str(every)!r}, steps={steps!r}): give the "
                        "optimizer steps once."
                    )
                steps = duration.value
            else:
                self._every_count = duration
        if steps is None and minutes is None and self._every_count is None:
            raise ConfigError(
                "checkpoint_every() needs steps=N (optimizer steps) or minutes=M (wall time), "
                "or a duration in samples or tokens, e.g. checkpoint_every(minutes=30) or "
                "checkpoint_every('1M samples')."
            )
        count = None if steps is None else _positive_int(steps, "checkpoint_every(steps=...)")
        seconds = (
            None
            if minutes is None
            else 60 * positive_number(minutes, "checkpoint_every(minutes=...)")
        )
        self._every = (count, seconds)
        return self

    def max_time(self, *, hours: float = 0, minutes: float = 0) -> LearnerBuilder:
        """Stop at the first step boundary once `hours` + `minutes` of wall time passed
        since `fit` began, with a checkpoint (mid-epoch, or the epoch end's). The outcome
        is "stopped: time limit reached (max_time ...)" (`StopReason.TIME_LIMIT`) and
        `exit_code` 75 (EX_TEMPFAIL: run the same command again, with
        `checkpoint("auto")`, to go on). With `preemption(requeue=True)` under SLURM the
        job is requeued. Under several processes rank 0's clock decides for all."""
        from ember.train.cadence import positive_number

        for value, what in ((hours, "hours"), (minutes, "minutes")):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                raise ConfigError(f"max_time({what}=...) must be a number >= 0, got {value!r}.")
        total = positive_number(
            3600 * hours + 60 * minutes, "max_time(hours=..., minutes=...) in seconds"
        )
        self._max_time = total
        return self

    def interrupter(self) -> Interrupter:
        """The handle that stops this run gracefully (`stop(message)`)."""
        return self._interrupter

    # Build -------------------------------------------------------------------
    def build(self, model: torch.nn.Module, optimizer: Any, lr: Any) -> Learner:
        """The Learner for `model`. `optimizer` is a torch optimizer over the model's
        parameters or an ember optimizer config; `lr` a float, an ember scheduler or a
        `torch.optim.lr_scheduler` object.

        Custom optimization: `optimizer` a dict of named optimizers (`{"gen": ...,
        "disc": ...}`), `lr` a dict with the same names (or one float for all), and the
        model's `train_step(batch, ctx)` steps them through `ctx`."""
        from ember.train.learner import Learner
        from ember.train.renderer.select import default_renderer

        if not isinstance(model, torch.nn.Module):
            raise ConfigError(f"build() needs a torch.nn.Module, got {type(model).__name__}.")
        if hasattr(model, "_orig_mod") and type(model).__name__ == "OptimizedModule":
            raise ConfigError(
                "build() got a model wrapped by torch.compile(model): its steps would run "
                "uncompiled and its checkpoints would carry '_orig_mod.' keys. Pass the model "
                "itself and ask for compilation with LearnerBuilder.compile(**options)."
            )
        check_steps(model)
        manual = isinstance(optimizer, Mapping)
        if manual:
            check_manual(model, optimizer, lr)
        else:
            check_automatic(model)
        if self._fsdp is not None and self._mixed_precision == "fp16":
            raise ConfigError(
                "mixed_precision('fp16') needs a gradient scaler that FSDP's sharded gradients "
                "do not support here: use mixed_precision('bf16'), or FSDP's own "
                "devices(..., strategy='fsdp', mixed_precision='bf16')."
            )
        placement = from_environment()
        if manual and ((self._devices is not None and len(self._devices) > 1) or placement):
            raise ConfigError(
                "Custom optimization (a dict of optimizers) runs on one device: several "
                "processes are not supported with it. Train on one device."
            )
        if self._micro_auto:
            self._check_micro_auto(manual)
        if self._devices is None and placement is None:
            device = _model_device(model)
        else:
            device = process_device(self._devices, placement[2] if placement else 0)
        if self._memory_history is not None and device.type != "cuda":
            raise ConfigError(
                f"memory_history() records CUDA allocations, and this run trains on {device}: "
                "drop memory_history(), or train on a CUDA device (devices(['cuda:0']))."
            )
        if self._fsdp is not None and self._fsdp.cpu_offload and device.type == "cpu":
            raise ConfigError(
                "FSDP's cpu_offload=True keeps the shards of a model trained on GPUs in host "
                "memory; this run trains on the CPU, where they are already. Drop cpu_offload."
            )
        if self._recompute:
            from ember.train.activation_checkpointing import apply

            apply(model, self._recompute)
        model.to(device)
        if self._compile is not None:
            model.compile(**self._compile)
        optimization = self._optimization(model, optimizer, lr, device)
        if self._micro_auto:
            optimization.micro_split = 1
        checkpointer = self._checkpointer
        if self._recorder is not None:
            checkpointer = FileCheckpointer(
                Artifacts(self._artifact_dir).checkpoints, self._recorder
            )
        self._check_resume(checkpointer)
        length = self._train_for
        if length is not None and length.unit == "tokens" and optimization.lr.pending is not None:
            raise ConfigError(
                "The learning-rate schedule's length is 'auto' (the run's optimizer steps), but "
                f"the run trains for {length}, and how many optimizer steps that takes is only "
                "known once the tokens are counted. Give the schedule an explicit step count "
                "(e.g. num_iters=10_000), or train_for a number of steps or samples."
            )
        if checkpointer is None and (self._every != (None, None) or self._every_count):
            raise ConfigError(
                "checkpoint_every() writes checkpoints, but no checkpointer is set: add "
                "with_file_checkpointer(recorder)."
            )
        sharded = self._fsdp is not None and self._fsdp.sharded_checkpoints
        if sharded and checkpointer is not None and not isinstance(checkpointer, FileCheckpointer):
            raise ConfigError(
                "FSDP's sharded_checkpoints=True has each process write files of its own, "
                f"which {type(checkpointer).__name__} cannot hold: use "
                "with_file_checkpointer(recorder), or drop sharded_checkpoints."
            )
        options = LearnerOptions(
            model=model,
            optimization=optimization,
            device=device,
            devices=tuple(self._devices) if self._devices is not None else None,
            distributed_timeout=self._timeout,
            fsdp=self._fsdp,
            artifact_dir=self._artifact_dir,
            overwrite=self._overwrite,
            num_epochs=self._num_epochs,
            metrics={split: tuple(entries) for split, entries in self._metrics.items()},
            loggers={split: tuple(loggers) for split, loggers in self._loggers.items()},
            renderer=self._renderer if self._renderer is not None else default_renderer(),
            grads_accumulation=self._grads_accumulation,
            checkpointer=checkpointer,
            strategy=self._retention() if checkpointer is not None else None,
            resume_from=self._checkpoint,
            on_checkpoint_error=self._on_checkpoint_error,
            interrupter=self._interrupter,
            listeners=tuple(self._listeners),
            application_log=self._application_log,
            summary=self._summary,
            early_stopping=self._early_stopping,
            nonfinite_loss=self._nonfinite,
            compile=self._compile,
            model_summary=self._model_summary,
            activation_checkpointing=self._recompute,
            resume_hyperparameters=self._resume_hyperparameters,
            hparams=self._hparams,
            pruning=self._pruning,
            preemption=self._preemption,
            cadence=self._make_cadence(),
            valid_every=self._valid_every,
            train_for=self._train_for,
            checkpoint_every=self._every_count,
            limit_batches=(self._limits["train"], self._limits["valid"]),
            memory_history=self._memory_history,
        )
        return Learner(options)

    def _check_micro_auto(self, manual: bool) -> None:
        """grads_accumulation("auto") splits batches whose loss ember backpropagates, on
        one process or DDP replicas."""
        if manual:
            raise ConfigError(
                "grads_accumulation('auto') splits a batch and backpropagates each part, and "
                "custom optimization (a dict of optimizers) runs its own backward passes: "
                "use grads_accumulation(n) with a smaller batch size instead."
            )
        if self._fsdp is not None:
            raise ConfigError(
                "grads_accumulation('auto') runs on one process or DDP replicas, not on "
                "FSDP shards: FSDP gathers the parameters inside every forward pass, where a "
                "rank that runs out of memory would leave the others waiting. Set the split "
                "yourself (a smaller batch size with grads_accumulation(n)), or use DDP."
            )

    def _optimization(
        self, model: torch.nn.Module, optimizer: Any, lr: Any, device: torch.device
    ) -> Optimization:
        """The optimizer(s) bound to the model, their schedules, and the callbacks."""
        named = dict(optimizer) if isinstance(optimizer, Mapping) else {"optimizer": optimizer}
        optimizers, drivers = {}, {}
        for name, given in named.items():
            rate = lr[name] if isinstance(lr, Mapping) else lr
            rate, interval = _interval(rate)
            scheduler, pending = _scheduler(rate)
            bound = _bind_optimizer(given, model, _initial_lr(scheduler))
            optimizers[name] = bound
            drivers[name] = LrDriver(scheduler, bound, pending, interval, self._lr_monitor())
        if len(optimizers) > 1:
            _check_disjoint(optimizers)
        callbacks = None
        if self._callbacks:
            callbacks = Callbacks(self._callbacks, Context(model, optimizers, self._num_epochs))
        options: tuple[Any, ...] = (
            device,
            self._mixed_precision,
            self._clip_norm,
            self._clip_value,
            callbacks,
        )
        if isinstance(optimizer, Mapping):
            return ManualOptimization(model, optimizers, drivers, *options)
        return Optimization(model, optimizers["optimizer"], drivers["optimizer"], *options)

    def _lr_monitor(self) -> tuple[str, str]:
        if self._monitor is not None:
            return self._monitor
        if any(entry.name == "Loss" for entry in self._metrics["valid"]):
            return ("valid", "Loss")
        return ("train", "Loss")

    def _make_cadence(self) -> Any:
        """This run's mid-epoch checkpoints and time limit (a `Cadence`), or None."""
        if self._every == (None, None) and self._max_time is None:
            return None
        from ember.train.cadence import Cadence

        return Cadence(*self._every, limit=self._max_time)

    def _retention(self) -> CheckpointingStrategy:
        if self._strategy is not None:
            return self._strategy
        keep_last = KeepLastNCheckpoints(2)
        if any(entry.name == "Loss" for entry in self._metrics["valid"]):
            return ComposedCheckpointingStrategy(keep_last, MetricCheckpointingStrategy("Loss"))
        return keep_last

    def _check_resume(self, checkpointer: Checkpointer | None) -> None:
        if self._checkpoint is None:
            return
        if checkpointer is None:
            raise ConfigError(
                "checkpoint() resumes from saved checkpoints, but no checkpointer is set: "
                "add with_file_checkpointer(recorder) with the recorder of the first run."
            )
        if self._checkpoint == "auto":  # no checkpoint: a fresh run, unless that loses some
            other = other_checkpoint_formats(
                Artifacts(self._artifact_dir).checkpoints, self._recorder
            )
            if other and not checkpointer.epochs():
                raise ConfigError(
                    f"checkpoint('auto'): the checkpoints in {checkpointer} were written in "
                    f"another format ({other}), and a fresh run would replace them: resume "
                    "with that recorder in with_file_checkpointer(...)."
                )
            return
        available = checkpointer.epochs()
        listing = ", ".join(map(str, available)) if available else "none"
        if self._checkpoint == "latest" and available:
            return
        if self._checkpoint != "latest" and self._checkpoint in available:
            return
        what = (
            "there is no complete checkpoint"
            if self._checkpoint == "latest"
            else f"there is no checkpoint of epoch {self._checkpoint}"
        )
        saved = "" if self._checkpoint == "latest" else f" (epochs saved: {listing})"
        raise ConfigError(
            f"checkpoint({self._checkpoint!r}): {what} in {checkpointer}{saved}. "
            + self._resume_fix(available)
        )

    def _resume_fix(self, available: list[int]) -> str:
        """The one thing that works from here: another recorder, another epoch, or a new run."""
        artifacts = Artifacts(self._artifact_dir)
        other = other_checkpoint_formats(artifacts.checkpoints, self._recorder)
        if other:
            return (
                f"The checkpoints there were written in another format ({other}): resume "
                "with that recorder in with_file_checkpointer(...)."
            )
        if available:
            return f"Resume with one of the epochs saved, e.g. checkpoint({available[-1]})."
        if any(artifacts.epoch_dirs(split) for split in ("train", "valid")):
            return (
                "The directory holds a run that saved no checkpoint: start it again with "
                "LearnerBuilder(dir, overwrite=True), or train in another directory."
            )
        return "Start without checkpoint()."


def _check_available(device: torch.device) -> None:
    """A device that this machine does not have is named at once, with those it has."""
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        names = ", ".join(["cpu", *(f"cuda:{index}" for index in range(count))])
        if count == 0:
            raise ConfigError(
                f"devices(): {device} is not available: torch sees no CUDA device on this "
                f"machine (torch {torch.__version__}). Devices here: {names}."
            )
        if device.index is not None and device.index >= count:
            raise ConfigError(
                f"devices(): {device} does not exist: this machine has {count} CUDA "
                f"device(s). Devices here: {names}."
            )
    elif device.type == "mps" and not torch.backends.mps.is_available():
        raise ConfigError(f"devices(): {device} is not available on this machine. Use 'cpu'.")


def _check_disjoint(optimizers: Mapping[str, torch.optim.Optimizer]) -> None:
    """Two optimizers must not update the same tensor."""
    owner: dict[int, str] = {}
    for name, optimizer in optimizers.items():
        for group in optimizer.param_groups:
            for param in group["params"]:
                other = owner.setdefault(id(param), name)
                if other != name:
                    raise ConfigError(
                        f"The optimizers {other!r} and {name!r} both update a tensor of shape "
                        f"{tuple(param.shape)}: each parameter belongs to one optimizer. "
                        "Create each one on its part of the model (e.g. "
                        "model.generator.parameters())."
                    )


def _batch_limit(limit: Any, split: str) -> int | float | None:
    """A checked `limit_batches` value: None, an int >= 1 or a float in (0, 1]."""
    if limit is None:
        return None
    if isinstance(limit, int) and not isinstance(limit, bool):
        if limit >= 1:
            return limit
        raise ConfigError(
            f"limit_batches({split}={limit!r}): a number of batches must be >= 1 (leave "
            f"{split} out, or None, to use every batch)."
        )
    if isinstance(limit, float):
        if 0.0 < limit <= 1.0:
            return limit
        raise ConfigError(
            f"limit_batches({split}={limit!r}): a fraction of the batches must be in (0, 1]; "
            f"for a number of batches give an int, e.g. limit_batches({split}=10)."
        )
    raise ConfigError(
        f"limit_batches({split}=...) takes an int (batches) or a float in (0, 1] (a fraction "
        f"of the loader's batches), got {type(limit).__name__} {limit!r}."
    )


def _checkpoint_error_policy(value: str) -> str:
    if value not in ("stop", "warn"):
        raise ConfigError(f"on_checkpoint_error must be 'stop' or 'warn', got {value!r}.")
    return value


def _model_device(model: torch.nn.Module) -> torch.device:
    for tensor in model.parameters():
        return tensor.device
    return torch.device("cpu")


def _interval(lr: Any) -> tuple[Any, Any]:
    """`(scheduler, "step" | "epoch")`, or a scheduler alone (stepped per optimizer step)."""
    if isinstance(lr, tuple):
        if len(lr) != 2 or lr[1] not in ("step", "epoch"):
            raise ConfigError(
                f"build() got the tuple {lr!r} as learning rate: give (scheduler, 'step') or "
                "(scheduler, 'epoch'), the interval at which the scheduler is stepped."
            )
        return lr[0], lr[1]
    return lr, "step"


def _scheduler(lr: Any) -> tuple[Any, Any]:
    """The scheduler for `lr`, or (None, config) for a config that needs the run's
    step count ("auto"), which the learner counts when `fit` starts."""
    if isinstance(lr, (int, float)) and not isinstance(lr, bool):
        return ConstantLr(float(lr)), None
    if isinstance(lr, torch.optim.lr_scheduler.LRScheduler):
        return lr, None
    if all(callable(getattr(lr, name, None)) for name in ("step", "state_dict", "load_state_dict")):
        return lr, None
    if callable(getattr(lr, "init", None)):
        try:
            built = lr.init()
        except StepsUnknown:
            return None, lr
        return _scheduler(built)
    raise ConfigError(
        f"build() got {lr!r} as learning rate: pass a float (constant rate), an ember "
        "scheduler (ember.lr) or a torch.optim.lr_scheduler object."
    )


def _initial_lr(scheduler: Any) -> float:
    if isinstance(scheduler, ConstantLr):
        return scheduler.lr
    return 0.0 if not isinstance(scheduler, torch.optim.lr_scheduler.LRScheduler) else math.nan


def _bind_optimizer(optimizer: Any, model: torch.nn.Module, lr: float) -> torch.optim.Optimizer:
    if isinstance(optimizer, torch.optim.Optimizer):
        owned = {id(p) for p in model.parameters()}
        foreign = [
            p for group in optimizer.param_groups for p in group["params"] if id(p) not in owned
        ]
        if foreign:
            raise ConfigError(
                f"The optimizer updates {len(foreign)} tensor(s) that are not parameters of "
                f"{type(model).__name__}: it was created for another model (or a copy). Create it "
                "from this model's parameters, e.g. torch.optim.Adam(model.parameters()), or pass "
                "an ember optimizer config (ember.optim.AdamConfig()) and let ember bind it."
            )
        return optimizer
    factory = optimizer.init() if callable(getattr(optimizer, "init", None)) else optimizer
    if callable(getattr(factory, "bind", None)):
        trainable = [p for p in model.parameters() if p.requires_grad]
        if not trainable:
            raise ConfigError(f"{type(model).__name__} has no trainable parameters.")
        return factory.bind(trainable, lr if math.isfinite(lr) else 0.0)
    raise ConfigError(
        f"build() got {type(optimizer).__name__} as optimizer: pass a torch.optim.Optimizer "
        "over the model's parameters or an ember optimizer config such as AdamConfig()."
    )
