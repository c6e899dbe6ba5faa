#!/usr/bin/env bash
# The added cost of authentication, tenant limits and idempotency: the same Turnpike (simulator
# engine, zero latency) and the same oha load as bench/run-gateway.sh, run with
#   off      authentication off, no limits (the baseline);
#   memory   an API key, a tenant with request, token and concurrency limits (set high enough
#            never to refuse, so every check runs), state in memory;
#   redis    the same with the state in a local redis-server (every check a Lua script);
# each with plain and streamed requests at 1 and 64 concurrent clients, and, for memory and
# redis, a run where every request carries the same Idempotency-Key (the lookup and replay
# path). Writes bench/results/tenancy.json and bench/results/tenancy.md.
#
#   bench/run-tenancy.sh [SECONDS_PER_RUN]
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-5}"
source bench/lib.sh
work=target/bench/tenancy
mkdir -p "$work/runs"

cargo build --release --quiet -p turnpike -p turnpike-sim
if [ ! -x target/bench/tools/bin/oha ]; then
  cargo install --locked --quiet --root target/bench/tools oha@1.16.0
fi
command -v redis-server > /dev/null || { echo "redis-server is needed (apt-get install redis-server)" >&2; exit 1; }
oha=target/bench/tools/bin/oha
key=$(target/release/turnpike keys generate)
export BENCH_KEY="$key"

write_config() { # NAME
  local name="$1"
  {
    echo '[server]'
    echo 'listen = "127.0.0.1:4110"'
    if [ "$name" = off ]; then
      printf '[auth]\nmode = "none"\n'
    else
      printf '[tenants.bench]\nrequests_per_second = 100000000\nrequests_per_day = 100000000000\n'
      printf 'tokens_per_minute = 100000000000\nconcurrent_streams = 100000\nkeys = [{ env = "BENCH_KEY" }]\n'
    fi
    if [ "$name" = redis ]; then
      printf '[state]\nbackend = "redis"\nredis_url = "redis://127.0.0.1:4111/0"\n'
    fi
    printf '[queue]\nmax_running = 4096\n'
    sim_engine_toml 4096
  } > "$work/$name.toml"
}

load() { # RUN-NAME IDEMPOTENCY-KEY-OR-EMPTY
  local name="$1" idem="$2"
  for mode in plain stream; do
    local stream=false
    [ "$mode" = stream ] && stream=true
    local body="{\"model\":\"sim\",\"messages\":[{\"role\":\"user\",\"content\":\"Hello, how are you today?\"}],\"max_tokens\":20,\"stream\":$stream}"
    local args=(--no-tui --output-format json -m POST -H "content-type: application/json" -H "authorization: Bearer $key" -d "$body")
    [ -n "$idem" ] && args+=(-H "idempotency-key: $idem-$mode")
    "$oha" "${args[@]}" -c 16 -z 1s http://127.0.0.1:4110/v1/chat/completions > /dev/null
    for c in 1 64; do
      echo "  $name $mode c=$c"
      "$oha" "${args[@]}" -c "$c" -z "${seconds}s" http://127.0.0.1:4110/v1/chat/completions > "$work/runs/$name-$mode-c$c.json"
    done
  done
}

redis-server --port 4111 --save "" --appendonly no > "$work/redis.log" 2>&1 &
pids+=($!)
for name in off memory redis; do
  echo "$name"
  write_config "$name"
  RUST_LOG=warn target/release/turnpike --log-format json serve --config "$work/$name.toml" > /dev/null 2> "$work/$name.log" &
  gateway=$!
  wait_ready http://127.0.0.1:4110/health
  load "$name" ""
  if [ "$name" != off ]; then
    load "$name-replay" "bench-$RANDOM"
  fi
  kill "$gateway"; wait "$gateway" 2>/dev/null || true
done
stop_all

python3 - "$work/runs" bench/results "$seconds" <<'PY'
import json, sys, pathlib
runs, out, seconds = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2]), sys.argv[3]
rows = {}
for f in sorted(runs.glob("*.json")):
    d = json.loads(f.read_text())
    codes = d.get("statusCodeDistribution", {})
    rows[f.stem] = {
        "rps": d["summary"]["requestsPerSec"],
        "p50_ms": d["latencyPercentiles"]["p50"] * 1e3,
        "p99_ms": d["latencyPercentiles"]["p99"] * 1e3,
        "status": codes,
    }
result = {"seconds_per_run": int(seconds), "runs": rows, "ratios_vs_off": {}}
lines = ["# Cost of authentication, limits and idempotency", "",
         f"`bench/run-tenancy.sh {seconds}`: Turnpike with the simulator engine (zero latency), oha, {seconds} s per run.", "",
         "| run | mode | req/s @64 | vs off | p50 @1 (ms) | p99 @1 (ms) | p50 @64 (ms) | p99 @64 (ms) |",
         "|---|---|---|---|---|---|---|---|"]
for name in ["off", "memory", "memory-replay", "redis", "redis-replay"]:
    for mode in ["plain", "stream"]:
        a, b = rows.get(f"{name}-{mode}-c1"), rows.get(f"{name}-{mode}-c64")
        base = rows.get(f"off-{mode}-c64")
        if not (a and b and base):
            continue
        ratio = b["rps"] / base["rps"]
        result["ratios_vs_off"][f"{name}-{mode}"] = ratio
        lines.append(f"| {name} | {mode} | {b['rps']:.0f} | {ratio:.2f}x | {a['p50_ms']:.2f} | {a['p99_ms']:.2f} | {b['p50_ms']:.2f} | {b['p99_ms']:.2f} |")
lines += ["", "Status codes of every run are in tenancy.json (all 200 expected: the limits are set never to refuse)."]
(out / "tenancy.json").write_text(json.dumps(result, indent=2) + "\n")
(out / "tenancy.md").write_text("\n".join(lines) + "\n")
print("\n".join(lines))
PY
