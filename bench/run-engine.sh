#!/usr/bin/env bash
# The default engine (CPU device, through its plugin) beside Hugging Face transformers on the
# same model, same workloads, same machine, same run: the `small` preset, or MODEL (a model folder
# or a .gguf file; transformers dequantizes it to f32, and for a .gguf llama.cpp's `llama-server`,
# built by tools/llama-server.sh, runs the same file too). Writes bench/results/engine.{json,md},
# or engine-NAME.{json,md} with NAME.
#   bench/run-engine.sh [MODEL NAME]
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -p turnpike -p turnpike-cuda -p turnpike-bench
py=${PYTHON:-target/py/numerics/bin/python}
[ -x "$py" ] || { echo "run tests/run.sh once first (it makes the transformers venv)"; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
model="${1:-}"
name="${2:-}"
label="small preset (24M parameters, f32)"
if [ -z "$model" ]; then
  target/release/turnpike make-model --preset small --out "$work/small"
  model="$work/small"
else
  label="$(basename "$model")"
fi
target/release/engine-bench target/release/libturnpike_cuda.so "$model" "$work/turnpike.json"
"$py" bench/engine_peer.py "$model" "$work/transformers.json"
llama=""
case "$model" in
  *.gguf)
    llama_server=$(tools/llama-server.sh)
    python3 bench/llama_peer.py "$llama_server" "$model" "$work/llama.json"
    llama="$model"
    ;;
esac
python3 bench/engine_report.py "$work" "$label" "${name:+-$name}" $llama
