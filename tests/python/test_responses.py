"""The Responses API with the official SDK against the real gateway and the simulator: create,
the strict `responses.stream()` helper, incomplete and failed responses, stored and chained
conversations, input items, tools, and refusals. Every body and every streamed event is
validated against the Open Responses pydantic models (PyPI's `openresponses-types`)."""

import json

import httpx
import openai
import pytest
from openresponses_types import types as spec

from conftest import TOOL_CALL, engine_counter, wait_for

EVENTS = {
    "response.created": spec.ResponseCreatedStreamingEvent,
    "response.queued": spec.ResponseQueuedStreamingEvent,
    "response.in_progress": spec.ResponseInProgressStreamingEvent,
    "response.output_item.added": spec.ResponseOutputItemAddedStreamingEvent,
    "response.content_part.added": spec.ResponseContentPartAddedStreamingEvent,
    "response.output_text.delta": spec.ResponseOutputTextDeltaStreamingEvent,
    "response.output_text.done": spec.ResponseOutputTextDoneStreamingEvent,
    "response.content_part.done": spec.ResponseContentPartDoneStreamingEvent,
    "response.output_item.done": spec.ResponseOutputItemDoneStreamingEvent,
    "response.function_call_arguments.delta": spec.ResponseFunctionCallArgumentsDeltaStreamingEvent,
    "response.reasoning_summary_part.added": spec.ResponseReasoningSummaryPartAddedStreamingEvent,
    "response.reasoning_summary_text.delta": spec.ResponseReasoningSummaryDeltaStreamingEvent,
    "response.reasoning_summary_text.done": spec.ResponseReasoningSummaryDoneStreamingEvent,
    "response.reasoning_summary_part.done": spec.ResponseReasoningSummaryPartDoneStreamingEvent,
    "response.function_call_arguments.done": spec.ResponseFunctionCallArgumentsDoneStreamingEvent,
    "response.completed": spec.ResponseCompletedStreamingEvent,
    "response.incomplete": spec.ResponseIncompleteStreamingEvent,
    "response.failed": spec.ResponseFailedStreamingEvent,
}


def post(gateway, body):
    return httpx.post(f"{gateway}/v1/responses", json=body, timeout=30)


def stream_events(gateway, body):
    """Every event of a streamed response, checked for framing, order of sequence numbers and
    schema; and whether it ended with `data: [DONE]`."""
    events, done = [], False
    with httpx.stream("POST", f"{gateway}/v1/responses", json={**body, "stream": True}, timeout=30) as r:
        assert r.status_code == 200, r.read()
        assert r.headers["content-type"].startswith("text/event-stream")
        kind = None
        for line in r.iter_lines():
            if line.startswith("event: "):
                kind = line[len("event: "):]
            elif line == "data: [DONE]":
                done = True
            elif line.startswith("data: "):
                event = json.loads(line[len("data: "):])
                assert event["type"] == kind, (kind, event)
                EVENTS[kind].model_validate(event)
                events.append(event)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    return events, done


def test_create_returns_the_full_response_object(gateway, client):
    body = post(gateway, {"model": "chat", "input": "Hello there", "metadata": {"k": "v"}}).json()
    spec.ResponseResource.model_validate(body)
    assert body["object"] == "response" and body["status"] == "completed"
    assert body["id"].startswith("resp_") and body["completed_at"] >= body["created_at"]
    for key in ("error", "incomplete_details", "instructions", "previous_response_id"):
        assert key in body and body[key] is None, key
    assert body["metadata"] == {"k": "v"} and body["store"] is True
    assert body["text"] == {"format": {"type": "text"}} and body["truncation"] == "disabled"
    [message] = body["output"]
    assert message["type"] == "message" and message["role"] == "assistant"
    assert message["content"][0]["type"] == "output_text"
    assert body["output_text"] == message["content"][0]["text"] != ""
    usage = body["usage"]
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]
    assert usage["output_tokens_details"] == {"reasoning_tokens": 0}
    assert "cached_tokens" in usage["input_tokens_details"]
    # The SDK reads the same object, with its convenience text.
    response = client.responses.create(model="chat", input="Hello there", instructions="Be brief.")
    assert response.output_text and response.instructions == "Be brief."


def test_the_stream_helper_accepts_the_event_order(client):
    seen = []
    with client.responses.stream(model="echo", input="Repeat after me") as stream:
        for event in stream:
            seen.append(event.type)
        final = stream.get_final_response()
    assert seen[:4] == ["response.created", "response.in_progress", "response.output_item.added", "response.content_part.added"]
    assert seen[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done", "response.completed"]
    assert final.status == "completed" and final.output_text


def test_streamed_events_are_consistent_and_match_the_spec(gateway):
    events, done = stream_events(gateway, {"model": "chat", "input": "Tell me something"})
    assert done
    deltas = [e for e in events if e["type"] == "response.output_text.delta"]
    text_done = next(e for e in events if e["type"] == "response.output_text.done")
    assert "".join(d["delta"] for d in deltas) == text_done["text"]
    item_id = events[2]["item"]["id"]
    assert {d["item_id"] for d in deltas} == {item_id} and {d["output_index"] for d in deltas} == {0}
    final = events[-1]["response"]
    assert final["status"] == "completed" and final["output"][0]["id"] == item_id
    assert events[0]["response"]["status"] == "in_progress" and events[0]["response"]["output"] == []


def test_the_token_limit_makes_an_incomplete_response(gateway, client):
    response = client.responses.create(model="chat", input="Go on and on", max_output_tokens=2, extra_body={"min_tokens": 2})
    assert response.status == "incomplete" and response.incomplete_details.reason == "max_output_tokens"
    assert response.usage.output_tokens == 2 and response.max_output_tokens == 2
    events, done = stream_events(gateway, {"model": "chat", "input": "Go on", "max_output_tokens": 2, "min_tokens": 2})
    assert done and events[-1]["type"] == "response.incomplete"
    assert events[-1]["response"]["incomplete_details"] == {"reason": "max_output_tokens"}


def test_an_engine_failure_mid_stream_is_response_failed(gateway):
    events, done = stream_events(gateway, {"model": "midfail", "input": "Start, then fail"})
    assert done and events[-1]["type"] == "response.failed"
    failed = events[-1]["response"]
    assert failed["status"] == "failed" and failed["error"]["code"]
    assert any(e["type"] == "response.output_text.delta" for e in events)


def test_conversations_chain_and_are_stored(client):
    first = client.responses.create(model="echo", input="My name is Ann.")
    second = client.responses.create(model="echo", input="What is my name?", previous_response_id=first.id)
    assert second.previous_response_id == first.id
    # The echo model repeats its prompt up to the first end of turn: the earlier turn's.
    assert "My name is Ann." in second.output_text
    assert client.responses.retrieve(second.id).output_text == second.output_text
    items = client.responses.input_items.list(second.id, order="asc")
    texts = [part.text for item in items.data if item.type == "message" for part in item.content]
    assert texts == ["My name is Ann.", first.output_text, "What is my name?"]
    newest = client.responses.input_items.list(second.id, limit=1)
    assert newest.data[0].content[0].text == "What is my name?" and newest.has_more
    deleted = client.responses.delete(second.id)
    assert deleted is None or getattr(deleted, "deleted", True)
    with pytest.raises(openai.NotFoundError) as err:
        client.responses.retrieve(second.id)
    assert err.value.body["code"] == "response_not_found"


def test_store_false_keeps_nothing(client):
    response = client.responses.create(model="chat", input="Forget me", store=False)
    assert response.store is False
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(response.id)
    with pytest.raises(openai.NotFoundError) as err:
        client.responses.create(model="chat", input="Again", previous_response_id=response.id)
    assert err.value.body["code"] == "previous_response_not_found"


WEATHER = {"type": "function", "name": "get_weather", "description": "Weather of a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}


def test_tool_calls_are_function_call_items_and_their_outputs_continue(gateway, client):
    response = client.responses.create(model="tools", input="Weather in Paris?", tools=[WEATHER])
    [call] = [item for item in response.output if item.type == "function_call"]
    assert call.name == "get_weather" and json.loads(call.arguments) == json.loads(TOOL_CALL)["arguments"]
    assert response.tools[0].name == "get_weather"
    events, done = stream_events(gateway, {"model": "tools", "input": "Weather in Paris?", "tools": [WEATHER]})
    kinds = [e["type"] for e in events]
    assert "response.function_call_arguments.done" in kinds and done
    added = next(e for e in events if e["type"] == "response.output_item.added")
    assert added["item"]["type"] == "function_call" and added["item"]["arguments"] == ""
    follow = client.responses.create(
        model="tools",
        previous_response_id=response.id,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "sunny, 21 C"}],
        tools=[WEATHER],
    )
    assert follow.status == "completed"
    items = client.responses.input_items.list(follow.id, order="asc").data
    assert [i.type for i in items] == ["message", "function_call", "function_call_output"]
    assert items[1].call_id == items[2].call_id == call.call_id


def test_bad_input_is_a_clear_error(gateway):
    cases = [
        ({"model": "chat", "input": [{"role": "user", "content": [{"type": "input_image", "image_url": "data:image/png;base64,AA"}]}]},
         400, "input[0].content[0]"),
        ({"model": "chat", "input": [{"role": "user", "content": [
            {"type": "input_text", "text": "read this"},
            {"type": "input_file", "file_data": "data:application/pdf;base64,AA", "filename": "a.pdf"}]}]},
         400, "input[0].content[1]"),
        ({"model": "chat", "input": [{"role": "user", "content": [
            {"type": "input_audio", "input_audio": {"data": "AA", "format": "wav"}}]}]}, 400, "input[0].content[0]"),
        ({"model": "chat", "input": [{"role": "robot", "content": "hi"}]}, 400, "input[0].role"),
        ({"model": "chat", "input": [{"type": "nonsense"}]}, 400, "input[0].type"),
        ({"model": "chat", "input": "hi", "tools": [{"type": "web_search"}]}, 400, "tools[0].type"),
        ({"model": "chat", "input": "hi", "truncation": "sometimes"}, 400, "truncation"),
        ({"model": "chat", "input": "hi", "previous_response_id": "resp_missing"}, 404, "previous_response_id"),
        ({"model": "nope", "input": "hi"}, 404, "model"),
        # An output for a call the conversation never made.
        ({"model": "chat", "input": [{"role": "user", "content": "hi"},
                                     {"type": "function_call_output", "call_id": "call_x", "output": "1"}]},
         400, "input[1].call_id"),
    ]
    for body, status, param in cases:
        r = post(gateway, body)
        assert r.status_code == status, (body, r.text)
        error = r.json()["error"]
        assert error["param"] == param and error["message"] and error["type"], (body, error)
    r = httpx.get(f"{gateway}/v1/responses/resp_missing/input_items?order=sideways", timeout=10)
    assert r.status_code in (400, 404)


def test_input_tokens_are_counted_without_running(client):
    counted = client.responses.input_tokens.count(model="chat", input="Hello there", instructions="Be brief.")
    created = client.responses.create(model="chat", input="Hello there", instructions="Be brief.")
    assert counted.input_tokens == created.usage.input_tokens > 0
    longer = client.responses.input_tokens.count(model="chat", input="Hello there", previous_response_id=created.id)
    assert longer.input_tokens > counted.input_tokens


def test_background_responses_run_and_can_be_cancelled(gateway, client):
    queued = client.responses.create(model="slow", input="Take your time", background=True, max_output_tokens=8)
    assert queued.status == "in_progress" and queued.background
    assert wait_for(lambda: client.responses.retrieve(queued.id).status in ("completed", "incomplete"))
    done = client.responses.retrieve(queued.id)
    assert done.output_text and done.usage.output_tokens > 0
    spec.ResponseResource.model_validate(httpx.get(f"{gateway}/v1/responses/{queued.id}", timeout=10).json())
    before = engine_counter(gateway, "cancelled")
    long = client.responses.create(model="slow", input="Take even longer", background=True,
                                   max_output_tokens=250, extra_body={"min_tokens": 250})
    cancelled = client.responses.cancel(long.id)
    assert cancelled.status == "cancelled"
    assert client.responses.retrieve(long.id).status == "cancelled"
    assert wait_for(lambda: engine_counter(gateway, "cancelled") > before)
    # A finished one stays as it was; a foreground one cannot be cancelled.
    assert client.responses.cancel(queued.id).status == done.status
    plain = client.responses.create(model="chat", input="now")
    with pytest.raises(openai.BadRequestError):
        client.responses.cancel(plain.id)
    r = post(gateway, {"model": "chat", "input": "x", "background": True, "store": False})
    assert r.status_code == 400 and r.json()["error"]["param"] == "store", r.text


def test_logprobs_when_included(gateway):
    body = {"model": "chat", "input": "Hi", "include": ["message.output_text.logprobs"], "top_logprobs": 2,
            "max_output_tokens": 6}
    response = post(gateway, body).json()
    spec.ResponseResource.model_validate(response)
    logprobs = response["output"][0]["content"][0]["logprobs"]
    assert logprobs and all(len(lp["top_logprobs"]) == 2 and lp["logprob"] <= 0 for lp in logprobs)
    assert "".join(lp["token"] for lp in logprobs) == response["output_text"]
    events, done = stream_events(gateway, body)
    streamed = [lp for e in events if e["type"] == "response.output_text.delta" for lp in e["logprobs"]]
    text_done = next(e for e in events if e["type"] == "response.output_text.done")
    assert streamed and streamed == text_done["logprobs"] and done
    # Not asked for: none.
    plain = post(gateway, {"model": "chat", "input": "Hi"}).json()
    assert plain["output"][0]["content"][0]["logprobs"] == []


def test_a_reasoning_model_returns_reasoning_items(gateway, client):
    from conftest import ANSWER, THOUGHT

    plain = client.responses.create(model="thinker", input="What is 2+2?")
    reasoning, message = plain.output
    assert reasoning.type == "reasoning" and reasoning.summary == []
    assert message.type == "message" and plain.output_text == ANSWER
    details = plain.usage.output_tokens_details
    assert 0 < details.reasoning_tokens < plain.usage.output_tokens
    summarised = client.responses.create(model="thinker", input="What is 2+2?", reasoning={"summary": "auto"})
    assert summarised.output[0].summary[0].text == THOUGHT and summarised.reasoning.summary == "auto"
    events, done = stream_events(gateway, {"model": "thinker", "input": "2+2?", "reasoning": {"summary": "detailed"}})
    kinds = [e["type"] for e in events]
    assert kinds[2:4] == ["response.output_item.added", "response.reasoning_summary_part.added"] and done
    deltas = "".join(e["delta"] for e in events if e["type"] == "response.reasoning_summary_text.delta")
    assert deltas == THOUGHT == next(e for e in events if e["type"] == "response.reasoning_summary_text.done")["text"]
    text = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    assert text == ANSWER
    final = events[-1]["response"]
    assert [i["type"] for i in final["output"]] == ["reasoning", "message"]
    assert final["usage"]["output_tokens_details"]["reasoning_tokens"] == details.reasoning_tokens
    # Chat carries it as reasoning_content.
    chat = client.chat.completions.create(model="thinker", messages=[{"role": "user", "content": "2+2?"}])
    message = chat.choices[0].message
    assert message.content == ANSWER and message.model_extra["reasoning_content"] == THOUGHT
    assert chat.usage.completion_tokens_details.reasoning_tokens == details.reasoning_tokens
    streamed = client.chat.completions.create(model="thinker", messages=[{"role": "user", "content": "2+2?"}], stream=True)
    pieces = {"content": "", "reasoning_content": ""}
    for chunk in streamed:
        for choice in chunk.choices:
            pieces["content"] += choice.delta.content or ""
            pieces["reasoning_content"] += (choice.delta.model_extra or {}).get("reasoning_content") or ""
    assert pieces == {"content": ANSWER, "reasoning_content": THOUGHT}


def test_the_simulator_reasons_as_much_as_the_effort_asks(client):
    counts = {}
    for effort in ("none", "low", "medium", "high"):
        response = client.responses.create(model="reasoner", input="Think it over", reasoning={"effort": effort})
        counts[effort] = response.usage.output_tokens_details.reasoning_tokens
        kinds = [item.type for item in response.output]
        assert kinds == (["message"] if effort == "none" else ["reasoning", "message"]), (effort, kinds)
        assert response.reasoning.effort == effort and response.output_text
    assert counts["none"] == 0 < counts["low"] < counts["medium"] < counts["high"], counts
    chat = client.chat.completions.create(model="reasoner", messages=[{"role": "user", "content": "hm"}],
                                          reasoning_effort="low")
    assert chat.choices[0].message.model_extra["reasoning_content"]
