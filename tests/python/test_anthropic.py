"""Anthropic's Messages API on the real binary, driven by the official `anthropic` SDK: create,
the stream helper and its final message, the raw event sequence, stop reasons, a tool-use round
trip (streamed and not), thinking blocks, count_tokens equal to `usage.input_tokens`, models in
Anthropic's shape, `x-api-key` on the same tenants, limits and idempotency, and errors raising
the SDK's own exception classes."""

import json
import os
import shutil
import subprocess
from pathlib import Path

import anthropic
import httpx
import pytest
from tokenizers import Tokenizer

from conftest import SCRIPTS, SIM_MODELS, TOKENIZER, TOOL_RESULT
from tenancy_support import Gateway, config_text, make_key

TOKENS = Tokenizer.from_file(str(TOKENIZER))
MODELS = {
    "echo": 'output = { mode = "echo" }',
    "thinker": SIM_MODELS["thinker"] % TOKENS.encode(SCRIPTS["thinker"], add_special_tokens=False).ids,
    "agent": SIM_MODELS["agent"] % TOKENS.encode(TOOL_RESULT, add_special_tokens=False).ids,
    "overloaded": "errors = { overload_rate = 1.0 }",
}
GATEWAY_ENTRIES = {"thinker": "reasoning = {}", "agent": 'tool_call_parser = "llama3_json"'}
WEATHER = {"name": "get_weather", "description": "The weather in a city.",
           "input_schema": {"type": "object", "properties": {"city": {"enum": ["Paris", "Oslo"]}},
                            "required": ["city"]}}
HELLO = [{"role": "user", "content": "Hello there, how are you?"}]


def anthropic_config() -> str:
    text = config_text("""
[auth]
mode = "required"

[tenants.acme]
models = ["*"]
keys = [{ env = "ACME_KEY" }]

[tenants.slow]
models = ["*"]
requests_per_minute = 1
keys = [{ env = "SLOW_KEY" }]
""", MODELS)
    for name, extra in GATEWAY_ENTRIES.items():
        text = text.replace(f'name = "{name}"\nengine = "sim"', f'name = "{name}"\nengine = "sim"\n{extra}')
    return text


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    keys = {"ACME_KEY": make_key(), "SLOW_KEY": make_key()}
    gateway = Gateway(tmp_path_factory.mktemp("anthropic"), anthropic_config(), keys)
    yield gateway, keys
    gateway.stop()


@pytest.fixture
def client(served):
    gateway, keys = served
    return anthropic.Anthropic(base_url=gateway.base, api_key=keys["ACME_KEY"], max_retries=0)


def test_create_answers_a_message_with_exact_usage(client):
    message = client.messages.create(model="echo", max_tokens=200, system="Be brief.", messages=HELLO)
    assert message.type == "message" and message.role == "assistant" and message.id.startswith("msg_")
    assert [b.type for b in message.content] == ["text"] and message.content[0].text
    assert message.stop_reason == "end_turn"
    counted = client.messages.count_tokens(model="echo", system="Be brief.", messages=HELLO)
    assert counted.input_tokens == message.usage.input_tokens > 0
    assert message.usage.output_tokens > 0


def test_the_stream_helper_and_its_final_message(client):
    with client.messages.stream(model="echo", max_tokens=200, messages=HELLO) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text and final.content[0].text == text and final.stop_reason == "end_turn"
    whole = client.messages.create(model="echo", max_tokens=200, messages=HELLO)
    assert whole.content[0].text == text
    assert final.usage.output_tokens == whole.usage.output_tokens


def test_the_event_sequence(client):
    events = list(client.messages.create(model="echo", max_tokens=200, messages=HELLO, stream=True))
    kinds = [e.type for e in events]
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop" and kinds[-2] == "message_delta"
    assert kinds[1] == "content_block_start" and "content_block_delta" in kinds and "content_block_stop" in kinds
    assert events[0].message.usage.input_tokens > 0
    assert events[-2].delta.stop_reason == "end_turn" and events[-2].usage.output_tokens > 0


def test_stop_reasons(client):
    cut = client.messages.create(model="echo", max_tokens=2, messages=HELLO)
    assert cut.stop_reason == "max_tokens" and cut.usage.output_tokens == 2
    stopped = client.messages.create(model="echo", max_tokens=200, messages=HELLO, stop_sequences=["how"])
    assert stopped.stop_reason == "stop_sequence" and stopped.stop_sequence == "how"
    assert "how" not in stopped.content[0].text


def test_a_tool_use_round_trip(client):
    first = client.messages.create(model="agent", max_tokens=200, messages=[{"role": "user", "content": "Weather?"}],
                                   tools=[WEATHER], tool_choice={"type": "tool", "name": "get_weather"})
    assert first.stop_reason == "tool_use"
    use = [b for b in first.content if b.type == "tool_use"][0]
    assert use.name == "get_weather" and use.input["city"] in ("Paris", "Oslo") and use.id.startswith("toolu_")
    with client.messages.stream(model="agent", max_tokens=200, messages=[{"role": "user", "content": "Weather?"}],
                                tools=[WEATHER], tool_choice={"type": "any"}) as stream:
        streamed = stream.get_final_message()
    assert streamed.stop_reason == "tool_use" and [b.type for b in streamed.content][-1] == "tool_use"
    assert isinstance(streamed.content[-1].input, dict)
    conversation = [
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": first.content},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "Sunny, 21 C"}]},
    ]
    answer = client.messages.create(model="agent", max_tokens=200, messages=conversation, tools=[WEATHER])
    assert answer.stop_reason == "end_turn" and answer.content[0].type == "text" and answer.content[0].text


def test_thinking_blocks_only_when_asked(client):
    thought = client.messages.create(model="thinker", max_tokens=200, messages=HELLO,
                                     thinking={"type": "enabled", "budget_tokens": 1024})
    assert [b.type for b in thought.content] == ["thinking", "text"]
    assert thought.content[0].thinking.strip() == "Let me think about it."
    plain = client.messages.create(model="thinker", max_tokens=200, messages=HELLO)
    assert [b.type for b in plain.content] == ["text"] and plain.content[0].text.strip() == "The answer is 4."
    with client.messages.stream(model="thinker", max_tokens=200, messages=HELLO,
                                thinking={"type": "enabled", "budget_tokens": 1024}) as stream:
        final = stream.get_final_message()
    assert [b.type for b in final.content] == ["thinking", "text"]


def test_models_in_anthropic_shape(client):
    listed = client.models.list()
    ids = [m.id for m in listed.data]
    assert "echo" in ids and all(m.type == "model" for m in listed.data)
    assert client.models.retrieve("echo").id == "echo"


def test_errors_raise_the_sdk_classes(served, client):
    gateway, keys = served
    with pytest.raises(anthropic.AuthenticationError) as bad_key:
        anthropic.Anthropic(base_url=gateway.base, api_key=make_key(), max_retries=0).messages.create(
            model="echo", max_tokens=10, messages=HELLO)
    assert bad_key.value.body["error"]["type"] == "authentication_error"
    with pytest.raises(anthropic.NotFoundError):
        client.messages.create(model="nope", max_tokens=10, messages=HELLO)
    with pytest.raises(anthropic.BadRequestError) as image:
        client.messages.create(model="echo", max_tokens=10, messages=[{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}}]}])
    assert "messages[0].content[0]" in image.value.message or "image" in image.value.message
    with pytest.raises(anthropic.OverloadedError) as overloaded:
        client.messages.create(model="overloaded", max_tokens=10, messages=HELLO)
    assert overloaded.value.status_code == 529
    raw = httpx.post(f"{gateway.base}/v1/messages", headers={"x-api-key": keys["ACME_KEY"]},
                     json={"model": "echo", "messages": HELLO}, timeout=10)
    assert raw.status_code == 400 and raw.json()["type"] == "error" and "max_tokens" in raw.json()["error"]["message"]
    slow = anthropic.Anthropic(base_url=gateway.base, api_key=keys["SLOW_KEY"], max_retries=0)
    slow.messages.create(model="echo", max_tokens=5, messages=HELLO)
    with pytest.raises(anthropic.RateLimitError) as limited:
        slow.messages.create(model="echo", max_tokens=5, messages=HELLO)
    assert int(limited.value.response.headers["retry-after"]) >= 1


def test_idempotency_replays_the_same_message(client):
    headers = {"Idempotency-Key": f"idem-{make_key()[3:15]}"}
    first = client.messages.create(model="echo", max_tokens=50, messages=HELLO, extra_headers=headers)
    again = client.messages.create(model="echo", max_tokens=50, messages=HELLO, extra_headers=headers)
    assert again.id == first.id and again.content == first.content
    assert json.loads(again.to_json())["usage"] == json.loads(first.to_json())["usage"]


@pytest.mark.js
def test_the_typescript_sdk_too(served):
    gateway, keys = served
    js = os.environ.get("TURNPIKE_JS")
    assert js, "TURNPIKE_JS is not set: tests/run.sh installs Anthropic's TypeScript SDK under target/js"
    script = Path(js) / "anthropic_sdk.mjs"
    shutil.copyfile(Path(__file__).parents[1] / "js" / "anthropic_sdk.mjs", script)
    run = subprocess.run(["node", str(script)], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "TURNPIKE_BASE": gateway.base, "TURNPIKE_KEY": keys["ACME_KEY"]})
    assert run.returncode == 0, run.stderr
    seen = json.loads(run.stdout)
    assert seen["message"]["stop_reason"] == "end_turn" and seen["message"]["text"]
    assert seen["counted"] == seen["message"]["input_tokens"]
    assert seen["streamed"]["text"] == seen["streamed"]["final_text"] == seen["message"]["text"]
    assert seen["tool"]["stop_reason"] == "tool_use" and seen["tool"]["block"]["type"] == "tool_use"
    assert seen["tool"]["block"]["input"]["city"] in ("Paris", "Oslo")
    assert seen["notFound"] == {"name": "NotFoundError", "status": 404, "type": "not_found_error"}
