#!/usr/bin/env bash
# The Responses API and its WebSocket transport against the same peers as run-gateway.sh:
#   HTTP   POST /v1/responses (store: false, about 20 output tokens), plain and streamed, at 1
#          and 64 concurrent requests, with oha: Turnpike, llmsim and LiteLLM's proxy; and
#          Turnpike's chat completions with the same prompt, to show what the Responses layer
#          costs on top of chat;
#   WS     response.create turns over WebSocket connections (1 and 64 connections, turns one
#          after another on each), with ws-turns (bench/src/ws_turns.rs): Turnpike and llmsim
#          (LiteLLM's proxy has no Responses WebSocket).
# Writes bench/results/responses.json and bench/results/responses.md.
#
#   bench/run-responses.sh [SECONDS_PER_RUN]
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-10}"
source bench/lib.sh
install_all
cargo build --release --quiet -p turnpike-bench --bin ws-turns
write_configs
prompt="Hello, how are you today?"
responses="{\"model\":\"sim\",\"input\":\"$prompt\",\"max_output_tokens\":20,\"store\":false"
chat="{\"model\":\"sim\",\"messages\":[{\"role\":\"user\",\"content\":\"$prompt\"}],\"max_tokens\":20"
create="{\"type\":\"response.create\",\"model\":\"sim\",\"input\":\"$prompt\",\"max_output_tokens\":20,\"store\":false}"

run_ws() { # NAME URL
  local name="$1" url="$2"
  target/release/ws-turns "$url" "$create" 16 2 sk-bench > /dev/null # warm-up
  for c in 1 64; do
    echo "  $name ws c=$c"
    target/release/ws-turns "$url" "$create" "$c" "$seconds" sk-bench > "$work/runs/$name-ws-c$c.json"
  done
}

echo "turnpike"
start_turnpike
run_load turnpike-responses http://127.0.0.1:4100/v1/responses "$responses"
run_load turnpike-chat http://127.0.0.1:4100/v1/chat/completions "$chat"
run_ws turnpike ws://127.0.0.1:4100/v1/responses
stop_all

echo "llmsim"
start_llmsim
run_load llmsim-responses http://127.0.0.1:4101/openai/v1/responses "$responses"
run_ws llmsim ws://127.0.0.1:4101/openai/v1/responses
stop_all

echo "litellm"
start_litellm
run_load litellm-responses http://127.0.0.1:4102/v1/responses "$responses"
stop_all

python3 bench/responses_report.py "$work/runs" bench/results "$seconds"
