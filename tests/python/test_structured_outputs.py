"""Structured outputs through the default engine (CPU device): `response_format` with a JSON
Schema or `json_object`, and the Responses API's `text.format`, constrain decoding by a grammar
(llguidance in the engine), so every answer parses and validates against its schema, whatever
the model's weights. The `tiny` model's are random, which makes it a hard test: nothing but the
grammar keeps its output in shape. The simulator draws random grammar-valid output through the
same library, and answers the same schemas without a model. Driven by the official `openai`
SDK; answers are checked with `jsonschema`."""

import json
import re

import jsonschema
import openai
import pytest
from pydantic import BaseModel

from test_default_engine import tiny, tiny_gateway  # noqa: F401 (fixtures)
from test_gguf_model import GGUF, smollm2  # noqa: F401 (fixture)

# Leaves a random model cannot run away with: bounded strings, numbers and choices.
LEAVES = {
    "name": {"type": "string", "maxLength": 8},
    "word": {"type": "string", "pattern": "^[a-z]{1,6}$"},
    "colour": {"enum": ["red", "green", "blue"]},
    "count": {"type": "integer", "minimum": 0, "maximum": 99},
    "delta": {"type": "integer", "minimum": -5, "maximum": 5},
    "ratio": {"type": "number", "enum": [0.25, 0.5, 0.75]},
    "flag": {"type": "boolean"},
    "nothing": {"type": "null"},
    "fixed": {"const": "v1"},
    "day": {"type": "string", "format": "date"},
}


def obj(properties):
    return {
        "type": "object",
        "properties": properties,
        "required": list(properties),
        "additionalProperties": False,
    }


def schemas():
    """Fifty schemas: each leaf alone in an object, in a bounded array, nested two objects deep,
    behind a `$ref`, and in an `anyOf` with another leaf."""
    out = []
    names = list(LEAVES)
    for i, (name, leaf) in enumerate(LEAVES.items()):
        other = LEAVES[names[(i + 1) % len(names)]]
        out.append((f"{name}", obj({name: leaf})))
        out.append((f"{name}[]", obj({"items": {"type": "array", "items": leaf, "minItems": 1, "maxItems": 3}})))
        out.append((f"nested {name}", obj({"outer": obj({"inner": leaf, "flag": LEAVES["flag"]})})))
        out.append(
            (
                f"$ref {name}",
                {**obj({"a": {"$ref": "#/$defs/leaf"}, "b": {"$ref": "#/$defs/leaf"}}), "$defs": {"leaf": leaf}},
            )
        )
        out.append((f"anyOf {name}", obj({"either": {"anyOf": [leaf, other]}})))
    return out


SCHEMAS = schemas()
MESSAGES = [{"role": "user", "content": "Fill in the form."}]


def format_for(schema):
    return {"type": "json_schema", "json_schema": {"name": "form", "schema": schema, "strict": True}}


@pytest.mark.parametrize("label,schema", SCHEMAS, ids=[label for label, _ in SCHEMAS])
def test_every_answer_parses_and_validates(tiny, label, schema):
    r = tiny.chat.completions.create(
        model="tiny",
        messages=MESSAGES,
        response_format=format_for(schema),
        max_tokens=400,
        temperature=1.0,
        seed=len(label),
        n=2,
    )
    assert len(r.choices) == 2
    for choice in r.choices:
        assert choice.finish_reason == "stop", choice
        jsonschema.validate(json.loads(choice.message.content), schema)


@pytest.mark.parametrize("label,schema", SCHEMAS[::5], ids=[label for label, _ in SCHEMAS[::5]])
def test_streamed_answers_are_the_non_streamed_ones(tiny, label, schema):
    request = dict(model="tiny", messages=MESSAGES, response_format=format_for(schema), max_tokens=400, seed=3)
    whole = tiny.chat.completions.create(**request).choices[0].message.content
    chunks = tiny.chat.completions.create(**request, stream=True)
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == whole
    jsonschema.validate(json.loads(streamed), schema)


# Schemas only the simulator's finishing rule keeps short: free strings, open objects, numbers.
OPEN = [
    ("free object", {"type": "object"}),
    ("free strings", obj({"title": {"type": "string"}, "tags": {"type": "array", "items": {"type": "string"}}})),
    ("numbers", obj({"x": {"type": "number"}, "n": {"type": "integer"}})),
    ("deep", obj({"a": obj({"b": obj({"c": {"type": "array", "items": {"type": "object"}, "minItems": 2}})})})),
]


@pytest.mark.parametrize("label,schema", SCHEMAS + OPEN, ids=[label for label, _ in SCHEMAS + OPEN])
def test_the_simulator_answers_every_schema(client, label, schema):
    request = dict(model="chat", messages=MESSAGES, response_format=format_for(schema), max_tokens=200, seed=len(label))
    r = client.chat.completions.create(**request, n=2)
    assert len(r.choices) == 2
    for choice in r.choices:
        assert choice.finish_reason == "stop", choice
        jsonschema.validate(json.loads(choice.message.content), schema)
    chunks = client.chat.completions.create(**request, stream=True)
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == client.chat.completions.create(**request).choices[0].message.content
    jsonschema.validate(json.loads(streamed), schema)


def test_the_simulator_parses_into_a_pydantic_model(client):
    r = client.chat.completions.parse(model="chat", messages=ASK, response_format=Form, max_tokens=200)
    assert isinstance(r.choices[0].message.parsed, Form)
    r = client.responses.parse(model="chat", input=ASK[0]["content"], text_format=Form, max_output_tokens=200)
    assert isinstance(r.output_parsed, Form)
    r = client.chat.completions.create(model="chat", messages=ASK, response_format={"type": "json_object"}, max_tokens=200)
    assert isinstance(json.loads(r.choices[0].message.content), dict)


class Form(BaseModel):
    colour: str
    count: int
    flag: bool


ASK = [{"role": "user", "content": "Describe the sky as a colour, a count of clouds and whether it rains."}]
needs_smollm2 = pytest.mark.skipif(not GGUF, reason="TURNPIKE_SMOLLM2_GGUF is not set (tests/run.sh sets it)")


@needs_smollm2
def test_the_sdk_parses_chat_into_a_pydantic_model(smollm2):
    # A real model (SmolLM2) under the SDK's strict schema of a pydantic model: free strings
    # and integers, so the answer ends when the model ends it.
    request = dict(model="smollm2", messages=ASK, response_format=Form, max_tokens=200, temperature=0)
    r = smollm2.chat.completions.parse(**request)
    assert isinstance(r.choices[0].message.parsed, Form)
    with smollm2.chat.completions.stream(**request) as stream:
        final = stream.get_final_completion()
    assert final.choices[0].message.parsed == r.choices[0].message.parsed


@needs_smollm2
def test_the_sdk_parses_a_response_into_a_pydantic_model(smollm2):
    r = smollm2.responses.parse(
        model="smollm2", input=ASK[0]["content"], text_format=Form, max_output_tokens=200, temperature=0
    )
    assert isinstance(r.output_parsed, Form)


@needs_smollm2
def test_json_object_gives_an_object(smollm2):
    r = smollm2.chat.completions.create(
        model="smollm2",
        messages=[{"role": "user", "content": "Give me a JSON object with your name."}],
        response_format={"type": "json_object"},
        max_tokens=200,
        temperature=0,
    )
    assert r.choices[0].finish_reason == "stop", r.choices[0]
    assert isinstance(json.loads(r.choices[0].message.content), dict)


def test_forced_text_is_fast_forwarded(tiny, tiny_gateway):
    # Keys the schema requires are forced: the engine appends them without sampling each, and
    # the answer is the same with log probabilities (which turn fast-forward off) as without.
    from test_default_engine import stat

    schema = obj({"a_rather_long_key_name": LEAVES["colour"], "another_required_key": LEAVES["flag"]})
    before = stat(tiny_gateway, "grammar_forced_tokens")
    request = dict(model="tiny", messages=MESSAGES, response_format=format_for(schema), max_tokens=100, temperature=0)
    fast = tiny.chat.completions.create(**request)
    after = stat(tiny_gateway, "grammar_forced_tokens")
    assert after - before >= 8
    slow = tiny.chat.completions.create(**request, logprobs=True)
    assert stat(tiny_gateway, "grammar_forced_tokens") == after
    assert fast.choices[0].message.content == slow.choices[0].message.content
    assert fast.usage.completion_tokens == slow.usage.completion_tokens
    jsonschema.validate(json.loads(fast.choices[0].message.content), schema)


def test_responses_text_format_constrains_output(tiny):
    schema = obj({"colour": LEAVES["colour"], "count": LEAVES["count"]})
    r = tiny.responses.create(
        model="tiny",
        input="Fill in the form.",
        text={"format": {"type": "json_schema", "name": "form", "schema": schema, "strict": True}},
        max_output_tokens=200,
    )
    jsonschema.validate(json.loads(r.output_text), schema)


def test_a_schema_that_does_not_compile_is_a_400(tiny):
    for schema, words in [
        ({"type": "object", "properties": {"a": {"type": "string", "format": "no-such-format"}}}, "format"),
        ({"type": "integer", "minimum": 5, "maximum": 1}, "minimum"),
        ({"type": "object", "dependentRequired": {"a": ["b"]}}, "dependentRequired"),
        ({"type": "nonsense"}, "type"),
    ]:
        with pytest.raises(openai.BadRequestError) as raised:
            tiny.chat.completions.create(model="tiny", messages=MESSAGES, response_format=format_for(schema), max_tokens=8)
        assert words in raised.value.message, raised.value.message
        assert raised.value.body["type"] == "invalid_request_error"
    # A schema that is no JSON Schema at all is refused before the engine, naming the parameter.
    with pytest.raises(openai.BadRequestError) as raised:
        tiny.chat.completions.create(model="tiny", messages=MESSAGES, response_format=format_for({"type": "nonsense"}),
                                     max_tokens=8)
    assert raised.value.body["param"] == "response_format.json_schema.schema"


@pytest.mark.parametrize("body,check", [
    ({"guided_regex": "(yes|no) [0-9]{2}"}, lambda t: re.fullmatch("(yes|no) [0-9]{2}", t)),
    ({"structured_outputs": {"regex": "[a-c]{4}"}}, lambda t: re.fullmatch("[a-c]{4}", t)),
    ({"guided_choice": ["red", "green", "blue"]}, lambda t: t in ("red", "green", "blue")),
    ({"nvext": {"guided_grammar": 'start: "x" NUM\nNUM: /[1-9]/'}}, lambda t: re.fullmatch("x[1-9]", t)),
    ({"guided_json": obj({"count": LEAVES["count"]})}, lambda t: 0 <= json.loads(t)["count"] <= 99),
])
def test_vllm_guided_extensions_shape_the_output(tiny, client, body, check):
    # The real engine (random weights) and the simulator; chat and legacy completions.
    for c, model in [(tiny, "tiny"), (client, "chat")]:
        r = c.chat.completions.create(model=model, messages=MESSAGES, max_tokens=60, n=2, seed=1, extra_body=body)
        for choice in r.choices:
            assert choice.finish_reason == "stop" and check(choice.message.content), choice
        r = c.completions.create(model=model, prompt="Answer:", max_tokens=60, seed=2, extra_body=body)
        assert check(r.choices[0].text), r.choices[0]


def test_two_shapes_at_once_are_a_400(client):
    for body, extra in [
        ({"guided_regex": "a", "guided_choice": ["b"]}, {}),
        ({"guided_regex": "a"}, {"response_format": {"type": "json_object"}}),
    ]:
        with pytest.raises(openai.BadRequestError) as raised:
            client.chat.completions.create(model="chat", messages=MESSAGES, max_tokens=8, extra_body=body, **extra)
        assert "cannot both shape the output" in raised.value.message


def test_unbounded_numbers_and_times_end_where_a_double_and_nanoseconds_do(tiny):
    # The random model, left free, writes digits until max_tokens; the grammar's number guard
    # ends a number at what a double holds and a time's fraction at nanoseconds.
    schema = obj({"x": {"type": "number"}, "n": {"type": "integer"}, "at": {"type": "string", "format": "date-time"}})
    for seed in range(6):
        r = tiny.chat.completions.create(model="tiny", messages=MESSAGES, response_format=format_for(schema),
                                         max_tokens=300, temperature=1.0, seed=seed)
        choice = r.choices[0]
        assert choice.finish_reason == "stop", (seed, choice)
        answer = json.loads(choice.message.content)
        jsonschema.validate(answer, schema)
        for key in ("x", "n"):
            raw = re.search(rf'"{key}":\s*(-?[0-9.]+)([eE][+-]?([0-9]+))?', choice.message.content)
            mantissa = raw.group(1).lstrip("-").replace(".", "")
            assert len(mantissa.lstrip("0")) <= 17 and len(mantissa) <= 24, (seed, key, raw.group(0))
            assert raw.group(3) is None or len(raw.group(3)) <= 3, (seed, key, raw.group(0))
        fraction = re.search(r":\d\d\.(\d+)", answer["at"])
        assert fraction is None or len(fraction.group(1)) <= 9, (seed, answer["at"])
