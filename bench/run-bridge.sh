#!/usr/bin/env bash
# Measures the per-event cost of the engine sink -> tokio stream bridge on one core, against a
# plain tokio channel (the peer), and end to end through the simulator plugin.
# Writes bench/results/bridge.json and bench/results/bridge.md.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --quiet -p turnpike-bench -p turnpike-sim
pin=()
command -v taskset >/dev/null && pin=(taskset -c 0)
{
  echo "# Bridge: sink -> stream, one core"
  echo
  echo "Measured $(date -u +%Y-%m-%d) on $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'),"
  echo "pinned to one core (\`${pin[*]:-unpinned}\`), release build; each figure is the median of 7 runs."
  echo "Command: \`bench/run-bridge.sh\`."
  echo
  "${pin[@]}" target/release/bridge-bench target/release/libturnpike_sim.so bench/results
} | tee bench/results/bridge.md.tmp
mv bench/results/bridge.md.tmp bench/results/bridge.md
