"""Forced tool calls through the default engine (CPU device): `tool_choice: "required"` or a
named function become a grammar that writes the model's own tool-call envelope (`hermes`
blocks, a `llama3_json` call, or `mistral`'s `[TOOL_CALLS]` control token and call list; two
mistral models: one whose tokenizer has the token, one that writes it as text) with the
function's parameters schema applied to the arguments, so the gateway's parsers return real `tool_calls`, streamed and not. The `tiny`
model's weights are random: nothing but the grammar makes it call anything. Official SDK."""

import json
import shutil
import subprocess
from typing import Literal

import jsonschema
import openai
import pytest
from pydantic import BaseModel, Field

from conftest import BIN
from tenancy_support import Gateway
from test_default_engine import PLUGIN

WEATHER = {
    "type": "object",
    "properties": {"city": {"enum": ["Paris", "Oslo"]}, "days": {"type": "integer", "minimum": 1, "maximum": 7}},
    "required": ["city", "days"],
    "additionalProperties": False,
}
TIME = {
    "type": "object",
    "properties": {"tz": {"type": "string", "pattern": "^[A-Z]{3}$"}},
    "required": ["tz"],
    "additionalProperties": False,
}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER, "strict": True}},
    {"type": "function", "function": {"name": "get_time", "parameters": TIME}},
]
SCHEMAS = {"get_weather": WEATHER, "get_time": TIME}
MESSAGES = [{"role": "user", "content": "What should I pack?"}]
FORMATS = ["hermes", "llama3_json", "mistral", "mistral-text"]


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    work = tmp_path_factory.mktemp("forced-calls")
    model = work / "tiny"
    subprocess.run([str(BIN), "make-model", "--preset", "tiny", "--out", str(model)], check=True, capture_output=True)
    # The same model, its tokenizer given Mistral's control token in a spare id below the vocabulary.
    mistral = work / "tiny-mistral"
    shutil.copytree(model, mistral)
    tokenizer = json.loads((mistral / "tokenizer.json").read_text())
    spare = json.loads((mistral / "config.json").read_text())["vocab_size"] - 1
    tokenizer["added_tokens"].append({"id": spare, "content": "[TOOL_CALLS]", "single_word": False, "lstrip": False,
                                      "rstrip": False, "normalized": False, "special": True})
    (mistral / "tokenizer.json").write_text(json.dumps(tokenizer))
    folders = {"mistral": mistral}
    lines = ["[server]", 'listen = "127.0.0.1:0"', "[auth]", 'mode = "none"', "[[engines]]", 'name = "default"',
             f'plugin = "{PLUGIN}"', "[engines.config]", "seed = 5"]
    for f in FORMATS:
        lines += ["[[engines.config.models]]", f'id = "{f}"', f'path = "{folders.get(f, model)}"', 'device = "cpu"',
                  "threads = 2"]
    for f in FORMATS:
        parser = f.split("-")[0]
        lines += ["[[models]]", f'name = "{f}"', 'engine = "default"', f'folder = "{folders.get(f, model)}"',
                  f'tool_call_parser = "{parser}"']
    running = Gateway(work, "\n".join(lines) + "\n", {})
    yield openai.OpenAI(base_url=f"{running.base}/v1", api_key="sk-unused", max_retries=0)
    running.stop()


def check_calls(calls, allowed):
    assert calls, "no tool call"
    for call in calls:
        assert call.function.name in allowed
        jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_time"}}])
def test_a_forced_call_comes_back_as_tool_calls(client, fmt, choice):
    allowed = {"get_time"} if isinstance(choice, dict) else set(SCHEMAS)
    request = dict(model=fmt, messages=MESSAGES, tools=TOOLS, tool_choice=choice, max_tokens=300, seed=4,
                   parallel_tool_calls=False)
    whole = client.chat.completions.create(**request)
    choice0 = whole.choices[0]
    assert choice0.finish_reason == "tool_calls", choice0
    check_calls(choice0.message.tool_calls, allowed)
    assert len(choice0.message.tool_calls) == 1
    # Streamed, the same call.
    names, arguments = {}, {}
    for chunk in client.chat.completions.create(**request, stream=True):
        for delta in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
            if delta.function.name:
                names[delta.index] = delta.function.name
            arguments[delta.index] = arguments.get(delta.index, "") + (delta.function.arguments or "")
    assert [names[0]] == [c.function.name for c in choice0.message.tool_calls]
    assert json.loads(arguments[0]) == json.loads(choice0.message.tool_calls[0].function.arguments)


def test_responses_force_a_function_call(client):
    tools = [{"type": "function", "name": t["function"]["name"], "parameters": t["function"]["parameters"]} for t in TOOLS]
    r = client.responses.create(model="hermes", input="What should I pack?", tools=tools, tool_choice="required",
                                max_output_tokens=300)
    calls = [item for item in r.output if item.type == "function_call"]
    assert calls and all(c.name in SCHEMAS for c in calls)
    for c in calls:
        jsonschema.validate(json.loads(c.arguments), SCHEMAS[c.name])


def test_forcing_an_unknown_function_or_with_a_response_format_is_a_400(client):
    for extra in [
        dict(tool_choice={"type": "function", "function": {"name": "nope"}}),
        dict(tool_choice="required", response_format={"type": "json_object"}),
    ]:
        with pytest.raises(openai.BadRequestError) as raised:
            client.chat.completions.create(model="hermes", messages=MESSAGES, tools=TOOLS, max_tokens=8, **extra)
        assert raised.value.body["param"] == "tool_choice", raised.value.body


class Forecast(BaseModel):
    city: Literal["Paris", "Oslo"]
    days: int = Field(ge=1, le=7)


def test_the_sdk_parses_a_pydantic_function_tool(client):
    r = client.chat.completions.parse(
        model="hermes",
        messages=MESSAGES,
        tools=[openai.pydantic_function_tool(Forecast)],
        tool_choice="required",
        max_tokens=300,
        seed=2,
    )
    [call] = r.choices[0].message.tool_calls
    assert call.function.name == "Forecast"
    assert isinstance(call.function.parsed_arguments, Forecast)


def test_the_simulator_forces_calls_too(gateway):
    # The simulator draws grammar-valid output, so forced calls work without a model.
    sim = openai.OpenAI(base_url=f"{gateway}/v1", api_key="sk-unused", max_retries=0)
    for seed in range(5):
        r = sim.chat.completions.create(model="tools", messages=MESSAGES, tools=TOOLS, tool_choice="required",
                                        max_tokens=200, seed=seed)
        assert r.choices[0].finish_reason == "tool_calls", r.choices[0]
        check_calls(r.choices[0].message.tool_calls, set(SCHEMAS))


def test_a_strict_function_holds_a_call_to_its_schema_once_it_begins(gateway):
    # The `strays` simulator model writes text, then a call with a city no schema allows. With
    # the function `strict` (tool_choice auto), its text comes through and the call is held to
    # the schema from `<tool_call>` on; without `strict`, it comes back as written.
    sim = openai.OpenAI(base_url=f"{gateway}/v1", api_key="sk-unused", max_retries=0)
    def ask(strict, stream=False):
        tool = {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER, "strict": strict}}
        return sim.chat.completions.create(model="strays", messages=MESSAGES, tools=[tool], max_tokens=100, seed=1,
                                           stream=stream)
    held = ask(True).choices[0]
    assert held.finish_reason == "tool_calls", held
    assert held.message.content == "Checking.\n"
    check_calls(held.message.tool_calls, {"get_weather"})
    free = ask(False).choices[0]
    assert json.loads(free.message.tool_calls[0].function.arguments) == {"city": "Rome"}
    # Streamed, the same held call.
    arguments = "".join(d.function.arguments or "" for c in ask(True, stream=True) if c.choices
                        for d in c.choices[0].delta.tool_calls or [])
    assert json.loads(arguments) == json.loads(held.message.tool_calls[0].function.arguments)
    # The Responses API's functions are strict unless they say otherwise.
    r = sim.responses.create(model="strays", input="Weather?", max_output_tokens=100,
                             tools=[{"type": "function", "name": "get_weather", "parameters": WEATHER}])
    [call] = [item for item in r.output if item.type == "function_call"]
    jsonschema.validate(json.loads(call.arguments), WEATHER)


def test_a_repeated_call_ends_the_answer(gateway):
    # The `repeater` simulator model writes one call three times, then text: the call comes back
    # once and the answer ends there, as tool_calls, streamed and not.
    sim = openai.OpenAI(base_url=f"{gateway}/v1", api_key="sk-unused", max_retries=0)
    tool = {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}}
    r = sim.chat.completions.create(model="repeater", messages=MESSAGES, tools=[tool], max_tokens=200)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls" and not choice.message.content, choice
    assert [json.loads(c.function.arguments) for c in choice.message.tool_calls] == [{"city": "Oslo"}]
    chunks = list(sim.chat.completions.create(model="repeater", messages=MESSAGES, tools=[tool], max_tokens=200,
                                              stream=True))
    indices = {d.index for c in chunks if c.choices for d in c.choices[0].delta.tool_calls or []}
    assert indices == {0}
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["tool_calls"]
