"""A metric logger writing to an MLflow run (needs the optional `mlflow` package)."""

from __future__ import annotations

import logging
import re
import time
from typing import Any, Mapping, Sequence

from pydantic import BaseModel

from ember.config import Config
from ember.errors import EmberError
from ember.train.logger._steps import GlobalSteps
from ember.train.logger.base import MetricRecord

log = logging.getLogger(__name__)

MAX_KEY_LENGTH = 250
METRICS_PER_BATCH = 1000
PARAMS_PER_BATCH = 100
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
    are skipped and a changed value is an error. `close()` ends the run as FINISHED, once.
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

    def log(self, split: str, epoch: int, records: Sequence[MetricRecord]) -> None:
        """Buffer the records at their global steps; send when `interval` has passed."""
        self._check_open()
        now = int(time.time() * 1000)
        metric = self._metric
        self._pending.extend(
            metric(
                self._key(split, record.name, False),
                float(record.value),
                now,
                self._steps.step(split, epoch, record.iteration),
            )
            for record in records
        )
        due = time.monotonic() - self._sent_at >= self.interval
        if due or len(self._pending) >= METRICS_PER_BATCH:
            self.flush()

    def end_epoch(self, split: str, epoch: int, aggregates: dict[str, float]) -> None:
        """Add the epoch aggregates at step = epoch and send everything buffered."""
        self._check_open()
        self._steps.end_epoch(split, epoch)
        now = int(time.time() * 1000)
        self._pending.extend(
            self._metric(self._key(split, name, True), float(value), now, epoch)
            for name, value in aggregates.items()
        )
        self.flush()

    def close(self) -> None:
        """Send what is buffered and end the run with status FINISHED (once)."""
        if self._closed:
            return
        self._closed = True
        try:
            self.flush()
        finally:
            self.client.set_terminated(self.run_id, status="FINISHED")


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
