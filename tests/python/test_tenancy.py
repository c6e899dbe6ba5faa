"""Tenants against the real gateway (state in memory): API keys, model permissions,
idempotency with the official SDK, concurrency permits, request and token limits, and the
hot-reloaded keys file."""

import json
import socket
import subprocess
import threading
import time

import openai
import pytest

from conftest import BIN, engine_counter, wait_for
from tenancy_support import HELLO, Gateway, chat_body, config_text, error_of, make_key, timed_stream

TENANTS = ("acme", "globex", "solo", "limited", "budget", "sockets")


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """One gateway with five tenants, each with its own key, and a keys file with one more
    acme key; yields (gateway, {tenant: key}, keys file, the file's key)."""
    directory = tmp_path_factory.mktemp("tenancy")
    keys_file = directory / "keys.toml"
    created = subprocess.run(
        [str(BIN), "keys", "create", "--file", str(keys_file), "--tenant", "acme"],
        capture_output=True, text=True, check=True,
    )
    file_key = created.stdout.strip()
    assert len(file_key) == 59 and file_key.startswith("tp-"), created.stdout
    keys = {name: make_key() for name in TENANTS}
    sections = f"""
[auth]
mode = "required"
keys_file = "{keys_file}"
reload_interval_ms = 200

[plans.roomy]
requests_per_minute = 6000
models = ["*"]

[tenants.acme]
plan = "roomy"
keys = [{{ env = "ACME_API_KEY" }}]

[tenants.globex]
plan = "roomy"
models = ["chat"]
keys = [{{ env = "GLOBEX_API_KEY" }}]

[tenants.solo]
plan = "roomy"
concurrent_streams = 1
keys = [{{ env = "SOLO_API_KEY" }}]

[tenants.limited]
requests_per_minute = 3
models = ["*"]
keys = [{{ env = "LIMITED_API_KEY" }}]

[tenants.budget]
plan = "roomy"
tokens_per_minute = 100
keys = [{{ env = "BUDGET_API_KEY" }}]

[tenants.sockets]
requests_per_minute = 4
models = ["*"]
keys = [{{ env = "SOCKETS_API_KEY" }}]

[idempotency]
join = true
"""
    env = {f"{name.upper()}_API_KEY": key for name, key in keys.items()}
    gateway = Gateway(directory, config_text(sections), env)
    yield gateway, keys, keys_file, file_key
    gateway.stop()


@pytest.fixture(scope="module")
def gateway(setup):
    return setup[0]


@pytest.fixture(scope="module")
def keys(setup):
    return setup[1]


def sdk(gateway, key):
    return openai.OpenAI(base_url=gateway.url, api_key=key, max_retries=0)


def test_keys_are_required_and_checked(gateway, keys):
    body = chat_body()
    with gateway.client(None) as anonymous:
        r = anonymous.post("/chat/completions", json=body)
        assert r.status_code == 401 and error_of(r)["code"] == "invalid_api_key"
        assert anonymous.get("/models").status_code == 401
    for key in (make_key(), "sk-not-a-turnpike-key", keys["acme"][:-1], keys["acme"] + "A"):
        with gateway.client(key) as c:
            r = c.post("/chat/completions", json=body)
            assert r.status_code == 401, (key, r.text)
            assert error_of(r)["code"] == "invalid_api_key"
    # The SDK sees the same answer as its own error class.
    with pytest.raises(openai.AuthenticationError) as err:
        sdk(gateway, make_key()).chat.completions.create(model="chat", messages=HELLO, max_tokens=5)
    assert err.value.body["code"] == "invalid_api_key"
    with gateway.client(keys["acme"]) as c:
        assert c.post("/chat/completions", json=body).status_code == 200


def test_models_are_per_tenant(gateway, keys):
    with gateway.client(keys["globex"]) as c:
        assert [m["id"] for m in c.get("/models").json()["data"]] == ["chat"]
        assert c.post("/chat/completions", json=chat_body("chat")).status_code == 200
        r = c.post("/chat/completions", json=chat_body("slow"))
        assert r.status_code == 403
        assert error_of(r)["code"] == "model_not_allowed" and error_of(r)["param"] == "model"
        r = c.post("/completions", json={"model": "slow", "prompt": "Hello", "max_tokens": 5})
        assert r.status_code == 403 and error_of(r)["code"] == "model_not_allowed"
    with pytest.raises(openai.PermissionDeniedError) as err:
        sdk(gateway, keys["globex"]).chat.completions.create(model="fixed", messages=HELLO, max_tokens=5)
    assert err.value.body["code"] == "model_not_allowed"
    acme_models = {m.id for m in sdk(gateway, keys["acme"]).models.list()}
    assert acme_models == {"chat", "slow", "long", "fixed"}


def test_sdk_idempotent_replay(gateway, keys):
    client = sdk(gateway, keys["acme"])
    key = {"Idempotency-Key": f"replay-{make_key()}"}
    args = dict(model="chat", messages=HELLO, max_tokens=30, extra_headers=key)
    first = client.chat.completions.with_raw_response.create(**args)
    again = client.chat.completions.with_raw_response.create(**args)
    assert first.headers.get("idempotent-replayed") is None
    assert again.headers.get("idempotent-replayed") == "true"
    a, b = first.parse(), again.parse()
    assert a.id == b.id and a.created == b.created
    assert a.choices[0].message.content == b.choices[0].message.content
    assert a.usage == b.usage
    assert json.loads(first.http_response.content) == json.loads(again.http_response.content)

    # The same key with another body is refused.
    with pytest.raises(openai.ConflictError) as err:
        client.chat.completions.create(**dict(args, max_tokens=31))
    assert err.value.status_code == 409 and err.value.body["code"] == "idempotency_key_reused"

    # Another tenant's record under the same key string is none of globex's business.
    other = sdk(gateway, keys["globex"]).chat.completions.with_raw_response.create(**args)
    assert other.headers.get("idempotent-replayed") is None
    assert other.parse().id != a.id


def test_sdk_idempotent_stream_replay(gateway, keys):
    client = sdk(gateway, keys["acme"])
    args = dict(
        model="chat", messages=HELLO, max_tokens=30, stream=True, stream_options={"include_usage": True},
        extra_headers={"Idempotency-Key": f"stream-{make_key()}"},
    )
    first = client.chat.completions.with_raw_response.create(**args)
    chunks = [c.model_dump() for c in first.parse()]
    again = client.chat.completions.with_raw_response.create(**args)
    replayed = [c.model_dump() for c in again.parse()]
    assert first.headers.get("idempotent-replayed") is None
    assert again.headers.get("idempotent-replayed") == "true"
    assert again.headers["content-type"].startswith("text/event-stream")
    assert len(chunks) > 3 and replayed == chunks
    assert len({c["id"] for c in chunks}) == 1
    assert chunks[-1]["usage"]["completion_tokens"] > 0
    # A streamed request and a plain one are different requests.
    with pytest.raises(openai.ConflictError) as err:
        client.chat.completions.create(**dict(args, stream=False, stream_options=None))
    assert err.value.body["code"] == "idempotency_key_reused"


def test_concurrent_repeat_joins_the_running_request(gateway, keys):
    """The second request arrives while the first is generating: it gets the same stream, and
    the engine runs once."""
    body = chat_body("long", max_tokens=50, stream=True)
    headers = {"Idempotency-Key": f"join-{make_key()}"}
    before = engine_counter(gateway.base, "completed")
    answers = {}

    def send(name):
        with gateway.client(keys["acme"]) as c:
            answers[name] = timed_stream(c, body, headers)

    first = threading.Thread(target=send, args=("first",))
    first.start()
    time.sleep(0.3)  # the first stream takes about 1 s
    send("second")
    first.join()
    (one, one_text, _, one_end), (two, two_text, two_first, two_end) = answers["first"], answers["second"]
    assert one.status_code == two.status_code == 200
    assert one.headers.get("idempotent-replayed") is None
    assert two.headers.get("idempotent-replayed") == "true"
    assert one_text == two_text and one_text.rstrip().endswith("data: [DONE]")
    ids = {json.loads(line[6:])["id"] for line in one_text.splitlines() if line.startswith("data: {")}
    assert len(ids) == 1
    # Joined: the second got what was already generated at once, then went along with the
    # first, instead of waiting for its end or running again.
    assert two_first < one_end - 0.3 and abs(two_end - one_end) < 0.5
    assert wait_for(lambda: engine_counter(gateway.base, "completed") >= before + 1, timeout=5)
    time.sleep(0.1)
    assert engine_counter(gateway.base, "completed") == before + 1


def test_concurrency_permit_comes_back_after_disconnect(gateway, keys):
    cancelled = engine_counter(gateway.base, "cancelled")
    with gateway.client(keys["solo"]) as streaming, gateway.client(keys["solo"]) as other:
        # About 4 s of stream; we read its first event and hang up.
        with streaming.stream("POST", "/chat/completions", json=chat_body("long", max_tokens=200, stream=True)) as s:
            assert s.status_code == 200
            # Keep the iterator: a dropped one closes the response, which is a disconnect.
            lines = s.iter_lines()
            assert next(lines) == "id: 0" and next(lines).startswith("data: {")
            r = other.post("/chat/completions", json=chat_body())
            assert r.status_code == 429, r.text
            assert error_of(r)["code"] == "concurrency_limit_exceeded"
            assert "retry-after" in r.headers
        closed = time.monotonic()
    with gateway.client(keys["solo"]) as c:
        assert wait_for(lambda: c.post("/chat/completions", json=chat_body()).status_code == 200, timeout=2)
    assert time.monotonic() - closed < 2  # well before the stream would have ended
    assert wait_for(lambda: engine_counter(gateway.base, "cancelled") == cancelled + 1, timeout=2)


def test_request_rate_limit(gateway, keys):
    with gateway.client(keys["limited"]) as c:
        for remaining in (2, 1, 0):
            r = c.post("/chat/completions", json=chat_body(max_tokens=1))
            assert r.status_code == 200
            assert r.headers["x-ratelimit-limit-requests"] == "3"
            assert r.headers["x-ratelimit-remaining-requests"] == str(remaining)
            assert r.headers["x-ratelimit-reset-requests"]
    with gateway.client(keys["limited"]) as c:
        r = c.post("/chat/completions", json=chat_body(max_tokens=1))
    assert r.status_code == 429
    error = error_of(r)
    assert (error["type"], error["code"]) == ("requests", "rate_limit_exceeded")
    # One request back every 20 s.
    assert 1 <= int(r.headers["retry-after"]) <= 20
    assert 0 < int(r.headers["retry-after-ms"]) <= 20_000
    assert r.headers["x-ratelimit-limit-requests"] == "3"
    assert r.headers["x-ratelimit-remaining-requests"] == "0"
    assert r.headers["x-ratelimit-reset-requests"]
    assert r.headers.get("x-should-retry") != "false"
    with pytest.raises(openai.RateLimitError) as err:
        sdk(gateway, keys["limited"]).chat.completions.create(model="chat", messages=HELLO, max_tokens=1)
    assert err.value.body["code"] == "rate_limit_exceeded"


def test_token_budget(gateway, keys):
    # budget: 100 tokens a minute. The `fixed` model spends exactly max_tokens.
    first = {"Idempotency-Key": f"budget-{make_key()}"}
    with gateway.client(keys["budget"]) as c:
        r = c.post("/chat/completions", json=chat_body("fixed", max_tokens=40), headers=first)
        assert r.status_code == 200, r.text
        first_body = r.json()
        usage = r.json()["usage"]
        spent = usage["prompt_tokens"] + usage["completion_tokens"]
        assert usage["completion_tokens"] == 40 and spent <= 70, usage
        assert r.headers["x-ratelimit-limit-tokens"] == "100"
        # The reservation (prompt + max_tokens) is settled at what was spent.
        remaining = int(r.headers["x-ratelimit-remaining-tokens"])
        assert 100 - spent - 40 <= remaining <= 100 - spent + 2, (remaining, spent)
        assert r.headers["x-ratelimit-reset-tokens"]
        assert r.headers["x-ratelimit-limit-requests"] == "6000"

        # The next one would reserve prompt + 40 again: over what is left, but it fits later.
        r = c.post("/chat/completions", json=chat_body("fixed", max_tokens=40))
        assert r.status_code == 429, r.text
        assert (error_of(r)["type"], error_of(r)["code"]) == ("tokens", "rate_limit_exceeded")
        assert r.headers["x-ratelimit-limit-tokens"] == "100"
        assert int(r.headers["x-ratelimit-remaining-tokens"]) < usage["prompt_tokens"] + 40
        assert int(r.headers["retry-after"]) >= 1 and int(r.headers["retry-after-ms"]) > 0
        assert r.headers.get("x-should-retry") != "false"

        # Larger than the whole budget: never admitted, and the client is told not to retry.
        r = c.post("/chat/completions", json=chat_body("fixed", max_tokens=100))
        assert r.status_code == 429, r.text
        assert error_of(r)["type"] == "tokens"
        assert r.headers["x-should-retry"] == "false"

        # A replay is not charged again: it is answered though its tokens no longer fit.
        r = c.post("/chat/completions", json=chat_body("fixed", max_tokens=40), headers=first)
        assert r.status_code == 200, r.text
        assert r.headers["idempotent-replayed"] == "true" and r.json() == first_body

        # A small one still fits in what is left.
        r = c.post("/chat/completions", json=chat_body("fixed", max_tokens=2))
        assert r.status_code == 200, r.text


@pytest.mark.parametrize(
    "value, length_error",
    [("k" * 300, True), ("k" * 256, True), ("", True), ("caf\u00e9".encode(), False), ("two words", False)],
    ids=["300-chars", "256-chars", "empty", "non-ascii", "space"],
)
def test_bad_idempotency_key(gateway, keys, value, length_error):
    with gateway.client(keys["acme"]) as c:
        r = c.post("/chat/completions", json=chat_body(max_tokens=1), headers={"Idempotency-Key": value})
    assert r.status_code == 400, r.text
    error = error_of(r)
    assert error["code"] == "invalid_header" and error["param"] == "Idempotency-Key"
    assert ("255" in error["message"]) == length_error


def test_longest_idempotency_key_is_accepted(gateway, keys):
    headers = {"Idempotency-Key": "k" * 255}
    with gateway.client(keys["acme"]) as c:
        first = c.post("/chat/completions", json=chat_body(max_tokens=3), headers=headers)
        again = c.post("/chat/completions", json=chat_body(max_tokens=3), headers=headers)
    assert first.status_code == again.status_code == 200
    assert again.headers["idempotent-replayed"] == "true" and first.json() == again.json()


def test_keys_file_is_reloaded(setup):
    gateway, _, keys_file, file_key = setup

    def ok(key):
        def status():
            with gateway.client(key) as c:
                return c.post("/chat/completions", json=chat_body(max_tokens=1)).status_code
        return status

    assert ok(file_key)() == 200
    # A key added while the gateway runs starts working ...
    created = subprocess.run(
        [str(BIN), "keys", "create", "--file", str(keys_file), "--tenant", "globex"],
        capture_output=True, text=True, check=True,
    )
    new_key = created.stdout.strip()
    assert wait_for(lambda: ok(new_key)() == 200, timeout=5)
    with gateway.client(new_key) as c:  # ... as globex's
        assert [m["id"] for m in c.get("/models").json()["data"]] == ["chat"]
    # ... and a revoked one stops.
    subprocess.run(
        [str(BIN), "keys", "revoke", "--file", str(keys_file), "--id", file_key[3:15]],
        capture_output=True, text=True, check=True,
    )
    assert wait_for(lambda: ok(file_key)() == 401, timeout=5)
    with gateway.client(file_key) as c:
        assert error_of(c.post("/chat/completions", json=chat_body()))["code"] == "invalid_api_key"
    assert ok(new_key)() == 200


def test_join_disabled_answers_in_progress(tmp_path):
    """With `join = false` a repeat while the first still runs is refused, not joined."""
    key = make_key()
    sections = """
[auth]
mode = "required"
[tenants.acme]
models = ["*"]
keys = [{ env = "ACME_API_KEY" }]
[idempotency]
join = false
"""
    gateway = Gateway(tmp_path, config_text(sections), {"ACME_API_KEY": key})
    try:
        body = chat_body("long", max_tokens=30, stream=True)
        headers = {"Idempotency-Key": "only-once"}
        with gateway.client(key) as first, gateway.client(key) as second:
            with first.stream("POST", "/chat/completions", json=body, headers=headers) as s:
                assert s.status_code == 200
                r = second.post("/chat/completions", json=body, headers=headers)
                assert r.status_code == 409, r.text
                assert error_of(r)["code"] == "idempotency_request_in_progress"
                streamed = s.read().decode()
            r = second.post("/chat/completions", json=body, headers=headers)
        assert r.status_code == 200 and r.headers["idempotent-replayed"] == "true"
        assert r.text == streamed
    finally:
        gateway.stop()


def test_early_rejection_keeps_connection_usable(gateway):
    """The gateway answers 401 (and request-rate 429) before it reads the request body. The
    answer must leave the connection usable, or say `Connection: close`: otherwise an HTTP/1.1
    client that sent its body a moment after the headers (httpx does) and reuses the
    connection loses its next request ("Server disconnected without sending a response")."""
    host, port = gateway.base.removeprefix("http://").rsplit(":", 1)
    body = json.dumps(chat_body(max_tokens=1)).encode()
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {make_key()}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode()
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        sock.sendall(head)  # the body comes later, as a client's second write would
        answer = sock.recv(65536).decode()
        assert answer.startswith("HTTP/1.1 401")
        if "\r\nconnection: close\r\n" in answer.lower():
            return
        time.sleep(0.1)  # the body arrives after the answer
        sock.sendall(body)
        time.sleep(0.1)
        try:
            sock.sendall(head + body)
            again = sock.recv(65536).decode()
        except OSError as e:
            again = repr(e)
        assert again.startswith("HTTP/1.1 401"), f"the kept-alive connection was closed: {again!r}"


def test_stored_responses_belong_to_their_tenant(gateway, keys):
    acme, globex = sdk(gateway, keys["acme"]), sdk(gateway, keys["globex"])
    first = acme.responses.create(model="chat", input="Remember this.", max_output_tokens=8)
    assert acme.responses.retrieve(first.id).id == first.id
    # Another tenant neither sees it nor continues it.
    with pytest.raises(openai.NotFoundError) as err:
        globex.responses.retrieve(first.id)
    assert err.value.body["code"] == "response_not_found"
    with pytest.raises(openai.NotFoundError) as err:
        globex.responses.create(model="chat", input="And then?", previous_response_id=first.id)
    assert err.value.body["code"] == "previous_response_not_found"
    assert err.value.body["param"] == "previous_response_id"
    with pytest.raises(openai.NotFoundError):
        globex.responses.delete(first.id)
    # Its owner still can.
    follow = acme.responses.create(model="chat", input="And then?", previous_response_id=first.id, max_output_tokens=8)
    assert follow.previous_response_id == first.id


def test_websockets_authenticate_as_http_does(gateway, keys):
    from websockets.exceptions import InvalidStatus
    from websockets.sync.client import connect

    url = gateway.url.replace("http://", "ws://") + "/responses"
    with pytest.raises(InvalidStatus) as err:
        connect(url)
    assert err.value.response.status_code == 401
    create = json.dumps({"type": "response.create", "model": "chat", "input": "hi", "max_output_tokens": 4})
    # The header form, and the browser's subprotocol form.
    for options in ({"additional_headers": {"Authorization": f"Bearer {keys['acme']}"}},
                    {"subprotocols": ["realtime", f"openai-insecure-api-key.{keys['acme']}"]}):
        with connect(url, **options) as ws:
            ws.send(create)
            while (event := json.loads(ws.recv(timeout=10)))["type"] not in ("response.completed", "response.incomplete", "error"):
                pass
            assert event["type"] != "error", event
    # A model the tenant may not use is the error HTTP gives, as an event; the socket stays open.
    with gateway.client(keys["globex"]) as c:
        http = c.post("/responses", json={"model": "echo", "input": "hi"})
    with connect(url, additional_headers={"Authorization": f"Bearer {keys['globex']}"}) as ws:
        ws.send(json.dumps({"type": "response.create", "model": "echo", "input": "hi"}))
        event = json.loads(ws.recv(timeout=10))
        assert event["type"] == "error" and event["status"] == http.status_code >= 400
        assert event["error"]["code"] == error_of(http)["code"]
        ws.send(create)
        while (event := json.loads(ws.recv(timeout=10)))["type"] not in ("response.completed", "response.incomplete", "error"):
            pass
        assert event["type"] != "error", event


def test_responses_honour_idempotency_keys(gateway, keys):
    body = {"model": "chat", "input": "Only once, please.", "max_output_tokens": 8}
    headers = {"Idempotency-Key": "responses-1"}
    with gateway.client(keys["acme"]) as c:
        first = c.post("/responses", json=body, headers=headers)
        replay = c.post("/responses", json=body, headers=headers)
        assert first.status_code == replay.status_code == 200, first.text
        assert replay.headers["idempotent-replayed"] == "true" and replay.json() == first.json()
        conflict = c.post("/responses", json={**body, "input": "Something else"}, headers=headers)
        assert conflict.status_code == 409 and error_of(conflict)["code"] == "idempotency_key_reused"


FINISHED = ("response.completed", "response.incomplete")


def ws_turn(ws, message):
    """Sends a message and reads its events up to the turn's last one or an error event."""
    ws.send(json.dumps(message))
    events = []
    while True:
        events.append(json.loads(ws.recv(timeout=10)))
        if events[-1]["type"] in ("response.completed", "response.incomplete", "response.failed", "error"):
            return events


def test_websocket_turns_honour_idempotency_keys(gateway, keys):
    from websockets.sync.client import connect

    url = gateway.url.replace("http://", "ws://") + "/responses"
    auth = {"Authorization": f"Bearer {keys['acme']}"}
    create = {"type": "response.create", "model": "chat", "input": "Exactly once", "max_output_tokens": 8,
              "idempotency_key": f"ws-{make_key()}"}
    with connect(url, additional_headers=auth) as ws:
        first = ws_turn(ws, create)
        assert first[-1]["type"] in FINISHED, first
    # A retry on a new connection (the first one dropped) replays the same events.
    with connect(url, additional_headers=auth) as ws:
        again = ws_turn(ws, create)
        assert again == first
        # The nested form is the same request.
        nested = {"type": "response.create", "idempotency_key": create["idempotency_key"],
                  "response": {k: v for k, v in create.items() if k not in ("type", "idempotency_key")}}
        assert ws_turn(ws, nested) == first
        # The key with another request is refused; the socket stays open.
        other = ws_turn(ws, {**create, "input": "Something else"})
        assert other[-1]["type"] == "error" and other[-1]["status"] == 409
        assert other[-1]["error"]["code"] == "idempotency_key_reused"
        bad = ws_turn(ws, {**create, "idempotency_key": "has spaces"})
        assert bad[-1]["status"] == 400 and bad[-1]["error"]["param"] == "idempotency_key"
        # The replayed response continues the conversation like the original.
        rid = first[-1]["response"]["id"]
        follow = ws_turn(ws, {"type": "response.create", "model": "chat", "input": "And then?",
                              "previous_response_id": rid, "max_output_tokens": 4})
        assert follow[-1]["type"] in FINISHED
    # Chat over WebSocket: the same key replays the same chunks.
    chat_url = gateway.url.replace("http://", "ws://") + "/chat/completions"
    request = {**chat_body(), "idempotency_key": f"ws-chat-{make_key()}"}
    answers = []
    for _ in range(2):
        with connect(chat_url, additional_headers=auth) as ws:
            ws.send(json.dumps(request))
            frames = []
            while (text := ws.recv(timeout=10)) != "[DONE]":
                frames.append(json.loads(text))
            answers.append(frames)
    assert answers[0] == answers[1] and answers[0][0]["object"] == "chat.completion.chunk"


def test_websocket_turns_count_against_request_rates(gateway, keys):
    from websockets.sync.client import connect

    url = gateway.url.replace("http://", "ws://") + "/responses"
    with connect(url, additional_headers={"Authorization": f"Bearer {keys['sockets']}"}) as ws:
        # The upgrade was one request of four; three turns fit, the fourth is refused.
        create = {"type": "response.create", "model": "chat", "input": "hi", "max_output_tokens": 4}
        for _ in range(3):
            assert ws_turn(ws, create)[-1]["type"] in FINISHED
        refused = ws_turn(ws, create)[-1]
        assert refused["type"] == "error" and refused["status"] == 429
        assert refused["error"]["code"] == "rate_limit_exceeded"

