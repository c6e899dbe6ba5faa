"""The Responses API over WebSocket: `client.responses.connect()` from the official SDK, and a
plain `websockets` client for the message forms, warm-up, errors that keep the socket open, the
connection limit and cancellation when the socket goes away. Every event is validated against
the Open Responses pydantic models."""

import json
import time

import pytest
from websockets.sync.client import connect

from conftest import config_text, engine_counter, wait_for
from test_responses import EVENTS


def ws_url(gateway):
    return gateway.replace("http://", "ws://") + "/v1/responses"


def turn(ws, message):
    """Sends one message and reads events up to the turn's last one (or an error event)."""
    ws.send(json.dumps(message))
    events = []
    while True:
        event = json.loads(ws.recv(timeout=30))
        events.append(event)
        if event["type"] == "error":
            return events
        EVENTS[event["type"]].model_validate(event)
        if event["type"] in ("response.completed", "response.incomplete", "response.failed"):
            assert [e["sequence_number"] for e in events] == list(range(len(events)))
            return events


def test_the_sdk_connects_and_runs_turns(client):
    with client.responses.connect() as connection:
        connection.response.create(model="chat", input="Hello over a socket", store=False)
        kinds, first = [], None
        for event in connection:
            kinds.append(event.type)
            if event.type == "response.completed":
                first = event.response
                break
        assert kinds[:2] == ["response.created", "response.in_progress"] and first.output_text
        # Not stored, yet the connection continues it.
        connection.response.create(model="echo", input="And now?", previous_response_id=first.id, store=False)
        for event in connection:
            if event.type == "response.completed":
                second = event.response
                break
        assert second.previous_response_id == first.id
        assert "Hello over a socket" in second.output_text


def test_message_forms_warm_up_and_errors_that_keep_the_socket(gateway):
    with connect(ws_url(gateway)) as ws:
        flat = turn(ws, {"type": "response.create", "model": "chat", "input": "flat"})
        nested = turn(ws, {"type": "response.create", "response": {"model": "chat", "input": "nested"}})
        assert flat[-1]["response"]["status"] == nested[-1]["response"]["status"] == "completed"
        warm = turn(ws, {"type": "response.create", "model": "chat", "generate": False})
        assert [e["type"] for e in warm] == ["response.created", "response.in_progress", "response.completed"]
        assert warm[-1]["response"]["output"] == []
        for bad, status, code in [
            ("not json", 400, "invalid_json"),
            (json.dumps({"type": "response.cancel"}), 400, "invalid_value"),
            (json.dumps({"type": "response.create", "model": "chat", "input": "x", "previous_response_id": "resp_nope"}),
             404, "previous_response_not_found"),
            (json.dumps({"type": "response.create", "model": "missing", "input": "x"}), 404, "model_not_found"),
        ]:
            ws.send(bad)
            event = json.loads(ws.recv(timeout=10))
            assert event["type"] == "error" and event["status"] == status, event
            assert event["error"]["code"] == code and event["error"]["message"], event
        # Still open: a turn after the errors works.
        again = turn(ws, {"type": "response.create", "model": "chat", "input": "still here?"})
        assert again[-1]["type"] == "response.completed"


def test_messages_sent_during_a_turn_run_after_it(gateway):
    with connect(ws_url(gateway)) as ws:
        ws.send(json.dumps({"type": "response.create", "model": "slow", "input": "one", "max_output_tokens": 5}))
        ws.send(json.dumps({"type": "response.create", "model": "chat", "input": "two"}))
        done = []
        while len(done) < 2:
            event = json.loads(ws.recv(timeout=30))
            if event["type"] in ("response.completed", "response.incomplete"):
                done.append(event["response"]["model"])
        assert done == ["slow", "chat"]


def test_a_socket_that_goes_away_cancels_its_turn(gateway):
    before = engine_counter(gateway, "cancelled")
    ws = connect(ws_url(gateway))
    ws.send(json.dumps({"type": "response.create", "model": "slow", "input": "long", "max_output_tokens": 200}))
    while json.loads(ws.recv(timeout=10))["type"] != "response.output_text.delta":
        pass
    ws.close()
    assert wait_for(lambda: engine_counter(gateway, "cancelled") > before)


def test_the_connection_limit_is_an_error_event(tmp_path):
    from tenancy_support import Gateway

    text = config_text().replace("max_body_bytes = 262144", "max_body_bytes = 262144\nwebsocket_max_connections = 1")
    gateway = Gateway(tmp_path, text, {})
    try:
        url = gateway.url.replace("http://", "ws://") + "/responses"
        with connect(url) as first:
            with connect(url) as second:
                event = json.loads(second.recv(timeout=10))
                assert event["type"] == "error" and event["status"] == 429
                assert event["error"]["code"] == "websocket_connection_limit_reached"
            assert turn(first, {"type": "response.create", "model": "chat", "input": "hi"})[-1]["type"] == "response.completed"
        # The permit comes back when a connection closes.
        time.sleep(0.2)
        with connect(url) as third:
            assert turn(third, {"type": "response.create", "model": "chat", "input": "hi"})[-1]["type"] == "response.completed"
    finally:
        gateway.stop()


def test_chat_completions_over_a_websocket(gateway):
    url = gateway.replace("http://", "ws://") + "/v1/chat/completions"
    with connect(url) as ws:
        for content in ("first question", "second question"):
            ws.send(json.dumps({"model": "echo", "messages": [{"role": "user", "content": content}],
                                "stream_options": {"include_usage": True}}))
            chunks = []
            while (text := ws.recv(timeout=10)) != "[DONE]":
                chunks.append(json.loads(text))
            assert {c["object"] for c in chunks} == {"chat.completion.chunk"} and len({c["id"] for c in chunks}) == 1
            assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
            answer = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
            assert content in answer
            assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == "stop"
            assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["total_tokens"] > 0
        # Errors are events; the socket stays open.
        ws.send(json.dumps({"model": "chat"}))
        event = json.loads(ws.recv(timeout=10))
        assert event["type"] == "error" and event["status"] == 400 and event["error"]["message"]
        ws.send(json.dumps({"model": "midfail", "messages": [{"role": "user", "content": "go"}]}))
        while "error" not in (event := json.loads(ws.recv(timeout=10))):
            assert event["object"] == "chat.completion.chunk"
        assert event["type"] == "error" and event["status"] >= 500 and event["error"]["type"] == "server_error"
        ws.send(json.dumps({"model": "chat", "messages": [{"role": "user", "content": "again"}], "max_tokens": 3}))
        while (text := ws.recv(timeout=10)) != "[DONE]":
            assert json.loads(text)["object"] == "chat.completion.chunk"


def test_an_output_for_a_call_never_made_fails_and_evicts_the_cached_response(client):
    # The `tools` model answers with a call; its output continues it. An output for a call_id
    # the response never made is an error event naming the item, and the failed turn evicts the
    # socket's cached response (store: false), so continuing it again is not found.
    tools = [{"type": "function", "name": "get_weather", "parameters": {"type": "object"}, "strict": False}]
    with client.responses.connect() as connection:
        connection.response.create(model="tools", input="Weather?", tools=tools, store=False)
        first = next(e.response for e in connection if e.type == "response.completed")
        [call] = [item for item in first.output if item.type == "function_call"]

        def continued(call_id):
            connection.response.create(model="chat", previous_response_id=first.id, store=False, tools=tools,
                                       input=[{"type": "function_call_output", "call_id": call_id, "output": "sunny"}])
            for event in connection:
                if event.type in ("error", "response.completed", "response.failed"):
                    return event

        bad = continued("call_never_made")
        assert bad.type == "error", bad
        assert bad.error.param == "input[0].call_id" and "call_never_made" in bad.error.message, bad
        gone = continued(call.call_id)
        assert gone.type == "error" and gone.error.code == "previous_response_not_found", gone
