#!/usr/bin/env bash
# Mixed soak: the release gateway (simulator engine at zero latency, state in memory) under a
# steady mix of every protocol for SECONDS (default 600) at RATE requests/s (default 400):
# chat plain and streamed, Responses (stored), Anthropic Messages, embeddings, and chat with a
# fresh Idempotency-Key each (`mixed-load`, src/mixed_load.rs). The gateway's RSS and the
# in-memory stores' gauges (stored responses, idempotency records) are sampled every 30 s.
# Goal: RSS growth after the first two minutes under 2%, and no errors.
#
# The in-memory stores are bounded (`[state] memory_max_bytes`, 256 MiB each by default); they
# fill at the rate responses arrive and then hold steady. The soak bounds them at STORE_BYTES
# (default 4 MiB) so they fill within the first two minutes and what is left to grow is
# anything unbounded; the report shows their gauges beside the RSS.
#
# Writes bench/results/soak-mixed.json and bench/results/soak-mixed.md.
#
#   bench/run-soak-mixed.sh [SECONDS] [RATE] [STORE_BYTES]
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-600}"
rate="${2:-400}"
store_bytes="${3:-4194304}"
source bench/lib.sh
cargo build --release --quiet -p turnpike -p turnpike-sim
cargo build --release --quiet -p turnpike-bench --bin mixed-load
{
  printf '[server]\nlisten = "127.0.0.1:4100"\n\n[auth]\nmode = "none"\n\n'
  printf '[state]\nmemory_max_bytes = %s\n\n' "$store_bytes"
  sim_engine_toml 1024
} > "$work/soak-mixed.toml"
RUST_LOG=warn target/release/turnpike --log-format json serve --config "$work/soak-mixed.toml" \
  > /dev/null 2> "$work/soak-mixed.log" &
pids+=($!)
gateway_pid="${pids[0]}"
wait_ready http://127.0.0.1:4100/health

sample() { # one line: unix time, RSS KiB, then the store gauges
  local rss
  rss=$(awk '/^VmRSS:/ {print $2}' "/proc/$gateway_pid/status")
  curl -sf http://127.0.0.1:4100/metrics | awk -v t="$(date +%s)" -v rss="$rss" '
    /^turnpike_stored_value_bytes / {sv=$2} /^turnpike_stored_values / {sn=$2}
    /^turnpike_idempotency_bytes / {ib=$2} /^turnpike_idempotency_records / {in_=$2}
    END {print t, rss, sn+0, sv+0, in_+0, ib+0}'
}
: > "$work/runs/soak-mixed-rss.txt"
(
  for _ in $(seq 0 30 "$seconds"); do
    sample >> "$work/runs/soak-mixed-rss.txt"
    sleep 30
  done
) &
sampler=$!
echo "mixed soak: ${rate} req/s for ${seconds} s, stores bounded at ${store_bytes} bytes"
target/release/mixed-load http://127.0.0.1:4100 sim "$rate" 32 "$seconds" > "$work/runs/soak-mixed-load.json"
sample >> "$work/runs/soak-mixed-rss.txt"
kill "$sampler" 2>/dev/null || true
python3 bench/soak_mixed_report.py "$work/runs" bench/results "$seconds" "$rate" "$store_bytes"
