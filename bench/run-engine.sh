#!/usr/bin/env bash
# The default engine (CPU device, through its plugin) beside Hugging Face transformers on the
# same model, same workloads, same machine, same run: the `small` preset, or MODEL (a model folder
# or a .gguf file, which transformers dequantizes to f32 as the engine does for now). Writes
# bench/results/engine.{json,md}, or engine-NAME.{json,md} with NAME.
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
  label="$(basename "$model") (weights dequantized to f32)"
fi
target/release/engine-bench target/release/libturnpike_cuda.so "$model" "$work/turnpike.json"
"$py" bench/engine_peer.py "$model" "$work/transformers.json"
python3 - "$work" "$label" "${name:+-$name}" <<'PY'
import json, platform, sys, os
work, model_label, suffix = sys.argv[1], sys.argv[2], sys.argv[3]
ours = json.load(open(f"{work}/turnpike.json"))
peer = json.load(open(f"{work}/transformers.json"))
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), platform.processor())
rows = [
    ("prefill, 512-token prompt (tokens/s)", "prefill_tokens_per_s", True),
    ("decode, 1 sequence (tokens/s)", "decode_1_tokens_per_s", True),
    ("decode, 16 sequences (tokens/s)", "decode_16_tokens_per_s", True),
    ("time to first token, 512 tokens, cold (ms)", "ttft_cold_ms", False),
    ("time to first token, same prompt again (ms)", "ttft_prefix_hit_ms", False),
]
table = []
for label, key, higher in rows:
    ratio = ours[key] / peer[key] if higher else peer[key] / ours[key]
    table.append({"measure": label, "turnpike": round(ours[key], 2), "transformers": round(peer[key], 2), "speedup": round(ratio, 2)})
doc = {"benchmark": "engine", "model": model_label, "cpu": cpu, "cores": os.cpu_count(),
       "turnpike": ours, "transformers": peer, "table": table}
json.dump(doc, open(f"bench/results/engine{suffix}.json", "w"), indent=2)
lines = ["# Default engine (CPU device) vs transformers", "",
         f"{model_label}, {cpu}, {os.cpu_count()} cores; medians of {ours['runs']} runs, with `bench/run-engine.sh`. "
         "Speedup > 1 means Turnpike is faster (for times: transformers' time / Turnpike's).", "",
         "| measure | Turnpike | transformers | speedup |", "|---|---:|---:|---:|"]
lines += [f"| {r['measure']} | {r['turnpike']} | {r['transformers']} | {r['speedup']}x |" for r in table]
open(f"bench/results/engine{suffix}.md", "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
PY
