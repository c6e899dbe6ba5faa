#!/usr/bin/env bash
# A fleet behind a router: two Turnpike nodes (the simulator at zero latency, so only routing and
# protocol work is measured) behind (a) a Turnpike gateway with the upstream engine plugin,
# (b) sglang-router (sgl-model-gateway) and (c) vllm-router, from their PyPI wheels; the same chat
# request (about 20 output tokens) driven by oha at 1 and 64 concurrent requests, non-streamed and
# streamed, and the same against one node directly. Writes bench/results/fleet.{json,md}: the
# latency each front adds over a node at concurrency 1 (p50, p99), requests/s at 64, and the CPU
# time per request at 64 of the front and of the nodes behind it (on a small host they share the
# cores, so the rate follows the sum). The fronts and a node alone take turns in an order rotated
# each round, ROUNDS rounds (median and spread).
#   bench/run-fleet.sh [SECONDS_PER_RUN [ROUNDS]]
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-5}"
rounds="${2:-3}"
source bench/lib.sh
install_turnpike
cargo build --release --quiet -p turnpike-upstream
routers="$work/routers"
if [ ! -x "$routers/bin/vllm-router" ] || [ ! -x "$routers/bin/sglang-router" ]; then
  python3 -m venv "$routers"
  "$routers/bin/python" -m pip install --quiet --disable-pip-version-check sglang-router==0.3.2 vllm-router==0.1.17
fi
rm -f "$work"/runs/fleet-*.json

node_toml() { # PORT
  printf '[server]\nlisten = "127.0.0.1:%s"\n\n[auth]\nmode = "none"\n\n' "$1"
  sim_engine_toml 1024
}
node_toml 4110 > "$work/node0.toml"
node_toml 4111 > "$work/node1.toml"
vocab=$(python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(max([v for v in d["model"]["vocab"].values()] + [t["id"] for t in d["added_tokens"]]) + 1)' examples/models/sim-small/tokenizer.json)
cat > "$work/front.toml" <<CONF
[server]
listen = "127.0.0.1:4112"

[auth]
mode = "none"

[[engines]]
name = "fleet"
plugin = "$PWD/target/release/libturnpike_upstream.so"
[engines.config]
[[engines.config.models]]
id = "sim"
upstream_model = "sim"
endpoints = ["http://127.0.0.1:4110", "http://127.0.0.1:4111"]
vocab_size = $vocab
eos_token_ids = [4]

[[models]]
name = "sim"
engine = "fleet"
folder = "$PWD/examples/models/sim-small"
CONF

start_node() { # NAME PORT
  RUST_LOG=warn target/release/turnpike --log-format json serve --config "$work/$1.toml" > /dev/null 2> "$work/$1.log" &
  pids+=($!)
  wait_ready "http://127.0.0.1:$2/health"
}
chat='{"model":"sim","messages":[{"role":"user","content":"Hello, how are you today?"}],"max_tokens":20'

start_node node0 4110
start_node node1 4111
cpu_nodes="${pids[*]}"

# Loads the front just started (the last of pids) on PORT as NAME in round ROUND, then stops it.
measure_front() { # NAME PORT ROUND
  wait_ready "http://127.0.0.1:$2/health"
  cpu_front="${pids[-1]}"
  run_load "fleet-$1-r$3" "http://127.0.0.1:$2/v1/chat/completions" "$chat"
  kill "${pids[-1]}"; unset 'pids[-1]'
}
# Each side of a round: a node alone (no front), then each front.
run_direct() {
  cpu_front=""
  run_load "fleet-direct-r$1" http://127.0.0.1:4110/v1/chat/completions "$chat"
}
run_turnpike() {
  start_node front 4112
  measure_front turnpike 4112 "$1"
}
run_sglang() {
  "$routers/bin/python" -m sglang_router.launch_router --host 127.0.0.1 --port 4113 --policy cache_aware \
    --log-level warn --worker-urls http://127.0.0.1:4110 http://127.0.0.1:4111 > "$work/sglang-router.log" 2>&1 &
  pids+=($!)
  measure_front sglang-router 4113 "$1"
}
run_vllm() {
  "$routers/bin/vllm-router" --host 127.0.0.1 --port 4114 --policy power_of_two \
    --worker-urls http://127.0.0.1:4110 http://127.0.0.1:4111 > "$work/vllm-router.log" 2>&1 &
  pids+=($!)
  measure_front vllm-router 4114 "$1"
}

# The order rotates each round, so no side always runs first (or right after another).
sides=(direct turnpike sglang vllm)
for round in $(seq 1 "$rounds"); do
  for i in 0 1 2 3; do
    side=${sides[$(((i + round - 1) % 4))]}
    echo "$side (round $round)"
    "run_$side" "$round"
  done
done
stop_all

python3 bench/fleet_report.py "$work/runs" bench/results "$seconds" "$rounds"
