"""The peer of `engine-bench`: the same workloads through Hugging Face `transformers`
(`generate`, greedy, f32, eager attention, every core) on the same model folder.

Usage: python engine_peer.py MODEL_DIR OUT_JSON
"""

import json
import os
import statistics
import sys
import time

import numpy as np
import torch
from transformers import AutoModelForCausalLM

RUNS = 5
torch.set_num_threads(os.cpu_count() or 1)
model_dir, out = sys.argv[1], sys.argv[2]
if model_dir.endswith(".gguf"):
    # transformers dequantizes a GGUF file to f32 (the engine keeps its quantized codes).
    folder, name = os.path.split(os.path.abspath(model_dir))
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32, attn_implementation="eager").eval()
else:
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="eager").eval()
rng = np.random.default_rng(7)


def prompts(n, length):
    return torch.tensor(rng.integers(5, 668, size=(n, length)))


@torch.no_grad()
def generate(ids, new_tokens):
    start = time.perf_counter()
    model.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=new_tokens,
        min_new_tokens=new_tokens,
        do_sample=False,
        pad_token_id=0,
    )
    return time.perf_counter() - start


generate(prompts(1, 64), 4)
prefill, decode_1, decode_16, ttft = [], [], [], []
for _ in range(RUNS):
    prefill.append(512 / generate(prompts(1, 512), 1))
    decode_1.append(128 / generate(prompts(1, 16), 128))
    decode_16.append(16 * 128 / generate(prompts(16, 16), 128))
    ttft.append(generate(prompts(1, 512), 1) * 1000)
results = {
    "runs": RUNS,
    "statistic": "median",
    "torch": torch.__version__,
    "threads": torch.get_num_threads(),
    "prefill_tokens_per_s": statistics.median(prefill),
    "decode_1_tokens_per_s": statistics.median(decode_1),
    "decode_16_tokens_per_s": statistics.median(decode_16),
    # transformers has no cross-request prefix cache: a repeated prompt costs a full prefill.
    "ttft_cold_ms": statistics.median(ttft),
    "ttft_prefix_hit_ms": statistics.median(ttft),
}
with open(out, "w") as f:
    json.dump(results, f, indent=2)
print(json.dumps(results))
