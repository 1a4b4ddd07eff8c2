"""A metric logger writing to an MLflow run (needs the optional `mlflow` package)."""

from __future__ import annotations

import logging
import math
import re
import time
from typing import Any, Mapping, Sequence

from pydantic import BaseModel

from ember.config import Config
from ember.errors import EmberError
from ember.train.logger._steps import GlobalSteps, ProcessMerge
from ember.train.logger.base import MetricRecord, RunStart

log = logging.getLogger(__name__)

MAX_KEY_LENGTH = 250
METRICS_PER_BATCH = 1000
PARAMS_PER_BATCH = 100
MAX_TAG_LENGTH = 5000
STEPS_TAG = "ember.steps"
_REFUSED = re.compile(r"[^A-Za-z0-9_\-. /]")


def mlflow_key(text: str) -> str:
    """`text` as a metric or param key every MLflow store accepts: characters other than
    ASCII letters, digits, `_ - . /` and space become `_`; empty, `.` and `..` path
    segments go (so the key never reads as another path); at most 250 characters."""
    cleaned = _REFUSED.sub("_", text)[:MAX_KEY_LENGTH]
    segments = ["_" if part in (".", "..") else part for part in cleaned.split("/") if part]
    return "/".join(segments) or "_"


def flatten_params(params: Config | Mapping[str, Any]) -> dict[str, str]:
    """Params as MLflow stores them: nested configs and dicts become dotted keys
    (`model.hidden_size`), values become text (`str`), keys go through `mlflow_key`."""
    if isinstance(params, BaseModel):
        data: Any = params.model_dump(mode="json")
    elif isinstance(params, Mapping):
        data = params
    else:
        raise EmberError(
            f"MLflow params must be an ember Config or a dict, not {type(params).__name__}."
        )
    flat: dict[str, str] = {}
    _flatten(data, "", flat)
    return {mlflow_key(key): value for key, value in flat.items()}


def _flatten(data: Mapping[str, Any], prefix: str, into: dict[str, str]) -> None:
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, BaseModel):
            value = value.model_dump(mode="json")
        if isinstance(value, Mapping) and value:
            _flatten(value, f"{name}.", into)
        else:
            into[name] = str(value)


class MlflowMetricLogger:
    """Logs metrics (and params) to one MLflow run through `mlflow.MlflowClient`.

    With `run_id` it attaches to that run (marking it RUNNING again if it had ended);
    otherwise it creates a run named `run_name` in `experiment_name` (created if
    missing). `tracking_uri=None` lets MLflow decide (`MLFLOW_TRACKING_URI`, else its
    default local store). For a local store with no server use `sqlite:///path/mlflow.db`;
    recent MLflow 3 releases refuse `file:` stores unless `MLFLOW_ALLOW_FILE_STORE=true`.
    No global MLflow state (active run, tracking URI) is read or changed.

    Iteration values go to `"{split}/{name}"` at the global step: the number of
    iterations this logger has seen in that split so far, across epochs. Epoch
    aggregates go to `"{split}/epoch/{name}"` at step = epoch. Iteration values are
    buffered and sent once `interval` seconds have passed, so a remote server is not
    called at every render tick; all that is buffered goes out at each epoch end and on
    `close()`. Keys pass through `mlflow_key`: `"valid/Accuracy (top-1)"` is stored as
    `"valid/Accuracy _top-1_"`. Params (an ember `Config` or a dict) are flattened by
    `flatten_params`; when attaching, params the run already holds with the same value
    are skipped and a changed value is an error. The run's hyperparameters
    (`LearnerBuilder.hparams`) are logged as params too when training starts.
    `close()` ends the run as FINISHED, once.

    The run's tag `ember.steps` holds the number of iterations of each finished epoch
    per split, so that a resumed run attached with `run_id` (`start_run`) places its
    steps after the earlier ones. MLflow cannot remove a logged value, so a resumed
    run does not send again a value the run already holds at the same step (an exact
    resume computes the same one). A value that differs from the one held is sent and
    named in a warning (the run then holds both), and values held after the point the
    resumed run ended are named in a warning at `close()`.

    Under several processes, each iteration's values from every process become one
    value at the iteration's step: their weighted mean. The other processes' values
    reach this logger when the processes exchange them (at each split's epoch end and
    when a run stops), so an epoch's iteration values are sent then.
    """

    def __init__(
        self,
        tracking_uri: str | None = None,
        experiment_name: str = "ember",
        run_name: str | None = None,
        params: Config | Mapping[str, Any] | None = None,
        run_id: str | None = None,
        interval: float = 2.0,
    ) -> None:
        mlflow = _import_mlflow()
        self._metric = mlflow.entities.Metric
        self._param = mlflow.entities.Param
        self.client: Any = mlflow.MlflowClient(tracking_uri=tracking_uri)
        if run_id is not None:
            run = self._get_run(run_id)
            if run.info.status != "RUNNING":
                self.client.update_run(run_id, status="RUNNING")
            existing = dict(run.data.params)
        else:
            experiment_id = self._experiment_id(experiment_name)
            run = self.client.create_run(experiment_id, run_name=run_name)
            existing = {}
        self.run_id: str = run.info.run_id
        self.experiment_id: str = run.info.experiment_id
        self._steps = GlobalSteps()
        self._merge = ProcessMerge()
        self._run: RunStart | None = None
        self._held: dict[str, dict[int, list[float]]] = {}  # key -> step -> values, on resume
        self._differ: set[str] = set()
        self._tagged: str | None = None
        self._keys: dict[tuple[str, str, bool], str] = {}
        self._owners: dict[str, tuple[str, str]] = {}
        self._closed = False
        self.interval = interval
        self._pending: list[Any] = []
        self._sent_at = time.monotonic()
        if params is not None:
            self._log_params(flatten_params(params), existing)

    def _get_run(self, run_id: str) -> Any:
        from mlflow.exceptions import MlflowException

        try:
            return self.client.get_run(run_id)
        except MlflowException as error:
            raise EmberError(
                f"Cannot attach to MLflow run {run_id!r} at {self.client.tracking_uri}: {error}"
            ) from error

    def _experiment_id(self, name: str) -> str:
        from mlflow.exceptions import MlflowException

        experiment = self.client.get_experiment_by_name(name)
        if experiment is None:
            try:
                return self.client.create_experiment(name)
            except MlflowException as error:
                if error.error_code != "RESOURCE_ALREADY_EXISTS":
                    raise
                experiment = self.client.get_experiment_by_name(name)  # created meanwhile
        if experiment.lifecycle_stage == "deleted":
            raise EmberError(
                f"MLflow experiment {name!r} is deleted: restore it or choose another name."
            )
        return experiment.experiment_id

    def _log_params(self, params: dict[str, str], existing: dict[str, str]) -> None:
        changed = sorted(k for k, v in params.items() if k in existing and existing[k] != v)
        if changed:
            listing = ", ".join(f"{k}: {existing[k]!r} -> {params[k]!r}" for k in changed)
            raise EmberError(
                f"MLflow run {self.run_id} already has other values for params: {listing}. "
                "Params cannot change; start a new run instead."
            )
        new = [self._param(k, v) for k, v in params.items() if k not in existing]
        for start in range(0, len(new), PARAMS_PER_BATCH):
            self.client.log_batch(self.run_id, params=new[start : start + PARAMS_PER_BATCH])

    def _log_hparams(self, params: dict[str, str]) -> None:
        """The run's hyperparameters (`LearnerBuilder.hparams`) as params: those the
        MLflow run lacks are logged; one it holds with another value cannot change,
        which a warning names."""
        existing = dict(self.client.get_run(self.run_id).data.params)
        changed = sorted(k for k, v in params.items() if k in existing and existing[k] != v)
        if changed:
            log.warning(
                "MLflow run %s keeps its earlier values of params %s (MLflow params cannot "
                "change); hparams.json in the artifact directory holds this run's.",
                self.run_id,
                ", ".join(changed),
            )
        self._log_params({k: v for k, v in params.items() if k not in changed}, existing)

    def _key(self, split: str, name: str, epoch_level: bool) -> str:
        cache = (split, name, epoch_level)
        key = self._keys.get(cache)
        if key is None:
            key = mlflow_key(f"{split}/epoch/{name}" if epoch_level else f"{split}/{name}")
            owner = self._owners.setdefault(key, (split, name))
            if owner != (split, name):
                log.warning(
                    "MLflow key %r is used by metrics %r and %r of %s: their values mix.",
                    key,
                    owner[1],
                    name,
                    split,
                )
            self._keys[cache] = key
        return key

    def _check_open(self) -> None:
        if self._closed:
            raise EmberError(f"MlflowMetricLogger: run {self.run_id} was ended by close().")

    def flush(self) -> None:
        """Send the buffered metrics now, in `log_batch` calls of at most 1000."""
        pending, self._pending = self._pending, []
        self._sent_at = time.monotonic()
        for start in range(0, len(pending), METRICS_PER_BATCH):
            self.client.log_batch(self.run_id, metrics=pending[start : start + METRICS_PER_BATCH])

    def start_run(self, run: RunStart) -> None:
        """Before training: a resumed run continues the steps after the ones it keeps
        and learns which values the MLflow run already holds after that point."""
        self._check_open()
        if run == self._run:
            return  # told twice before logging anything
        self._run = run
        self._merge = ProcessMerge(run.processes)
        if run.hparams is not None:
            self._log_hparams(flatten_params(run.hparams))
        if not run.resumed:
            return
        data = self.client.get_run(self.run_id).data
        ours = {key: where for key in data.metrics if (where := _split_of(key)) is not None}
        text = data.tags.get(STEPS_TAG)
        if text:
            try:
                self._steps = GlobalSteps.from_text(text)
            except ValueError as error:
                raise EmberError(
                    f"MLflow run {self.run_id}: the tag {STEPS_TAG} cannot be read ({error}), "
                    "so the resumed run cannot place its steps after the earlier ones."
                ) from None
        elif ours:
            log.warning(
                "MLflow run %s holds metrics but no %s tag: the resumed run's steps start again "
                "at 1 and values of the resumed epochs may be held twice.",
                self.run_id,
                STEPS_TAG,
            )
            return
        self._steps.resume(run)
        self._held = {}
        for key, (split, epoch_level) in ours.items():
            last = run.epoch - 1 if epoch_level else self._steps.last(split)
            later: dict[int, list[float]] = {}
            for metric in self.client.get_metric_history(self.run_id, key):
                if metric.step > last:
                    later.setdefault(metric.step, []).append(metric.value)
            if later:
                self._held[key] = later
        self._save_steps()

    def log(self, split: str, epoch: int, records: Sequence[MetricRecord]) -> None:
        """Buffer the records (one per iteration under several processes) at their
        global steps; send when `interval` has passed."""
        self._check_open()
        now = int(time.time() * 1000)
        for record_epoch, record in self._merge.add(split, epoch, records):
            self._add(split, record_epoch, record, now)
        due = time.monotonic() - self._sent_at >= self.interval
        if due or len(self._pending) >= METRICS_PER_BATCH:
            self.flush()

    def _add(self, split: str, epoch: int, record: MetricRecord, now: int) -> None:
        step = self._steps.step(split, epoch, record.iteration)
        self._queue(self._key(split, record.name, False), float(record.value), now, step)

    def _queue(self, key: str, value: float, now: int, step: int) -> None:
        held = self._held.get(key)
        if held is not None and step in held:
            values = held.pop(step)
            if not held:
                del self._held[key]
            if any(v == value or (math.isnan(v) and math.isnan(value)) for v in values):
                return  # the run holds it already
            if key not in self._differ:
                self._differ.add(key)
                log.warning(
                    "MLflow run %s held %s = %r at step %d from before the resume; the resumed "
                    "run gives %r, which is sent too (MLflow cannot replace a logged value).",
                    self.run_id,
                    key,
                    values[0],
                    step,
                    value,
                )
        self._pending.append(self._metric(key, value, now, step))

    def end_epoch(self, split: str, epoch: int, aggregates: dict[str, float]) -> None:
        """Add the epoch aggregates at step = epoch and send everything buffered."""
        self._check_open()
        now = int(time.time() * 1000)
        for record_split, record_epoch, record in self._merge.release(split):
            self._add(record_split, record_epoch, record, now)
        self._steps.end_epoch(split, epoch)
        for name, value in aggregates.items():
            self._queue(self._key(split, name, True), float(value), now, epoch)
        self.flush()
        self._save_steps()

    def close(self) -> None:
        """Send what is buffered and end the run with status FINISHED (once)."""
        if self._closed:
            return
        self._closed = True
        try:
            now = int(time.time() * 1000)
            for split, epoch, record in self._merge.release():
                self._add(split, epoch, record, now)
            self.flush()
            self._save_steps()
            if self._held:
                later = ", ".join(
                    f"{key} at step {min(steps)}" + (f"..{max(steps)}" if len(steps) > 1 else "")
                    for key, steps in sorted(self._held.items())
                )
                log.warning(
                    "MLflow run %s still holds values logged before the resume after the point "
                    "where this run ended (%s); MLflow cannot remove logged values.",
                    self.run_id,
                    later,
                )
        finally:
            self.client.set_terminated(self.run_id, status="FINISHED")

    def _save_steps(self) -> None:
        """Keep the finished epochs' lengths in the run's `ember.steps` tag."""
        text = self._steps.to_text()
        if text == self._tagged:
            return
        self._tagged = text
        if len(text) > MAX_TAG_LENGTH:
            log.warning(
                "MLflow run %s: the epoch lengths no longer fit in the tag %s (%d characters); "
                "a run resumed from a later epoch cannot place its steps.",
                self.run_id,
                STEPS_TAG,
                len(text),
            )
            return
        self.client.set_tag(self.run_id, STEPS_TAG, text)


def _split_of(key: str) -> tuple[str, bool] | None:
    """(split, is an epoch value) of a key this logger writes; None for another key."""
    split, _, rest = key.partition("/")
    if split not in ("train", "valid") or not rest:
        return None
    return split, rest.startswith("epoch/")


def _import_mlflow() -> Any:
    try:
        import mlflow
        import mlflow.entities
    except ImportError as error:
        raise EmberError(
            "MlflowMetricLogger needs the mlflow package, which cannot be imported "
            f"({error}). Install it with `pip install mlflow` (or `pip install ember[mlflow]`)."
        ) from error
    return mlflow
