"""Server tools: a gateway plugin's tools offered to the model beside the client's, run by the
gateway when the model calls them, the conversation continued until it answers. The `agent`
simulator model calls a tool it is offered, then answers the tool's result with text; the C
example plugin's `unix_time` tool and the rule-breaking plugin's tools run them. Chat completions
and the Responses API (where the calls appear as `mcp_call` items), streamed and not, usage over
every round, client tools still returned to the client, deadlines, and cancellation mid-loop."""

import json
import threading
import time

import httpx
import openai
import pytest
from tokenizers import Tokenizer

from conftest import GATEWAY_MODELS, SIM_MODELS, TOKENIZER, TOOL_RESULT
from tenancy_support import Gateway, config_text, make_key
from test_gateway_plugins import FAULTY, c_plugin
from test_operations import wait_until

MARKER = Tokenizer.from_file(str(TOKENIZER)).encode(TOOL_RESULT, add_special_tokens=False).ids
AGENT = {"agent": SIM_MODELS["agent"] % MARKER, "echo": 'output = { mode = "echo" }'}
ASK = [{"role": "user", "content": "What time is it?"}]
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"enum": ["Paris"]}}, "required": ["city"]}}}


def server_tools_config(plugins: str) -> str:
    text = config_text('[auth]\nmode = "required"\n\n[tenants.acme]\nmodels = ["*"]\nkeys = [{ env = "ACME_KEY" }]\n'
                       + plugins, AGENT)
    # The gateway's own entry for the agent model: its tool-call format.
    return text.replace('name = "agent"\nengine = "sim"', f'name = "agent"\nengine = "sim"\n{GATEWAY_MODELS["agent"]}')


@pytest.fixture
def key():
    return make_key()


def started(tmp_path, key, plugins: str) -> tuple[Gateway, openai.OpenAI]:
    gateway = Gateway(tmp_path, server_tools_config(plugins), {"ACME_KEY": key, "RUST_LOG": "warn,turnpike=info"})
    return gateway, openai.OpenAI(base_url=gateway.url, api_key=key, max_retries=0)


def test_chat_runs_the_tool_and_answers_in_one_response(tmp_path, key):
    gateway, client = started(tmp_path, key, f'[[plugins]]\nlibrary = "{c_plugin(tmp_path)}"\n')
    try:
        answer = client.chat.completions.create(model="agent", messages=ASK, max_tokens=60)
        choice = answer.choices[0]
        assert choice.finish_reason == "stop" and not choice.message.tool_calls and choice.message.content
        # Two rounds: the second prompt holds the first, the call and its result.
        alone = client.chat.completions.create(model="echo", messages=ASK, max_tokens=1)
        assert answer.usage.prompt_tokens > 2 * alone.usage.prompt_tokens
        chunks = list(client.chat.completions.create(model="agent", messages=ASK, max_tokens=60, stream=True,
                                                     stream_options={"include_usage": True}))
        assert not any(c.choices and c.choices[0].delta.tool_calls for c in chunks)
        assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["stop"]
        assert chunks[-1].usage.prompt_tokens == answer.usage.prompt_tokens
    finally:
        gateway.stop()


def test_responses_show_the_calls_as_mcp_call_items(tmp_path, key):
    gateway, client = started(tmp_path, key, f'[[plugins]]\nname = "clock"\nlibrary = "{c_plugin(tmp_path)}"\n')
    try:
        response = client.responses.create(model="agent", input="What time is it?", max_output_tokens=60)
        kinds = [item.type for item in response.output]
        assert kinds[0] == "mcp_call" and kinds[-1] == "message", kinds
        call = response.output[0]
        assert call.name == "unix_time" and call.server_label == "clock" and "unix_time" in call.output
        assert response.output_text
        # The next turn continues from it: the call and its result are part of the conversation.
        follow = client.responses.create(model="agent", input="And now?", previous_response_id=response.id,
                                         max_output_tokens=60)
        fresh = client.responses.create(model="echo", input="And now?", max_output_tokens=1)
        assert follow.usage.input_tokens > fresh.usage.input_tokens + 40
        events = list(client.responses.create(model="agent", input="What time is it?", max_output_tokens=60,
                                              stream=True))
        added = [e.item.type for e in events if e.type == "response.output_item.added"]
        assert added[0] == "mcp_call" and "message" in added
        done = events[-1].response
        assert done.status == "completed" and [i.type for i in done.output][0] == "mcp_call"
    finally:
        gateway.stop()


def test_a_client_tool_still_comes_back_to_the_client(tmp_path, key):
    gateway, client = started(tmp_path, key, f'[[plugins]]\nlibrary = "{c_plugin(tmp_path)}"\n')
    try:
        answer = client.chat.completions.create(
            model="agent", messages=ASK, tools=[WEATHER], max_tokens=60,
            tool_choice={"type": "function", "function": {"name": "get_weather"}})
        choice = answer.choices[0]
        assert choice.finish_reason == "tool_calls"
        assert [c.function.name for c in choice.message.tool_calls] == ["get_weather"]
    finally:
        gateway.stop()


def test_a_tool_past_its_deadline_is_cancelled_and_the_model_told(tmp_path, key):
    plugins = f'[[plugins]]\nname = "silent"\nlibrary = "{FAULTY}"\ntool_timeout_ms = 300\n[plugins.config]\nbreak = "tool_silent"\n'
    gateway, client = started(tmp_path, key, plugins)
    try:
        response = client.responses.create(model="agent", input="Echo this", max_output_tokens=60)
        call = response.output[0]
        assert call.type == "mcp_call" and call.status == "failed" and "did not answer" in call.error
        assert response.output[-1].type == "message"
        assert wait_until(lambda: "cancelled" in gateway.log.read_text())
    finally:
        gateway.stop()


def test_a_client_that_leaves_mid_loop_cancels_the_tool_call(tmp_path, key):
    plugins = f'[[plugins]]\nname = "silent"\nlibrary = "{FAULTY}"\ntool_timeout_ms = 60000\n[plugins.config]\nbreak = "tool_silent"\n'
    gateway, _ = started(tmp_path, key, plugins)
    try:
        body = {"model": "agent", "messages": ASK, "max_tokens": 60, "stream": True}
        headers = {"Authorization": f"Bearer {key}"}

        def leave_early():
            try:
                with httpx.stream("POST", f"{gateway.url}/chat/completions", json=body, headers=headers,
                                  timeout=httpx.Timeout(10, read=1.5)) as response:
                    for _ in response.iter_raw():
                        pass
            except httpx.ReadTimeout:
                pass  # the tool never answers; the client gives up

        client_thread = threading.Thread(target=leave_early)
        started_at = time.monotonic()
        client_thread.start()
        client_thread.join(20)
        assert wait_until(lambda: "cancelled" in gateway.log.read_text(), timeout=10), gateway.log.read_text()
        assert time.monotonic() - started_at < 15, "the call was cancelled long before its deadline"
    finally:
        gateway.stop()


def test_a_background_response_runs_the_tools_too(tmp_path, key):
    gateway, client = started(tmp_path, key, f'[[plugins]]\nname = "clock"\nlibrary = "{c_plugin(tmp_path)}"\n')
    try:
        queued = client.responses.create(model="agent", input="What time is it?", max_output_tokens=60,
                                         background=True)
        assert wait_until(lambda: client.responses.retrieve(queued.id).status == "completed")
        done = client.responses.retrieve(queued.id)
        assert [i.type for i in done.output][0] == "mcp_call" and done.output[-1].type == "message"
        assert done.output[0].server_label == "clock"
    finally:
        gateway.stop()
