#!/usr/bin/env bash
# What TLS costs: the same gateway (the simulator at zero latency, about 20 output tokens) with
# TLS off and on (an ECDSA P-256 certificate made here by openssl), driven by oha at 1 and 64
# concurrent requests, non-streamed and streamed, over kept-alive connections; and at 64 with a
# new connection per request (a full handshake each time). Writes bench/results/tls.{json,md}:
# requests/s and p99 with TLS as a fraction of without.
#   bench/run-tls.sh [SECONDS_PER_RUN]
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-5}"
source bench/lib.sh
install_turnpike
rm -f "$work"/runs/tls-*.json

openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 -subj /CN=127.0.0.1 \
  -addext subjectAltName=IP:127.0.0.1 -keyout "$work/tls.key" -out "$work/tls.crt" 2> /dev/null
server_toml() { # PORT [TLS]
  printf '[server]\nlisten = "127.0.0.1:%s"\n' "$1"
  if [ -n "${2:-}" ]; then
    printf '[server.tls]\ncert_file = "%s"\nkey_file = "%s"\n' "$PWD/$work/tls.crt" "$PWD/$work/tls.key"
  fi
  printf '\n[auth]\nmode = "none"\n\n'
  sim_engine_toml 1024
}
server_toml 4120 > "$work/tls-off.toml"
server_toml 4121 tls > "$work/tls-on.toml"

chat='{"model":"sim","messages":[{"role":"user","content":"Hello, how are you today?"}],"max_tokens":20'
oha_flags=(--insecure)
load() { # NAME URL
  run_load "$1" "$2" "$chat"
  echo "  $1 plain c=64, a connection per request"
  "$work/tools/bin/oha" --no-tui --insecure --output-format json -m POST -H "content-type: application/json" \
    -d "$chat,\"stream\":false}" --disable-keepalive -c 64 -z "${seconds}s" "$2" > "$work/runs/$1-fresh-c64.json"
}

for side in off on; do
  port=4120 scheme=http
  [ "$side" = on ] && port=4121 scheme=https
  RUST_LOG=warn target/release/turnpike --log-format json serve --config "$work/tls-$side.toml" > /dev/null 2> "$work/tls-$side.log" &
  pids+=($!)
  for _ in $(seq 1 120); do curl -skf -o /dev/null "$scheme://127.0.0.1:$port/health" && break; sleep 0.5; done
  echo "tls $side"
  load "tls-$side" "$scheme://127.0.0.1:$port/v1/chat/completions"
  stop_all
done

python3 bench/tls_report.py "$work/runs" bench/results "$seconds"
