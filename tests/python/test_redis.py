"""Several gateway replicas on one real Redis: shared request and token limits, idempotency
records seen by every replica, and what happens while Redis is down and after it is back.

Needs `redis-server` on the PATH (tests/run.sh installs it); without it these tests fail."""

import json
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from conftest import engine_counter, wait_for
from tenancy_support import Gateway, Redis, chat_body, config_text, error_of, make_key, post_once, tenant, timed_stream


@pytest.fixture
def redis(tmp_path):
    server = Redis(tmp_path / "redis")
    yield server
    server.stop()


@pytest.fixture
def replicas(tmp_path):
    """Starts gateways and stops them at the end: `replicas(sections, env, count)`."""
    started = []

    def start(sections, env, count=2, name="replica"):
        gateways = [Gateway(tmp_path, config_text(sections), env, f"{name}{len(started) + i}") for i in range(count)]
        started.extend(gateways)
        return gateways

    yield start
    for gateway in started:
        gateway.stop()


def state(redis, failure_mode=""):
    return f"""
[state]
backend = "redis"
redis_url = "{redis.url}"
timeout_ms = 250
{failure_mode}
"""


def burst(gateways, key, body, count, threads=24):
    """`count` requests at once, alternating between the gateways; returns the answers and
    the seconds from the first send to the last answer."""
    started = time.monotonic()
    with ThreadPoolExecutor(threads) as pool:
        answers = list(pool.map(
            lambda i: post_once(gateways[i % len(gateways)].base, "/v1/chat/completions", key, body), range(count)
        ))
    return answers, time.monotonic() - started


def test_request_rate_is_shared(redis, replicas):
    key = make_key()
    gateways = replicas(tenant("requests_per_minute = 20") + state(redis), {"ACME_API_KEY": key})
    answers, elapsed = burst(gateways, key, chat_body(max_tokens=1), 120)
    statuses = Counter(status for status, _, _ in answers)
    assert set(statuses) <= {200, 429}, statuses
    admitted = statuses[200]
    # 20 at once, then one every 3 s.
    assert 20 - 1 <= admitted <= 20 + elapsed * 20 / 60 + 1, (statuses, elapsed)
    for status, headers, body in answers:
        if status == 429:
            assert (body["error"]["type"], body["error"]["code"]) == ("requests", "rate_limit_exceeded")
            assert headers["x-ratelimit-limit-requests"] == "20"
            assert headers["x-ratelimit-remaining-requests"] == "0"
            assert int(headers["retry-after"]) >= 1
    # Both replicas turn the tenant away now, whichever admitted what.
    for gateway in gateways:
        status, _, _ = post_once(gateway.base, "/v1/chat/completions", key, chat_body(max_tokens=1))
        assert status == 429


@pytest.mark.parametrize("model", ["chat", "fixed"])
def test_token_budget_is_shared(redis, replicas, model):
    """600 tokens a minute; each request reserves prompt + 50. `chat` gives back what it did
    not use; `fixed` uses all 50, so its admissions are bounded exactly."""
    key = make_key()
    gateways = replicas(tenant("tokens_per_minute = 600") + state(redis), {"ACME_API_KEY": key})
    answers, elapsed = burst(gateways, key, chat_body(model, max_tokens=50), 60)
    statuses = Counter(status for status, _, _ in answers)
    assert set(statuses) <= {200, 429}, statuses
    usages = [body["usage"] for status, _, body in answers if status == 200]
    prompt = usages[0]["prompt_tokens"]
    one_request = prompt + 50
    assert all(u["prompt_tokens"] == prompt for u in usages)
    spent = sum(u["prompt_tokens"] + u["completion_tokens"] for u in usages)
    budget = 600 + elapsed * 10
    # Every admission fitted what the budget had left, so all that was spent fits the budget.
    assert spent <= budget + one_request, (statuses, spent, elapsed)
    # The first 600 // one_request reservations fit whatever the order.
    assert len(usages) >= 600 // one_request, (statuses, spent)
    if model == "fixed":
        assert all(u["completion_tokens"] == 50 for u in usages)
        assert len(usages) * one_request <= budget + one_request
    assert statuses[429] > 0
    for status, headers, body in answers:
        if status == 429:
            assert (body["error"]["type"], body["error"]["code"]) == ("tokens", "rate_limit_exceeded")
            assert headers["x-ratelimit-limit-tokens"] == "600"


def test_idempotent_replay_across_replicas(redis, replicas):
    key = make_key()
    a, b = replicas(tenant("") + state(redis), {"ACME_API_KEY": key})
    headers = {"Idempotency-Key": "order-1"}
    with a.client(key) as on_a, b.client(key) as on_b:
        first = on_a.post("/chat/completions", json=chat_body(max_tokens=30), headers=headers)
        replay = on_b.post("/chat/completions", json=chat_body(max_tokens=30), headers=headers)
        assert first.status_code == replay.status_code == 200
        assert first.headers.get("idempotent-replayed") is None
        assert replay.headers["idempotent-replayed"] == "true"
        assert replay.json() == first.json()
        assert replay.headers["x-request-id"] == first.headers["x-request-id"]
        # A different body under the same key is refused on either replica.
        for client in (on_a, on_b):
            r = client.post("/chat/completions", json=chat_body(max_tokens=31), headers=headers)
            assert r.status_code == 409 and error_of(r)["code"] == "idempotency_key_reused"

        stream = chat_body(max_tokens=30, stream=True)
        headers = {"Idempotency-Key": "order-2"}
        first = on_b.post("/chat/completions", json=stream, headers=headers)
        replay = on_a.post("/chat/completions", json=stream, headers=headers)
        assert first.status_code == replay.status_code == 200
        assert replay.headers["idempotent-replayed"] == "true"
        assert replay.text == first.text and first.text.rstrip().endswith("data: [DONE]")


def test_repeat_on_another_replica_while_running(redis, replicas):
    """A repeat on replica B while replica A still generates waits for A's record and replays
    it (joining the live stream is per replica); the engine runs once in all."""
    key = make_key()
    a, b = replicas(tenant("") + state(redis), {"ACME_API_KEY": key})
    body = chat_body("long", max_tokens=50, stream=True)
    headers = {"Idempotency-Key": "join-across"}
    answers = {}

    def send(gateway):
        with gateway.client(key) as c:
            answers[gateway.base] = timed_stream(c, body, headers)

    first = threading.Thread(target=send, args=(a,))
    first.start()
    time.sleep(0.3)  # A's stream takes about 1 s
    send(b)
    first.join()
    (one, one_text, _, one_end), (two, two_text, _, two_end) = answers[a.base], answers[b.base]
    assert one.status_code == two.status_code == 200
    assert one.headers.get("idempotent-replayed") is None
    assert two.headers["idempotent-replayed"] == "true"
    assert one_text == two_text and one_text.rstrip().endswith("data: [DONE]")
    assert two_end - one_end < 0.5  # not a second run of about 1 s
    completed = lambda: sum(engine_counter(g.base, "completed") for g in (a, b))
    assert wait_for(lambda: completed() >= 1, timeout=5)
    time.sleep(0.1)
    assert completed() == 1


def test_redis_outage_and_recovery(redis, replicas):
    key = make_key()
    env = {"ACME_API_KEY": key}
    limits = tenant("requests_per_minute = 10")
    # A lets plain requests through without Redis but refuses idempotent ones; B refuses both.
    (a,) = replicas(limits + state(redis, '[state.failure_mode]\nrequests = "open"\nidempotency = "closed"'), env, 1, "open")
    (b,) = replicas(limits + state(redis, '[state.failure_mode]\nrequests = "closed"'), env, 1, "closed")
    plain = chat_body(max_tokens=1)

    def send(gateway, idempotency_key=None):
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else None
        return post_once(gateway.base, "/v1/chat/completions", key, plain, headers)

    assert send(a)[0] == 200 and send(b)[0] == 200
    assert send(a, "before-outage")[0] == 200

    redis.stop()
    for _ in range(3):  # also once the store has noticed
        status, _, body = send(a)
        assert status == 200, body
        status, headers, body = send(a, "during-outage")
        assert status == 503, body
        assert body["error"]["code"] == "state_unavailable" and int(headers["retry-after"]) >= 1
        status, _, body = send(b)
        assert status == 503, body
        assert body["error"]["code"] == "state_unavailable"

    # Readiness says which replica can serve: A (fail open) serves unlimited, B cannot serve.
    assert wait_for(lambda: store_up(a) == 0 and store_up(b) == 0, timeout=5)
    ready_a, ready_b = httpx.get(f"{a.base}/ready", timeout=10), httpx.get(f"{b.base}/ready", timeout=10)
    assert ready_a.status_code == 200 and ready_a.json()["state"] == "unavailable", ready_a.text
    assert ready_b.status_code == 503 and ready_b.json()["state"] == "unavailable", ready_b.text

    redis.start()  # same port, empty
    back = time.monotonic()
    # Once the probe sees Redis again, the very first request is served with its limits, not
    # by the failure mode.
    assert wait_for(lambda: store_up(b) == 1, timeout=5), "the store probe did not see Redis return"
    status, _, body = send(b)
    assert status == 200, body
    assert httpx.get(f"{b.base}/ready", timeout=10).json() == {"status": "ready", "state": "ok"}
    assert wait_for(lambda: send(b)[0] == 200, timeout=10), "the closed replica did not recover"
    assert wait_for(lambda: send(a, "after-outage")[0] == 200, timeout=10), "idempotency did not recover"
    recovered = time.monotonic() - back
    assert recovered < 5, recovered
    # The records live in Redis again: the same key is now a replay, on either replica.
    for gateway in (a, b):
        status, headers, _ = send(gateway, "after-outage")
        assert status == 200 and headers["idempotent-replayed"] == "true"
    # And the limit holds again, for both replicas.
    statuses = [send(a)[0] for _ in range(12)]
    assert 429 in statuses, statuses
    assert statuses.count(200) <= 10
    status, _, body = send(b)
    assert status == 429 and body["error"]["code"] == "rate_limit_exceeded"


def store_up(gateway) -> float:
    text = httpx.get(f"{gateway.base}/metrics", timeout=10).text
    found = [line for line in text.splitlines() if line.startswith("turnpike_state_store_up ")]
    return float(found[0].split()[1]) if found else -1.0


def test_stored_responses_are_shared_by_replicas(redis, replicas):
    key = make_key()
    a, b = replicas(tenant("") + state(redis), {"ACME_API_KEY": key})
    with a.client(key) as on_a, b.client(key) as on_b:
        first = on_a.post("/responses", json={"model": "chat", "input": "Hello", "max_output_tokens": 8})
        assert first.status_code == 200, first.text
        first = first.json()
        # Stored on one replica, found, continued and deleted on the other.
        got = on_b.get(f"/responses/{first['id']}")
        assert got.status_code == 200 and got.json() == first
        follow = on_b.post("/responses", json={"model": "chat", "input": "More", "previous_response_id": first["id"]})
        assert follow.status_code == 200 and follow.json()["previous_response_id"] == first["id"]
        items = on_a.get(f"/responses/{follow.json()['id']}/input_items", params={"order": "asc"}).json()
        assert [i["type"] for i in items["data"]] == ["message", "message", "message"]
        # A streamed response is stored too.
        streamed = on_a.post("/responses", json={"model": "chat", "input": "Stream", "stream": True})
        last = [line for line in streamed.text.splitlines() if line.startswith("data: {")][-1]
        streamed_id = json.loads(last[len("data: "):])["response"]["id"]
        assert wait_for(lambda: on_b.get(f"/responses/{streamed_id}").status_code == 200)
        assert on_b.delete(f"/responses/{first['id']}").json()["deleted"] is True
        assert on_a.get(f"/responses/{first['id']}").status_code == 404


def test_a_background_response_is_cancelled_from_another_replica(redis, replicas):
    key = make_key()
    a, b = replicas(tenant("") + state(redis), {"ACME_API_KEY": key})
    before = engine_counter(a.base, "cancelled")
    with a.client(key) as on_a, b.client(key) as on_b:
        body = {"model": "slow", "input": "Go on for a while", "background": True, "max_output_tokens": 250, "min_tokens": 250}
        started = on_a.post("/responses", json=body).json()
        assert started["status"] == "in_progress"
        cancelled = on_b.post(f"/responses/{started['id']}/cancel").json()
        assert cancelled["status"] == "cancelled"
        # The replica running it notices, stops the engine, and does not overwrite the cancel.
        assert wait_for(lambda: engine_counter(a.base, "cancelled") > before)
        time.sleep(0.5)
        assert on_a.get(f"/responses/{started['id']}").json()["status"] == "cancelled"


def test_a_streamed_background_response_is_read_on_another_replica(redis, replicas):
    key = make_key()
    a, b = replicas(tenant("") + state(redis), {"ACME_API_KEY": key})
    with a.client(key) as on_a, b.client(key) as on_b:
        # About 2 s of output (100 tokens, 20 ms apart), so it is still running when read.
        body = {"model": "slow", "input": "Stream it", "background": True, "stream": True, "max_output_tokens": 100}
        with on_a.stream("POST", "/responses", json=body) as r:
            first = next(line for line in r.iter_lines() if line.startswith("data: {"))
        rid = json.loads(first[len("data: "):])["response"]["id"]
        # The other replica follows it live in the shared store, from after the first event.
        events, done, running_when_first_seen = [], False, None
        with on_b.stream("GET", f"/responses/{rid}", params={"stream": "true", "starting_after": 0}) as r:
            assert r.status_code == 200, r.read()
            for line in r.iter_lines():
                if line == "data: [DONE]":
                    done = True
                elif line.startswith("data: {"):
                    events.append(json.loads(line[len("data: "):]))
                    if running_when_first_seen is None:
                        running_when_first_seen = on_a.get(f"/responses/{rid}").json()["status"] == "in_progress"
        assert running_when_first_seen, "the other replica's reader saw nothing until the end"
        assert done and [e["sequence_number"] for e in events] == list(range(1, len(events) + 1))
        assert events[-1]["type"] in ("response.completed", "response.incomplete")
        assert events[-1]["response"] == on_a.get(f"/responses/{rid}").json()
