#!/usr/bin/env bash
# What tracing costs: the same gateway (the simulator at zero latency, about 20 output tokens)
# with no [tracing] and with every request traced (sample_ratio 1.0, OTLP/HTTP to a local sink
# that accepts the exports, bench/src/otlp_sink.rs), driven by oha at 1 and 64 concurrent requests, non-streamed and
# streamed. Writes bench/results/tracing.{json,md}: requests/s and p99 traced as a fraction of
# untraced.
#   bench/run-tracing.sh [SECONDS_PER_RUN]
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-5}"
source bench/lib.sh
install_turnpike
cargo build --release --quiet -p turnpike-bench --bin otlp-sink
rm -f "$work"/runs/tracing-*.json

target/release/otlp-sink 4132 &
pids+=($!)
gateway_toml() { # PORT [TRACED]
  printf '[server]\nlisten = "127.0.0.1:%s"\n\n[auth]\nmode = "none"\n\n' "$1"
  sim_engine_toml 1024
  if [ -n "${2:-}" ]; then
    printf '\n[tracing]\notlp_endpoint = "http://127.0.0.1:4132/v1/traces"\nsample_ratio = 1.0\n'
  fi
}
gateway_toml 4130 > "$work/tracing-off.toml"
gateway_toml 4131 traced > "$work/tracing-on.toml"

chat='{"model":"sim","messages":[{"role":"user","content":"Hello, how are you today?"}],"max_tokens":20'
for side in off on; do
  port=4130
  [ "$side" = on ] && port=4131
  RUST_LOG=warn target/release/turnpike --log-format json serve --config "$work/tracing-$side.toml" > /dev/null 2> "$work/tracing-$side.log" &
  pids+=($!)
  wait_ready "http://127.0.0.1:$port/health"
  echo "tracing $side"
  run_load "tracing-$side" "http://127.0.0.1:$port/v1/chat/completions" "$chat"
  if [ "$side" = on ]; then
    sleep 6 # the last batch
    dropped=$(curl -s "http://127.0.0.1:$port/metrics" | awk '/^turnpike_trace_spans_dropped_total/ {print $2}')
    exported_spans=$(curl -s "http://127.0.0.1:$port/metrics" | awk '/^turnpike_trace_spans_exported_total/ {print $2}')
  fi
  gateway="${pids[-1]}"
  kill "$gateway"; unset 'pids[-1]'
  wait "$gateway" 2>/dev/null || true
done
exported=$(curl -s http://127.0.0.1:4132/)
stop_all

python3 bench/tracing_report.py "$work/runs" bench/results "$seconds" "$exported" "${exported_spans:-0}" "${dropped:-0}"
