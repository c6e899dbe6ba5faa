#!/usr/bin/env bash
# Bounded work per request: what an oversized prompt and an oversized WebSocket message cost the
# release gateway (simulator engine, a chat model with a 4,096-token context, the default 4 MiB
# body limit). For each: the time to the refusal and the gateway's RSS before, after three
# refusals, and its peak, read from /proc.
#
# Writes bench/results/limits.json and bench/results/limits.md.
#
#   bench/run-limits.sh
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --quiet -p turnpike -p turnpike-sim
python3 -m venv target/bench/limits-venv >/dev/null 2>&1 || true
target/bench/limits-venv/bin/python -m pip install --quiet --disable-pip-version-check httpx==0.28.1 websockets==15.0.1
target/bench/limits-venv/bin/python bench/limits.py bench/results
