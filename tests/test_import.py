"""`import ember` stays light: optional integrations load only when used."""

from __future__ import annotations

from ember_testing import fresh

HEAVY = [
    "tensorboard",
    "mlflow",
    "matplotlib",
    "torchmetrics",
    "sklearn",
    "safetensors",
    "plotext",
    "IPython",
    "wandb",
    "optuna",
    "psutil",
    "skimage",
    "sacrebleu",
    "rouge_score",
    "nltk",
]


def test_import_ember_loads_no_optional_integration():
    code = (
        "import sys, json, ember, ember.train, ember.train.metric, ember.data, ember.record,"
        " ember.optim, ember.lr;"
        f"print(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))"
    )
    assert fresh(code) == []


def test_import_ember_costs_nothing_until_a_name_is_used():
    code = (
        "import sys, json, ember, ember.train;"
        "light = [m for m in ('pydantic', 'rich', 'msgpack') if m in sys.modules];"
        "ember.Config; print(json.dumps([light, 'pydantic' in sys.modules]))"
    )
    assert fresh(code) == [[], True]


def test_the_renderers_load_ipython_only_to_display():
    code = (
        "import sys, json; from ember.train.renderer import NotebookRenderer, default_renderer;"
        "default_renderer(); NotebookRenderer();"
        "print(json.dumps('IPython' in sys.modules))"
    )
    assert fresh(code) is False
