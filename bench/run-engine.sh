#!/usr/bin/env bash
# The default engine (CPU device, through its plugin) beside Hugging Face transformers on the
# same `small` model, same workloads, same machine, same run. Writes bench/results/engine.{json,md}.
#   bench/run-engine.sh
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -p turnpike -p turnpike-cuda -p turnpike-bench
py=${PYTHON:-target/py/numerics/bin/python}
[ -x "$py" ] || { echo "run tests/run.sh once first (it makes the transformers venv)"; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
target/release/turnpike make-model --preset small --out "$work/small"
target/release/engine-bench target/release/libturnpike_cuda.so "$work/small" "$work/turnpike.json"
"$py" bench/engine_peer.py "$work/small" "$work/transformers.json"
python3 - "$work" <<'PY'
import json, platform, sys, os
work = sys.argv[1]
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
doc = {"benchmark": "engine", "model": "small preset (24M parameters, f32)", "cpu": cpu, "cores": os.cpu_count(),
       "turnpike": ours, "transformers": peer, "table": table}
json.dump(doc, open("bench/results/engine.json", "w"), indent=2)
lines = ["# Default engine (CPU device) vs transformers", "",
         f"`small` preset, f32, {cpu}, {os.cpu_count()} cores; medians of {ours['runs']} runs. "
         "Speedup > 1 means Turnpike is faster (for times: transformers' time / Turnpike's).", "",
         "| measure | Turnpike | transformers | speedup |", "|---|---:|---:|---:|"]
lines += [f"| {r['measure']} | {r['turnpike']} | {r['transformers']} | {r['speedup']}x |" for r in table]
open("bench/results/engine.md", "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
PY
