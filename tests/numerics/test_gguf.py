"""The default engine's GGUF reader and dequantizers against ggml's own Python package (`gguf`):
files the `gguf` writer makes, with random tensors of every type the engine loads, read back by
`turnpike-gguf` and compared with `gguf.quants.dequantize`. No model download: the tests write
their files.
"""

import json
import os
import subprocess
from pathlib import Path

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(os.environ.get("TURNPIKE_BIN", ROOT / "target/debug/turnpike"))
TOOL = BIN.parent / "turnpike-gguf"

# Types the gguf package can quantize itself, and K- and IQ4 quants, whose blocks the test makes.
QUANTIZED = [Q.F32, Q.F16, Q.BF16, Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1]
# Where each random block's f16 scales sit, and their size.
K_QUANTS = {
    Q.Q4_K: [(0, 0.02), (2, 0.01)],
    Q.Q5_K: [(0, 0.02), (2, 0.01)],
    Q.Q6_K: [(208, 0.003)],
    Q.Q2_K: [(80, 0.02), (82, 0.01)],
    Q.Q3_K: [(108, 0.02)],
    Q.IQ4_NL: [(0, 0.02)],
    Q.IQ4_XS: [(0, 0.02)],
}


def run(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run([str(TOOL), *args], capture_output=True, text=True, check=check)


def raw_k_quant(qtype: Q, rows: int, cols: int, rng: np.random.Generator) -> np.ndarray:
    """Random blocks of a K-quant with finite, moderate f16 scales at their places."""
    block_values, block_bytes = gguf.GGML_QUANT_SIZES[qtype]
    blocks = rng.integers(0, 256, size=(rows * cols // block_values, block_bytes), dtype=np.uint8)
    for offset, scale in K_QUANTS[qtype]:
        d = (rng.random(len(blocks)) * scale + scale / 10).astype(np.float16)
        blocks[:, offset : offset + 2] = d.view(np.uint8).reshape(-1, 2)
    return blocks.reshape(rows, -1)


def write(path: Path, tensors: dict, metadata=lambda w: None) -> None:
    writer = gguf.GGUFWriter(str(path), "llama")
    metadata(writer)
    for name, (raw, qtype, shape) in tensors.items():
        writer.add_tensor(name, raw, raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.fixture(scope="module")
def typed_file(tmp_path_factory):
    """One file with a random 8 x 512 tensor of every loaded type, and its expected values."""
    rng = np.random.default_rng(7)
    rows, cols = 8, 512
    tensors, expected = {}, {}
    for qtype in QUANTIZED:
        values = rng.standard_normal((rows, cols)).astype(np.float32)
        raw = gguf.quants.quantize(values, qtype)
        if qtype in (Q.F32, Q.F16):
            raw = raw.view(np.uint8)
        tensors[qtype.name] = (raw, qtype, (rows, cols))
    for qtype in K_QUANTS:
        tensors[qtype.name] = (raw_k_quant(qtype, rows, cols, rng), qtype, (rows, cols))
    for name, (raw, qtype, shape) in tensors.items():
        expected[name] = gguf.quants.dequantize(raw, qtype).reshape(shape).astype(np.float32)
    path = tmp_path_factory.mktemp("gguf") / "typed.gguf"
    write(path, tensors)
    return path, expected


@pytest.mark.parametrize("kind", [q.name for q in QUANTIZED + list(K_QUANTS)])
def test_every_loaded_type_dequantizes_as_ggml_does(typed_file, kind):
    path, expected = typed_file
    out = json.loads(run("dequantize", str(path), kind).stdout)
    (tensor,) = out["tensors"]
    assert tensor["type"] == kind
    assert tensor["shape"] == list(expected[kind].shape)
    ours = np.asarray(tensor["values"], dtype=np.float32).reshape(expected[kind].shape)
    reference = expected[kind]
    scale = float(np.abs(reference).max())
    np.testing.assert_allclose(ours, reference, rtol=1e-6, atol=scale * 1e-6)


def test_metadata_and_the_tensor_table_read_back(tmp_path):
    def metadata(w):
        w.add_uint32("llama.block_count", 30)
        w.add_float32("llama.rope.freq_base", 100000.0)
        w.add_bool("tokenizer.ggml.add_bos_token", False)
        w.add_string("tokenizer.chat_template", "{{ messages }}")
        w.add_array("tokenizer.ggml.tokens", ["<|im_start|>", "a", "ü"])
        w.add_array("tokenizer.ggml.token_type", [3, 1, 1])

    values = np.arange(6, dtype=np.float32).reshape(2, 3)
    path = tmp_path / "meta.gguf"
    write(path, {"w": (values.view(np.uint8), Q.F32, (2, 3))}, metadata)
    info = json.loads(run("info", str(path)).stdout)
    meta = info["metadata"]
    assert info["version"] == 3
    assert meta["general.architecture"] == "llama"
    assert meta["llama.block_count"] == 30
    assert meta["llama.rope.freq_base"] == 100000.0
    assert meta["tokenizer.ggml.add_bos_token"] is False
    assert meta["tokenizer.chat_template"] == "{{ messages }}"
    assert meta["tokenizer.ggml.tokens"] == ["<|im_start|>", "a", "ü"]
    assert meta["tokenizer.ggml.token_type"] == [3, 1, 1]
    assert info["tensors"] == [{"name": "w", "shape": [2, 3], "type": "F32"}]
    (tensor,) = json.loads(run("dequantize", str(path)).stdout)["tensors"]
    assert tensor["values"] == values.ravel().tolist()


def test_a_type_the_engine_does_not_load_is_named(tmp_path):
    values = np.random.default_rng(1).standard_normal((4, 64)).astype(np.float32)
    path = tmp_path / "iq2.gguf"
    K_QUANTS[Q.IQ2_XXS] = [(0, 0.02)]
    raw = raw_k_quant(Q.IQ2_XXS, 4, 256, np.random.default_rng(1))
    del K_QUANTS[Q.IQ2_XXS]
    write(path, {"blk.0.ffn_up.weight": (raw, Q.IQ2_XXS, (4, 256))})
    info = json.loads(run("info", str(path)).stdout)
    assert info["tensors"][0]["type"] == "IQ2_XXS"
    failed = run("dequantize", str(path), check=False)
    assert failed.returncode == 1
    assert "`blk.0.ffn_up.weight` is IQ2_XXS" in failed.stderr
    assert "Q4_K" in failed.stderr  # it says what it does load


def test_a_file_that_is_not_gguf_or_is_cut_short_is_an_error(tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a gguf file at all")
    failed = run("info", str(bad), check=False)
    assert failed.returncode == 1 and "not a GGUF file" in failed.stderr
    values = np.zeros((4, 64), dtype=np.float32)
    whole = tmp_path / "whole.gguf"
    write(whole, {"w": (values.view(np.uint8), Q.F32, (4, 64))})
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(whole.read_bytes()[:-100])
    failed = run("info", str(cut), check=False)
    assert failed.returncode == 1 and "past the end" in failed.stderr
