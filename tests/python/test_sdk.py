"""The official `openai` SDK against the real gateway, unchanged (run under both SDK majors)."""

import base64
import json
import struct

import httpx
import openai
import pydantic
import pytest

from conftest import TOOL_CALL, engine_counter, wait_for

HELLO = [{"role": "user", "content": "Hello there"}]


def test_models(client):
    ids = [m.id for m in client.models.list()]
    assert {"chat", "echo", "slow"} <= set(ids)
    model = client.models.retrieve("echo")
    assert (model.id, model.object, model.owned_by) == ("echo", "model", "tests")
    with pytest.raises(openai.NotFoundError) as err:
        client.models.retrieve("gpt-nope")
    assert err.value.body["code"] == "model_not_found"


def test_chat(client):
    r = client.chat.completions.create(model="chat", messages=HELLO, max_tokens=30)
    choice = r.choices[0]
    assert isinstance(choice.message.content, str) and choice.message.content
    assert choice.message.role == "assistant"
    assert choice.finish_reason in ("stop", "length")
    assert r.system_fingerprint.startswith("fp_")
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    assert 0 < r.usage.completion_tokens <= 30


def test_chat_is_reproducible_with_a_seed(client):
    answers = {
        client.chat.completions.create(model="chat", messages=HELLO, seed=1234, max_tokens=20).choices[0].message.content
        for _ in range(2)
    }
    assert len(answers) == 1


def test_chat_stream_with_usage(client):
    stream = client.chat.completions.create(
        model="chat", messages=HELLO, max_tokens=20, stream=True, stream_options={"include_usage": True}
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert len({(c.id, c.created, c.model) for c in chunks}) == 1
    finishes = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finishes) == 1
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens > 0
    assert all(c.usage is None for c in chunks[:-1])


def test_chat_stream_helper(client):
    # The strict helper checks event order and indexes; the echo model ends its turn itself.
    with client.chat.completions.stream(model="echo", messages=[{"role": "user", "content": "Repeat me"}]) as stream:
        deltas = [e.delta for e in stream if e.type == "content.delta"]
        final = stream.get_final_completion()
    text = final.choices[0].message.content
    assert text == "user\n\nRepeat me"
    assert "".join(deltas) == text
    assert final.choices[0].finish_reason == "stop"


def test_stop_strings_that_span_tokens_are_cut(client):
    r = client.chat.completions.create(
        model="echo", messages=[{"role": "user", "content": "alpha beta gamma delta"}], stop=["ta gam", "zzz"]
    )
    assert r.choices[0].message.content == "user\n\nalpha be"
    assert r.choices[0].finish_reason == "stop"
    streamed = client.chat.completions.create(
        model="echo", messages=[{"role": "user", "content": "alpha beta gamma delta"}], stop=["ta gam"], stream=True
    )
    assert "".join(c.choices[0].delta.content or "" for c in streamed if c.choices) == "user\n\nalpha be"


def test_several_choices_streamed(client):
    stream = client.chat.completions.create(model="chat", messages=HELLO, n=3, max_tokens=10, stream=True)
    by_index = {}
    for chunk in stream:
        for choice in chunk.choices:
            by_index.setdefault(choice.index, []).append(choice)
    assert sorted(by_index) == [0, 1, 2]
    for choices in by_index.values():
        assert choices[0].delta.role == "assistant"
        assert sum(1 for c in choices if c.finish_reason) == 1


def test_chat_logprobs(client):
    r = client.chat.completions.create(model="chat", messages=HELLO, max_tokens=8, logprobs=True, top_logprobs=3)
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens or len(content) == r.usage.completion_tokens - 1
    for token in content:
        assert token.logprob <= 0 and len(token.top_logprobs) == 3
    streamed = client.chat.completions.create(
        model="chat", messages=HELLO, max_tokens=8, logprobs=True, top_logprobs=2, stream=True
    )
    tokens = [t for c in streamed if c.choices and c.choices[0].logprobs for t in c.choices[0].logprobs.content]
    assert tokens and all(len(t.top_logprobs) == 2 for t in tokens)


WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
WEATHER_QUESTION = [{"role": "user", "content": "Weather in Paris?"}]


def test_tool_calls_streamed_and_not(client):
    r = client.chat.completions.create(model="tools", messages=WEATHER_QUESTION, tools=[WEATHER_TOOL])
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.id.startswith("call_") and call.type == "function"
    assert (call.function.name, json.loads(call.function.arguments)) == ("get_weather", {"city": "Paris"})

    calls = {}
    finishes = []
    for chunk in client.chat.completions.create(
        model="tools", messages=WEATHER_QUESTION, tools=[WEATHER_TOOL], stream=True
    ):
        delta = chunk.choices[0].delta
        for piece in delta.tool_calls or []:
            entry = calls.setdefault(piece.index, {"id": piece.id, "name": piece.function.name, "arguments": ""})
            entry["arguments"] += piece.function.arguments or ""
        if chunk.choices[0].finish_reason:
            finishes.append(chunk.choices[0].finish_reason)
    assert finishes == ["tool_calls"]
    assert [(c["name"], c["arguments"]) for c in calls.values()] == [(call.function.name, call.function.arguments)]
    assert calls[0]["id"].startswith("call_")

    # Offered nothing to call, the model's words are just text.
    plain = client.chat.completions.create(model="tools", messages=WEATHER_QUESTION)
    assert plain.choices[0].message.content == TOOL_CALL and plain.choices[0].finish_reason == "stop"


def test_tool_call_stream_helper_parses_arguments(client):
    class GetWeather(pydantic.BaseModel):
        city: str

    tool = openai.pydantic_function_tool(GetWeather, name="get_weather")
    with client.chat.completions.stream(model="tools", messages=WEATHER_QUESTION, tools=[tool]) as stream:
        done = [e for e in stream if e.type == "tool_calls.function.arguments.done"]
        final = stream.get_final_completion()
    assert [e.name for e in done] == ["get_weather"]
    (call,) = final.choices[0].message.tool_calls
    assert call.function.parsed_arguments == GetWeather(city="Paris")


@pytest.mark.parametrize(
    "prompt, prompts",
    [("Once upon a time", 1), (["Once", "Twice"], 2), ([5, 6, 7], 1), ([[5, 6], [7, 8, 9]], 2)],
)
def test_completion_prompt_forms(client, prompt, prompts):
    r = client.completions.create(model="chat", prompt=prompt, max_tokens=5, n=2)
    assert r.object == "text_completion"
    assert [c.index for c in r.choices] == list(range(prompts * 2))
    assert all(c.finish_reason in ("stop", "length") for c in r.choices)


def test_completion_echo_and_logprobs(client):
    echoed = client.completions.create(model="echo", prompt="Say it back", echo=True, max_tokens=30)
    assert echoed.choices[0].text.startswith("Say it back")
    r = client.completions.create(model="chat", prompt="Once", max_tokens=6, logprobs=2)
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset)
    assert all(len(alternatives) == 2 for alternatives in lp.top_logprobs)
    stream = client.completions.create(model="chat", prompt="Once", max_tokens=6, stream=True)
    assert sum(1 for c in stream if c.choices[0].finish_reason) == 1


def test_embeddings_base64_by_default_and_float(client, gateway):
    # The SDK asks for base64 by default and decodes it.
    default = client.embeddings.create(model="chat", input=["hello", "world"])
    assert [d.index for d in default.data] == [0, 1]
    vector = default.data[0].embedding
    assert len(vector) == 64 and abs(sum(x * x for x in vector) - 1) < 1e-3
    floats = client.embeddings.create(model="chat", input="hello", encoding_format="float")
    assert floats.data[0].embedding == pytest.approx(vector, abs=1e-6)
    raw = httpx.post(f"{gateway}/v1/embeddings", json={"model": "chat", "input": "hello", "encoding_format": "base64"})
    decoded = struct.unpack("<64f", base64.b64decode(raw.json()["data"][0]["embedding"]))
    assert list(decoded) == pytest.approx(vector, abs=1e-6)
    short = client.embeddings.create(model="chat", input=[[5, 6, 7]], dimensions=8)
    assert len(short.data[0].embedding) == 8
    assert short.usage.prompt_tokens == 3


def test_a_client_that_goes_away_cancels_the_engine_request(client, gateway):
    before = engine_counter(gateway, "cancelled")
    stream = client.chat.completions.create(model="slow", messages=HELLO, max_tokens=200, stream=True)
    iterator = iter(stream)
    next(iterator)
    next(iterator)
    stream.close()
    assert wait_for(lambda: engine_counter(gateway, "cancelled") > before), "streamed request not cancelled"
    # Also a non-streamed request, abandoned before its first token.
    before = engine_counter(gateway, "cancelled")
    with pytest.raises(httpx.TimeoutException):
        httpx.post(
            f"{gateway}/v1/chat/completions",
            json={"model": "slow", "messages": HELLO, "max_tokens": 200},
            timeout=0.02,
        )
    assert wait_for(lambda: engine_counter(gateway, "cancelled") > before), "non-streamed request not cancelled"


def test_each_error_class_raised_by_the_sdk(client):
    cases = [
        (openai.BadRequestError, dict(model="chat", messages=HELLO, temperature=5), "temperature"),
        (openai.BadRequestError, dict(model="chat", messages=HELLO, max_tokens=100_000), "max_tokens"),
        (openai.NotFoundError, dict(model="absent", messages=HELLO), "model"),
        (
            openai.BadRequestError,
            dict(model="chat", messages=HELLO, response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": [1]}}),
            "response_format.json_schema.schema",
        ),
        (openai.RateLimitError, dict(model="overloaded", messages=HELLO), None),
        (openai.InternalServerError, dict(model="down", messages=HELLO), None),
        (openai.InternalServerError, dict(model="broken", messages=HELLO), None),
    ]
    for error, kwargs, param in cases:
        with pytest.raises(error) as raised:
            client.chat.completions.create(**kwargs)
        body = raised.value.body
        assert set(body) >= {"message", "type", "param", "code"}, body
        if param:
            assert body["param"] == param
    with pytest.raises(openai.RateLimitError) as raised:
        client.chat.completions.create(model="overloaded", messages=HELLO, stream=True)
    assert raised.value.response.headers["retry-after"] and raised.value.response.headers["retry-after-ms"]
    with pytest.raises(openai.APIStatusError) as raised:
        client.chat.completions.create(model="chat", messages=[{"role": "user", "content": "x" * 300_000}])
    assert raised.value.status_code == 413
    with pytest.raises(openai.BadRequestError) as raised:
        client.chat.completions.create(model="chat", messages=[{"role": "user", "content": "river " * 9000}])
    assert raised.value.body["code"] == "context_length_exceeded"
