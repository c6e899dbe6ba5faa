#!/usr/bin/env bash
# A/B of the gateway's request path: the release gateway built from BASE (a git revision)
# against the working tree's, on the same machine in the same run, rounds interleaved so drift
# hits both alike. Each round drives the same loads as
# run-gateway.sh and run-responses.sh, Turnpike only: chat and Responses (store: false) plain
# and streamed at 1 and 64 concurrent requests (oha), and Responses WebSocket turns at 1 and 64
# connections (ws-turns). The report takes each cell's median over the rounds and the ratio
# head / base (rates) and base / head (latency): 1.00x is no change. Odd rounds run the base
# first, even rounds the head, so neither always runs on a warmer machine.
#
# Writes bench/results/ab.json and bench/results/ab.md.
#
#   bench/run-ab.sh BASE [SECONDS_PER_RUN] [ROUNDS]
set -euo pipefail
cd "$(dirname "$0")/.."
base_rev="${1:?usage: bench/run-ab.sh BASE [SECONDS_PER_RUN] [ROUNDS]}"
seconds="${2:-5}"
rounds="${3:-4}"
source bench/lib.sh
install_turnpike
cargo build --release --quiet -p turnpike-bench --bin ws-turns
write_configs

# The base build: its sources in a worktree, compiled into this target directory (so the
# dependencies are shared), its two artifacts kept aside; then the head is built again.
ab="$work/ab"
rm -rf "$ab/runs" "$ab/base"
mkdir -p "$ab/runs" "$ab/base"
src="$ab/base-src"
git worktree remove --force "$src" 2>/dev/null || rm -rf "$src"
git worktree add --detach --quiet "$src" "$base_rev"
target_dir="$PWD/target"
(cd "$src" && cargo build --release --quiet -p turnpike -p turnpike-sim --target-dir "$target_dir")
cp target/release/turnpike target/release/libturnpike_sim.so "$ab/base/"
git worktree remove --force "$src"
cargo build --release --quiet -p turnpike -p turnpike-sim
head_rev=$(git rev-parse --short HEAD)
[ -z "$(git status --porcelain -- gateway engine-api engines/sim)" ] || head_rev="$head_rev+dirty"
base_rev=$(git rev-parse --short "$base_rev")

prompt="Hello, how are you today?"
responses="{\"model\":\"sim\",\"input\":\"$prompt\",\"max_output_tokens\":20,\"store\":false"
chat="{\"model\":\"sim\",\"messages\":[{\"role\":\"user\",\"content\":\"$prompt\"}],\"max_tokens\":20"
create="{\"type\":\"response.create\",\"model\":\"sim\",\"input\":\"$prompt\",\"max_output_tokens\":20,\"store\":false}"

start_build() { # BIN SIM: Turnpike on port 4100 with this binary and simulator plugin
  sed "s|$PWD/target/release/libturnpike_sim.so|$2|" "$work/turnpike.toml" > "$ab/turnpike.toml"
  RUST_LOG=warn "$1" --log-format json serve --config "$ab/turnpike.toml" > /dev/null 2> "$ab/turnpike.log" &
  pids+=($!)
  wait_ready http://127.0.0.1:4100/health
}

for round in $(seq 1 "$rounds"); do
  order="base head"
  [ $((round % 2)) -eq 0 ] && order="head base"
  for side in $order; do
    if [ "$side" = base ]; then
      start_build "$ab/base/turnpike" "$PWD/$ab/base/libturnpike_sim.so"
    else
      start_build target/release/turnpike "$PWD/target/release/libturnpike_sim.so"
    fi
    echo "round $round: $side"
    run_load "../ab/runs/$side-r$round-chat" http://127.0.0.1:4100/v1/chat/completions "$chat"
    run_load "../ab/runs/$side-r$round-responses" http://127.0.0.1:4100/v1/responses "$responses"
    target/release/ws-turns ws://127.0.0.1:4100/v1/responses "$create" 16 2 sk-bench > /dev/null
    for c in 1 64; do
      target/release/ws-turns ws://127.0.0.1:4100/v1/responses "$create" "$c" "$seconds" sk-bench \
        > "$ab/runs/$side-r$round-ws-c$c.json"
    done
    stop_all
  done
done

python3 bench/ab_report.py "$ab/runs" bench/results "$seconds" "$rounds" "$base_rev" "$head_rev"
