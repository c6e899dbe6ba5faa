# What the gateway benchmarks share (sourced by run-gateway.sh and run-responses.sh): installing
# the load tools and the peers under target/bench, their configurations, and starting, waiting
# for and stopping the servers. Every server is started the same way in every script, so their
# results compare.

work=target/bench
mkdir -p "$work/runs"

# The release gateway and simulator, and oha.
install_turnpike() {
  cargo build --release --quiet -p turnpike -p turnpike-sim
  if [ ! -x "$work/tools/bin/oha" ]; then
    cargo install --locked --quiet --root "$work/tools" oha@1.16.0
  fi
}

# What install_turnpike installs, llmsim (cargo) and LiteLLM's proxy (pip).
install_all() {
  install_turnpike
  if [ ! -x "$work/tools/bin/llmsim" ]; then
    cargo install --locked --quiet --root "$work/tools" llmsim@0.6.0
  fi
  if [ ! -x "$work/litellm/bin/litellm" ]; then
    python3 -m venv "$work/litellm"
    # The newest release whose dependencies this machine's package index can satisfy.
    "$work/litellm/bin/python" -m pip install --quiet "litellm[proxy]==1.106.2"
  fi
}

# Turnpike's engine: the simulator at zero latency, serving `sim`, running MAX_RUNNING at once.
sim_engine_toml() { # MAX_RUNNING
  cat <<CONF
[[engines]]
name = "sim"
plugin = "$PWD/target/release/libturnpike_sim.so"
[engines.config]
max_running = $1
[[engines.config.models]]
id = "sim"
tokenizer = "$PWD/examples/models/sim-small/tokenizer.json"
eos_token_id = 4
latency = "instant"

[[models]]
name = "sim"
engine = "sim"
folder = "$PWD/examples/models/sim-small"
CONF
}

# The three servers' configurations: Turnpike with the simulator at zero latency, llmsim's
# `instant` profile, LiteLLM answering with `mock_response` behind a master key.
write_configs() {
  {
    printf '[server]\nlisten = "127.0.0.1:4100"\n\n[auth]\nmode = "none"\n\n'
    sim_engine_toml 1024
  } > "$work/turnpike.toml"
  cat > "$work/llmsim.toml" <<CONF
[latency]
profile = "instant"
CONF
  cat > "$work/litellm.yaml" <<CONF
model_list:
  - model_name: sim
    litellm_params:
      model: openai/sim
      api_key: sk-unused
      mock_response: "The river moved slowly under the old stone bridge and a dog barked at the water."
general_settings:
  master_key: sk-bench
CONF
}

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

start_turnpike() { # on port 4100
  RUST_LOG=warn target/release/turnpike --log-format json serve --config "$work/turnpike.toml" > /dev/null 2> "$work/turnpike.log" &
  pids+=($!)
  wait_ready http://127.0.0.1:4100/health
}

start_llmsim() { # on port 4101
  "$work/tools/bin/llmsim" serve --config "$work/llmsim.toml" --host 127.0.0.1 --port 4101 --generator lorem --target-tokens 20 > "$work/llmsim.log" 2>&1 &
  pids+=($!)
  wait_ready http://127.0.0.1:4101/health
}

start_litellm() { # on port 4102
  LITELLM_LOCAL_MODEL_COST_MAP=True LITELLM_TELEMETRY=False \
    "$work/litellm/bin/litellm" --config "$work/litellm.yaml" --host 127.0.0.1 --port 4102 > "$work/litellm.log" 2>&1 &
  pids+=($!)
  wait_ready http://127.0.0.1:4102/health/liveliness
}

# oha against URL with BODY (its `"stream"` set per mode), at 1 and 64 concurrent requests, into
# $work/runs/NAME-MODE-cC.json; the array oha_flags adds flags (`--insecure` for a test
# certificate).
oha_flags=()
# Processes whose CPU time run_load records over each run at 64 (space-separated PIDs; empty for
# none), into $work/runs/NAME-MODE-c64.cpu.json: the front's and the nodes' behind it.
cpu_front=""
cpu_nodes=""
run_load() { # NAME URL BODY_WITHOUT_CLOSING_BRACE
  local name="$1" url="$2" body="$3"
  for mode in plain stream; do
    local stream=false
    [ "$mode" = stream ] && stream=true
    local args=(--no-tui "${oha_flags[@]}" --output-format json -m POST -H "content-type: application/json" -H "authorization: Bearer sk-bench" -d "$body,\"stream\":$stream}")
    "$work/tools/bin/oha" "${args[@]}" -c 16 -z 2s "$url" > /dev/null # warm-up
    for c in 1 64; do
      echo "  $name $mode c=$c"
      local measured=false front0 nodes0
      if [ "$c" = 64 ] && [ -n "$cpu_front$cpu_nodes" ]; then
        measured=true front0=$(cpu_ticks $cpu_front) nodes0=$(cpu_ticks $cpu_nodes)
      fi
      "$work/tools/bin/oha" "${args[@]}" -c "$c" -z "${seconds}s" "$url" > "$work/runs/$name-$mode-c$c.json"
      if $measured; then
        printf '{"hz": %s, "front_ticks": %s, "nodes_ticks": %s}\n' "$(getconf CLK_TCK)" \
          "$(($(cpu_ticks $cpu_front) - front0))" "$(($(cpu_ticks $cpu_nodes) - nodes0))" \
          > "$work/runs/$name-$mode-c$c.cpu.json"
      fi
    done
  done
}

# The CPU time (user and system, in clock ticks) the processes PIDS and their children have
# used so far (a router started by a Python launcher may run in a child).
cpu_ticks() { # PID...
  local total=0 p
  for p in "$@" $(for p in "$@"; do pgrep -P "$p" || true; done); do
    # utime and stime: fields 14 and 15, counted after the name's closing parenthesis (a
    # name may hold spaces).
    total=$((total + $({ sed 's/.*) //' "/proc/$p/stat" 2>/dev/null || true; } | awk '{t = $12 + $13} END {print t + 0}')))
  done
  echo "$total"
}
