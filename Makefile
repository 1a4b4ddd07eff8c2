# Every target installs what it needs into .venv by itself.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
ARGS ?=
PYTEST_ARGS ?=

.PHONY: venv data tmux demo test test-fast test-cuda check docs bench bench-gpu gpu-check clean

$(STAMP): pyproject.toml requirements-dev.txt
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet -r requirements-dev.txt
	$(PY) -m pip install --quiet --no-deps --no-build-isolation -e .
	$(PY) -c "import ember, torch; print('ember', ember.__version__, 'with torch', torch.__version__)"
	@touch $(STAMP)

venv: $(STAMP)

data: venv
	@PYTHON=$(PY) bash scripts/fetch_mnist.sh

demo: venv data
	$(PY) examples/mnist/training.py $(ARGS)
	$(PY) examples/mnist/inference.py

test: venv data tmux
	$(PY) -m pytest $(PYTEST_ARGS)

tmux:
	@command -v tmux >/dev/null || (apt-get update -qq && apt-get install -y -qq tmux) || \
		(echo "tmux is needed by the dashboard tests: install it (apt-get install tmux)" && exit 1)

test-fast: venv data
	$(PY) -m pytest -m "not slow and not cuda" $(PYTEST_ARGS)

test-cuda: venv data
	$(PY) -m pytest -m cuda $(PYTEST_ARGS)

check: venv
	$(PY) -m ruff check src tests examples bench
	$(PY) -m ruff format --check src tests examples bench
	$(PY) -m mypy
	$(VENV)/bin/lint-imports

docs: venv
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict --site-dir site

bench: venv
	$(PY) -m pip install --quiet -r bench/requirements.txt
	$(PY) bench/run.py --reps 5

bench-gpu: venv
	$(PY) bench/gpu.py --reps 3 $(ARGS)

# Every check that needs a CUDA GPU, in the Python it is started with (a GPU machine's
# own CUDA build of torch; no virtualenv, nothing fetched): bench/results/gpu-check.md.
gpu-check:
	PYTHONPATH=src $(PYTHON) bench/gpu_check.py $(ARGS)

clean:
	rm -rf $(VENV) artifacts .pytest_cache .hypothesis
