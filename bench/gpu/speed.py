"""The CUDA device's speed on the Llama-3.2-1B- and Llama-3.1-8B-shaped presets (random bf16
weights), beside `transformers` `generate` on the same weights and batch, and beside the GPU's
memory bandwidth measured in the same run.

- bandwidth: a 2 GiB device-to-device copy (bytes read + written per second), best of 20;
- batch-1 decode as a fraction of the bandwidth limit: the weight bytes one decode step reads
  (every weight; the embedding table only when it is also the output projection) times decode
  tokens per second, over the bandwidth;
- decode tokens/s at 1, 8, 64 and 256 sequences (128 prompt tokens, 256 output tokens) and time
  to first token for 1024- and 4096-token prompts, through the plugin (`engine-gpu-bench`);
- the same through `transformers` (bf16, SDPA attention, static shapes as it likes them):
  decode rate from the difference between 256 and 1 new tokens, time to first token from
  1 new token.

Writes OUT.json and OUT.md.

    python bench/gpu/speed.py --dist bench/gpu/dist --work DIR --out bench/results/gpu
"""

import argparse
import json
import pathlib
import statistics
import subprocess
import time

import models
import torch
from safetensors import safe_open
from transformers import AutoModelForCausalLM

PRESETS = ["llama-3.2-1b", "llama-3.1-8b"]
CONCURRENCY = [1, 8, 64, 256]
PROMPT, OUTPUT = 128, 256

parser = argparse.ArgumentParser()
parser.add_argument("--dist", type=pathlib.Path, required=True)
parser.add_argument("--work", type=pathlib.Path, required=True)
parser.add_argument("--out", type=pathlib.Path, required=True)
parser.add_argument("--presets", default=",".join(PRESETS))
parser.add_argument("--no-peer", action="store_true", help="skip transformers (quicker reruns)")
args = parser.parse_args()
device = "cuda"


def bandwidth():
    n = 2 << 30
    src = torch.empty(n, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    best = float("inf")
    for _ in range(20):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dst.copy_(src)
        end.record()
        torch.cuda.synchronize()
        best = min(best, start.elapsed_time(end) / 1000)
    del src, dst
    torch.cuda.empty_cache()
    return 2 * n / best


def step_bytes(folder):
    config = json.loads((folder / "config.json").read_text())
    total, embed = 0, 0
    for file in folder.glob("*.safetensors"):
        with safe_open(file, "pt") as f:
            for name in f.keys():
                tensor = f.get_slice(name)
                size = 2
                for d in tensor.get_shape():
                    size *= d
                total += size
                if name == "model.embed_tokens.weight":
                    embed = size
    return total if config.get("tie_word_embeddings") else total - embed


def make(preset):
    return models.make(args.dist, args.work, preset)


def ours(folder):
    out = args.work / f"{folder.name}-turnpike.json"
    subprocess.run([str(args.dist / "engine-gpu-bench"), str(args.dist / "libturnpike_cuda.so"), str(folder), str(out)],
                   check=True)
    return json.loads(out.read_text())


def profile(folder):
    """Where a decode step's time goes (turnpike-cuda-profile), at 1..256 sequences."""
    done = subprocess.run([str(args.dist / "turnpike-cuda-profile"), str(folder)], check=True,
                          capture_output=True, text=True)
    return json.loads(done.stdout)["profiles"]


def profile_lines(profiles):
    """A table of each part's microseconds per step, and each product's GB/s."""
    parts = []
    for p in profiles:
        parts += [line["part"] for line in p["lines"] if line["part"] not in parts]
    lines = ["| part (µs per step) | " + " | ".join(f"{p['batch']} seq" for p in profiles) + " |",
             "|---|" + "---:|" * len(profiles)]
    for name in parts:
        cells = []
        for p in profiles:
            part = next((line for line in p["lines"] if line["part"] == name), None)
            if part is None:
                cells.append("")
                continue
            rate = f" ({part['weight_bytes'] / part['micros'] / 1e3:.0f} GB/s)" if part["weight_bytes"] else ""
            cells.append(f"{part['micros']:.1f}{rate}")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines


def peer(folder):
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16, attn_implementation="sdpa").to(device).eval()
    generator = torch.Generator().manual_seed(3)

    def timed(batch, length, new):
        ids = torch.randint(5, 668, (batch, length), generator=generator).to(device)
        torch.cuda.synchronize()
        start = time.perf_counter()
        with torch.no_grad():
            model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, min_new_tokens=new,
                           do_sample=False, pad_token_id=0)
        torch.cuda.synchronize()
        return time.perf_counter() - start

    timed(1, 16, 4)
    results = {}
    for c in CONCURRENCY:
        try:
            first = statistics.median(timed(c, PROMPT, 1) for _ in range(3))
            full = statistics.median(timed(c, PROMPT, OUTPUT) for _ in range(2))
            results[f"decode_{c}_tokens_per_s"] = c * (OUTPUT - 1) / (full - first)
        except torch.OutOfMemoryError:
            results[f"decode_{c}_tokens_per_s"] = None
            torch.cuda.empty_cache()
    for name, length in (("ttft_1k_ms", 1024), ("ttft_4k_ms", 4096)):
        results[name] = statistics.median(timed(1, length, 1) for _ in range(5)) * 1000
    del model
    torch.cuda.empty_cache()
    return results


gpu = torch.cuda.get_device_name(0)
bw = bandwidth()
print(f"{gpu}: copy bandwidth {bw / 1e9:.0f} GB/s")
doc = {"benchmark": "gpu", "gpu": gpu, "bandwidth_bytes_per_s": bw, "torch": torch.__version__, "presets": {}}


def write():
    """Writes what is measured so far, so a run cut short still leaves its figures."""
    lines = [f"# Default engine, CUDA device, on {gpu}", "",
             f"Measured copy bandwidth: {bw / 1e9:.0f} GB/s. Random bf16 weights; {PROMPT} prompt tokens, "
             f"{OUTPUT} output tokens per sequence. Speedup > 1 means Turnpike is faster.", ""]
    for preset, entry in doc["presets"].items():
        a, b = entry["turnpike"], entry.get("transformers") or {}
        weights, fraction = entry["step_weight_bytes"], entry["batch1_bandwidth_fraction"]
        lines += [f"## {preset}", "", f"Weights read per decode step: {weights / 1e9:.2f} GB. Batch-1 decode at "
                  f"{fraction:.0%} of the bandwidth limit ({bw / weights:.0f} steps/s).", "",
                  "| measure | Turnpike | transformers | speedup |", "|---|---:|---:|---:|"]
        for c in CONCURRENCY:
            key = f"decode_{c}_tokens_per_s"
            theirs = b.get(key)
            ratio = f"{a[key] / theirs:.2f}x" if theirs else "n/a"
            lines.append(f"| decode, {c} sequences (tokens/s) | {a[key]:.0f} | {theirs or 0:.0f} | {ratio} |")
        for key, label in (("ttft_1k_ms", "time to first token, 1k prompt (ms)"),
                           ("ttft_4k_ms", "time to first token, 4k prompt (ms)")):
            theirs = b.get(key)
            ratio = f"{theirs / a[key]:.2f}x" if theirs else "n/a"
            lines.append(f"| {label} | {a[key]:.1f} | {theirs or 0:.1f} | {ratio} |")
        lines.append("")
        if entry.get("profile"):
            lines += [f"Where a decode step's time goes (`turnpike-cuda-profile`, contexts of "
                      f"{entry['profile'][0]['context']} tokens):", ""] + profile_lines(entry["profile"]) + [""]
    args.out.with_suffix(".json").write_text(json.dumps(doc, indent=2))
    args.out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    return lines


for preset in args.presets.split(","):
    folder = make(preset)
    weights = step_bytes(folder)
    a = ours(folder)
    fraction = a["decode_1_tokens_per_s"] * weights / bw
    doc["presets"][preset] = {"step_weight_bytes": weights, "turnpike": a, "transformers": None,
                              "batch1_bandwidth_fraction": fraction}
    write()
    doc["presets"][preset]["profile"] = profile(folder)
    write()
    if not args.no_peer:
        doc["presets"][preset]["transformers"] = peer(folder)
        write()
print("\n".join(write()))
