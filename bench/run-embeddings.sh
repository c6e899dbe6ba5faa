#!/usr/bin/env bash
# Embeddings on the CPU: Turnpike (gateway and default engine, over HTTP) beside
# sentence-transformers on a BERT-base-shaped model, batches of 32. See bench/embeddings_bench.py.
# Writes bench/results/embeddings.{json,md}.
#   bench/run-embeddings.sh
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -p turnpike -p turnpike-cuda
py=${PYTHON:-target/py/numerics/bin/python}
[ -x "$py" ] || { echo "run tests/run.sh once first (it makes the numerics venv)"; exit 1; }
"$py" bench/embeddings_bench.py "$PWD/target/release/turnpike"
