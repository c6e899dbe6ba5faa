"""Operating the real binary: TLS (the openai SDK over TLS with a test CA, certificate rotation
while serving, mTLS, minimum versions), the plain-HTTP health listener, and the drain on
SIGTERM (readiness first, streams that finish within the deadline finish, those that do not end
with a clean error event, never cut mid-frame)."""

import os
import signal
import ssl
import threading
import time

import httpx
import openai
import pytest
import trustme

from tenancy_support import HELLO, Gateway, config_text

CHAT_MODEL = {"chat": 'output = { mode = "echo" }'}
# About 4 s of tokens, 20 ms apart.
LONG_MODEL = {"long": 'latency = { ttft_ms = 50, itl_ms = 20 }\noutput = { mode = "random", length = [200, 200] }'}


def issue(ca: trustme.CA, directory, name: str) -> tuple[str, str]:
    """A server certificate for 127.0.0.1 and localhost signed by `ca`, written as PEM files."""
    cert = ca.issue_cert("127.0.0.1", "localhost")
    chain, key = directory / f"{name}.crt", directory / f"{name}.key"
    cert.private_key_pem.write_to_path(str(key))
    chain.write_bytes(b"".join(blob.bytes() for blob in cert.cert_chain_pems))
    return str(chain), str(key)


def replace(path: str, data: bytes) -> None:
    """Writes `path` whole, as a rotation tool does (rename over the old file)."""
    partial = path + ".partial"
    with open(partial, "wb") as f:
        f.write(data)
    os.replace(partial, path)


def trusting(ca: trustme.CA, client_cert: trustme.LeafCert | None = None, **versions) -> ssl.SSLContext:
    context = ssl.create_default_context()
    ca.configure_trust(context)
    if client_cert is not None:
        client_cert.configure_cert(context)
    for attribute, value in versions.items():
        setattr(context, attribute, value)
    return context


def tls_gateway(directory, tls: str, server: str = "", models=CHAT_MODEL) -> Gateway:
    text = config_text('[auth]\nmode = "none"\n\n[server.tls]\n' + tls, models, server=server)
    return Gateway(directory, text, {})


def chat_over(gateway: Gateway, context: ssl.SSLContext) -> str:
    with httpx.Client(verify=context, timeout=10) as http:
        client = openai.OpenAI(base_url=gateway.url, api_key="unused", http_client=http, max_retries=0)
        answer = client.chat.completions.create(model="chat", messages=HELLO, max_tokens=8)
    return answer.choices[0].message.content


def handshake_fails(gateway: Gateway, context: ssl.SSLContext) -> bool:
    try:
        with httpx.Client(verify=context, timeout=5) as http:
            http.get(f"{gateway.base}/health")
    except (httpx.ConnectError, httpx.ReadError, httpx.RemoteProtocolError):
        return True
    return False


def wait_until(condition, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return False


def test_the_sdk_over_tls_and_a_certificate_rotated_while_serving(tmp_path):
    first_ca, second_ca = trustme.CA(), trustme.CA()
    chain, key = issue(first_ca, tmp_path, "server")
    gateway = tls_gateway(tmp_path, f'cert_file = "{chain}"\nkey_file = "{key}"\nreload_ms = 100\n')
    try:
        assert gateway.base.startswith("https://")
        assert chat_over(gateway, trusting(first_ca))
        # Plain HTTP to the TLS port gets no answer.
        with pytest.raises((httpx.RemoteProtocolError, httpx.ReadError, httpx.ConnectError)):
            httpx.get(gateway.base.replace("https://", "http://") + "/health", timeout=5)

        # Rotation: a certificate from another CA, written while serving, is used within the
        # reload interval; a client that trusts only the old CA is now refused.
        rotated_chain, rotated_key = issue(second_ca, tmp_path, "rotated")
        with open(rotated_key, "rb") as k, open(rotated_chain, "rb") as c:
            key_pem, chain_pem = k.read(), c.read()
        replace(key, key_pem)
        replace(chain, chain_pem)
        assert wait_until(lambda: not handshake_fails(gateway, trusting(second_ca))), gateway.log.read_text()
        assert handshake_fails(gateway, trusting(first_ca))
        assert chat_over(gateway, trusting(second_ca))

        # A broken file keeps the certificate in use, and the log says why.
        replace(chain, b"-----BEGIN CERTIFICATE-----\nnot base64\n-----END CERTIFICATE-----\n")
        assert wait_until(lambda: "previous certificate stays" in gateway.log.read_text())
        assert chat_over(gateway, trusting(second_ca))
    finally:
        gateway.stop()


def test_a_minimum_version_of_tls_1_3_refuses_tls_1_2_clients(tmp_path):
    ca = trustme.CA()
    chain, key = issue(ca, tmp_path, "server")
    gateway = tls_gateway(tmp_path, f'cert_file = "{chain}"\nkey_file = "{key}"\nmin_version = "1.3"\n')
    try:
        assert handshake_fails(gateway, trusting(ca, maximum_version=ssl.TLSVersion.TLSv1_2))
        assert chat_over(gateway, trusting(ca, minimum_version=ssl.TLSVersion.TLSv1_3))
    finally:
        gateway.stop()
    # TLS 1.2 is served by default.
    gateway = tls_gateway(tmp_path, f'cert_file = "{chain}"\nkey_file = "{key}"\n')
    try:
        assert chat_over(gateway, trusting(ca, maximum_version=ssl.TLSVersion.TLSv1_2))
    finally:
        gateway.stop()


@pytest.mark.parametrize("mode", ["required", "optional"])
def test_client_certificates(tmp_path, mode):
    server_ca, client_ca, stranger_ca = trustme.CA(), trustme.CA(), trustme.CA()
    chain, key = issue(server_ca, tmp_path, "server")
    client_ca.cert_pem.write_to_path(str(tmp_path / "clients.pem"))
    tls = f'cert_file = "{chain}"\nkey_file = "{key}"\nclient_ca_file = "clients.pem"\nclient_auth = "{mode}"\n'
    gateway = tls_gateway(tmp_path, tls)
    try:
        assert chat_over(gateway, trusting(server_ca, client_ca.issue_cert("ops@example.com")))
        # A certificate some other CA signed is refused in either mode.
        assert handshake_fails(gateway, trusting(server_ca, stranger_ca.issue_cert("mallory@example.com")))
        if mode == "required":
            assert handshake_fails(gateway, trusting(server_ca))
        else:
            assert chat_over(gateway, trusting(server_ca))
    finally:
        gateway.stop()


@pytest.mark.parametrize(
    ("tls", "says"),
    [
        ('cert_file = "missing.crt"\nkey_file = "missing.key"\n', "missing.crt"),
        ('cert_file = "{chain}"\nkey_file = "{other_key}"\n', "server.tls"),
        ('cert_file = "{chain}"\nkey_file = "{key}"\nmin_version = "1.1"\n', "min_version"),
        ('cert_file = "{chain}"\nkey_file = "{key}"\nclient_auth = "required"\n', "client_ca_file"),
        ('cert_file = "{chain}"\nkey_file = "{key}"\nciphers = "all"\n', "ciphers"),
    ],
)
def test_a_bad_tls_configuration_is_refused_at_startup(tmp_path, tls, says):
    ca = trustme.CA()
    chain, key = issue(ca, tmp_path, "server")
    _, other_key = issue(ca, tmp_path, "other")
    config = tmp_path / "bad.toml"
    tls = tls.format(chain=chain, key=key, other_key=other_key)
    config.write_text(config_text('[auth]\nmode = "none"\n\n[server.tls]\n' + tls, CHAT_MODEL))
    import subprocess

    from conftest import BIN

    done = subprocess.run([str(BIN), "serve", "--config", str(config)], capture_output=True, text=True, timeout=30)
    assert done.returncode != 0
    assert says in done.stderr, done.stderr


def test_the_health_listener_serves_probes_in_plain_http_beside_tls(tmp_path):
    ca = trustme.CA()
    chain, key = issue(ca, tmp_path, "server")
    gateway = tls_gateway(tmp_path, f'cert_file = "{chain}"\nkey_file = "{key}"\n', server='health_listen = "127.0.0.1:0"')
    try:
        assert gateway.health and gateway.health.startswith("http://")
        assert httpx.get(f"{gateway.health}/health").json() == {"status": "ok"}
        assert httpx.get(f"{gateway.health}/ready").status_code == 200
        # Only the probes: the API is not reachable in plain HTTP.
        refused = httpx.get(f"{gateway.health}/v1/models")
        assert refused.status_code == 404 and "error" in refused.json()
        assert httpx.post(f"{gateway.health}/v1/chat/completions", json={}).status_code == 404
    finally:
        gateway.stop()


def stream_raw(base: str, body: dict, out: list, started: threading.Event | None = None) -> None:
    """Streams a chat completion and appends (status, the raw bytes) to `out`."""
    chunks = []
    try:
        with httpx.Client(timeout=30) as http:
            with http.stream("POST", f"{base}/v1/chat/completions", json=body) as response:
                for chunk in response.iter_raw():
                    if started is not None and chunk:
                        started.set()
                    chunks.append(chunk)
                out.append((response.status_code, b"".join(chunks)))
    except httpx.HTTPError as e:  # a cut connection is what this test must never see
        out.append((None, repr(e).encode() + b" after " + b"".join(chunks)))


def events_of(raw: bytes) -> list[str]:
    """The events of a stream, each without its `id:` line."""
    assert raw.endswith(b"\n\n"), f"cut mid-frame: {raw[-200:]!r}"
    frames = [frame.decode() for frame in raw.split(b"\n\n") if frame]
    return ["\n".join(line for line in frame.split("\n") if not line.startswith("id: ")) for frame in frames]


def start_streams(base: str, body: dict, count: int) -> tuple[list, list]:
    """`count` streams of `body` on threads, each under way (its first bytes in) on return;
    returns the threads and the list their (status, raw bytes) land in."""
    results: list = []
    started = [threading.Event() for _ in range(count)]
    threads = [threading.Thread(target=stream_raw, args=(base, body, results, s)) for s in started]
    for t in threads:
        t.start()
    assert all(s.wait(10) for s in started), "streams did not start"
    return threads, results


def test_sigterm_during_fifty_streams_ends_every_one_cleanly(tmp_path):
    server = 'drain_delay_ms = 1000\ndrain_timeout_ms = 1000\nhealth_listen = "127.0.0.1:0"'
    # 250 tokens at 50 ms (12.5 s): no stream can end on its own before the cut 2 s after
    # SIGTERM, however long the fifty take to start on a loaded machine.
    endless = {"long": 'latency = { ttft_ms = 50, itl_ms = 50 }\noutput = { mode = "random", length = [250, 250] }'}
    gateway = Gateway(tmp_path, config_text('[auth]\nmode = "none"', endless, server=server), {})
    body = {"model": "long", "messages": HELLO, "max_tokens": 250, "stream": True}
    try:
        threads, results = start_streams(gateway.base, body, 50)
        gateway.process.send_signal(signal.SIGTERM)
        # Readiness turns first, while the listener still answers.
        ready = httpx.get(f"{gateway.health}/ready", timeout=5)
        assert ready.status_code == 503 and ready.json()["status"] == "draining"
        for t in threads:
            t.join(15)
        assert gateway.process.wait(timeout=15) == 0
    finally:
        gateway.stop()
    assert len(results) == 50
    for status, raw in results:
        assert status == 200, raw[-300:]
        last = events_of(raw)[-1]
        # Each outlasts the deadline, so each ends with the protocol's error event.
        assert last.startswith("data: {\"error\""), last
        assert "server_shutting_down" in last, last
    assert "drain deadline reached" in gateway.log.read_text()


def test_streams_that_finish_within_the_drain_deadline_finish(tmp_path):
    gateway = Gateway(tmp_path, config_text('[auth]\nmode = "none"', LONG_MODEL, server="drain_timeout_ms = 10000"), {})
    body = {"model": "long", "messages": HELLO, "max_tokens": 40, "stream": True}
    try:
        threads, results = start_streams(gateway.base, body, 5)
        began = time.monotonic()
        gateway.process.send_signal(signal.SIGTERM)
        for t in threads:
            t.join(15)
        assert gateway.process.wait(timeout=15) == 0
        # It exits once the last stream has ended, not at the deadline.
        assert time.monotonic() - began < 5
    finally:
        gateway.stop()
    for status, raw in results:
        assert status == 200
        assert events_of(raw)[-1] == "data: [DONE]"
    # New connections are refused once the listener has closed.
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{gateway.base}/health", timeout=2)


def tenants_config(tenants: dict[str, str], server: str = "") -> str:
    sections = '[auth]\nmode = "required"\nreload_interval_ms = 100\n'
    for name, env in tenants.items():
        sections += f'\n[tenants.{name}]\nmodels = ["*"]\nkeys = [{{ env = "{env}" }}]\n'
    return config_text(sections, {**CHAT_MODEL, **LONG_MODEL}, server=server)


def status_with(gateway: Gateway, key: str) -> int:
    body = {"model": "chat", "messages": HELLO, "max_tokens": 4}
    return httpx.post(f"{gateway.url}/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"}, timeout=10).status_code


def test_a_config_reload_replaces_tenants_and_refuses_a_broken_file(tmp_path):
    from tenancy_support import make_key
    from test_hardening import metric

    acme, beta = make_key(), make_key()
    env = {"ACME_API_KEY": acme, "BETA_API_KEY": beta, "RUST_LOG": "warn,turnpike::audit=info"}
    gateway = Gateway(tmp_path, tenants_config({"acme": "ACME_API_KEY"}), env)
    try:
        assert status_with(gateway, acme) == 200
        assert status_with(gateway, beta) == 401
        # A stream under way when its tenant is removed finishes on the state it started with.
        results: list = []
        started = threading.Event()
        body = {"model": "long", "messages": HELLO, "max_tokens": 60, "stream": True}
        stream = threading.Thread(
            target=lambda: results.append(stream_with_key(gateway, acme, body, started)))
        stream.start()
        assert started.wait(10)
        gateway.config.write_text(tenants_config({"beta": "BETA_API_KEY"}))
        assert wait_until(lambda: status_with(gateway, beta) == 200), gateway.log.read_text()
        assert status_with(gateway, acme) == 401
        stream.join(15)
        assert results and results[0][0] == 200 and events_of(results[0][1])[-1] == "data: [DONE]"
        assert '"event":"config_reloaded"' in gateway.log.read_text()

        # A file that fails validation is refused whole; the running configuration stays.
        failed_before = metric(gateway.base, "turnpike_config_reloads_total", 'result="failed"')
        broken = tenants_config({"beta": "BETA_API_KEY", "acme": "ACME_API_KEY"})
        gateway.config.write_text(broken.replace("[tenants.acme]\n", "[tenants.acme]\nbogus = 1\n"))
        assert wait_until(lambda: '"event":"config_reload_failed"' in gateway.log.read_text()), gateway.log.read_text()
        assert "bogus" in gateway.log.read_text()
        assert status_with(gateway, beta) == 200 and status_with(gateway, acme) == 401
        assert metric(gateway.base, "turnpike_config_reloads_total", 'result="failed"') > failed_before

        # SIGHUP reloads at once; a setting that needs a restart is named, not applied.
        gateway.config.write_text(tenants_config({"acme": "ACME_API_KEY"}, server="request_timeout_ms = 5000"))
        gateway.process.send_signal(signal.SIGHUP)
        assert wait_until(lambda: status_with(gateway, acme) == 200)
        assert wait_until(lambda: "take effect on restart" in gateway.log.read_text())
    finally:
        gateway.stop()


def stream_with_key(gateway: Gateway, key: str, body: dict, started: threading.Event):
    chunks = []
    with httpx.Client(timeout=30, headers={"Authorization": f"Bearer {key}"}) as http:
        with http.stream("POST", f"{gateway.url}/chat/completions", json=body) as response:
            for chunk in response.iter_raw():
                started.set()
                chunks.append(chunk)
            return response.status_code, b"".join(chunks)


def redis_dump(redis) -> str:
    """Every key and value in `redis` (strings and hashes), as text."""
    import shutil
    import subprocess

    cli = shutil.which("redis-cli")
    assert cli, "redis-cli is missing (it comes with redis-server)"
    run = lambda *args: subprocess.run([cli, "-p", str(redis.port), *args], capture_output=True, text=True, check=True).stdout
    out = []
    for key in run("--scan").split():
        kind = run("TYPE", key).strip()
        out.append(key + " " + (run("GET", key) if kind == "string" else run("HGETALL", key) if kind == "hash" else kind))
    return "\n".join(out)


def answer_text(response: httpx.Response, stream: bool) -> str:
    import json

    if not stream:
        return response.json()["choices"][0]["message"]["content"]
    text = ""
    for line in response.text.splitlines():
        if line.startswith("data: {"):
            for choice in json.loads(line[6:])["choices"]:
                text += choice["delta"].get("content") or ""
    return text


def test_store_false_keeps_no_content_in_idempotency_records(tmp_path):
    from tenancy_support import Redis

    redis = Redis(tmp_path / "redis")
    sections = f'[auth]\nmode = "none"\n\n[state]\nbackend = "redis"\nredis_url = "{redis.url}"\n'
    gateway = Gateway(tmp_path, config_text(sections, CHAT_MODEL), {})
    marker = "zebra-crossing-4411"
    try:
        def post(key: str, store: bool | None, stream: bool = False):
            body = {"model": "chat", "messages": [{"role": "user", "content": f"say {marker}"}], "max_tokens": 30, "stream": stream}
            if store is not None:
                body["store"] = store
            return httpx.post(f"{gateway.url}/chat/completions", json=body, headers={"Idempotency-Key": key}, timeout=10)

        # Kept: a repeat replays the stored answer, which the store holds.
        first = post("kept", None)
        assert first.status_code == 200 and marker in first.text
        again = post("kept", None)
        assert again.headers.get("idempotent-replayed") == "true" and again.json() == first.json()
        assert marker in redis_dump(redis)

        import subprocess

        subprocess.run(["redis-cli", "-p", str(redis.port), "FLUSHALL"], check=True, capture_output=True)
        for stream in (False, True):
            key = f"private-{stream}"
            private = post(key, False, stream)
            assert private.status_code == 200 and marker in answer_text(private, stream)
            # A repeat is not run again, and cannot be replayed.
            repeat = post(key, False, stream)
            assert repeat.status_code == 409, repeat.text
            assert repeat.json()["error"]["code"] == "idempotency_response_not_stored"
        dump = redis_dump(redis)
        assert "idem" in dump, dump  # the records exist ...
        assert marker not in dump, dump  # ... without the prompt or the answer
    finally:
        gateway.stop()
        redis.stop()


@pytest.mark.parametrize("policy", ["plain", "hash"])
def test_logs_never_carry_prompts_and_hash_client_identifiers_on_request(tmp_path, policy):
    sections = f'[auth]\nmode = "none"\n\n[logging]\ncontent = "{policy}"\n'
    gateway = Gateway(tmp_path, config_text(sections, CHAT_MODEL), {"RUST_LOG": "debug"})
    marker = "okapi-umbrella-7731"
    try:
        body = {"model": "chat", "messages": [{"role": "user", "content": marker}], "max_tokens": 60, "user": "alice@example.com"}
        answer = httpx.post(f"{gateway.url}/chat/completions", json=body, timeout=10)
        assert answer.status_code == 200 and marker in answer.json()["choices"][0]["message"]["content"]
        assert wait_until(lambda: "request finished" in gateway.log.read_text())
    finally:
        gateway.stop()
    log = gateway.log.read_text()
    assert marker not in log
    if policy == "hash":
        assert "alice" not in log and '"user":"sha256:' in log
    else:
        assert '"user":"alice@example.com"' in log


def test_a_request_waiting_in_the_queue_at_the_cut_hears_server_shutting_down(tmp_path):
    sections = '[auth]\nmode = "none"\n\n[queue]\nmax_running = 1\n'
    gateway = Gateway(tmp_path, config_text(sections, LONG_MODEL, server="drain_timeout_ms = 500"), {})
    body = {"model": "long", "messages": HELLO, "max_tokens": 200, "stream": True}
    waiting: list = []
    try:
        threads, results = start_streams(gateway.base, body, 1)
        # This one waits for the model's one place, held by the stream.
        waiter = threading.Thread(target=lambda: waiting.append(httpx.post(
            f"{gateway.url}/chat/completions", json={**body, "stream": False}, timeout=30)))
        waiter.start()
        time.sleep(0.3)
        gateway.process.send_signal(signal.SIGTERM)
        waiter.join(15)
        for t in threads:
            t.join(15)
        assert gateway.process.wait(timeout=15) == 0
    finally:
        gateway.stop()
    assert waiting, "the waiting request got no answer"
    assert waiting[0].status_code == 503, waiting[0].text
    assert waiting[0].json()["error"]["code"] == "server_shutting_down"
    assert events_of(results[0][1])[-1].startswith('data: {"error"')
