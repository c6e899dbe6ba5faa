"""Structured output on an engine that cannot constrain it (the simulator without a tokenizer
says `grammar: false`, as a vendor plugin without grammar support would). Per model, the
gateway either refuses such requests up front (`structured_output = "refuse"`, the default:
400) or lets them run and checks each answer against the schema, the JSON object rule or the
forced tool call (`"validate"`: 422 `output_validation_failed` on a violation; a stream ends
with the error event after the text it has sent). Official `openai` SDK."""

import json

import openai
import pytest
from tokenizers import Tokenizer

from conftest import FOLDER, SIM, TOKENIZER
from tenancy_support import Gateway

CITY = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"], "additionalProperties": False}
COUNT = {"type": "object", "properties": {"city": {"type": "integer"}}, "required": ["city"]}
ANSWER = '{"city": "Paris"}'
CALL = '{"name": "get_weather", "parameters": {"city": "Paris"}}'
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": CITY}}]
MESSAGES = [{"role": "user", "content": "Where?"}]


def script(text: str) -> str:
    ids = Tokenizer.from_file(str(TOKENIZER)).encode(text, add_special_tokens=False).ids
    return f'output = {{ mode = "script", tokens = {ids} }}'


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    vocab = Tokenizer.from_file(str(TOKENIZER)).get_vocab_size(with_added_tokens=True)
    # No `tokenizer` in the simulator's models: they cannot constrain output.
    engine_models = {
        "answers": script(ANSWER),
        "rambles": 'output = { mode = "random", length = [5, 20] }',
        "refuses": 'output = { mode = "random", length = [5, 20] }',
        "calls": script(CALL),
    }
    gateway_models = {
        "answers": 'structured_output = "validate"',
        "rambles": 'structured_output = "validate"',
        "refuses": 'tool_call_parser = "llama3_json"',
        "calls": 'structured_output = "validate"\ntool_call_parser = "llama3_json"',
    }
    lines = ["[server]", 'listen = "127.0.0.1:0"', "[auth]", 'mode = "none"', "[[engines]]", 'name = "sim"',
             f'plugin = "{SIM}"', "[engines.config]", "seed = 3"]
    for name, output in engine_models.items():
        lines += ["[[engines.config.models]]", f'id = "{name}"', f"vocab_size = {vocab}", "eos_token_id = 4", output]
    for name, extra in gateway_models.items():
        lines += ["[[models]]", f'name = "{name}"', 'engine = "sim"', f'folder = "{FOLDER}"', extra]
    running = Gateway(tmp_path_factory.mktemp("validated"), "\n".join(lines) + "\n", {})
    yield openai.OpenAI(base_url=f"{running.base}/v1", api_key="sk-unused", max_retries=0)
    running.stop()


def schema_format(schema):
    return {"type": "json_schema", "json_schema": {"name": "place", "schema": schema, "strict": True}}


def test_a_valid_answer_passes_through(client):
    r = client.chat.completions.create(model="answers", messages=MESSAGES, response_format=schema_format(CITY),
                                       max_tokens=50)
    assert json.loads(r.choices[0].message.content) == {"city": "Paris"}
    r = client.responses.create(model="answers", input="Where?", max_output_tokens=50,
                                text={"format": {"type": "json_schema", "name": "place", "schema": CITY}})
    assert json.loads(r.output_text) == {"city": "Paris"}


def test_an_answer_that_breaks_the_schema_is_a_422(client):
    with pytest.raises(openai.UnprocessableEntityError) as raised:
        client.chat.completions.create(model="answers", messages=MESSAGES, response_format=schema_format(COUNT),
                                       max_tokens=50)
    body = raised.value.body
    assert body["code"] == "output_validation_failed" and body["param"] == "response_format", body
    assert "/city" in body["message"], body
    with pytest.raises(openai.UnprocessableEntityError):
        client.chat.completions.create(model="rambles", messages=MESSAGES, response_format={"type": "json_object"},
                                       max_tokens=50)


def test_a_stream_ends_with_the_error_after_its_text(client):
    stream = client.chat.completions.create(model="rambles", messages=MESSAGES, max_tokens=50, stream=True,
                                            response_format={"type": "json_object"})
    seen = []
    with pytest.raises(openai.APIError) as raised:
        for chunk in stream:
            seen += [c.delta.content for c in chunk.choices if c.delta.content]
    assert seen, "the text came first"
    assert "does not match" in raised.value.message, raised.value.message


def test_refuse_is_a_400_up_front(client):
    with pytest.raises(openai.BadRequestError) as raised:
        client.chat.completions.create(model="refuses", messages=MESSAGES, response_format=schema_format(CITY),
                                       max_tokens=50)
    assert "cannot enforce structured output" in raised.value.message
    with pytest.raises(openai.BadRequestError) as raised:
        client.chat.completions.create(model="refuses", messages=MESSAGES, tools=TOOLS, tool_choice="required",
                                       max_tokens=50)
    assert raised.value.body["param"] == "tool_choice"


def test_a_forced_call_is_checked(client):
    r = client.chat.completions.create(model="calls", messages=MESSAGES, tools=TOOLS, tool_choice="required",
                                       max_tokens=50)
    call = r.choices[0].message.tool_calls[0]
    assert (call.function.name, json.loads(call.function.arguments)) == ("get_weather", {"city": "Paris"})
    strict = [{"type": "function", "function": {"name": "get_weather", "parameters": COUNT}}]
    with pytest.raises(openai.UnprocessableEntityError) as raised:
        client.chat.completions.create(model="calls", messages=MESSAGES, tools=strict, tool_choice="required",
                                       max_tokens=50)
    assert raised.value.body["param"] == "tool_choice", raised.value.body
    # It calls a tool, but not the one named.
    both = TOOLS + [{"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}]
    with pytest.raises(openai.UnprocessableEntityError) as raised:
        client.chat.completions.create(model="calls", messages=MESSAGES, tools=both, max_tokens=50,
                                       tool_choice={"type": "function", "function": {"name": "get_time"}})
    assert "get_weather" in raised.value.message, raised.value.message
