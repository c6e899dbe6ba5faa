"""What a red team found and what holds now, against the real binary: JWT claims that must be
present, bounded work for large bodies and WebSocket messages (RSS read from /proc), header and
body read timeouts and the connection cap, idempotent joiners that outlive the first client (in
memory and on two replicas sharing a real Redis), the WebSocket Origin check and JSON-only
bodies."""

import base64
import hashlib
import hmac
import json
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect as ws_connect

from conftest import FOLDER, engine_counter, wait_for
from tenancy_support import Gateway, Redis, chat_body, config_text, error_of, make_key, post_once, tenant

SECRET = "a-test-secret-that-is-long-enough-for-hs256"
LONG_MODEL = {"long": 'latency = { ttft_ms = 50, itl_ms = 20 }\noutput = { mode = "random", length = [200, 200] }'}
CHAT_MODEL = {"chat": 'output = { mode = "random", length = [5, 20] }'}


def rss_kib(gateway: Gateway) -> int:
    for line in open(f"/proc/{gateway.process.pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def metric(base: str, name: str, labels: str = "") -> float:
    text = httpx.get(f"{base}/metrics", timeout=10).text
    for line in text.splitlines():
        if line.startswith(name) and labels in line and not line.startswith("#"):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def address(gateway: Gateway) -> tuple[str, int]:
    host, port = gateway.base.removeprefix("http://").rsplit(":", 1)
    return host, int(port)


def closed_by_server(sock: socket.socket, within: float) -> bool:
    """Whether the server closes `sock` (EOF or reset) within `within` seconds, reading and
    discarding whatever it answers first."""
    sock.settimeout(within)
    deadline = time.monotonic() + within
    try:
        while time.monotonic() < deadline:
            if not sock.recv(65536):
                return True
    except (ConnectionResetError, BrokenPipeError):
        return True
    except TimeoutError:
        return False
    return False


# --- 1. JWT: configured issuer and audience are required ---------------------------------


def jwt(claims: dict) -> str:
    def part(value: dict) -> str:
        return base64.urlsafe_b64encode(json.dumps(value).encode()).rstrip(b"=").decode()

    head = part({"alg": "HS256", "typ": "JWT"}) + "." + part(claims)
    signature = hmac.new(SECRET.encode(), head.encode(), hashlib.sha256).digest()
    return head + "." + base64.urlsafe_b64encode(signature).rstrip(b"=").decode()


@pytest.fixture(scope="module")
def jwt_gateway(tmp_path_factory):
    sections = """
[auth]
mode = "required"

[auth.jwt]
algorithm = "HS256"
secret_env = "TP_TEST_JWT_SECRET"
issuer = "https://idp.example"
audience = "turnpike"

[tenants.acme]
models = ["*"]
"""
    gateway = Gateway(tmp_path_factory.mktemp("jwt"), config_text(sections, CHAT_MODEL), {"TP_TEST_JWT_SECRET": SECRET})
    yield gateway
    gateway.stop()


@pytest.mark.parametrize(
    "claims, accepted",
    [
        ({"iss": "https://idp.example", "aud": "turnpike"}, True),
        ({"iss": "https://idp.example", "aud": ["other", "turnpike"]}, True),
        ({"iss": "https://idp.example"}, False),
        ({"aud": "turnpike"}, False),
        ({}, False),
        ({"iss": "https://idp.example", "aud": None}, False),
        ({"iss": None, "aud": "turnpike"}, False),
        ({"iss": "https://idp.example", "aud": []}, False),
        ({"iss": "https://other.example", "aud": "turnpike"}, False),
        ({"iss": "https://idp.example", "aud": "another-service"}, False),
    ],
)
def test_jwt_needs_every_configured_claim(jwt_gateway, claims, accepted):
    token = jwt({"tenant": "acme", "exp": int(time.time()) + 600, **claims})
    r = httpx.get(f"{jwt_gateway.url}/models", headers={"Authorization": f"Bearer {token}"}, timeout=10)
    if accepted:
        assert r.status_code == 200, r.text
    else:
        assert r.status_code == 401, (claims, r.text)
        assert error_of(r)["code"] == "invalid_api_key"


# --- 2, 3, 7. Bounded work for large bodies and messages; JSON only ------------------------


@pytest.fixture(scope="module")
def open_gateway(tmp_path_factory):
    sections = """
[auth]
mode = "none"
"""
    text = config_text(sections, CHAT_MODEL).replace(
        "[server]\n", '[server]\nmax_body_bytes = 4194304\ncors_allowed_origins = ["https://app.example"]\n', 1
    )
    text += '[[models]]\nname = "ctx"\nengine = "sim"\nengine_model = "chat"\n'
    text += f'folder = "{FOLDER}"\n'
    text += "context_length = 4096\n"
    gateway = Gateway(tmp_path_factory.mktemp("open"), text, {})
    yield gateway
    gateway.stop()


def test_a_huge_prompt_is_refused_without_tokenizing_it(open_gateway):
    words = "the river moved slowly under the old stone bridge and "
    content = words * (3_900_000 // len(words))
    body = {"model": "ctx", "messages": [{"role": "user", "content": content}], "max_tokens": 5}
    small = httpx.post(f"{open_gateway.url}/chat/completions", json=chat_body("ctx", 5), timeout=30)
    assert small.status_code == 200, small.text
    before = rss_kib(open_gateway)
    for _ in range(3):
        r = httpx.post(f"{open_gateway.url}/chat/completions", json=body, timeout=60)
        assert r.status_code == 400, r.text[:300]
        error = error_of(r)
        assert error["code"] == "context_length_exceeded" and error["param"] == "messages"
        assert "more than" in error["message"]
    grown = rss_kib(open_gateway) - before
    # Three 3.9 MB bodies: parsing holds a few copies of one at a time; tokenizing it whole
    # held hundreds of megabytes.
    assert grown < 96 * 1024, f"RSS grew by {grown} KiB"
    # A prompt that fits is still answered, and its count is exact.
    ok = httpx.post(f"{open_gateway.url}/completions", json={"model": "ctx", "prompt": words * 200, "max_tokens": 2}, timeout=30)
    assert ok.status_code == 200, ok.text
    assert ok.json()["usage"]["prompt_tokens"] > 2000


def test_a_websocket_message_over_the_body_limit_closes_the_socket(open_gateway):
    host, port = address(open_gateway)
    before = rss_kib(open_gateway)
    huge = json.dumps({"model": "chat", "messages": [{"role": "user", "content": "x" * (10 << 20)}]})
    with ws_connect(f"ws://{host}:{port}/v1/chat/completions", max_size=None) as ws:
        try:
            ws.send(huge)
            event = json.loads(ws.recv(timeout=10))
            assert event["type"] == "error" and event["error"]["code"] == "request_too_large", event
            ws.recv(timeout=10)
            raise AssertionError("the socket stayed open")
        except ConnectionClosed as closed:
            assert closed.rcvd is None or closed.rcvd.code == 1009, closed
    grown = rss_kib(open_gateway) - before
    assert grown < 48 * 1024, f"RSS grew by {grown} KiB"
    # A message under the limit still gets its answer.
    with ws_connect(f"ws://{host}:{port}/v1/chat/completions") as ws:
        ws.send(json.dumps({"model": "chat", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}))
        frames = []
        while not frames or frames[-1] != "[DONE]":
            frames.append(ws.recv(timeout=10))
        assert json.loads(frames[0])["object"] == "chat.completion.chunk"


@pytest.mark.parametrize(
    "content_type",
    ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x", None],
)
def test_bodies_that_are_not_json_are_415(open_gateway, content_type):
    body = json.dumps(chat_body("chat", 3)).encode()
    headers = {"Content-Type": content_type} if content_type else {}
    request = httpx.Request("POST", f"{open_gateway.url}/chat/completions", content=body, headers=headers)
    r = httpx.Client(timeout=10).send(request)
    assert r.status_code == 415, r.text
    assert error_of(r)["code"] == "unsupported_media_type"


def test_a_refusal_before_the_body_is_read_closes_the_connection(open_gateway):
    # The unread rest of the body would be read as the next request: the response says
    # `connection: close`, so a client opens a new connection instead of losing its next call.
    with httpx.Client(timeout=10) as client:
        big = client.post(f"{open_gateway.url}/chat/completions", content=b"x" * (5 << 20), headers={"Content-Type": "application/json"})
        assert big.status_code == 413, big.text
        assert big.headers["connection"] == "close"
        # A refusal that could read the (small) body first keeps the connection.
        text = client.post(f"{open_gateway.url}/chat/completions", content=b"{}", headers={"Content-Type": "text/plain"})
        assert text.status_code == 415 and text.headers.get("connection") != "close"
        # The same client goes on, on a fresh connection after the 413.
        for _ in range(2):
            ok = client.post(f"{open_gateway.url}/chat/completions", json=chat_body("chat", 3))
            assert ok.status_code == 200, ok.text
            assert ok.headers.get("connection") != "close"


def test_json_bodies_with_parameters_and_empty_posts_pass(open_gateway):
    body = json.dumps(chat_body("chat", 3)).encode()
    for content_type in ("application/json", "application/json; charset=utf-8"):
        r = httpx.post(f"{open_gateway.url}/chat/completions", content=body, headers={"Content-Type": content_type}, timeout=10)
        assert r.status_code == 200, r.text
    # A POST without a body (a cancel) needs no Content-Type.
    r = httpx.post(f"{open_gateway.url}/responses/resp_nope/cancel", timeout=10)
    assert r.status_code == 404, r.text


# --- 6. The WebSocket upgrade checks Origin -------------------------------------------------


def upgrade_status(gateway: Gateway, origin: str | None) -> int:
    host, port = address(gateway)
    lines = [
        "GET /v1/chat/completions HTTP/1.1",
        f"Host: {host}:{port}",
        "Upgrade: websocket",
        "Connection: Upgrade",
        "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==",
        "Sec-WebSocket-Version: 13",
    ]
    if origin:
        lines.append(f"Origin: {origin}")
    with socket.create_connection((host, port), timeout=10) as sock:
        sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
        return int(sock.recv(4096).split(b" ", 2)[1])


def test_websocket_upgrades_from_other_origins_are_refused(open_gateway):
    assert upgrade_status(open_gateway, "https://evil.example") == 403
    assert upgrade_status(open_gateway, "https://app.example") == 101
    assert upgrade_status(open_gateway, None) == 101
    # A client library that names the host it connects to as its origin is not a cross-site page.
    host, port = address(open_gateway)
    assert upgrade_status(open_gateway, f"http://{host}:{port}") == 101
    # The same origin over HTTP gets no CORS grant either.
    r = httpx.options(
        f"{open_gateway.url}/chat/completions",
        headers={"Origin": "https://evil.example", "Access-Control-Request-Method": "POST"},
        timeout=10,
    )
    assert "access-control-allow-origin" not in r.headers


# --- 4. Header and body read timeouts, and the connection cap ------------------------------


@pytest.fixture(scope="module")
def strict_gateway(tmp_path_factory):
    sections = '[auth]\nmode = "none"\n'
    text = config_text(sections, CHAT_MODEL).replace(
        "[server]\n", "[server]\nheader_read_timeout_ms = 600\nbody_read_timeout_ms = 600\nmax_connections = 16\n", 1
    )
    gateway = Gateway(tmp_path_factory.mktemp("strict"), text, {})
    yield gateway
    gateway.stop()


def test_headers_that_never_finish_are_cut(strict_gateway):
    before = metric(strict_gateway.base, "turnpike_http_connections_closed_total", 'reason="header_timeout"')
    socks = []
    for _ in range(8):
        sock = socket.create_connection(address(strict_gateway), timeout=5)
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        socks.append(sock)
    idle = socket.create_connection(address(strict_gateway), timeout=5)  # sends nothing at all
    for sock in socks + [idle]:
        assert closed_by_server(sock, 5), "a connection that never sent its headers stayed open"
        sock.close()
    assert wait_for(
        lambda: metric(strict_gateway.base, "turnpike_http_connections_closed_total", 'reason="header_timeout"') >= before + 9
    )


@pytest.mark.parametrize("chunked", [False, True])
def test_a_body_that_stalls_is_408(strict_gateway, chunked):
    host, port = address(strict_gateway)
    body = json.dumps(chat_body("chat", 3)).encode()
    head = [f"POST /v1/chat/completions HTTP/1.1", f"Host: {host}:{port}", "Content-Type: application/json"]
    if chunked:
        head.append("Transfer-Encoding: chunked")
        first = f"{16:x}\r\n".encode() + body[:16] + b"\r\n"
    else:
        head.append(f"Content-Length: {len(body)}")
        first = body[:16]
    with socket.create_connection((host, port), timeout=10) as sock:
        sock.sendall(("\r\n".join(head) + "\r\n\r\n").encode() + first)
        started = time.monotonic()
        sock.settimeout(10)
        answer = sock.recv(65536)
        assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
        assert b"request_timeout" in answer
        assert time.monotonic() - started < 5
        assert closed_by_server(sock, 5)
    assert metric(strict_gateway.base, "turnpike_http_connections_closed_total", 'reason="body_timeout"') >= 1


def test_connections_past_the_cap_are_closed_at_once(tmp_path):
    sections = '[auth]\nmode = "none"\n'
    text = config_text(sections, CHAT_MODEL).replace("[server]\n", "[server]\nmax_connections = 6\n", 1)
    gateway = Gateway(tmp_path, text, {})
    try:
        held = [socket.create_connection(address(gateway), timeout=5) for _ in range(6)]
        time.sleep(0.2)
        extra = socket.create_connection(address(gateway), timeout=5)
        assert closed_by_server(extra, 3), "a connection past the cap was kept"
        extra.close()
        for sock in held:
            sock.close()
        assert wait_for(lambda: metric(gateway.base, "turnpike_http_connections_closed_total", 'reason="limit"') >= 1)
        assert httpx.get(f"{gateway.base}/health", timeout=5).status_code == 200
    finally:
        gateway.stop()


# --- 5. Idempotent joiners outlive the first client -----------------------------------------


def abandon_after(gateway: Gateway, key: str, body: dict, idempotency_key: str, delay: float) -> threading.Thread:
    """Sends an idempotent request on a raw socket and closes it after `delay` seconds, before
    any answer."""
    host, port = address(gateway)
    data = json.dumps(body).encode()
    lines = [
        "POST /v1/chat/completions HTTP/1.1",
        f"Host: {host}:{port}",
        f"Authorization: Bearer {key}",
        "Content-Type: application/json",
        f"Content-Length: {len(data)}",
        f"Idempotency-Key: {idempotency_key}",
    ]
    sock = socket.create_connection((host, port), timeout=30)
    sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode() + data)

    def leave():
        time.sleep(delay)
        sock.close()

    thread = threading.Thread(target=leave)
    thread.start()
    return thread


def join_after_first_leaves(first: Gateway, joiners: list[Gateway], key: str) -> list[tuple[int, dict, dict]]:
    body = chat_body("long", 60)  # about 1.3 s of generation, answered whole at the end
    idempotency_key = f"joiners-{time.monotonic_ns()}"
    leaving = abandon_after(first, key, body, idempotency_key, delay=0.6)
    time.sleep(0.2)
    with ThreadPoolExecutor(len(joiners)) as pool:
        futures = [
            pool.submit(post_once, g.base, "/v1/chat/completions", key, body, {"Idempotency-Key": idempotency_key})
            for g in joiners
        ]
        results = [f.result() for f in futures]
    leaving.join()
    return results


def test_joiners_get_the_answer_when_the_first_client_leaves(tmp_path):
    key = make_key()
    gateway = Gateway(tmp_path, config_text(tenant(), LONG_MODEL), {"ACME_API_KEY": key})
    try:
        results = join_after_first_leaves(gateway, [gateway] * 10, key)
        statuses = [status for status, _, _ in results]
        assert statuses == [200] * 10, [(s, b) for s, _, b in results if s != 200]
        answers = {json.dumps(body["choices"]) for _, _, body in results}
        assert len(answers) == 1
        assert all(headers.get("idempotent-replayed") == "true" for _, headers, _ in results)
        assert wait_for(lambda: engine_counter(gateway.base, "completed") == 1)
        assert engine_counter(gateway.base, "cancelled") == 0
    finally:
        gateway.stop()


def test_the_work_is_dropped_once_every_listener_left(tmp_path):
    key = make_key()
    gateway = Gateway(tmp_path, config_text(tenant(), LONG_MODEL), {"ACME_API_KEY": key})
    try:
        abandon_after(gateway, key, chat_body("long", 150), "alone", delay=0.3).join()
        assert wait_for(lambda: engine_counter(gateway.base, "cancelled") == 1, timeout=5)
        # The key was let go: a retry runs anew and completes.
        status, _, _ = post_once(gateway.base, "/v1/chat/completions", key, chat_body("long", 150), {"Idempotency-Key": "alone"})
        assert status == 200
    finally:
        gateway.stop()


def test_joiners_on_two_replicas_sharing_redis(tmp_path):
    redis = Redis(tmp_path / "redis")
    key = make_key()
    sections = tenant(f'[state]\nbackend = "redis"\nredis_url = "{redis.url}"\n')
    a, b = (Gateway(tmp_path, config_text(sections, LONG_MODEL), {"ACME_API_KEY": key}, f"r{i}") for i in range(2))
    try:
        # Joiners on both replicas: those on the first keep the run alive, those on the second
        # replay its record.
        results = join_after_first_leaves(a, [a, b] * 5, key)
        assert [s for s, _, _ in results] == [200] * 10, [(s, body) for s, _, body in results if s != 200]
        assert len({json.dumps(body["choices"]) for _, _, body in results}) == 1
        completed = lambda: engine_counter(a.base, "completed") + engine_counter(b.base, "completed")
        assert wait_for(lambda: completed() == 1)
        # Joiners only on the other replica: the first run is dropped with its only listener,
        # and they run it again among themselves; none is a 500.
        results = join_after_first_leaves(a, [b] * 5, key)
        assert [s for s, _, _ in results] == [200] * 5, [(s, body) for s, _, body in results if s != 200]
        assert len({json.dumps(body["choices"]) for _, _, body in results}) == 1
    finally:
        a.stop()
        b.stop()
        redis.stop()


# --- Fuzz: WebSocket messages -------------------------------------------------------------


def odd(rng, depth=0):
    roll = rng.randrange(15 if depth < 30 else 13)
    if roll == 13:
        return [odd(rng, depth + 1)]
    if roll == 14:
        return {"type": odd(rng, depth + 1)}
    return [None, True, -1, 0, 2**64, -(2**63), 1e308, -0.5, "", "\u0000\ufeff🙂<|eot_id|>", "x" * rng.randrange(3000), [], {}][roll]


def mutate(seed, rng) -> str:
    value = json.loads(json.dumps(seed))
    for _ in range(rng.randrange(1, 4)):
        holder, key = None, None
        at = value
        while isinstance(at, (dict, list)) and at and rng.random() < 0.6:
            holder = at
            key = rng.choice(list(at)) if isinstance(at, dict) else rng.randrange(len(at))
            at = at[key]
        roll = rng.random()
        if isinstance(at, dict) and at and roll < 0.3:
            del at[rng.choice(list(at))]
        elif isinstance(at, dict) and roll < 0.5:
            at[rng.choice(["type", "model", "input", "messages", "stream", "n", "previous_response_id", "generate"])] = odd(rng)
        elif holder is None:
            value = odd(rng)
        else:
            holder[key] = odd(rng)
    text = json.dumps(value)
    if rng.random() < 0.15 and text:
        i = rng.randrange(len(text))
        text = text[:i] if rng.random() < 0.5 else text[:i] + rng.choice('{["\\') + text[i:]
    return text


@pytest.mark.parametrize(
    "path, seed, terminal",
    [
        ("/v1/chat/completions", {"model": "chat", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3}, {"[DONE]"}),
        (
            "/v1/responses",
            {"type": "response.create", "model": "chat", "input": [{"role": "user", "content": "Hi"}], "max_output_tokens": 3, "store": False},
            {"response.completed", "response.incomplete", "response.failed"},
        ),
    ],
)
def test_mutated_websocket_messages_get_error_events_and_the_socket_stays(open_gateway, path, seed, terminal):
    import random

    rng = random.Random(20261125)
    host, port = address(open_gateway)

    def turn(ws, message: str) -> str:
        """Sends one message; returns 'error' or the terminal frame's kind."""
        ws.send(message)
        while True:
            frame = ws.recv(timeout=15)
            if frame in terminal:
                return frame
            event = json.loads(frame)
            kind = event.get("type")
            if kind == "error":
                assert event["status"] < 500, (message[:400], event)
                assert {"message", "type", "param", "code"} <= set(event["error"]), event
                return "error"
            if kind in terminal:
                return kind

    with ws_connect(f"ws://{host}:{port}{path}", max_size=None) as ws:
        outcomes = [turn(ws, mutate(seed, rng)) for _ in range(150)]
        # The socket survived every message and still serves a good one.
        assert turn(ws, json.dumps(seed)) in terminal
    assert "error" in outcomes and len(set(outcomes)) > 1, outcomes
