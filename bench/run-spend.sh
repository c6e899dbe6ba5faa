#!/usr/bin/env bash
# The added cost of spend: the same Turnpike (simulator engine, zero latency, a tenant with an
# API key and high request and token limits) and the same oha load as bench/run-tenancy.sh, run
#   off   prices absent, usage records off (spend.usage_records = false);
#   on    the model priced, a daily, monthly and total budget on the tenant and on the key (set
#         high enough never to refuse, so every charge and settle runs), usage records on
#         (on Redis through a usage journal, as docs/configuration.md advises there);
# with the state in memory and in a local redis-server, plain and streamed requests, at 1 and 64
# concurrent clients. One gateway per state runs for the whole bench and is switched between off
# and on by reloading its configuration (SIGHUP), so off and on are measured on the same
# process: two processes with the same configuration differ by up to 10% on this kind of host
# (measured: a second "off" gateway ran 0.89x-1.06x the first), more than the cost measured
# here. Each cell (state, mode, concurrency) of a round runs off and on back to back, in the
# order off-on in odd rounds and on-off in even ones (ROUNDS times), so a busy host hits both
# and neither always goes first; the report gives the median ratio on/off and its spread.
# Writes bench/results/spend.json and bench/results/spend.md.
#
#   bench/run-spend.sh [SECONDS_PER_RUN] [ROUNDS]
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-5}"
rounds="${2:-3}"
source bench/lib.sh
install_turnpike
work=target/bench/spend
mkdir -p "$work/runs"
rm -f "$work"/runs/*.json "$work"/runs/*.ticks "$work"/runs/*.redis
command -v redis-server > /dev/null || { echo "redis-server is needed (apt-get install redis-server)" >&2; exit 1; }
oha=target/bench/tools/bin/oha
key=$(target/release/turnpike keys generate)
export BENCH_KEY="$key"
id=$(echo "$key" | cut -d- -f2)

port() { # STATE: its gateway's port
  if [ "$1" = redis ]; then echo 4114; else echo 4112; fi
}

write_config() { # SPEND(off|on) STATE(memory|redis)
  local spend="$1" state="$2"
  {
    printf '[server]\nlisten = "127.0.0.1:%s"\n' "$(port "$state")"
    printf '[tenants.bench]\nrequests_per_second = 100000000\ntokens_per_minute = 100000000000\n'
    if [ "$spend" = on ]; then
      printf '[tenants.bench.budget]\nper_day = 1000000\nper_month = 10000000\ntotal = 100000000\nsoft = 0.9\n'
    fi
    printf '[auth]\nkeys_file = "%s"\n' "$PWD/$work/keys.toml"
    if [ "$state" = redis ]; then
      printf '[state]\nbackend = "redis"\nredis_url = "redis://127.0.0.1:4111/0"\n'
    fi
    printf '[spend]\n'
    if [ "$spend" = on ] && [ "$state" = redis ]; then
      printf 'usage_journal = "%s"\n' "$PWD/$work/usage.journal"
    fi
    if [ "$spend" = on ]; then
      printf '[[spend.prices]]\nmodel = "sim"\ninput = 0.15\ncached_input = 0.075\noutput = 0.6\n'
    else
      printf 'usage_records = false\n'
    fi
    printf '[queue]\nmax_running = 4096\n'
    sim_engine_toml 4096
  } > "$work/$spend-$state.toml"
}

# The key, with a budget of its own (read by both configurations; `off` has no prices, so
# nothing is charged to it).
hash=$(printf '%s' "$key" | sha256sum | cut -d' ' -f1)
cat > "$work/keys.toml" <<KEYS
[[keys]]
id = "$id"
hash = "sha256:$hash"
tenant = "bench"
[keys.budget]
per_day = 1000000
total = 100000000
KEYS

body() { # MODE: the request (streamed with its usage, or plain)
  local start='{"model":"sim","messages":[{"role":"user","content":"Hello, how are you today? Tell me about the weather."}],"max_tokens":20'
  if [ "$1" = stream ]; then
    echo "$start"',"stream":true,"stream_options":{"include_usage":true}}'
  else
    echo "$start}"
  fi
}

load() { # STATE MODE OHA-FLAGS...: oha with MODE's request against that state's gateway
  local state="$1" mode="$2"
  shift 2
  "$oha" --no-tui -m POST -H "content-type: application/json" -H "authorization: Bearer $key" \
    -d "$(body "$mode")" "$@" "http://127.0.0.1:$(port "$state")/v1/chat/completions"
}

redis_cpu() { # Redis' user and system CPU seconds so far
  redis-cli -p 4111 info cpu | tr -d '\r' | awk -F: '/^used_cpu_(user|sys):/ {s += $2} END {print s}'
}

redis-server --port 4111 --save "" --appendonly no > "$work/redis.log" 2>&1 &
pids+=($!)
reloads() { # STATE: its gateway's successful configuration reloads so far
  curl -s "http://127.0.0.1:$(port "$1")/metrics" |
    sed -n 's/^turnpike_config_reloads_total{result="ok"} \([0-9]*\).*/\1/p' | grep . || echo 0
}

declare -A gateways spending
switch() { # SPEND STATE: that state's gateway, reloaded with SPEND's configuration
  local spend="$1" state="$2"
  [ "${spending[$state]:-}" = "$spend" ] && return
  local before
  before=$(reloads "$state")
  cp "$work/$spend-$state.toml" "$work/$state.toml"
  kill -HUP "${gateways[$state]}"
  for _ in $(seq 100); do
    [ "$(reloads "$state")" -gt "$before" ] && break
    sleep 0.1
  done
  [ "$(reloads "$state")" -gt "$before" ] || { echo "the $state gateway did not reload" >&2; exit 1; }
  spending[$state]=$spend
}

for state in memory redis; do
  write_config off "$state"
  write_config on "$state"
  # Started on: the usage journal is opened at start (reloading to off leaves it idle, with
  # a warning that its removal takes effect on restart).
  cp "$work/on-$state.toml" "$work/$state.toml"
  RUST_LOG=warn target/release/turnpike --log-format json serve --config "$work/$state.toml" \
    > /dev/null 2> "$work/$state.log" &
  gateways[$state]=$!
  spending[$state]=on
  pids+=($!)
  wait_ready "http://127.0.0.1:$(port "$state")/health"
  for spend in off on; do
    switch "$spend" "$state"
    for mode in plain stream; do # warm-up
      load "$state" "$mode" -c 16 -z 1s > /dev/null
    done
  done
done

run_cell() { # SPEND STATE MODE C ROUND: one run, with the gateway's (and Redis') CPU time
  local spend="$1" state="$2" mode="$3" c="$4" round="$5"
  local name="$spend-$state-$mode-c$c-r$round" gateway=${gateways[$state]}
  switch "$spend" "$state"
  echo "  round $round $spend $state $mode c=$c"
  local before redis_before calls
  before=$(awk '{print $14 + $15}' "/proc/$gateway/stat")
  redis-cli -p 4111 config resetstat > /dev/null
  redis_before=$(redis_cpu)
  load "$state" "$mode" --output-format json -c "$c" -z "${seconds}s" > "$work/runs/$name.json"
  echo "$(( $(awk '{print $14 + $15}' "/proc/$gateway/stat") - before ))" > "$work/runs/$name.ticks"
  if [ "$state" = redis ]; then
    calls=$(redis-cli -p 4111 info commandstats | tr -d '\r' | sed -n 's/^cmdstat_evalsha:calls=\([0-9]*\),.*/\1/p')
    echo "$(redis_cpu) $redis_before ${calls:-0}" > "$work/runs/$name.redis"
  fi
}

for round in $(seq 1 "$rounds"); do
  order="off on"
  [ $((round % 2)) = 0 ] && order="on off"
  for state in memory redis; do
    for mode in plain stream; do
      for c in 1 64; do
        for spend in $order; do
          run_cell "$spend" "$state" "$mode" "$c" "$round"
        done
      done
    done
  done
done
stop_all

cpu=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')
bandwidth=$(target/py/numerics/bin/python bench/read_bandwidth.py 2>/dev/null || python3 bench/read_bandwidth.py 2>/dev/null || echo "?")
python3 bench/spend_report.py "$work/runs" bench/results "$seconds" "$rounds" "$cpu" "$bandwidth" "$(getconf CLK_TCK)"
