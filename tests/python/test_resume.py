"""Resumable streams: a client whose connection drops mid-stream sends the request again with
its `Idempotency-Key` and `Last-Event-ID` and reads on, on the same replica (live) or on
another one sharing a real Redis (from the record), with the official openai SDK; and what a
resume that cannot be served answers.

Needs `redis-server` on the PATH (tests/setup.sh installs it)."""

import json
import time

import httpx
import openai
import pytest

from conftest import engine_counter, wait_for
from tenancy_support import HELLO, Gateway, Redis, config_text, error_of, make_key, tenant

# About 60 tokens, 20 ms apart: 1.3 s of stream.
ARGS = dict(model="long", messages=HELLO, max_tokens=60, stream=True)


@pytest.fixture
def pair(tmp_path):
    """Two replicas on one Redis, and the tenant's key."""
    redis = Redis(tmp_path / "redis")
    key = make_key()
    sections = tenant(f'[state]\nbackend = "redis"\nredis_url = "{redis.url}"\n')
    gateways = [Gateway(tmp_path, config_text(sections), {"ACME_API_KEY": key}, f"r{i}") for i in range(2)]
    yield gateways, key
    for gateway in gateways:
        gateway.stop()
    redis.stop()


def sdk(gateway: Gateway, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway.url, api_key=key, max_retries=0)


def cut_after(client: openai.OpenAI, idempotency_key: str, k: int) -> list:
    """The first `k` chunks of a stream, then the connection closed."""
    stream = client.chat.completions.create(**ARGS, extra_headers={"Idempotency-Key": idempotency_key})
    seen = []
    for chunk in stream:
        seen.append(chunk)
        if len(seen) == k:
            break
    stream.close()
    return seen


def dumped(chunks) -> list[dict]:
    return [c.model_dump() for c in chunks]


@pytest.mark.parametrize("where", ["same", "other"])
def test_a_cut_stream_resumes_where_it_stopped(pair, where):
    (a, b), key = pair
    idempotency_key = f"resume-{where}"
    seen = cut_after(sdk(a, key), idempotency_key, 5)
    assert len(seen) == 5
    # Every event of a chat stream is one chunk, numbered from 0: the last read is 4.
    on = a if where == "same" else b
    resumed = sdk(on, key).chat.completions.create(
        **ARGS, extra_headers={"Idempotency-Key": idempotency_key, "Last-Event-ID": "4"}
    )
    rest = list(resumed)
    whole = list(sdk(b, key).chat.completions.create(**ARGS, extra_headers={"Idempotency-Key": idempotency_key}))
    assert dumped(seen + rest) == dumped(whole)
    text = "".join(c.choices[0].delta.content or "" for c in whole if c.choices)
    assert len(text) > 20, whole
    # One run in all, billed once; nothing was cancelled.
    completed = lambda: sum(engine_counter(g.base, "completed") for g in (a, b))
    assert wait_for(lambda: completed() >= 1, timeout=5)
    time.sleep(0.1)
    assert completed() == 1
    assert sum(engine_counter(g.base, "cancelled") for g in (a, b)) == 0


def test_every_event_carries_its_place(pair):
    (a, _), key = pair
    headers = {"Authorization": f"Bearer {key}", "Idempotency-Key": "raw"}
    body = {k: v for k, v in ARGS.items()} | {"max_tokens": 5}
    with httpx.Client(base_url=a.url, headers=headers, timeout=30) as c:
        raw = c.post("/chat/completions", json=body).text
        events = [e for e in raw.split("\n\n") if e and not e.startswith(":")]
        assert [e.split("\n")[0] for e in events] == [f"id: {i}" for i in range(len(events))]
        assert events[-1].endswith("data: [DONE]")
        # Resuming after the last event reads nothing more; past it there is no such event.
        last = len(events) - 1
        tail = c.post("/chat/completions", json=body, headers={"Last-Event-ID": str(last)})
        assert tail.status_code == 200 and tail.text == ""
        past = c.post("/chat/completions", json=body, headers={"Last-Event-ID": str(last + 1)})
        assert past.status_code == 404
        assert (error_of(past)["code"], error_of(past)["param"]) == ("event_not_found", "Last-Event-ID")


def test_a_resume_that_cannot_be_served_says_why(tmp_path):
    key = make_key()
    sections = tenant("[idempotency]\nttl_secs = 1\nresume_window_ms = 300\n")
    gateway = Gateway(tmp_path, config_text(sections), {"ACME_API_KEY": key})
    try:
        with gateway.client(key) as c:
            body = dict(ARGS, messages=HELLO)
            # Without a key, or malformed: 400 naming the header.
            for headers in ({"Last-Event-ID": "3"}, {"Last-Event-ID": "x", "Idempotency-Key": "k"}):
                r = c.post("/chat/completions", json=body, headers=headers)
                assert r.status_code == 400, r.text
                assert (error_of(r)["code"], error_of(r)["param"]) == ("invalid_header", "Last-Event-ID")
            # A key that never ran: 404 naming it, and nothing is run.
            r = c.post("/chat/completions", json=body, headers={"Idempotency-Key": "never", "Last-Event-ID": "0"})
            assert r.status_code == 404
            assert (error_of(r)["code"], error_of(r)["param"]) == ("stream_not_found", "Idempotency-Key")
            assert "kept for 1 s" in error_of(r)["message"]
            assert engine_counter(gateway.base, "completed") == 0
        # A stream every client left goes on for the resume window only, then is dropped.
        cut_after(sdk(gateway, key), "left", 2)
        assert wait_for(lambda: engine_counter(gateway.base, "cancelled") == 1, timeout=5)
        with gateway.client(key) as c:
            r = c.post("/chat/completions", json=body, headers={"Idempotency-Key": "left", "Last-Event-ID": "1"})
            assert r.status_code == 404 and error_of(r)["code"] == "stream_not_found"
            # A finished stream past its retention: gone, and the answer says for how long they stay.
            short = dict(body, max_tokens=3)
            assert c.post("/chat/completions", json=short, headers={"Idempotency-Key": "old"}).status_code == 200
            time.sleep(1.5)
            r = c.post("/chat/completions", json=short, headers={"Idempotency-Key": "old", "Last-Event-ID": "0"})
            assert r.status_code == 404 and "kept for 1 s" in error_of(r)["message"]
            # An answer that is not a stream has no events to resume after.
            whole = dict(short, stream=False)
            assert c.post("/chat/completions", json=whole, headers={"Idempotency-Key": "json"}).status_code == 200
            r = c.post("/chat/completions", json=whole, headers={"Idempotency-Key": "json", "Last-Event-ID": "0"})
            assert r.status_code == 400 and error_of(r)["param"] == "Last-Event-ID"
    finally:
        gateway.stop()


def test_a_resume_without_idempotency_is_refused(tmp_path):
    key = make_key()
    gateway = Gateway(tmp_path, config_text(tenant("[idempotency]\nenabled = false\n")), {"ACME_API_KEY": key})
    try:
        with gateway.client(key) as c:
            headers = {"Idempotency-Key": "k", "Last-Event-ID": "2"}
            r = c.post("/chat/completions", json=dict(ARGS, max_tokens=3), headers=headers)
            assert r.status_code == 400 and error_of(r)["param"] == "Last-Event-ID", r.text
            assert engine_counter(gateway.base, "completed") == 0
    finally:
        gateway.stop()


def test_a_websocket_turn_resumes_on_a_new_connection(pair):
    from websockets.sync.client import connect

    (a, b), key = pair
    auth = {"Authorization": f"Bearer {key}"}
    request = {"model": "long", "messages": HELLO, "max_tokens": 60, "idempotency_key": "ws-resume"}

    def url(gateway):
        return gateway.url.replace("http://", "ws://") + "/chat/completions"

    def read_all(ws):
        frames = []
        while (text := ws.recv(timeout=10)) != "[DONE]":
            frames.append(json.loads(text))
        return frames

    with connect(url(a), additional_headers=auth) as ws:
        ws.send(json.dumps(request))
        seen = [json.loads(ws.recv(timeout=10)) for _ in range(4)]
    # The socket is gone; the turn goes on for the resume window. A new socket, on either
    # replica, picks it up after the last message read.
    for gateway in (a, b):
        with connect(url(gateway), additional_headers=auth) as ws:
            ws.send(json.dumps({**request, "resume_after": 3}))
            rest = read_all(ws)
            ws.send(json.dumps(request))
            whole = read_all(ws)
        assert seen + rest == whole and len(whole) > 10
    # Without the key, a resume is refused on the socket, which stays open.
    with connect(url(a), additional_headers=auth) as ws:
        ws.send(json.dumps({k: v for k, v in request.items() if k != "idempotency_key"} | {"resume_after": 1}))
        refused = json.loads(ws.recv(timeout=10))
        assert refused["type"] == "error" and refused["status"] == 400
        assert refused["error"]["param"] == "resume_after"
