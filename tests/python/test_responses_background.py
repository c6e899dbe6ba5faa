"""Background responses beyond the basics of test_responses.py: streamed background responses
whose stream is picked up again after the connection dropped (`GET ?stream=true` with and
without `starting_after`, and the SDK's `responses.stream(response_id=...)` helper), and the
`queued` status of a response that waits for its place in the model's queue. Every event is
validated against the Open Responses pydantic models."""

import json
import threading

import httpx
import openai
import pytest
from openresponses_types import types as spec

from conftest import wait_for
from test_responses import EVENTS


def read_events(response):
    """The JSON events of an SSE response, and whether it ended with `data: [DONE]`."""
    events, done = [], False
    for line in response.iter_lines():
        if line == "data: [DONE]":
            done = True
        elif line.startswith("data: "):
            event = json.loads(line[len("data: "):])
            EVENTS[event["type"]].model_validate(event)
            events.append(event)
    return events, done


def text_of(events):
    return "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")


def test_a_streamed_background_response_is_picked_up_again(gateway, client):
    body = {"model": "slow", "input": "Keep going", "background": True, "stream": True, "max_output_tokens": 40}
    first = []
    with httpx.stream("POST", f"{gateway}/v1/responses", json=body, timeout=30) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            if line.startswith("data: "):
                event = json.loads(line[len("data: "):])
                EVENTS[event["type"]].model_validate(event)
                first.append(event)
                if sum(e["type"] == "response.output_text.delta" for e in first) == 3:
                    break  # the connection drops here; the response goes on
    created = first[0]["response"]
    assert first[0]["type"] == "response.created" and created["background"] and created["status"] == "in_progress"
    rid, last = created["id"], first[-1]["sequence_number"]
    # Picked up live, after the last event seen.
    with httpx.stream("GET", f"{gateway}/v1/responses/{rid}", params={"stream": "true", "starting_after": last},
                      timeout=30) as r:
        assert r.status_code == 200, r.read()
        rest, done = read_events(r)
    assert done and rest[0]["sequence_number"] == last + 1
    events = first + rest
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert events[-1]["type"] in ("response.completed", "response.incomplete")
    final = client.responses.retrieve(rid)
    assert final.status == events[-1]["response"]["status"] and text_of(events) == final.output_text
    # After the end, the whole stream again, with the SDK's helper (which checks the order).
    with client.responses.stream(response_id=rid) as stream:
        replayed = list(stream)
    assert [e.sequence_number for e in replayed] == list(range(len(events)))
    assert replayed[-1].response.id == rid and replayed[-1].response.output_text == final.output_text
    # The raw form, from a sequence number on.
    again = list(client.responses.retrieve(rid, stream=True, starting_after=len(events) - 3))
    assert [e.sequence_number for e in again] == [len(events) - 2, len(events) - 1]


def test_a_retry_with_the_same_key_gets_the_same_background_response(gateway, client):
    body = {"model": "slow", "input": "Once only", "background": True, "stream": True, "max_output_tokens": 30}
    headers = {"Idempotency-Key": "background-stream-1"}
    ids = []
    for _ in range(2):
        with httpx.stream("POST", f"{gateway}/v1/responses", json=body, headers=headers, timeout=30) as r:
            assert r.status_code == 200, r.read()
            first = next(line for line in r.iter_lines() if line.startswith("data: {"))
        ids.append(json.loads(first[len("data: "):])["response"]["id"])
    # The first client left after one event; the retry read the same response, not a new one.
    assert ids[0] == ids[1]
    assert wait_for(lambda: client.responses.retrieve(ids[0]).status in ("completed", "incomplete"))


def test_a_cancelled_stream_keeps_its_events(gateway, client):
    body = {"model": "slow", "input": "Go on", "background": True, "stream": True, "max_output_tokens": 200,
            "min_tokens": 200}
    with httpx.stream("POST", f"{gateway}/v1/responses", json=body, timeout=30) as r:
        seen = []
        for line in r.iter_lines():
            if line.startswith("data: {"):
                seen.append(json.loads(line[len("data: "):]))
                if seen[-1]["type"] == "response.output_text.delta":
                    break
    rid = seen[0]["response"]["id"]
    assert client.responses.cancel(rid).status == "cancelled"
    with httpx.stream("GET", f"{gateway}/v1/responses/{rid}", params={"stream": "true"}, timeout=30) as r:
        events, done = read_events(r)
    assert done and [e["sequence_number"] for e in events] == list(range(len(events)))
    assert len(events) >= len(seen) and events[: len(seen)] == seen


def test_streams_that_cannot_be_read_are_clear_errors(gateway, client):
    plain = client.responses.create(model="chat", input="Not in the background", max_output_tokens=4)
    r = httpx.get(f"{gateway}/v1/responses/{plain.id}", params={"stream": "true"}, timeout=10)
    assert r.status_code == 400 and r.json()["error"]["param"] == "stream", r.text
    for params, param in (({"stream": "yes"}, "stream"), ({"stream": "true", "starting_after": "-1"}, "starting_after")):
        r = httpx.get(f"{gateway}/v1/responses/{plain.id}", params=params, timeout=10)
        assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
    r = httpx.get(f"{gateway}/v1/responses/resp_missing", params={"stream": "true"}, timeout=10)
    assert r.status_code == 404 and r.json()["error"]["code"] == "response_not_found"


@pytest.fixture(scope="module")
def one_at_a_time(tmp_path_factory):
    """A gateway whose models run one generation at a time (`[queue] max_running = 1`)."""
    from tenancy_support import TENANCY_MODELS, Gateway, config_text

    sections = '[auth]\nmode = "none"\n\n[queue]\nmax_running = 1\nmax_waiting = 8\n'
    gateway = Gateway(tmp_path_factory.mktemp("queued"), config_text(sections, TENANCY_MODELS), {})
    yield gateway
    gateway.stop()


def test_a_background_response_waiting_for_its_place_is_queued(one_at_a_time):
    base = one_at_a_time.url
    client = openai.OpenAI(base_url=base, api_key="sk-unused", max_retries=0)
    # `long` streams 200 tokens 20 ms apart: it holds the model's one place for seconds.
    busy = threading.Thread(target=lambda: client.chat.completions.create(
        model="long", messages=[{"role": "user", "content": "hold on"}], max_tokens=100))
    busy.start()
    try:
        metrics = f"{one_at_a_time.base}/metrics"
        assert wait_for(lambda: 'turnpike_queue_running{model="long"} 1' in httpx.get(metrics).text)
        waiting = client.responses.create(model="long", input="after you", background=True, max_output_tokens=5)
        assert waiting.status == "queued" and waiting.background
        spec.ResponseResource.model_validate(waiting.model_dump(mode="json"))
        # Streamed while queued: created and queued, then in progress once it has its place.
        body = {"model": "long", "input": "me too", "background": True, "stream": True, "max_output_tokens": 5}
        with httpx.stream("POST", f"{base}/responses", json=body, timeout=60) as r:
            events, done = read_events(r)
        kinds = [e["type"] for e in events]
        assert kinds[:3] == ["response.created", "response.queued", "response.in_progress"], kinds
        assert events[0]["response"]["status"] == events[1]["response"]["status"] == "queued"
        assert done and kinds[-1] in ("response.completed", "response.incomplete")
        assert [e["sequence_number"] for e in events] == list(range(len(events)))
        assert wait_for(lambda: client.responses.retrieve(waiting.id).status in ("completed", "incomplete"), 30)
        # A queued response can be cancelled before it ever runs.
        blocker = client.responses.create(model="long", input="again", background=True, max_output_tokens=150)
        queued = client.responses.create(model="long", input="never mind", background=True, max_output_tokens=5)
        assert queued.status == "queued"
        assert client.responses.cancel(queued.id).status == "cancelled"
        client.responses.cancel(blocker.id)
        after = client.responses.retrieve(queued.id)
        assert after.status == "cancelled" and after.output == []
    finally:
        busy.join()
