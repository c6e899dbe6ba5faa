"""The default engine's model math against Hugging Face `transformers`, on the same weights.

Models come from `turnpike make-model`; the engine side runs through
`turnpike-cuda-reference`, which drives the engine's real scheduler, block manager and CPU
device. Logits are compared at the last prompt position with the relative error
max|engine - hf| / max|hf| (f32 on both sides), and greedy tokens must be identical.
"""

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(os.environ.get("TURNPIKE_BIN", ROOT / "target/debug/turnpike"))
REFERENCE = BIN.parent / "turnpike-cuda-reference"
TOLERANCE = 1e-4
VOCAB = 668

torch.set_num_threads(2)


def make(tmp: Path, preset: str, *extra: str) -> Path:
    out = tmp / "-".join((preset,) + extra).replace("--", "")
    if not out.exists():
        subprocess.run([str(BIN), "make-model", "--preset", preset, "--out", str(out), *extra], check=True)
    return out


@pytest.fixture(scope="module", params=["tiny", "tiny-qwen2"])
def model_dir(request, tmp_path_factory):
    return make(tmp_path_factory.mktemp("models"), request.param)


def load_hf(path: Path):
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32, attn_implementation="eager")
    return model.eval()


@pytest.fixture(scope="module")
def hf(model_dir):
    return load_hf(model_dir)


def prompts(seed: int, lengths):
    rng = np.random.default_rng(seed)
    return [rng.integers(5, VOCAB, size=n).tolist() for n in lengths]


def engine(path: Path, runs, block_size=16, max_batch_tokens=512, activations="exact", max_context=None):
    request = {
        "model": str(path),
        "block_size": block_size,
        "max_batch_tokens": max_batch_tokens,
        "activations": activations,
        "runs": runs,
    }
    if max_context is not None:
        request["max_context"] = max_context
    out = subprocess.run([str(REFERENCE)], input=json.dumps(request), capture_output=True, text=True, check=True)
    return json.loads(out.stdout)["runs"]


@torch.no_grad()
def hf_last_logits(model, prompt):
    return model(torch.tensor([prompt])).logits[0, -1].numpy()


@torch.no_grad()
def hf_greedy(model, prompt, n):
    ids = list(prompt)
    for _ in range(n):
        ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(prompt) :]


def rel_err(ours, theirs):
    ours = np.asarray(ours, dtype=np.float64)
    theirs = np.asarray(theirs, dtype=np.float64)
    assert ours.shape == theirs.shape
    return float(np.max(np.abs(ours - theirs)) / np.max(np.abs(theirs)))


def test_single_prompts(model_dir, hf):
    batch = prompts(1, [1, 7, 16, 33, 120])
    runs = engine(model_dir, [{"prompts": [p]} for p in batch])
    for prompt, run in zip(batch, runs):
        err = rel_err(run["results"][0]["logits"], hf_last_logits(hf, prompt))
        assert err < TOLERANCE, f"prompt of {len(prompt)} tokens: relative error {err:.2e}"


def test_a_batch_of_mixed_lengths(model_dir, hf):
    batch = prompts(2, [5, 64, 17, 200, 1, 48])
    [run] = engine(model_dir, [{"prompts": batch}])
    for prompt, result in zip(batch, run["results"]):
        err = rel_err(result["logits"], hf_last_logits(hf, prompt))
        assert err < TOLERANCE, f"prompt of {len(prompt)} tokens in a batch: relative error {err:.2e}"


def test_chunked_prefill(model_dir, hf):
    [prompt] = prompts(3, [300])
    # 40 tokens a step: the prompt is computed in 8 chunks that do not align with blocks.
    [run] = engine(model_dir, [{"prompts": [prompt]}], block_size=16, max_batch_tokens=40)
    err = rel_err(run["results"][0]["logits"], hf_last_logits(hf, prompt))
    assert err < TOLERANCE, f"chunked prefill: relative error {err:.2e}"


def test_after_a_prefix_cache_hit(model_dir, hf):
    [shared, tail] = prompts(4, [100, 30])
    second = shared[:80] + tail
    first_run, second_run = engine(model_dir, [{"prompts": [shared]}, {"prompts": [second]}], block_size=16)
    assert first_run["results"][0]["cached_tokens"] == 0
    assert second_run["results"][0]["cached_tokens"] == 80
    err = rel_err(second_run["results"][0]["logits"], hf_last_logits(hf, second))
    assert err < TOLERANCE, f"after a prefix hit: relative error {err:.2e}"


def test_a_repeated_prompt_reuses_its_partial_last_block(model_dir, hf):
    # 37 tokens: two full blocks and 5 tokens of a third, which the first run fills with the
    # tokens it generates. The second run takes all but the last prompt token from the cache,
    # below the block, and computes that one token into a copy of the cached block.
    [prompt] = prompts(5, [37])
    first, again = engine(model_dir, [{"prompts": [prompt], "generate": 20}, {"prompts": [prompt]}], block_size=16)
    assert first["results"][0]["cached_tokens"] == 0
    assert again["results"][0]["cached_tokens"] == 36
    err = rel_err(again["results"][0]["logits"], hf_last_logits(hf, prompt))
    assert err < TOLERANCE, f"after reuse below the block: relative error {err:.2e}"


def test_reuse_is_token_granular(model_dir, hf):
    # The first run ends inside its third block (37 prompt tokens and 2 generated): that partial
    # block stays matchable, so the same prompt again computes its last token only, and a
    # prompt that leaves it after 40 tokens reuses those 40.
    [prompt, other] = prompts(6, [37, 12])
    first, again = engine(model_dir, [{"prompts": [prompt], "generate": 2}, {"prompts": [prompt]}], block_size=16)
    assert again["results"][0]["cached_tokens"] == 36
    err = rel_err(again["results"][0]["logits"], hf_last_logits(hf, prompt))
    assert err < TOLERANCE, f"after reuse of a partial block: relative error {err:.2e}"
    seen = prompt + first["results"][0]["tokens"][:1]
    diverging = seen[:38] + other
    _, later = engine(model_dir, [{"prompts": [prompt], "generate": 2}, {"prompts": [diverging]}], block_size=16)
    assert later["results"][0]["cached_tokens"] == 38
    err = rel_err(later["results"][0]["logits"], hf_last_logits(hf, diverging))
    assert err < TOLERANCE, f"after a divergence inside a block: relative error {err:.2e}"


def test_32_greedy_tokens_are_identical(model_dir, hf):
    batch = prompts(5, [12, 40])
    [run] = engine(model_dir, [{"prompts": batch, "generate": 32}], block_size=8)
    for prompt, result in zip(batch, run["results"]):
        assert result["tokens"] == hf_greedy(hf, prompt, 32)


@pytest.mark.parametrize("dtype", ["bf16", "f16"])
def test_half_precision_sharded_weights_load_and_match(tmp_path, dtype):
    path = make(tmp_path, "tiny", "--dtype", dtype, "--shard-mib", "0.05")
    assert (path / "model.safetensors.index.json").exists()
    model = load_hf(path)
    [prompt] = prompts(6, [50])
    [run] = engine(path, [{"prompts": [prompt]}])
    err = rel_err(run["results"][0]["logits"], hf_last_logits(model, prompt))
    assert err < TOLERANCE, f"{dtype} weights: relative error {err:.2e}"
