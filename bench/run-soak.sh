#!/usr/bin/env bash
# Soak: the release gateway (simulator engine at zero latency, the gateway benchmark's config)
# under a steady load of half its measured maximum rate for SECONDS (default 600), plain and
# streamed chat completions alternating, with the gateway's RSS read from /proc every 30 s.
# Goals: RSS growth under 5% from the first sample to the last, and zero errors.
#
# Writes bench/results/soak.json and bench/results/soak.md.
#
#   bench/run-soak.sh [SECONDS]
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-600}"
source bench/lib.sh
cargo build --release --quiet -p turnpike -p turnpike-sim
if [ ! -x "$work/tools/bin/oha" ]; then
  cargo install --locked --quiet --root "$work/tools" oha@1.16.0
fi
write_configs
start_turnpike
gateway_pid="${pids[0]}"
url=http://127.0.0.1:4100/v1/chat/completions
body='{"model":"sim","messages":[{"role":"user","content":"Hello, how are you today?"}],"max_tokens":20'
load() { # STREAM ARGS...
  local stream="$1"
  shift
  "$work/tools/bin/oha" --no-tui --output-format json -m POST -H "content-type: application/json" \
    -d "$body,\"stream\":$stream}" "$@" "$url"
}

echo "maximum rate (64 connections, 10 s, plain)"
load false -c 16 -z 2s > /dev/null
load false -c 64 -z 10s > "$work/runs/soak-max.json"
max=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["summary"]["requestsPerSec"])' "$work/runs/soak-max.json")
rate=$(python3 -c "print(max(1, int(float('$max') / 2)))")
echo "maximum ${max} req/s; soaking at ${rate} req/s for ${seconds} s"

rss() { awk '/^VmRSS:/ {print $2}' "/proc/$gateway_pid/status"; }
: > "$work/runs/soak-rss.txt"
(
  for _ in $(seq 0 30 "$seconds"); do
    echo "$(date +%s) $(rss)" >> "$work/runs/soak-rss.txt"
    sleep 30
  done
) &
sampler=$!
# Half the rate plain, half streamed, at once.
half=$(( rate / 2 > 0 ? rate / 2 : 1 ))
load false -c 32 -q "$half" -z "${seconds}s" > "$work/runs/soak-plain.json" &
plain=$!
load true -c 32 -q "$half" -z "${seconds}s" > "$work/runs/soak-stream.json" &
stream=$!
wait "$plain" "$stream"
echo "$(date +%s) $(rss)" >> "$work/runs/soak-rss.txt"
kill "$sampler" 2>/dev/null || true

python3 bench/soak_report.py "$work/runs" bench/results "$seconds" "$max" "$rate"
