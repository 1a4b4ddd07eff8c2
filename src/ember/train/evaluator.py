"""Evaluating and predicting with a model: `EvaluatorBuilder`, `Evaluator`.

`Evaluator.eval(name, loader)` runs the model's `test_step` (or `valid_step`) over a
whole data set with the metrics, the renderer and the per-batch metric files of a
training run, and returns each metric's value over the whole set. `predict(loader)`
runs the model over a data set and returns its outputs, concatenated.

```
ARTIFACT_DIR/
├── evaluation.log              Python logging of the evaluations
└── test/<name>/
    ├── <Metric>.log            one "value,weight,check" line per batch
    ├── <Metric>.json           the count matrix of a matrix metric (confusion matrix)
    └── values.json             {"name", "values", "items", "batches"}
```

An evaluation writes into `test/.<name>.partial/` and replaces `test/<name>/` only
once it completes, so an interrupted evaluation leaves nothing behind and an earlier
evaluation of the same name stays as it was.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
from pathlib import Path
from typing import Any, Callable, ContextManager, Iterable, Sequence

import torch

from ember.errors import ConfigError, TrainingError
from ember.train.distributed import Distributed
from ember.train.files.artifacts import Artifacts
from ember.train.files.metric_files import (
    add_lines,
    format_value,
    matrix_file_name,
    metric_file_name,
    write_matrix,
)
from ember.train.fit.evaluation import evaluating, run_pass
from ember.train.length.batches import BatchPlanner
from ember.train.length.interrupter import Interrupter
from ember.train.length.signals import signal_handlers
from ember.train.logger.application import FileApplicationLogger
from ember.train.logger.base import MetricRecord
from ember.train.metric.base import Metric, RegisteredMetric
from ember.train.options import LearnerOptions
from ember.train.parallel.dealt import RankShare
from ember.train.plugins import check_plugin
from ember.train.prediction import concat_outputs, predict
from ember.train.processor import MetricsProcessor
from ember.train.renderer.base import Renderer, RunInfo
from ember.train.structure import check_train_methods

__all__ = ["EvaluationInterrupted", "Evaluator", "EvaluatorBuilder", "concat_outputs"]

log = logging.getLogger(__name__)
SPLIT = "test"
_NOTHING = contextlib.nullcontext()


class EvaluationInterrupted(TrainingError):
    """An evaluation stopped by Ctrl-C, SIGTERM or `Interrupter.stop`: its partial
    values were discarded (an earlier evaluation of the same name is kept)."""


class EvaluatorBuilder:
    """Options of an evaluator, as chained calls; `build(model)`.

    Everything it writes goes under `artifact_dir` (it may be a training run's
    directory: evaluations go to `test/` and `evaluation.log`, beside the run's files).
    """

    def __init__(self, artifact_dir: str | os.PathLike[str]) -> None:
        self._artifact_dir = Path(artifact_dir)
        self._metrics: list[RegisteredMetric] = []
        self._renderer: Renderer | None = None
        self._summary = False
        self._device: torch.device | None = None
        self._interrupter = Interrupter()

    def _add_metric(self, metric: Any, numeric: bool) -> EvaluatorBuilder:
        check_plugin(metric, Metric, "a metric")
        name = str(metric.name)
        if any(existing.name == name for existing in self._metrics):
            raise ConfigError(f"The metric {name!r} is registered twice: register each once.")
        self._metrics.append(RegisteredMetric(metric, numeric))
        return self

    def metric(self, metric: Any) -> EvaluatorBuilder:
        """A metric, shown as text and logged."""
        return self._add_metric(metric, numeric=False)

    def metric_numeric(self, metric: Any) -> EvaluatorBuilder:
        """A metric, shown, logged and plotted."""
        return self._add_metric(metric, numeric=True)

    def renderer(self, renderer: Any) -> EvaluatorBuilder:
        """How progress is shown (default: `PlainRenderer()`, plain text lines: one pass
        over a data set needs no live dashboard)."""
        check_plugin(renderer, Renderer, "a renderer")
        self._renderer = renderer
        return self

    def summary(self) -> EvaluatorBuilder:
        """Print (and log) a table of the values at the end of each evaluation."""
        self._summary = True
        return self

    def devices(self, devices: Sequence[str | torch.device]) -> EvaluatorBuilder:
        """The device to evaluate on, e.g. `["cpu"]` or `["cuda:0"]` (default: the
        device of the model's parameters). An evaluation runs on one device."""
        if isinstance(devices, (str, torch.device)):
            devices = [devices]
        if len(devices) != 1:
            raise ConfigError(
                f"devices() of an evaluator takes one device (an evaluation runs on one "
                f"process), got {len(devices)}."
            )
        try:
            device = torch.device(devices[0])
        except (RuntimeError, TypeError) as error:
            raise ConfigError(f"devices(): {error}") from None
        if device.type == "cuda" and not torch.cuda.is_available():
            raise ConfigError(f"devices(): {device} is not available: torch sees no CUDA device.")
        self._device = device
        return self

    def interrupter(self) -> Interrupter:
        """The handle that stops an evaluation from code (`stop(message)`)."""
        return self._interrupter

    def build(self, model: torch.nn.Module) -> Evaluator:
        """The evaluator of `model` (moved to the device)."""
        from ember.train.renderer.plain import PlainRenderer

        if not isinstance(model, torch.nn.Module):
            raise ConfigError(f"build() needs a torch.nn.Module, got {type(model).__name__}.")
        check_train_methods(model)  # the model.eval() call runs train(False) on every submodule
        device = self._device if self._device is not None else _model_device(model)
        model.to(device)
        return Evaluator(
            model,
            device,
            self._artifact_dir,
            tuple(self._metrics),
            self._renderer if self._renderer is not None else PlainRenderer(),
            summary=self._summary,
            interrupter=self._interrupter,
        )


class Evaluator:
    """Evaluates (`eval`) and runs (`predict`) one model on one device."""

    def __init__(
        self,
        model: torch.nn.Module,
        device: torch.device,
        artifact_dir: str | os.PathLike[str],
        metrics: Sequence[RegisteredMetric],
        renderer: Renderer,
        *,
        summary: bool = False,
        interrupter: Interrupter | None = None,
        autocast: Callable[[], ContextManager[Any]] | None = None,
        dist: Distributed | None = None,
    ) -> None:
        self.model = model
        self.device = torch.device(device)
        self.artifact_dir = Path(artifact_dir)
        self.artifacts = Artifacts(artifact_dir)
        self.metrics = tuple(metrics)
        self.renderer = renderer
        self.summary = summary
        self.interrupter = interrupter if interrupter is not None else Interrupter()
        self._autocast = autocast if autocast is not None else contextlib.nullcontext
        self.dist = dist
        """The processes an FSDP fit sharded the model over: each runs its batches."""

    # Evaluation ------------------------------------------------------------------
    def eval(self, name: str, loader: Iterable[Any]) -> dict[str, float]:
        """Evaluate the model on every batch of `loader`; return `{metric: value}`
        over the whole set (each metric's epoch value), also saved in
        `test/<name>/values.json`. An evaluation of the same name is replaced."""
        step, step_name = self._step()
        if self.dist is None:
            _check_one_process("eval")
        elif not self.dist.main:  # its share of the batches; rank 0 writes the files
            processor = MetricsProcessor({SPLIT: self.metrics}, {}, None, 1, gathers=True)
            values = self._run(processor, step, step_name, loader)[0]
            assert values is not None  # (no stop is asked for under several processes)
            return values
        artifacts = self.artifacts
        final = artifacts.evaluation_dir(name)
        partial = artifacts.evaluation_partial(name)
        artifacts.check_writable()
        app_log = FileApplicationLogger(artifacts.evaluation_log)
        app_log.install()
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
        logger = _EvaluationLogger(partial)
        processor = MetricsProcessor(
            {SPLIT: self.metrics},
            {SPLIT: [logger]},
            self.renderer,
            1,
            gathers=self.dist is not None,
        )
        reason = "failed"
        try:
            log.info(
                "Evaluation %r of %s on %s (%s), metrics: %s.",
                name,
                type(self.model).__name__,
                self.device,
                step_name,
                ", ".join(entry.name for entry in self.metrics) or "none",
            )
            self.renderer.start(self._info(name))
            with signal_handlers(self.interrupter) if self.dist is None else _NOTHING:
                values, items, batches, tokens = self._run(processor, step, step_name, loader)
            if values is None:
                reason = f"stopped: {self.interrupter.message or 'stop requested'}"
                log.warning(
                    "Evaluation %r %s after %d batch(es); its partial values were discarded.",
                    name,
                    reason,
                    batches,
                )
                raise EvaluationInterrupted(
                    f"Evaluation {name!r} {reason} after {batches} batch(es); its partial values "
                    "were discarded."
                )
            logger.close()
            for metric, counts in processor.matrices.items():
                write_matrix(partial / matrix_file_name(metric), metric, counts)
            record: dict[str, Any] = {
                "name": name,
                "values": values,
                "items": items,
                "batches": batches,
            }
            if tokens is not None:
                record["tokens"] = tokens
            text = json.dumps(record, indent=2) + "\n"
            (partial / "values.json").write_text(text, encoding="utf-8")
            if final.exists():
                log.info("Evaluation %r replaces the earlier evaluation of that name.", name)
                shutil.rmtree(final)
            partial.rename(final)
            reason = "completed"
            text_values = ", ".join(f"{key} {value!r}" for key, value in values.items())
            over = counted(items, tokens)
            log.info("Evaluation %r (%s): %s", name, over, text_values or "no metrics")
            if self.summary:
                table = summary_table(name, values, items, tokens)
                print(table)
                log.info("%s", table)
            return values
        except BaseException as error:
            if reason == "failed":
                log.error("Evaluation %r failed: %s", name, error)
            raise
        finally:
            self.interrupter.reset()
            logger.close()
            shutil.rmtree(partial, ignore_errors=True)
            try:
                self.renderer.end(reason)
            finally:
                app_log.uninstall()

    def _run(
        self, processor: MetricsProcessor, step: Any, step_name: str, loader: Iterable[Any]
    ) -> tuple[dict[str, float] | None, int, int, int | None]:
        """Every batch: the step in eval mode under inference mode; the whole-set values
        (None when a stop came first), the items and the batches seen, and the tokens
        when every batch told them (its `num_tokens`, else its output's `tokens`); under
        several processes (`dist`), this process's batches and every process's counts."""
        share = RankShare(loader, self.dist, "eval") if self.dist is not None else None
        loader = share.loader if share is not None else loader
        total = len(loader) if hasattr(loader, "__len__") else None  # type: ignore[arg-type]
        processor.start_split(SPLIT, 1, total if share is None else share.longest)
        planner = BatchPlanner(loader, name="evaluation", exact=False)
        batches = planner.single_pass()
        context = torch.inference_mode if share is None else torch.no_grad  # FSDP's buffers
        with evaluating(self.model, context, self._autocast, split=SPLIT):
            seen = run_pass(
                step,
                step_name,
                batches if share is None else share.padded(batches),
                processor,
                SPLIT,
                1,
                self.device,
                check=True,
                stop=self.interrupter.should_stop if share is None else None,
                count=planner.count,
                tokens=True,
            )
        if seen.stopped:
            return None, seen.items, seen.batches, None
        if seen.batches == 0:
            raise TrainingError(
                "The evaluation data loader yielded no batch: check that its dataset is not empty."
            )
        values = processor.end_split(self.dist)
        if share is not None:
            return values, *share.totals(seen.items, seen.batches, processor.tokens())
        return values, seen.items, seen.batches, processor.tokens()

    def _step(self) -> tuple[Any, str]:
        for name in ("test_step", "valid_step"):
            step = getattr(self.model, name, None)
            if callable(step):
                return step, name
        raise TrainingError(
            f"{type(self.model).__name__} has no test_step or valid_step method: an evaluation "
            "runs `test_step(self, batch) -> output` (or else `valid_step`), whose output the "
            "metrics read."
        )

    def _info(self, name: str) -> RunInfo:
        return RunInfo(
            artifact_dir=str(self.artifact_dir),
            start_epoch=1,
            num_epochs=1,
            model_name=type(self.model).__name__,
            num_parameters=sum(p.numel() for p in self.model.parameters()),
            devices=(str(self.device),),
            metrics=tuple((SPLIT, e.name, e.unit, e.numeric) for e in self.metrics),
            interrupter=self.interrupter,
            evaluation=name,
        )

    # Prediction ------------------------------------------------------------------
    def predict(self, loader: Iterable[Any]) -> Any:
        """The model's outputs over every batch of `loader`, on the CPU, concatenated
        along the first dimension (see `concat_outputs`). Each batch goes to the
        model's `predict_step(batch)` when it has one, else to `forward`: the batch
        itself when it is a tensor, otherwise its first tensor (depth first through
        tuples, lists, dicts and dataclasses, e.g. the inputs of `(inputs, targets)`)."""
        if self.dist is not None:  # every process gets every output
            return RankShare(loader, self.dist, "predict").predict(
                self.model, self.device, self._autocast
            )
        _check_one_process("predict")
        return predict(self.model, loader, self.device, self._autocast)


def counted(items: int, tokens: int | None) -> str:
    """What an evaluation went over: "90 items", or "196 items, 3,920 tokens" when its
    batches told their tokens (what a loss that is a mean over tokens is weighted by)."""
    return f"{items:,} items" + (f", {tokens:,} tokens" if tokens is not None else "")


def summary_table(
    name: str, values: dict[str, float], items: int, tokens: int | None = None
) -> str:
    """The table `summary()` prints after an evaluation."""
    rows = [(metric, format_value(value)) for metric, value in values.items()]
    width = max([len("Metric"), *(len(metric) for metric, _ in rows)])
    lines = [f"Evaluation {name!r} ({counted(items, tokens)})", f"{'Metric':<{width}}  Value"]
    lines += [f"{metric:<{width}}  {value}" for metric, value in rows]
    return "\n".join(lines)


def _check_one_process(what: str) -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        raise TrainingError(
            f"{what}() runs on one process, but torch.distributed has {dist.get_world_size()} "
            f"processes. Call {what}() from one process only, outside the process group (e.g. "
            "after fit returns, or in a separate script)."
        )


def _model_device(model: torch.nn.Module) -> torch.device:
    for tensor in model.parameters():
        return tensor.device
    return torch.device("cpu")


class _EvaluationLogger:
    """Writes one evaluation's metric lines: `<directory>/<Metric>.log`."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._files: dict[str, Any] = {}
        self._chains: dict[str, int] = {}  # each file's last check: its next line chains on

    def log(self, split: str, epoch: int, records: Sequence[MetricRecord]) -> None:
        lines = add_lines({}, records, self._chains)
        for name, text in lines.items():
            handle = self._files.get(name)
            if handle is None:
                self.directory.mkdir(parents=True, exist_ok=True)
                path = self.directory / metric_file_name(name)
                handle = open(path, "a", encoding="utf-8")  # noqa: SIM115 - kept open
                self._files[name] = handle
            handle.write("".join(text))
            handle.flush()

    def end_epoch(self, split: str, epoch: int, aggregates: dict[str, float]) -> None:
        self.close()

    def close(self) -> None:
        for handle in self._files.values():
            handle.close()
        self._files.clear()
        self._chains.clear()


def learner_evaluator(options: LearnerOptions, dist: Distributed | None = None) -> Evaluator:
    """An evaluator of a learner's model with its settings (`Learner.evaluate`,
    `Learner.predict`): its device, artifact directory, validation metrics (the
    training ones when it has none), renderer and mixed precision; under FSDP, on the
    processes `dist` of the fit, over which the model stays sharded. It has an
    interrupter of its own: a stop that ended `fit` (and sets `exit_code`) does not
    stop it."""
    if options.fsdp is not None and (dist is None or dist.finished):
        raise TrainingError(
            "Under FSDP, evaluate() and predict() run after fit() has trained the model, on "
            "the processes it trained on, where each holds a shard of it: call them on every "
            "process once fit() returns. Before fit(), or after a fit that failed, load the "
            "weights into a plain model (e.g. ember.train.load_checkpoint(directory, model)) "
            "and use an Evaluator."
        )
    metrics = options.metrics.get("valid") or options.metrics.get("train") or ()
    return Evaluator(
        options.model,
        options.device,
        options.artifact_dir,
        metrics,
        options.renderer,
        summary=options.summary,
        interrupter=Interrupter(),
        autocast=options.optimization.autocast,
        dist=dist if options.fsdp is not None else None,
    )
