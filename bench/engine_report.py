"""Writes bench/results/engine[-NAME].{json,md} from the runs of bench/run-engine.sh: Turnpike's
default engine beside llama.cpp's `llama-server` (for a GGUF model) and Hugging Face
transformers, on the same file, machine and run.

Usage: python engine_report.py WORK_DIR MODEL_LABEL SUFFIX [GGUF]
"""

import json
import os
import platform
import subprocess
import sys

work, model_label, suffix = sys.argv[1], sys.argv[2], sys.argv[3]
gguf = sys.argv[4] if len(sys.argv) > 4 else ""
ours = json.load(open(f"{work}/turnpike.json"))
peers = {}
if os.path.exists(f"{work}/transformers.json"):
    peers["transformers"] = json.load(open(f"{work}/transformers.json"))
if os.path.exists(f"{work}/llama.json"):
    peers = {"llama.cpp": json.load(open(f"{work}/llama.json")), **peers}
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), platform.processor())
length = ours.get("prompt_len", 512)
rows = [
    (f"prefill, {length}-token prompt (tokens/s)", "prefill_tokens_per_s", True),
    ("decode, 1 sequence (tokens/s)", "decode_1_tokens_per_s", True),
    ("decode, 8 sequences (tokens/s)", "decode_8_tokens_per_s", True),
    ("decode, 16 sequences (tokens/s)", "decode_16_tokens_per_s", True),
    ("decode, 1 sequence, JSON Schema grammar (tokens/s)", "decode_1_json_tokens_per_s", True),
    ("decode, 16 sequences, JSON Schema grammar (tokens/s)", "decode_16_json_tokens_per_s", True),
    ("decode, 1 sequence, JSON Schema grammar, no fast-forward (tokens/s)", "decode_1_json_masked_tokens_per_s", True),
    ("decode, 16 sequences, JSON Schema grammar, no fast-forward (tokens/s)", "decode_16_json_masked_tokens_per_s", True),
    (f"time to first token, {length} tokens, cold (ms)", "ttft_cold_ms", False),
    ("time to first token, same prompt again (ms)", "ttft_prefix_hit_ms", False),
    ("resident memory after load (MiB)", "rss_after_load_mib", False),
    ("resident memory, peak while loading (MiB)", "rss_load_peak_mib", False),
    ("resident memory, peak (MiB)", "rss_peak_mib", False),
]
table = []
for label, key, higher in rows:
    row = {"measure": label, "turnpike": round(ours[key], 2) if key in ours else None}
    for name, peer in peers.items():
        theirs = peer.get(key)
        row[name] = round(theirs, 2) if theirs is not None else None
        if theirs and ours.get(key):
            row[f"vs {name}"] = round(ours[key] / theirs if higher else theirs / ours[key], 2)
    table.append(row)

# Bytes one decode step reads: every weight as the CPU device keeps it (4-bit codes; 6-bit codes
# for Q6_K, Q5_0, Q5_1, Q5_K, Q2_K and Q3_K; 8-bit codes for the others; with a scale, and a
# minimum where the type has one, per 32 values, or per 16 for Q6_K, Q2_K and Q3_K: for the
# K-quants and IQ4_XS a byte each and a half per 256 values, for the others a half; f32 as is).
packed_bytes = None
if gguf:
    tool = os.path.join(os.path.dirname(sys.argv[0]), "..", "target", "release", "turnpike-gguf")
    info = json.loads(subprocess.run([tool, "info", gguf], capture_output=True, text=True, check=True).stdout)
    per_value = {"F32": 4, "F16": 2, "BF16": 2, "Q4_0": 18 / 32, "Q4_1": 20 / 32, "Q4_K": 18.5 / 32,
                 "Q8_0": 34 / 32, "Q5_K": 26.5 / 32, "Q6_K": 13.125 / 16, "Q5_0": 26 / 32, "Q5_1": 28 / 32,
                 "Q2_K": 14.25 / 16, "Q3_K": 13.125 / 16, "IQ4_NL": 34 / 32, "IQ4_XS": 33.25 / 32}
    packed_bytes = 0
    for t in info["tensors"]:
        n = 1
        for d in t["shape"]:
            n *= d
        packed_bytes += n * per_value.get(t["type"], 4)
doc = {"benchmark": "engine", "model": model_label, "cpu": cpu, "cores": os.cpu_count(),
       "turnpike": ours, **peers, "table": table, "weight_bytes_per_decode_step": packed_bytes}
json.dump(doc, open(f"bench/results/engine{suffix}.json", "w"), indent=2)
names = list(peers)
head = "| measure | Turnpike | " + " | ".join(f"{n} | vs {n}" for n in names) + " |"
lines = [f"# Default engine (CPU device) vs {' and '.join(names)}", "",
         f"{model_label}, {cpu}, {os.cpu_count()} cores; medians of {ours['runs']} runs"
         f"{ours.get('rounds_note', '')}, with `{os.environ.get('BENCH_COMMAND', 'bench/run-engine.sh')}`. "
         "A ratio > 1 means Turnpike is ahead (for times and memory: the peer's figure / Turnpike's).", "",
         head, "|---|---:|" + "---:|---:|" * len(names)]
fmt = lambda v: "–" if v is None else f"{v}"
keys = {label: key for label, key, _ in rows}


def spread(side, label):
    """The rounds' range of a measure, where the runs came in rounds."""
    values = side.get(f"{keys[label]}_rounds")
    return f" ({min(values):.1f}–{max(values):.1f})" if values and len(values) > 1 else ""


sides = {"turnpike": ours, **peers}
for r in table:
    cells = " | ".join(f"{fmt(r.get(n))}{spread(sides[n], r['measure'])} | {fmt(r.get('vs ' + n))}{'x' if r.get('vs ' + n) else ''}" for n in names)
    lines.append(f"| {r['measure']} | {fmt(r['turnpike'])}{spread(ours, r['measure'])} | {cells} |")
if packed_bytes:
    bw = ours.get("memory_read_gb_per_s", 0)
    d1 = ours["decode_1_tokens_per_s"]
    lines += ["", f"A decode step reads {packed_bytes / 1e6:.1f} MB of weights as the engine keeps them; "
              f"at {d1:.1f} tokens/s that is {packed_bytes * d1 / 1e9:.2f} GB/s against {bw:.2f} GB/s "
              f"measured read bandwidth ({100 * packed_bytes * d1 / 1e9 / bw:.0f}%)." if bw else ""]
g = ours.get("grammar")
if g and ours.get("decode_16_json_masked_tokens_per_s"):
    base = lambda n: ours.get(f"decode_{n}_beside_json_tokens_per_s") or ours[f"decode_{n}_tokens_per_s"]
    cost = lambda n: 100 * (1 - ours[f"decode_{n}_json_masked_tokens_per_s"] / base(n))
    gain = lambda n: ours[f"decode_{n}_json_tokens_per_s"] / ours[f"decode_{n}_json_masked_tokens_per_s"]
    lines += ["", f"Masking by a grammar costs {cost(1):.1f}% of decode throughput at 1 sequence and "
              f"{cost(16):.1f}% at 16 (fast-forward off, against unconstrained runs interleaved with them); with the tokens the grammar forces "
              f"fast-forwarded (the default), the same schema decodes {gain(1):.2f}x / {gain(16):.2f}x faster "
              f"than masked alone. A token mask takes {g['grammar_mask_us_p50']:.0f} µs (p50) / "
              f"{g['grammar_mask_us_p99']:.0f} µs (p99); a schema compiles in {g['grammar_compile_ms_p50']:.2f} ms "
              f"(p50) / {g['grammar_compile_ms_p99']:.2f} ms (p99), a repeated one in "
              f"{g['grammar_compile_cached_ms']:.3f} ms (cached); the model's grammar compiler loads in "
              f"{g['grammar_load_ms']:.0f} ms."]
open(f"bench/results/engine{suffix}.md", "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
