#!/usr/bin/env bash
# The Batch API on SmolLM2 (default engine, CPU device): batch throughput against the same lines
# sent by a client at its best concurrency, and interactive time to first token with a batch
# running against without. See bench/batch_bench.py. Writes bench/results/batch.{json,md}.
#   bench/run-batch.sh [ROUNDS]
set -euo pipefail
cd "$(dirname "$0")/.."
rounds="${1:-3}"
source tests/lib.sh
cargo build --release --quiet -p turnpike -p turnpike-cuda
py=${PYTHON:-target/py/numerics/bin/python}
[ -x "$py" ] || { echo "run tests/setup.sh once first (it makes the numerics venv)"; exit 1; }
[ -f "$SMOLLM2_GGUF" ] || { echo "run tests/setup.sh once first (it fetches SmolLM2)"; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 bench/batch_bench.py "$PWD/target/release/turnpike" "$PWD/target/release/libturnpike_cuda.so" \
  "$PWD/$SMOLLM2_GGUF" "$work/batch.json" "$rounds"
cpu=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')
bandwidth=$("$py" bench/read_bandwidth.py)
python3 bench/batch_report.py "$work/batch.json" "$cpu" "$bandwidth"
