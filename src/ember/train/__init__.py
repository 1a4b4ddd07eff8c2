"""Training: the LearnerBuilder, the Learner, step protocols and outputs."""

from ember.train.adapters import ForwardOutput, LossFromModel
from ember.train.build.builder import LearnerBuilder
from ember.train.checkpoint import (
    ComposedCheckpointingStrategy,
    KeepLastNCheckpoints,
    MetricCheckpointingStrategy,
    load_checkpoint,
)
from ember.train.early_stopping import MetricEarlyStoppingStrategy
from ember.train.evaluator import EvaluationInterrupted, Evaluator, EvaluatorBuilder
from ember.train.events import (
    End,
    EndEpoch,
    Listener,
    ProcessedItem,
    Start,
    StartEpoch,
    StartSplit,
    ValidPoint,
)
from ember.train.learner import Learner
from ember.train.length.duration import Duration
from ember.train.length.interrupter import Interrupter
from ember.train.lr_finder import LrFinderResult, lr_find
from ember.train.output import (
    ClassificationOutput,
    ImageOutput,
    MultiLabelClassificationOutput,
    RegressionOutput,
    SequenceOutput,
    TextOutput,
)
from ember.train.run_evaluation import evaluate_run
from ember.train.smoke import SmokeReport, SmokeTestError
from ember.train.step import TrainOutput, TrainStep, ValidStep

__all__ = [
    "ClassificationOutput",
    "ComposedCheckpointingStrategy",
    "Duration",
    "End",
    "EndEpoch",
    "EvaluationInterrupted",
    "Evaluator",
    "EvaluatorBuilder",
    "ForwardOutput",
    "ImageOutput",
    "Interrupter",
    "KeepLastNCheckpoints",
    "Learner",
    "LearnerBuilder",
    "Listener",
    "LossFromModel",
    "LrFinderResult",
    "MetricCheckpointingStrategy",
    "MetricEarlyStoppingStrategy",
    "MultiLabelClassificationOutput",
    "ProcessedItem",
    "RegressionOutput",
    "SequenceOutput",
    "SmokeReport",
    "SmokeTestError",
    "Start",
    "StartEpoch",
    "StartSplit",
    "TextOutput",
    "TrainOutput",
    "TrainStep",
    "ValidPoint",
    "ValidStep",
    "evaluate_run",
    "load_checkpoint",
    "lr_find",
]
