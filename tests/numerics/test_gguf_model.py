"""The default engine serving a model from a GGUF file, against Hugging Face `transformers`.

The test converts the project's own model folders into GGUF as llama.cpp's converter lays them out
(`llama` query and key rows interleaved per head, `qwen2` left as is, the configuration in the
metadata), quantized with ggml's own `gguf` package; `transformers` then runs a copy of the folder
holding exactly the dequantized weights. The engine reads the GGUF file and nothing else, so the
metadata, the tensor names, the rotary layout and the dequantization are all checked end to end.
"""

import json
import shutil
from pathlib import Path

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from safetensors.numpy import load_file, save_file
from test_numerics import TOLERANCE, engine, hf_greedy, hf_last_logits, load_hf, make, prompts, rel_err

NAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}
TOP = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight", "lm_head.weight": "output.weight"}


def gguf_name(name: str) -> str:
    if name in TOP:
        return TOP[name]
    layer, part = name.removeprefix("model.layers.").split(".", 1)
    return f"blk.{layer}.{NAMES[part]}"


def interleave(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's order for a `llama` query or key projection: each head's two rotary halves
    interleaved."""
    half = w.shape[0] // heads // 2
    return w.reshape(heads, 2, half, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def deinterleave(w: np.ndarray, heads: int) -> np.ndarray:
    half = w.shape[0] // heads // 2
    return w.reshape(heads, half, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def convert(folder: Path, out: Path, qtype: Q) -> tuple[Path, Path]:
    """`folder` as a GGUF file (matrices as `qtype`, vectors as F32), and a copy of the folder
    holding the weights that file dequantizes to."""
    config = json.loads((folder / "config.json").read_text())
    # Plain rotary embeddings only: Llama 3 scaling travels as llama.cpp's `rope_freqs.weight`
    # tensor, which test_llama_cpp_files.py checks on files llama.cpp's own converter writes.
    assert not config.get("rope_scaling"), "convert plain-rotary models only"
    arch = config["model_type"]
    heads, kv_heads = config["num_attention_heads"], config.get("num_key_value_heads") or config["num_attention_heads"]
    out.mkdir(parents=True)
    path = out / f"model-{qtype.name}.gguf"
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    if config.get("head_dim"):
        writer.add_key_length(config["head_dim"])
        writer.add_value_length(config["head_dim"])
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    writer.add_rope_freq_base(config.get("rope_theta", 10000.0))
    writer.add_vocab_size(config["vocab_size"])
    eos = config.get("eos_token_id")
    if isinstance(eos, int):
        writer.add_eos_token_id(eos)
    dequantized = {}
    for name, w in load_file(str(folder / "model.safetensors")).items():
        w = w.astype(np.float32)
        stored = w
        if arch == "llama" and name.endswith(("q_proj.weight", "q_proj.bias")):
            stored = interleave(w, heads)
        elif arch == "llama" and name.endswith(("k_proj.weight", "k_proj.bias")):
            stored = interleave(w, kv_heads)
        kind = qtype if w.ndim == 2 and w.shape[1] % 32 == 0 else Q.F32
        raw = gguf.quants.quantize(stored, kind)
        if kind in (Q.F32, Q.F16):
            raw = raw.view(np.uint8)
        writer.add_tensor(gguf_name(name), raw, raw_dtype=kind)
        back = gguf.quants.dequantize(raw, kind).reshape(w.shape).astype(np.float32)
        if stored is not w:
            back = deinterleave(back, heads if "q_proj" in name else kv_heads)
        dequantized[name] = back
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    reference = out / "dequantized"
    shutil.copytree(folder, reference)
    save_file(dequantized, str(reference / "model.safetensors"))
    return path, reference


CASES = [("tiny", Q.F32), ("tiny", Q.Q8_0), ("tiny", Q.F16), ("tiny-qwen2", Q.Q4_0), ("tiny-qwen2", Q.Q8_0)]


def plain_rotary(tmp: Path, preset: str) -> Path:
    """The preset's folder with plain rotary embeddings (see `convert`)."""
    folder = make(tmp, preset)
    config = json.loads((folder / "config.json").read_text())
    config.pop("rope_scaling", None)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


@pytest.fixture(scope="module", params=CASES, ids=[f"{p}-{q.name}" for p, q in CASES])
def converted(request, tmp_path_factory):
    preset, qtype = request.param
    tmp = tmp_path_factory.mktemp("gguf-models")
    folder = plain_rotary(tmp, preset)
    path, reference = convert(folder, tmp / "converted", qtype)
    return folder, path, load_hf(reference)


def test_logits_match_transformers_on_the_dequantized_weights(converted):
    _, path, hf = converted
    batch = prompts(11, [1, 9, 40, 130])
    runs = engine(path, [{"prompts": [p]} for p in batch])
    for prompt, run in zip(batch, runs):
        err = rel_err(run["results"][0]["logits"], hf_last_logits(hf, prompt))
        assert err < TOLERANCE, f"prompt of {len(prompt)} tokens: relative error {err:.2e}"


def test_greedy_tokens_are_identical(converted):
    _, path, hf = converted
    batch = prompts(12, [10, 33])
    [run] = engine(path, [{"prompts": batch, "generate": 24}], block_size=8)
    for prompt, result in zip(batch, run["results"]):
        assert result["tokens"] == hf_greedy(hf, prompt, 24)


@pytest.mark.parametrize("preset", ["tiny", "tiny-qwen2"])
def test_an_f32_file_computes_what_its_folder_does(preset, tmp_path):
    folder = plain_rotary(tmp_path, preset)
    path, _ = convert(folder, tmp_path / "converted", Q.F32)
    batch = prompts(13, [20, 70])
    [from_file] = engine(path, [{"prompts": batch}])
    [from_folder] = engine(folder, [{"prompts": batch}])
    for a, b in zip(from_file["results"], from_folder["results"]):
        assert a["logits"] == b["logits"]


def test_what_the_engine_cannot_serve_is_named(tmp_path):
    from test_numerics import REFERENCE
    import subprocess

    def refusal(arch: str, extra=lambda w: None) -> str:
        path = tmp_path / f"{arch}.gguf"
        writer = gguf.GGUFWriter(str(path), arch)
        extra(writer)
        writer.add_tensor("token_embd.weight", np.zeros((8, 32), dtype=np.float32))
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        request = json.dumps({"model": str(path), "runs": []})
        out = subprocess.run([str(REFERENCE)], input=request, capture_output=True, text=True)
        assert out.returncode != 0
        return out.stderr

    assert "GGUF architecture `gemma`" in refusal("gemma")
