#!/usr/bin/env bash
# How fast an admin change reaches another replica: two release gateways sharing a real
# redis-server, an admin change (a tenant put) through one, and the other's /admin/v1/state
# polled until it shows the new revision; for the default sync interval (250 ms) and a short
# one (50 ms). Writes bench/results/admin.{json,md}: convergence p50/p99/max against the bound
# (the interval plus one store round trip), and the time a change takes to commit.
#   bench/run-admin.sh [CHANGES_PER_INTERVAL]
set -euo pipefail
cd "$(dirname "$0")/.."
changes="${1:-200}"
source bench/lib.sh
cargo build --release --quiet -p turnpike -p turnpike-sim
rm -f "$work"/runs/admin-*.json

redis_port=4139
redis-server --port "$redis_port" --bind 127.0.0.1 --save "" --appendonly no > /dev/null &
pids+=($!)
admin_key=$(target/release/turnpike keys generate | tail -1)
export ADMIN_KEY="$admin_key"
TURNPIKE_AUDIT_KEY=$(python3 -c 'import secrets; print(secrets.token_urlsafe(48))')
export TURNPIKE_AUDIT_KEY

db=0
for interval in 250 50; do
  db=$((db + 1)) # a fresh database per interval, so each run starts at revision 0
  for side in 1 2; do
    {
      printf '[server]\nlisten = "127.0.0.1:%s"\n\n' "$((4140 + side))"
      printf '[auth]\nmode = "required"\n\n[tenants.ops]\nkeys = [{ env = "ADMIN_KEY", endpoints = ["admin"] }]\n\n'
      printf '[state]\nbackend = "redis"\nredis_url = "redis://127.0.0.1:%s/%s"\n\n' "$redis_port" "$db"
      printf '[admin]\nenabled = true\nsync_interval_ms = %s\n' "$interval"
      printf 'audit_keys = [{ id = "k1", env = "TURNPIKE_AUDIT_KEY" }]\n\n'
      sim_engine_toml 64
    } > "$work/admin-$side.toml"
    RUST_LOG=warn target/release/turnpike --log-format json serve --config "$work/admin-$side.toml" \
      > /dev/null 2> "$work/admin-$side.log" &
    pids+=($!)
    wait_ready "http://127.0.0.1:$((4140 + side))/health"
  done
  echo "sync_interval_ms = $interval"
  python3 bench/admin_convergence.py http://127.0.0.1:4141 http://127.0.0.1:4142 "$interval" "$changes" \
    > "$work/runs/admin-$interval.json"
  for p in "${pids[@]:1}"; do kill "$p"; done
  wait "${pids[@]:1}" 2> /dev/null || true
  pids=("${pids[0]}")
done

python3 bench/admin_report.py "$work/runs" bench/results
