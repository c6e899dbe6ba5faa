#!/usr/bin/env bash
# Gateway benchmark: Turnpike (simulator engine, zero latency) against LiteLLM's proxy (a model
# answering with mock_response, master-key auth) and llmsim (zero latency), all driven by the
# same load tool (oha) with the same chat request of about 20 output tokens: requests/s at
# saturation and p50/p99 latency at 1 and 64 concurrent requests, non-streamed and streamed.
#
# Installs what it needs under target/bench (see lib.sh), then writes bench/results/gateway.json
# and bench/results/gateway.md.
#
#   bench/run-gateway.sh [SECONDS_PER_RUN]
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-10}"
source bench/lib.sh
install_all
write_configs
chat='{"model":"sim","messages":[{"role":"user","content":"Hello, how are you today?"}],"max_tokens":20'

echo "turnpike"
start_turnpike
run_load turnpike http://127.0.0.1:4100/v1/chat/completions "$chat"
stop_all

echo "llmsim"
start_llmsim
run_load llmsim http://127.0.0.1:4101/openai/v1/chat/completions "$chat"
stop_all

echo "litellm"
start_litellm
run_load litellm http://127.0.0.1:4102/v1/chat/completions "$chat"
stop_all

python3 bench/gateway_report.py "$work/runs" bench/results "$seconds"
