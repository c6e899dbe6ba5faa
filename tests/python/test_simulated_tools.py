"""Tool flows against the simulator, as client libraries run them: the `agent` simulator model
calls one of the tools a request offers (its arguments drawn from the function's schema
through the gateway's call grammar, in the model's own envelope, so the gateway's parser
returns real calls), then answers the tool's result with text. Chat completions and the
Responses API, streamed and not, over HTTP and `client.responses.connect()`, and the
`openai-agents` SDK running an agent with one function tool to completion."""

import json

import jsonschema
import openai
import pytest

WEATHER = {
    "type": "object",
    "properties": {"city": {"enum": ["Paris", "Oslo", "Lima"]}, "days": {"type": "integer", "minimum": 1, "maximum": 7}},
    "required": ["city", "days"],
    "additionalProperties": False,
}
TIME = {"type": "object", "properties": {"tz": {"type": "string", "pattern": "^[A-Z]{3}$"}}, "required": ["tz"],
        "additionalProperties": False}
SCHEMAS = {"get_weather": WEATHER, "get_time": TIME}
CHAT_TOOLS = [{"type": "function", "function": {"name": n, "parameters": s}} for n, s in SCHEMAS.items()]
RESPONSE_TOOLS = [{"type": "function", "name": n, "parameters": s, "strict": False} for n, s in SCHEMAS.items()]


def valid(name, arguments):
    jsonschema.validate(json.loads(arguments), SCHEMAS[name])
    return True


@pytest.mark.parametrize("seed", range(3))
def test_chat_two_turn_tool_flow(client, seed):
    messages = [{"role": "user", "content": "What is the weather?"}]
    first = client.chat.completions.create(model="agent", messages=messages, tools=CHAT_TOOLS, seed=seed)
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    [call] = choice.message.tool_calls
    assert valid(call.function.name, call.function.arguments)
    # Streamed, the same call.
    chunks = list(client.chat.completions.create(model="agent", messages=messages, tools=CHAT_TOOLS, seed=seed,
                                                 stream=True))
    deltas = [d for c in chunks if c.choices for d in c.choices[0].delta.tool_calls or []]
    assert deltas[0].function.name == call.function.name
    assert json.loads("".join(d.function.arguments or "" for d in deltas)) == json.loads(call.function.arguments)
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    # The tool's result is answered with text.
    messages += [choice.message.model_dump(exclude_none=True),
                 {"role": "tool", "tool_call_id": call.id, "content": "sunny"}]
    second = client.chat.completions.create(model="agent", messages=messages, tools=CHAT_TOOLS, seed=seed)
    assert second.choices[0].finish_reason == "stop" and second.choices[0].message.content
    assert not second.choices[0].message.tool_calls


def test_responses_two_turn_tool_flow(client):
    first = client.responses.create(model="agent", input="What is the weather?", tools=RESPONSE_TOOLS,
                                    extra_body={"seed": 4})
    [call] = [item for item in first.output if item.type == "function_call"]
    assert valid(call.name, call.arguments)
    with client.responses.stream(model="agent", input="What is the weather?", tools=RESPONSE_TOOLS,
                                 extra_body={"seed": 4}) as stream:
        streamed = stream.get_final_response()
    [again] = [item for item in streamed.output if item.type == "function_call"]
    assert (again.name, json.loads(again.arguments)) == (call.name, json.loads(call.arguments))
    follow = client.responses.create(model="agent", previous_response_id=first.id, tools=RESPONSE_TOOLS,
                                     input=[{"type": "function_call_output", "call_id": call.call_id,
                                             "output": "sunny"}])
    assert follow.status == "completed" and follow.output_text
    assert not [item for item in follow.output if item.type == "function_call"]


def test_responses_tool_flow_over_a_websocket(client):
    with client.responses.connect() as connection:
        connection.response.create(model="agent", input="What is the weather?", tools=RESPONSE_TOOLS, store=False)
        first = next(e.response for e in connection if e.type == "response.completed")
        [call] = [item for item in first.output if item.type == "function_call"]
        assert valid(call.name, call.arguments)
        connection.response.create(model="agent", previous_response_id=first.id, store=False, tools=RESPONSE_TOOLS,
                                   input=[{"type": "function_call_output", "call_id": call.call_id, "output": "9"}])
        second = next(e.response for e in connection if e.type == "response.completed")
        assert second.output_text and not [i for i in second.output if i.type == "function_call"]


def test_an_agent_runs_to_completion(gateway):
    agents = pytest.importorskip("agents")
    agents.set_tracing_disabled(True)
    calls = []

    @agents.function_tool
    def get_weather(city: str) -> str:
        """The weather in a city."""
        calls.append(city)
        return f"sunny in {city}"

    client = openai.AsyncOpenAI(base_url=f"{gateway}/v1", api_key="sk-unused", max_retries=0)
    model = agents.OpenAIResponsesModel(model="agent", openai_client=client)
    agent = agents.Agent(name="weather", instructions="Answer with the weather.", tools=[get_weather], model=model)
    result = agents.Runner.run_sync(agent, "What is the weather in Paris?", max_turns=4)
    assert len(calls) == 1 and isinstance(calls[0], str)
    assert isinstance(result.final_output, str) and result.final_output
