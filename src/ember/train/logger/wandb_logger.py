"""A metric logger writing to a Weights & Biases run (needs the optional `wandb` package)."""

from __future__ import annotations

import json
import logging
import netrc
import os
import secrets
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence
from urllib.parse import urlparse

from ember.durable import atomic_write_bytes
from ember.errors import EmberError
from ember.train.files.artifacts import Artifacts
from ember.train.logger._steps import GlobalSteps, ProcessMerge
from ember.train.logger.base import MetricRecord, RunStart

log = logging.getLogger(__name__)

STATE_FORMAT = "ember-wandb-run"
EPOCH_STEP = "epoch"
"""The W&B step metric of epoch values."""


def step_metric(split: str) -> str:
    """The W&B step metric of a split's iteration values (`train/step`)."""
    return f"{split}/step"


class WandbMetricLogger:
    """Logs metrics to one W&B run, its hyperparameters as the run's config.

    Iteration values go to `"{split}/{name}"` against the step metric `"{split}/step"`:
    the number of iterations of that split so far, across epochs, as TensorBoard and
    MLflow count them. Epoch values go to `"{split}/epoch/{name}"` against the step
    metric `"epoch"`. When the run ends, the run's summary holds each split's final
    epoch values. The hyperparameters given to `LearnerBuilder.hparams` (and `config`,
    which they extend) are the run's config.

    The W&B run is started when training starts. `mode=None` chooses "online" when an
    API key is set (`WANDB_API_KEY`, or `wandb login`) and "offline" otherwise
    (`WANDB_MODE` wins when set); an offline run is uploaded later with `wandb sync`.
    W&B keeps its files under `dir`, by default the artifact directory (`wandb/`).

    The run's id is kept in the artifact directory (`wandb-run.json`, with the
    number of iterations of each finished epoch and the last step sent): a run
    resumed from a checkpoint continues the same W&B run (`resume="allow"`), its steps
    after the earlier ones. W&B cannot remove a logged value, so values at steps the
    W&B run already holds are not sent again (an exact resume computes the same ones).

    W&B never stops training: if it cannot start (no network: `init_timeout`
    seconds at most) or any of its calls fails, a warning names the error and the run
    goes on without W&B.
    """

    def __init__(
        self,
        project: str | None = None,
        *,
        entity: str | None = None,
        name: str | None = None,
        group: str | None = None,
        tags: Sequence[str] | None = None,
        config: Mapping[str, Any] | None = None,
        mode: str | None = None,
        dir: str | os.PathLike[str] | None = None,
        init_timeout: float = 30.0,
    ) -> None:
        if mode not in (None, "online", "offline", "disabled"):
            raise EmberError(
                f"WandbMetricLogger(mode=...) takes 'online', 'offline', 'disabled' or None "
                f"(offline unless an API key is set), got {mode!r}."
            )
        self._wandb = _import_wandb()
        self.project = project
        self.entity = entity
        self.name = name
        self.group = group
        self.tags = list(tags) if tags is not None else None
        self.config = dict(config) if config is not None else {}
        self.mode = mode
        self.dir = Path(dir) if dir is not None else None
        self.init_timeout = init_timeout
        self.run: Any = None
        """The `wandb` run while training, None before (or after it failed)."""
        self.run_id: str | None = None
        self._state_path: Path | None = None
        self._steps = GlobalSteps()
        self._merge = ProcessMerge()
        self._sent: dict[str, int] = {}  # split -> last iteration step sent
        self._sent_epochs: dict[str, int] = {}  # split -> last epoch value sent
        self._final: dict[str, dict[str, float]] = {}
        self._defined: set[str] = set()
        self._started: RunStart | None = None
        self._failed = False

    # Starting ---------------------------------------------------------------------------
    def chosen_mode(self) -> str:
        """The mode the run starts in: as given, else `WANDB_MODE`, else online when an
        API key is set and offline when not."""
        if self.mode is not None:
            return self.mode
        environment = os.environ.get("WANDB_MODE")
        if environment:
            return environment
        return "online" if _api_key_set() else "offline"

    def start_run(self, run: RunStart) -> None:
        """Start (or, for a resumed ember run, continue) the W&B run."""
        if run == self._started and self.run is not None:
            return
        self.close()
        self._started, self._failed = run, False
        self._merge = ProcessMerge(run.processes)
        directory = self.dir
        if run.artifact_dir is not None:
            artifacts = Artifacts(run.artifact_dir)
            self._state_path = artifacts.wandb_run
            directory = directory or artifacts.wandb_dir
        state = self._read_state() if run.resumed else None
        if state is not None:
            self.run_id = state["run_id"]
            self._steps = GlobalSteps.from_text(json.dumps(state["steps"]))
            self._sent = {k: int(v) for k, v in state.get("sent", {}).items()}
            self._sent_epochs = {k: int(v) for k, v in state.get("sent_epochs", {}).items()}
            self._steps.resume(run)
        else:
            if run.resumed and self._state_path is not None:
                log.warning(
                    "%s is missing: the resumed training logs to a new W&B run.", self._state_path
                )
            self.run_id = secrets.token_hex(4)
            self._steps, self._sent, self._sent_epochs = GlobalSteps(), {}, {}
        self._final, self._defined = {}, set()
        config = {**self.config, **(run.hparams or {})}
        wandb = self._wandb
        if directory is not None:
            Path(directory).mkdir(parents=True, exist_ok=True)
        started = self._call(
            "starting the run",
            wandb.init,
            project=self.project,
            entity=self.entity,
            name=self.name,
            group=self.group,
            tags=self.tags,
            config=config or None,
            id=self.run_id,
            resume="allow",
            dir=str(directory) if directory is not None else None,
            mode=self.chosen_mode(),
            reinit="create_new",
            settings=wandb.Settings(init_timeout=self.init_timeout, console="off"),
        )
        self.run = None if started is _FAILED else started
        self._save_state()

    # Logging ----------------------------------------------------------------------------
    def log(self, split: str, epoch: int, records: Sequence[MetricRecord]) -> None:
        """One W&B row per iteration (its values and `split/step`), in order."""
        rows: dict[int, dict[str, Any]] = {}
        for record_epoch, record in self._merge.add(split, epoch, records):
            self._add(rows, split, record_epoch, record)
        self._send_rows(split, rows)

    def _add(
        self, rows: dict[int, dict[str, Any]], split: str, epoch: int, record: MetricRecord
    ) -> None:
        step = self._steps.step(split, epoch, record.iteration)
        if step <= self._sent.get(split, 0):
            return  # held by the W&B run from before the resume
        row = rows.setdefault(step, {step_metric(split): step})
        row[f"{split}/{record.name}"] = float(record.value)

    def _send_rows(self, split: str, rows: dict[int, dict[str, Any]]) -> None:
        if not rows or self.run is None:
            return
        self._define(split, [key for row in rows.values() for key in row])
        for step in sorted(rows):
            if self._call("logging values", self.run.log, rows[step]) is _FAILED:
                return
            self._sent[split] = step

    def _define(self, split: str, keys: Sequence[str]) -> None:
        """Tie each new key to its step metric (`split/step`, or `epoch`)."""
        for key in keys:
            if key in self._defined:
                continue
            self._defined.add(key)
            if key in (step_metric(split), EPOCH_STEP):
                target = None
            elif key.startswith(f"{split}/epoch/"):
                target = EPOCH_STEP
            else:
                target = step_metric(split)
            self._call("defining a metric", self.run.define_metric, key, step_metric=target)

    def end_epoch(self, split: str, epoch: int, aggregates: dict[str, float]) -> None:
        """The epoch values, against `epoch`; then the state is saved."""
        rows: dict[int, dict[str, Any]] = {}
        for record_split, record_epoch, record in self._merge.release(split):
            self._add(rows, record_split, record_epoch, record)
        self._send_rows(split, rows)
        self._steps.end_epoch(split, epoch)
        values = {f"{split}/epoch/{name}": float(value) for name, value in aggregates.items()}
        self._final[split] = values
        if self.run is not None and values and epoch > self._sent_epochs.get(split, 0):
            row = {**values, EPOCH_STEP: epoch}
            self._define(split, list(row))
            if self._call("logging epoch values", self.run.log, row) is not _FAILED:
                self._sent_epochs[split] = epoch
        self._save_state()

    def close(self) -> None:
        """Send what waits, write the final epoch values to the run's summary and finish
        the W&B run (later calls do nothing)."""
        for split, epoch, record in self._merge.release():
            rows: dict[int, dict[str, Any]] = {}
            self._add(rows, split, epoch, record)
            self._send_rows(split, rows)
        run, self.run = self.run, None
        self._started = None
        if run is None:
            return
        final = {key: value for values in self._final.values() for key, value in values.items()}
        if final:
            self._call("writing the summary", run.summary.update, final)
        self._call("finishing the run", run.finish)
        self._save_state()

    # Helpers ----------------------------------------------------------------------------
    def _call(self, what: str, action: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run a W&B call; a failure is a warning, and W&B is left for the rest of the run
        (a run that failed is not finished: W&B's exit hook does that)."""
        if self._failed:
            return _FAILED
        try:
            return action(*args, **kwargs)
        except Exception as error:
            self._failed = True
            self.run = None
            log.warning(
                "W&B failed while %s (%s: %s); training goes on without W&B.",
                what,
                type(error).__name__,
                error,
            )
            return _FAILED

    def _read_state(self) -> dict[str, Any] | None:
        path = self._state_path
        if path is None or not path.exists():
            return None
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            if data.get("format") != STATE_FORMAT or not isinstance(data.get("run_id"), str):
                raise ValueError("not an ember W&B run record")
            return data
        except (OSError, ValueError, AttributeError) as error:
            log.warning("%s cannot be read (%s): a new W&B run is started.", path, error)
            return None

    def _save_state(self) -> None:
        if self._state_path is None or self.run_id is None:
            return

        data = {
            "format": STATE_FORMAT,
            "run_id": self.run_id,
            "project": self.project,
            "steps": json.loads(self._steps.to_text()),
            "sent": self._sent,
            "sent_epochs": self._sent_epochs,
        }
        self._state_path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(self._state_path, (json.dumps(data, indent=1) + "\n").encode("utf-8"))


class _Failed:
    def __repr__(self) -> str:
        return "<W&B call failed>"


_FAILED = _Failed()


def _api_key_set() -> bool:
    """Whether W&B has an API key: `WANDB_API_KEY`, or a `wandb login` entry in
    `~/.netrc` for its host (read locally: nothing is asked of the network)."""
    if os.environ.get("WANDB_API_KEY"):
        return True
    host = urlparse(os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")).hostname
    path = os.environ.get("NETRC", os.path.join(os.path.expanduser("~"), ".netrc"))
    try:
        return bool(host and netrc.netrc(path).authenticators(host))
    except (OSError, netrc.NetrcParseError):
        return False


def _import_wandb() -> Any:
    try:
        import wandb
    except ImportError as error:
        raise EmberError(
            "WandbMetricLogger needs the wandb package, which cannot be imported "
            f"({error}). Install it with `pip install wandb` (or `pip install ember[wandb]`)."
        ) from error
    return wandb
