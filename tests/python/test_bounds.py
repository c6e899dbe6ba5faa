"""What one tenant, one key, one request or one bad write may not do, on the real binary: call
the node endpoint without its scope, hold every WebSocket slot or keep idle sockets open for
ever, write megabytes into a log line, lock every caller out with an emptied or truncated config
file, or make a SIGHUP report a change that did not happen."""

import base64
import hashlib
import hmac
import json
import signal
import time

import httpx
import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect as ws_connect

from tenancy_support import HELLO, Gateway, config_text, make_key
from test_hardening import address, metric
from test_operations import status_with, tenants_config, wait_until

CHAT = {"chat": 'output = { mode = "random", length = [3, 6] }'}
NODE_BODY = {"model": "chat", "input_ids": [10, 11, 12], "sampling_params": {"max_new_tokens": 2}}


# --- The node endpoint has its own scope ----------------------------------------------------


def test_generate_needs_a_key_that_names_it(tmp_path):
    keys = {name: make_key() for name in ("ALL", "CHAT", "EMBED", "ADMIN", "NODE", "JWT_SECRET")}
    keys["JWT_SECRET"] = "a-test-secret-that-is-long-enough-for-hs256"
    sections = """
[auth]
mode = "required"
jwt = { algorithm = "HS256", secret_env = "JWT_SECRET" }

[tenants.acme]
models = ["*"]
keys = [{ env = "ALL" }, { env = "CHAT", endpoints = ["chat"] }, { env = "EMBED", endpoints = ["embeddings"] },
        { env = "ADMIN", endpoints = ["admin"] }, { env = "NODE", endpoints = ["generate"] }]
"""
    gateway = Gateway(tmp_path, config_text(sections, CHAT), keys)

    def generate(key: str) -> httpx.Response:
        return httpx.post(f"{gateway.base}/generate", json=NODE_BODY, headers={"Authorization": f"Bearer {key}"},
                          timeout=10)

    def token(scope: str) -> str:
        def part(value: dict) -> str:
            return base64.urlsafe_b64encode(json.dumps(value).encode()).rstrip(b"=").decode()

        head = part({"alg": "HS256", "typ": "JWT"}) + "." + part(
            {"sub": "svc", "tenant": "acme", "scope": scope, "exp": int(time.time()) + 600})
        mac = hmac.new(keys["JWT_SECRET"].encode(), head.encode(), hashlib.sha256).digest()
        return head + "." + base64.urlsafe_b64encode(mac).rstrip(b"=").decode()

    try:
        for name in ("ALL", "CHAT", "EMBED", "ADMIN"):
            refused = generate(keys[name])
            assert refused.status_code == 403, (name, refused.text)
            assert refused.json()["error"]["code"] == "endpoint_not_allowed"
        assert generate(keys["NODE"]).status_code == 200
        assert generate(token("endpoint:chat")).status_code == 403
        assert generate(token("")).status_code == 403, "an unscoped token does not reach the node endpoint"
        assert generate(token("endpoint:generate")).status_code == 200
        # The node key reaches nothing else; the unscoped key still reaches the API.
        assert status_with(gateway, keys["NODE"]) == 403
        assert status_with(gateway, keys["ALL"]) == 200
    finally:
        gateway.stop()


# --- WebSocket slots per tenant, and idle sockets --------------------------------------------


@pytest.fixture
def socket_gateway(tmp_path):
    keys = {"ACME_KEY": make_key(), "GLOBEX_KEY": make_key(), "WIDE_KEY": make_key()}
    sections = """
[auth]
mode = "required"

[tenants.acme]
models = ["*"]
keys = [{ env = "ACME_KEY" }]

[tenants.globex]
models = ["*"]
keys = [{ env = "GLOBEX_KEY" }]

[tenants.wide]
models = ["*"]
max_websockets = 5
keys = [{ env = "WIDE_KEY" }]
"""
    server = "websocket_max_connections = 8\nwebsocket_max_per_tenant = 3\nwebsocket_idle_timeout_s = 1"
    gateway = Gateway(tmp_path, config_text(sections, CHAT, server=server), keys)
    yield gateway, keys
    gateway.stop()


def open_socket(gateway: Gateway, key: str):
    host, port = address(gateway)
    return ws_connect(f"ws://{host}:{port}/v1/chat/completions",
                      additional_headers={"Authorization": f"Bearer {key}"})


def refusal(ws) -> dict:
    event = json.loads(ws.recv(timeout=10))
    with pytest.raises(ConnectionClosed):
        ws.recv(timeout=10)
    return event


def answered(ws) -> bool:
    ws.send(json.dumps({"model": "chat", "messages": HELLO, "max_tokens": 3}))
    frames = []
    while not frames or frames[-1] != "[DONE]":
        frames.append(ws.recv(timeout=10))
    return json.loads(frames[0])["object"] == "chat.completion.chunk"


def test_one_tenant_cannot_hold_every_websocket_slot(socket_gateway):
    gateway, keys = socket_gateway
    held = [open_socket(gateway, keys["ACME_KEY"]) for _ in range(3)]
    try:
        assert all(answered(ws) for ws in held)
        with open_socket(gateway, keys["ACME_KEY"]) as extra:
            event = refusal(extra)
            assert event["status"] == 429 and event["error"]["code"] == "websocket_tenant_limit_reached", event
        # Another tenant still gets in; a plan's own cap is above the server's default.
        with open_socket(gateway, keys["GLOBEX_KEY"]) as other:
            assert answered(other)
        wide = [open_socket(gateway, keys["WIDE_KEY"]) for _ in range(5)]
        assert answered(wide[-1])
        # The server's own cap still holds (3 + 5 open of 8).
        with open_socket(gateway, keys["GLOBEX_KEY"]) as last:
            assert refusal(last)["error"]["code"] == "websocket_connection_limit_reached"
        for ws in wide:
            ws.close()
        assert metric(gateway.base, "turnpike_rate_limit_dropped_total", 'limit="websockets"') >= 1
        # A slot comes back when its socket closes.
        held.pop().close()
        time.sleep(0.2)
        with open_socket(gateway, keys["ACME_KEY"]) as again:
            assert answered(again)
    finally:
        for ws in held:
            ws.close()


def test_an_idle_socket_is_closed_and_pings_do_not_keep_it(socket_gateway):
    gateway, keys = socket_gateway
    with open_socket(gateway, keys["ACME_KEY"]) as ws:
        assert answered(ws)
        started = time.monotonic()
        ws.ping()
        time.sleep(0.5)
        ws.ping()
        event = json.loads(ws.recv(timeout=10))
        assert event["error"]["code"] == "websocket_idle_timeout", event
        assert 0.8 < time.monotonic() - started < 5
        with pytest.raises(ConnectionClosed):
            ws.recv(timeout=10)
    # A socket that keeps talking is not idle.
    with open_socket(gateway, keys["GLOBEX_KEY"]) as busy:
        for _ in range(3):
            time.sleep(0.6)
            assert answered(busy)
    assert metric(gateway.base, "turnpike_websocket_closed_total", 'reason="idle"') >= 1


# --- Reloads that would lock every caller out ----------------------------------------------


def test_an_emptied_or_truncated_config_is_refused_on_reload(tmp_path):
    acme = make_key()
    env = {"ACME_API_KEY": acme, "RUST_LOG": "warn,turnpike::audit=info"}
    keys_file = tmp_path / "keys.toml"
    keys_file.write_text("")
    good = tenants_config({"acme": "ACME_API_KEY"}).replace(
        "reload_interval_ms = 100\n", f'reload_interval_ms = 100\nkeys_file = "{keys_file}"\n')
    gateway = Gateway(tmp_path, good, env)
    try:
        assert status_with(gateway, acme) == 200
        failed = lambda: metric(gateway.base, "turnpike_config_reloads_total", 'result="failed"')

        gateway.config.write_text("")
        gateway.process.send_signal(signal.SIGHUP)
        assert wait_until(lambda: failed() >= 1), gateway.log.read_text()
        assert "the file is empty" in gateway.log.read_text()
        assert status_with(gateway, acme) == 200

        # Cut where a table begins: valid TOML, valid config, no tenant left.
        truncated = good[: good.index("[tenants.acme]")]
        gateway.config.write_text(truncated)
        gateway.process.send_signal(signal.SIGHUP)
        assert wait_until(lambda: failed() >= 2), gateway.log.read_text()
        assert "allow_empty_directory" in gateway.log.read_text()
        assert status_with(gateway, acme) == 200

        # Said on purpose, it is allowed.
        allowed = truncated.replace("reload_interval_ms = 100\n", "reload_interval_ms = 100\nallow_empty_directory = true\n")
        gateway.config.write_text(allowed)
        gateway.process.send_signal(signal.SIGHUP)
        assert wait_until(lambda: status_with(gateway, acme) == 401), gateway.log.read_text()
    finally:
        gateway.stop()


def test_a_sighup_with_nothing_changed_reports_no_change(tmp_path):
    env = {"ACME_API_KEY": make_key(), "JWT_SECRET": "a-test-secret-that-is-long-enough-for-hs256",
           "RUST_LOG": "info"}
    text = tenants_config({"acme": "ACME_API_KEY"}).replace(
        "reload_interval_ms = 100\n", 'reload_interval_ms = 100\njwt = { algorithm = "HS256", secret_env = "JWT_SECRET" }\n')
    gateway = Gateway(tmp_path, text, env)
    try:
        assert status_with(gateway, env["ACME_API_KEY"]) == 200  # serving: the signal handler is in place
        for _ in range(3):
            gateway.process.send_signal(signal.SIGHUP)
            time.sleep(0.3)
        assert wait_until(lambda: metric(gateway.base, "turnpike_config_reloads_total", 'result="ok"') >= 3)
        log = gateway.log.read_text()
        assert "take effect on restart" not in log, log
    finally:
        gateway.stop()


# --- A client's text in the log --------------------------------------------------------------


def test_a_huge_user_field_is_cut_in_the_log(tmp_path):
    gateway = Gateway(tmp_path, config_text('[auth]\nmode = "none"\n', CHAT), {"RUST_LOG": "info"})
    try:
        huge = "u" * (2 << 20)
        before = gateway.log.stat().st_size
        chat = httpx.post(f"{gateway.url}/chat/completions", json={"model": "chat", "messages": HELLO,
                                                                    "max_tokens": 3, "user": huge}, timeout=30)
        assert chat.status_code == 200
        messages = httpx.post(f"{gateway.url}/messages", json={"model": "chat", "max_tokens": 3, "messages": HELLO,
                                                                "metadata": {"user_id": huge}}, timeout=30)
        assert messages.status_code == 200, messages.text
        assert wait_until(lambda: gateway.log.read_text().count("2097152 bytes, sha256:") >= 2), gateway.log.read_text()[-2000:]
        assert gateway.log.stat().st_size - before < 64 << 10
    finally:
        gateway.stop()
