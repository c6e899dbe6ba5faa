#!/usr/bin/env bash
# What gateway plugins cost: the same release gateway (the simulator at zero latency, about 20
# output tokens) without plugins and with the shipped `guard` and `redact` loaded on every
# request, driven by oha at 1 and 64 concurrent requests, non-streamed and streamed, two rounds
# each, interleaved. Then the server-tool loop: a request whose model calls the C example's
# `unix_time` tool (answered at once) and answers its result, against the two requests a client
# would make itself (the call, then the answer); the difference is what a round costs the
# gateway beyond the rounds themselves. Writes bench/results/plugins.{json,md}.
#   bench/run-plugins.sh [SECONDS_PER_RUN]
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-5}"
source bench/lib.sh
install_turnpike
cargo build --release --quiet -p turnpike-plugin-guard -p turnpike-plugin-redact
rm -f "$work"/runs/plugins-*.json
python="target/py/openai3/bin/python"
[ -x "$python" ] || { echo "run tests/run.sh once first: the tokenizer comes from its venv" >&2; exit 1; }
cc -std=c11 -O2 -fPIC -shared -I plugin-api/include examples/c-gateway-plugin/mild_words.c -o "$work/libmild_words.so"

# The agent model calls a tool it is offered, then answers the tool's result (after its marker).
marker=$("$python" -c "
from tokenizers import Tokenizer
t = Tokenizer.from_file('examples/models/sim-small/tokenizer.json')
print(t.encode('<|start_header_id|>ipython<|end_header_id|>', add_special_tokens=False).ids)")
config() { # PORT PLUGINS_TOML
  printf '[server]\nlisten = "127.0.0.1:%s"\n\n[auth]\nmode = "none"\n\n' "$1"
  sim_engine_toml 1024
  cat <<CONF
[[engines.config.models]]
id = "agent"
tokenizer = "$PWD/examples/models/sim-small/tokenizer.json"
eos_token_id = 4
latency = "instant"
output = { mode = "random", length = [8, 8] }
tool_calls = { rate = 1.0, result_marker = $marker }

[[models]]
name = "agent"
engine = "sim"
folder = "$PWD/examples/models/sim-small"
tool_call_parser = "llama3_json"

$2
CONF
}
config 4150 "" > "$work/plugins-none.toml"
config 4151 "$(printf '[[plugins]]\nlibrary = "%s"\n[plugins.config]\ndeny = ["forbidden"]\n\n[[plugins]]\nlibrary = "%s"\n' \
  "$PWD/target/release/libturnpike_plugin_guard.so" "$PWD/target/release/libturnpike_plugin_redact.so")" > "$work/plugins-on.toml"
config 4152 "$(printf '[[plugins]]\nlibrary = "%s"\nmodels = ["agent"]\n' "$PWD/$work/libmild_words.so")" > "$work/plugins-tools.toml"

chat='{"model":"sim","messages":[{"role":"user","content":"Hello, how are you today? Write to me at jane@example.com."}],"max_tokens":20'
for round in 1 2; do
  for side in none on; do
    port=4150
    [ "$side" = on ] && port=4151
    RUST_LOG=warn target/release/turnpike --log-format json serve --config "$work/plugins-$side.toml" > /dev/null 2> "$work/plugins-$side.log" &
    pids+=($!)
    wait_ready "http://127.0.0.1:$port/health"
    echo "plugins $side, round $round"
    run_load "plugins-$side-r$round" "http://127.0.0.1:$port/v1/chat/completions" "$chat"
    stop_all
  done
done

# The tool loop against the two single rounds it replaces, on one gateway.
RUST_LOG=warn target/release/turnpike --log-format json serve --config "$work/plugins-tools.toml" > /dev/null 2> "$work/plugins-tools.log" &
pids+=($!)
wait_ready http://127.0.0.1:4152/health
ask='{"role":"user","content":"What time is it?"}'
call='{"role":"assistant","content":"","tool_calls":[{"id":"call_1","type":"function","function":{"name":"unix_time","arguments":"{}"}}]}'
result='{"role":"tool","tool_call_id":"call_1","content":"{\"unix_time\":1795700000}"}'
tool='{"type":"function","function":{"name":"unix_time","parameters":{"type":"object","properties":{}}}}'
one() { # NAME BODY
  echo "  tool loop: $1"
  "$work/tools/bin/oha" --no-tui --output-format json -m POST -H "content-type: application/json" -d "$2" -c 1 -z "${seconds}s" \
    http://127.0.0.1:4152/v1/chat/completions > "$work/runs/plugins-tools-$1.json"
}
one loop "{\"model\":\"agent\",\"messages\":[$ask],\"max_tokens\":20}"
# A client's own two rounds: its tool offered as its own (so the gateway runs nothing), then the
# call and its result sent back.
one call "{\"model\":\"agent\",\"messages\":[$ask],\"tools\":[$tool],\"max_tokens\":20}"
one answer "{\"model\":\"agent\",\"messages\":[$ask,$call,$result],\"tools\":[$tool],\"max_tokens\":20}"
stop_all

python3 bench/plugins_report.py "$work/runs" bench/results "$seconds"
