#!/usr/bin/env bash
# Gateway benchmark: Turnpike (simulator engine, zero latency) against LiteLLM's proxy (a model
# answering with mock_response, master-key auth) and llmsim (zero latency), all driven by the
# same load tool (oha) with the same chat request of about 20 output tokens: requests/s at
# saturation and p50/p99 latency at 1 and 64 concurrent requests, non-streamed and streamed.
#
# Installs what it needs under target/bench (oha and llmsim with cargo, LiteLLM with pip), then
# writes bench/results/gateway.json and bench/results/gateway.md.
#
#   bench/run-gateway.sh [SECONDS_PER_RUN]
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-10}"
work=target/bench
mkdir -p "$work/runs"

cargo build --release --quiet -p turnpike -p turnpike-sim
if [ ! -x "$work/tools/bin/oha" ] || [ ! -x "$work/tools/bin/llmsim" ]; then
  cargo install --locked --quiet --root "$work/tools" oha@1.16.0 llmsim@0.6.0
fi
if [ ! -x "$work/litellm/bin/litellm" ]; then
  python3 -m venv "$work/litellm"
  # The newest release whose dependencies this machine's package index can satisfy.
  "$work/litellm/bin/python" -m pip install --quiet "litellm[proxy]==1.106.2"
fi

cat > "$work/turnpike.toml" <<EOF
[server]
listen = "127.0.0.1:4100"

[auth]
mode = "none"

[[engines]]
name = "sim"
plugin = "$PWD/target/release/libturnpike_sim.so"
[engines.config]
max_running = 1024
[[engines.config.models]]
id = "sim"
tokenizer = "$PWD/examples/models/sim-small/tokenizer.json"
eos_token_id = 4
latency = "instant"

[[models]]
name = "sim"
engine = "sim"
folder = "$PWD/examples/models/sim-small"
EOF
cat > "$work/llmsim.toml" <<EOF
[latency]
profile = "instant"
EOF
cat > "$work/litellm.yaml" <<EOF
model_list:
  - model_name: sim
    litellm_params:
      model: openai/sim
      api_key: sk-unused
      mock_response: "The river moved slowly under the old stone bridge and a dog barked at the water."
general_settings:
  master_key: sk-bench
EOF

pids=()
stop_all() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; pids=(); }
trap stop_all EXIT

wait_ready() { # URL
  for _ in $(seq 1 120); do
    curl -sf -o /dev/null "$1" && return 0
    sleep 0.5
  done
  echo "not ready: $1" >&2
  return 1
}

run_load() { # NAME URL
  local name="$1" url="$2"
  for mode in plain stream; do
    local stream=false
    [ "$mode" = stream ] && stream=true
    local body="{\"model\":\"sim\",\"messages\":[{\"role\":\"user\",\"content\":\"Hello, how are you today?\"}],\"max_tokens\":20,\"stream\":$stream}"
    local args=(--no-tui --output-format json -m POST -H "content-type: application/json" -H "authorization: Bearer sk-bench" -d "$body")
    "$work/tools/bin/oha" "${args[@]}" -c 16 -z 2s "$url" > /dev/null # warm-up
    for c in 1 64; do
      echo "  $name $mode c=$c"
      "$work/tools/bin/oha" "${args[@]}" -c "$c" -z "${seconds}s" "$url" > "$work/runs/$name-$mode-c$c.json"
    done
  done
}

echo "turnpike"
RUST_LOG=warn target/release/turnpike --log-format json serve --config "$work/turnpike.toml" > /dev/null 2> "$work/turnpike.log" &
pids+=($!)
wait_ready http://127.0.0.1:4100/health
run_load turnpike http://127.0.0.1:4100/v1/chat/completions
stop_all

echo "llmsim"
"$work/tools/bin/llmsim" serve --config "$work/llmsim.toml" --host 127.0.0.1 --port 4101 --generator lorem --target-tokens 20 > "$work/llmsim.log" 2>&1 &
pids+=($!)
wait_ready http://127.0.0.1:4101/health
run_load llmsim http://127.0.0.1:4101/openai/v1/chat/completions
stop_all

echo "litellm"
LITELLM_LOCAL_MODEL_COST_MAP=True LITELLM_TELEMETRY=False \
  "$work/litellm/bin/litellm" --config "$work/litellm.yaml" --host 127.0.0.1 --port 4102 > "$work/litellm.log" 2>&1 &
pids+=($!)
wait_ready http://127.0.0.1:4102/health/liveliness
run_load litellm http://127.0.0.1:4102/v1/chat/completions
stop_all

python3 bench/gateway_report.py "$work/runs" bench/results "$seconds"
