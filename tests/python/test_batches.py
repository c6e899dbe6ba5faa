"""The Batch API on the real binary with the official `openai` SDK: files uploaded, checked and
read back; batches created, polled, listed, cancelled; every endpoint kind; result files in
OpenAI's line format; bad input refused with a clear 4xx; and two replicas on a real
`redis-server` sharing one batch, one of them killed mid-run, with every line answered once."""

import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai
import pytest

from tenancy_support import HELLO, TENANCY_MODELS, Gateway, Redis, config_text, error_of, free_port, make_key, tenant

ENDPOINTS = {
    "/v1/chat/completions": lambda i: {"model": "chat", "messages": HELLO, "max_tokens": 8},
    "/v1/completions": lambda i: {"model": "chat", "prompt": f"Line {i}", "max_tokens": 8},
    "/v1/embeddings": lambda i: {"model": "chat", "input": f"line {i}"},
    "/v1/responses": lambda i: {"model": "chat", "input": f"Line {i}", "max_output_tokens": 16},
}
OBJECTS = {"/v1/chat/completions": "chat.completion", "/v1/completions": "text_completion",
           "/v1/embeddings": "list", "/v1/responses": "response"}


def lines(endpoint: str, count: int, body=None, start: int = 0) -> bytes:
    body = body or ENDPOINTS[endpoint]
    rows = [{"custom_id": f"req-{i}", "method": "POST", "url": endpoint, "body": body(i)}
            for i in range(start, start + count)]
    return ("\n".join(json.dumps(r) for r in rows) + "\n").encode()


def files_section(directory, extra: str = "") -> str:
    return f'[files]\ndir = "{directory}"\nmax_bytes = 1048576\n{extra}\n'


# moto's S3 server accepts any credentials; the gateway reads them from AWS's variables.
S3_ENV = {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test"}


@pytest.fixture(scope="module")
def s3_server(tmp_path_factory):
    """An S3-compatible server (moto's server mode) on a free loopback port, with a bucket."""
    binary = Path(sys.executable).parent / "moto_server"
    assert binary.exists(), "moto_server is missing: tests/python/requirements.txt installs moto[server]"
    port = free_port()
    log = open(tmp_path_factory.mktemp("moto") / "moto.log", "w")
    process = subprocess.Popen([str(binary), "-H", "127.0.0.1", "-p", str(port)], stdout=log, stderr=log)
    endpoint = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            if httpx.put(f"{endpoint}/turnpike-files", timeout=2).status_code == 200:
                break
        except httpx.TransportError:
            pass
        assert time.monotonic() < deadline and process.poll() is None, "moto_server did not start"
        time.sleep(0.1)
    yield endpoint
    process.terminate()
    process.wait(timeout=10)
    log.close()


@pytest.fixture(params=["dir", "s3"])
def storage(request, tmp_path):
    """Where files go, as a [files] section maker and the environment it needs."""
    if request.param == "dir":
        return (lambda extra="": files_section(tmp_path / "files", extra)), {}
    endpoint = request.getfixturevalue("s3_server")
    prefix = f"run-{time.monotonic_ns()}"

    def section(extra: str = "") -> str:
        return (f'[files]\nurl = "s3://turnpike-files/{prefix}"\nendpoint = "{endpoint}"\nregion = "us-east-1"\n'
                f"max_bytes = 1048576\n{extra}\n")

    return section, S3_ENV


@pytest.fixture
def started(tmp_path):
    gateways = []

    def start(sections: str, env: dict, name: str = "batch", models=None):
        gateway = Gateway(tmp_path, config_text(sections, models), env, f"{name}{len(gateways)}")
        gateways.append(gateway)
        return gateway

    yield start
    for gateway in gateways:
        gateway.stop()


def upload(client: openai.OpenAI, data: bytes, name: str = "input.jsonl"):
    return client.files.create(file=(name, io.BytesIO(data)), purpose="batch")


def wait_until_ended(client: openai.OpenAI, batch_id: str, timeout: float = 120.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        batch = client.batches.retrieve(batch_id)
        if batch.status in ("completed", "failed", "expired", "cancelled"):
            return batch
        time.sleep(0.1)
    raise AssertionError(f"batch {batch_id} did not end: {batch}")


def wait_for_completed(client: openai.OpenAI, batch_id: str, count: int, timeout: float = 60.0) -> None:
    """Waits until at least `count` lines of the batch are answered."""
    deadline = time.monotonic() + timeout
    while client.batches.retrieve(batch_id).request_counts.completed < count:
        assert time.monotonic() < deadline, f"fewer than {count} lines answered"
        time.sleep(0.05)


def on_redis(redis, tmp_path, batches: str) -> str:
    """A tenant, the state in `redis`, files in one directory every replica shares."""
    state = f'[state]\nbackend = "redis"\nredis_url = "{redis.url}"\ntimeout_ms = 1000\n'
    return tenant() + state + files_section(tmp_path / "files", batches).replace("max_bytes = 1048576",
                                                                              "max_bytes = 8388608")


def lines_run(gateway: Gateway) -> int:
    """The batch lines a replica answered, from its /metrics."""
    metrics = httpx.get(f"{gateway.base}/metrics").text
    return int(sum(float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
                   if line.startswith("turnpike_batch_lines_total")))


def results(client: openai.OpenAI, file_id: str | None) -> list[dict]:
    if file_id is None:
        return []
    return [json.loads(line) for line in client.files.content(file_id).text.splitlines() if line]


def test_every_endpoint_kind_runs_end_to_end_with_the_sdk(started, storage, tmp_path):
    key = make_key()
    usage_file = tmp_path / "usage.jsonl"
    section, env = storage
    gateway = started(tenant() + section() + f'[spend]\nusage_file = "{usage_file}"\n',
                      {"ACME_API_KEY": key, **env})
    client = openai.OpenAI(base_url=gateway.url, api_key=key, max_retries=0)
    batches = {}
    for endpoint in ENDPOINTS:
        uploaded = upload(client, lines(endpoint, 5))
        assert uploaded.purpose == "batch" and uploaded.bytes > 0 and uploaded.status == "processed"
        assert client.files.retrieve(uploaded.id).filename == "input.jsonl"
        batch = client.batches.create(input_file_id=uploaded.id, endpoint=endpoint, completion_window="24h",
                                      metadata={"job": "nightly"})
        assert batch.status == "validating" and batch.request_counts.total == 5
        batches[endpoint] = batch.id
    for endpoint, batch_id in batches.items():
        batch = wait_until_ended(client, batch_id)
        assert batch.status == "completed", batch
        assert batch.request_counts.completed == 5 and batch.request_counts.failed == 0, batch
        assert batch.error_file_id is None and batch.metadata == {"job": "nightly"}
        answered = results(client, batch.output_file_id)
        assert sorted(r["custom_id"] for r in answered) == [f"req-{i}" for i in range(5)]
        for row in answered:
            assert row["error"] is None and row["response"]["status_code"] == 200, row
            assert row["response"]["body"]["object"] == OBJECTS[endpoint], row
            assert row["id"].startswith("batch_req_")
    page = client.batches.list(limit=2)
    assert [b.id for b in page.data] == list(batches.values())[::-1][:2] and page.has_more
    # The SDK follows `after` through every page.
    assert [b.id for b in client.batches.list(limit=3)] == list(batches.values())[::-1]
    outputs = [f for f in client.files.list(purpose="batch_output")]
    assert len(outputs) == len(ENDPOINTS)
    # Each line's usage is one record, marked as batch work.
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        records = [json.loads(line) for line in usage_file.read_text().splitlines()] if usage_file.exists() else []
        marked = [r for r in records if r.get("batch_id") in batches.values()]
        if len(marked) >= 20:
            break
        time.sleep(0.2)
    assert len(marked) == 20, records
    # Deleting a file removes it for good.
    first = client.batches.retrieve(batches["/v1/completions"]).input_file_id
    assert client.files.delete(first).deleted
    with pytest.raises(openai.NotFoundError):
        client.files.retrieve(first)


def test_failed_lines_go_to_the_error_file_and_the_rest_still_run(started, tmp_path):
    key = make_key()
    limited = tenant().replace('models = ["*"]', 'models = ["chat"]')
    gateway = started(limited + files_section(tmp_path / "files"), {"ACME_API_KEY": key})
    client = openai.OpenAI(base_url=gateway.url, api_key=key, max_retries=0)
    body = {"/v1/chat/completions": lambda i: {"model": "chat" if i % 2 else "fixed", "messages": HELLO,
                                               "max_tokens": 4}}["/v1/chat/completions"]
    data = lines("/v1/chat/completions", 6, body)
    data += json.dumps({"custom_id": "bad-param", "method": "POST", "url": "/v1/chat/completions",
                        "body": {"model": "chat", "messages": HELLO, "temperature": 9}}).encode() + b"\n"
    batch = client.batches.create(input_file_id=upload(client, data).id, endpoint="/v1/chat/completions",
                                  completion_window="24h")
    batch = wait_until_ended(client, batch.id)
    assert batch.status == "completed"
    assert (batch.request_counts.completed, batch.request_counts.failed) == (3, 4), batch
    errors = results(client, batch.error_file_id)
    by_id = {row["custom_id"]: row for row in errors}
    assert set(by_id) == {"req-0", "req-2", "req-4", "bad-param"}
    assert by_id["req-0"]["response"]["status_code"] == 403
    assert by_id["req-0"]["response"]["body"]["error"]["code"] == "model_not_allowed"
    assert by_id["req-0"]["error"]["code"] == "model_not_allowed"
    assert by_id["bad-param"]["response"]["status_code"] == 400
    assert by_id["bad-param"]["response"]["body"]["error"]["param"] == "temperature"


def test_cancel_mid_run_keeps_finished_lines(started, storage):
    key = make_key()
    section, env = storage
    gateway = started(tenant() + section("[batches]\nconcurrency = 2\nchunk_lines = 2"), {"ACME_API_KEY": key, **env})
    client = openai.OpenAI(base_url=gateway.url, api_key=key, max_retries=0)
    # Each line streams about 0.5 s: 40 lines at 2 at a time take 10 s.
    body = lambda i: {"model": "long", "messages": HELLO, "max_tokens": 25}
    batch = client.batches.create(input_file_id=upload(client, lines("/v1/chat/completions", 40, body)).id,
                                  endpoint="/v1/chat/completions", completion_window="24h")
    wait_for_completed(client, batch.id, 2, timeout=30)
    cancelling = client.batches.cancel(batch.id)
    assert cancelling.status == "cancelling" and cancelling.cancelling_at
    batch = wait_until_ended(client, batch.id, timeout=30)
    assert batch.status == "cancelled" and batch.cancelled_at
    answered = results(client, batch.output_file_id)
    assert 2 <= len(answered) < 40 and batch.request_counts.completed == len(answered), batch
    assert all(row["response"]["status_code"] == 200 for row in answered)
    # Cancelled work left the engine: nothing is still generating.
    metrics = httpx.get(f"{gateway.base}/metrics").text
    assert "turnpike_batch_lines_running 0" in metrics
    # An ended batch cannot be cancelled again.
    with pytest.raises(openai.ConflictError):
        client.batches.cancel(batch.id)


def test_bad_input_gets_a_clear_4xx(started, storage):
    key, other = make_key(), make_key()
    sections = tenant() + '[tenants.globex]\nmodels = ["*"]\nkeys = [{ env = "GLOBEX_API_KEY" }]\n'
    section, env = storage
    gateway = started(sections + section(), {"ACME_API_KEY": key, "GLOBEX_API_KEY": other, **env})
    client = openai.OpenAI(base_url=gateway.url, api_key=key, max_retries=0)
    good = lines("/v1/chat/completions", 3)
    # Malformed JSONL: the first bad line is named.
    with pytest.raises(openai.BadRequestError) as bad:
        upload(client, good + b'{"custom_id": "x", "method": "POST"\n')
    assert "line 4" in str(bad.value) and bad.value.body["param"] == "file"
    with pytest.raises(openai.BadRequestError) as repeated:
        upload(client, good + lines("/v1/chat/completions", 1))
    assert "line 4" in str(repeated.value) and "unique" in str(repeated.value)
    with pytest.raises(openai.BadRequestError):
        client.files.create(file=("x.jsonl", io.BytesIO(good)), purpose="fine-tune")
    # Over the size limit.
    with pytest.raises(openai.APIStatusError) as large:
        upload(client, good * 20000)
    assert large.value.status_code == 413
    uploaded = upload(client, good)
    # An endpoint batches do not run, or one the lines do not call.
    with pytest.raises(openai.BadRequestError) as endpoint:
        client.batches.create(input_file_id=uploaded.id, endpoint="/v1/images/generations", completion_window="24h")
    assert endpoint.value.body["param"] == "endpoint"
    with pytest.raises(openai.BadRequestError) as mismatch:
        client.batches.create(input_file_id=uploaded.id, endpoint="/v1/embeddings", completion_window="24h")
    assert "line 1" in str(mismatch.value)
    with pytest.raises(openai.BadRequestError):
        client.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="1h")
    # Another tenant's file and batch are not found.
    stranger = openai.OpenAI(base_url=gateway.url, api_key=other, max_retries=0)
    with pytest.raises(openai.NotFoundError):
        stranger.files.retrieve(uploaded.id)
    with pytest.raises(openai.NotFoundError):
        stranger.files.content(uploaded.id)
    with pytest.raises(openai.NotFoundError) as missing:
        stranger.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h")
    assert missing.value.body["param"] == "input_file_id"
    batch = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h")
    with pytest.raises(openai.NotFoundError):
        stranger.batches.retrieve(batch.id)
    assert [b.id for b in stranger.batches.list()] == []
    assert wait_until_ended(client, batch.id).status == "completed"
    # Unknown fields are refused, as OpenAI does.
    response = httpx.post(f"{gateway.url}/batches", headers={"Authorization": f"Bearer {key}"},
                          json={"input_file_id": uploaded.id, "endpoint": "/v1/chat/completions",
                                "completion_window": "24h", "priority": 1})
    assert response.status_code == 400 and error_of(response)["param"] == "priority"


def test_per_tenant_limits_on_open_batches_and_lines(started, tmp_path):
    key = make_key()
    limits = "[batches]\nmax_open_per_tenant = 1\nmax_lines = 4\nconcurrency = 1"
    gateway = started(tenant() + files_section(tmp_path / "files", limits), {"ACME_API_KEY": key})
    client = openai.OpenAI(base_url=gateway.url, api_key=key, max_retries=0)
    body = lambda i: {"model": "long", "messages": HELLO, "max_tokens": 25}
    with pytest.raises(openai.BadRequestError) as long_file:
        client.batches.create(input_file_id=upload(client, lines("/v1/chat/completions", 5, body)).id,
                              endpoint="/v1/chat/completions", completion_window="24h")
    assert "at most 4" in str(long_file.value)
    small = upload(client, lines("/v1/chat/completions", 4, body)).id
    running = client.batches.create(input_file_id=small, endpoint="/v1/chat/completions", completion_window="24h")
    with pytest.raises(openai.RateLimitError) as busy:
        client.batches.create(input_file_id=small, endpoint="/v1/chat/completions", completion_window="24h")
    assert "1 batches open" in str(busy.value)
    client.batches.cancel(running.id)
    assert wait_until_ended(client, running.id).status == "cancelled"
    # An ended batch no longer counts.
    again = client.batches.create(input_file_id=small, endpoint="/v1/chat/completions", completion_window="24h")
    client.batches.cancel(again.id)


def test_a_batch_whose_input_is_deleted_fails_and_keeps_what_it_answered(started, tmp_path):
    key = make_key()
    gateway = started(tenant() + files_section(tmp_path / "files", "[batches]\nconcurrency = 1\nchunk_lines = 1"),
                      {"ACME_API_KEY": key})
    client = openai.OpenAI(base_url=gateway.url, api_key=key, max_retries=0)
    body = lambda i: {"model": "long", "messages": HELLO, "max_tokens": 25}
    input_file = upload(client, lines("/v1/chat/completions", 6, body)).id
    batch = client.batches.create(input_file_id=input_file, endpoint="/v1/chat/completions", completion_window="24h")
    wait_for_completed(client, batch.id, 1, timeout=30)
    client.files.delete(input_file)
    batch = wait_until_ended(client, batch.id, timeout=30)
    assert batch.status == "failed" and batch.failed_at, batch
    assert batch.errors.data[0].code == "file_not_found", batch.errors
    answered = results(client, batch.output_file_id)
    assert 1 <= len(answered) < 6 and batch.request_counts.completed == len(answered)


def test_lines_wait_for_their_tenants_request_rate_instead_of_failing(started, tmp_path):
    key = make_key()
    gateway = started(tenant("requests_per_second = 2") + files_section(tmp_path / "files"), {"ACME_API_KEY": key})
    # The client's own calls share the rate with the lines: the SDK waits as the 429s say.
    client = openai.OpenAI(base_url=gateway.url, api_key=key, max_retries=30)
    body = lambda i: {"model": "chat", "messages": HELLO, "max_tokens": 4}
    input_file = upload(client, lines("/v1/chat/completions", 8, body)).id
    batch = client.batches.create(input_file_id=input_file, endpoint="/v1/chat/completions", completion_window="24h")
    batch = wait_until_ended(client, batch.id, timeout=60)
    assert batch.status == "completed" and batch.request_counts.completed == 8, batch
    # The rate refused lines more than once; each waited and ran.
    metrics = httpx.get(f"{gateway.base}/metrics").text
    refused = [line for line in metrics.splitlines()
               if line.startswith("turnpike_rate_limit_dropped_total") and 'limit="requests"' in line]
    assert refused and float(refused[0].rsplit(" ", 1)[1]) > 0, refused


def test_files_are_off_until_a_directory_is_configured(started):
    key = make_key()
    gateway = started(tenant(), {"ACME_API_KEY": key})
    client = openai.OpenAI(base_url=gateway.url, api_key=key, max_retries=0)
    with pytest.raises(openai.BadRequestError) as off:
        upload(client, lines("/v1/chat/completions", 1))
    assert "[files] dir" in str(off.value)
    with pytest.raises(openai.BadRequestError):
        client.batches.list()


def test_two_replicas_share_a_batch_and_one_killed_mid_run_loses_nothing(started, tmp_path):
    redis = Redis(tmp_path / "redis")
    try:
        key = make_key()
        sections = on_redis(redis, tmp_path, "[batches]\nconcurrency = 16\nchunk_lines = 25")
        models = {**TENANCY_MODELS, "quick": 'latency = { ttft_ms = 5, itl_ms = 1 }\noutput = { mode = "random", length = [4, 4] }'}
        first = started(sections, {"ACME_API_KEY": key}, "replica", models)
        second = started(sections, {"ACME_API_KEY": key}, "replica", models)
        client = openai.OpenAI(base_url=first.url, api_key=key, max_retries=0)
        body = lambda i: {"model": "quick", "messages": HELLO, "max_tokens": 4}
        batch = client.batches.create(input_file_id=upload(client, lines("/v1/chat/completions", 2000, body)).id,
                                      endpoint="/v1/chat/completions", completion_window="24h")
        wait_for_completed(client, batch.id, 300)
        first.process.send_signal(signal.SIGKILL)
        first.process.wait()
        other = openai.OpenAI(base_url=second.url, api_key=key, max_retries=0)
        batch = wait_until_ended(other, batch.id, timeout=240)
        assert batch.status == "completed", batch
        assert (batch.request_counts.completed, batch.request_counts.failed) == (2000, 0), batch
        answered = results(other, batch.output_file_id)
        ids = [row["custom_id"] for row in answered]
        assert len(ids) == 2000 and set(ids) == {f"req-{i}" for i in range(2000)}
        # The killed replica had run lines of its own: the survivor ran fewer than all.
        assert 0 < lines_run(second) < 2000, lines_run(second)
    finally:
        redis.stop()


GGUF = os.environ.get("TURNPIKE_SMOLLM2_GGUF")
CUDA_PLUGIN = Path(os.environ.get("TURNPIKE_CUDA", Path(__file__).resolve().parents[2] / "target/debug/libturnpike_cuda.so"))


@pytest.mark.skipif(not GGUF, reason="TURNPIKE_SMOLLM2_GGUF is not set (tests/run.sh sets it)")
def test_a_batch_on_smollm2_answers_as_direct_requests_do(tmp_path):
    """SmolLM2 on the default engine's CPU device: greedy batch lines answer exactly what the
    same requests answer directly, and interactive requests are served while the batch runs."""
    config = "\n".join([
        "[server]", 'listen = "127.0.0.1:0"', "[auth]", 'mode = "none"',
        files_section(tmp_path / "files", "[batches]\nconcurrency = 4\nchunk_lines = 3"),
        "[[engines]]", 'name = "default"', f'plugin = "{CUDA_PLUGIN}"', "[engines.config]",
        "[[engines.config.models]]", 'id = "smollm2"', f'path = "{GGUF}"', 'device = "cpu"', "threads = 2", "",
    ])
    gateway = Gateway(tmp_path, config, {"TURNPIKE_CACHE_DIR": str(tmp_path / "cache")})
    try:
        client = openai.OpenAI(base_url=gateway.url, api_key="sk-unused", max_retries=0, timeout=300)
        questions = ["What is the capital of France?", "Name a colour.", "What is 2 + 2?",
                     "Say hello.", "Name a fruit.", "What day follows Monday?", "Name an ocean."]
        body = lambda i: {"model": "smollm2", "messages": [{"role": "user", "content": questions[i]}],
                          "max_tokens": 12, "temperature": 0}
        batch = client.batches.create(input_file_id=upload(client, lines("/v1/chat/completions", 7, body)).id,
                                      endpoint="/v1/chat/completions", completion_window="24h")
        # Interactive requests while it runs.
        for question in questions[:2]:
            answer = client.chat.completions.create(model="smollm2", max_tokens=6, temperature=0,
                                                    messages=[{"role": "user", "content": question}])
            assert answer.choices[0].message.content
        batch = wait_until_ended(client, batch.id, timeout=300)
        assert batch.status == "completed" and batch.request_counts.completed == 7, batch
        answered = {row["custom_id"]: row["response"]["body"] for row in results(client, batch.output_file_id)}
        for i in range(7):
            direct = client.chat.completions.create(**body(i))
            assert answered[f"req-{i}"]["choices"][0]["message"]["content"] == direct.choices[0].message.content
            assert answered[f"req-{i}"]["usage"]["prompt_tokens"] == direct.usage.prompt_tokens
        assert "Paris" in answered["req-0"]["choices"][0]["message"]["content"]
    finally:
        gateway.stop()


def test_a_batch_survives_a_restart_of_its_only_replica(started, tmp_path):
    redis = Redis(tmp_path / "redis")
    try:
        key = make_key()
        sections = on_redis(redis, tmp_path, "[batches]\nconcurrency = 2\nchunk_lines = 5")
        models = {**TENANCY_MODELS, "steady": 'latency = { ttft_ms = 20, itl_ms = 2 }\noutput = { mode = "random", length = [4, 4] }'}
        first = started(sections, {"ACME_API_KEY": key}, "alone", models)
        client = openai.OpenAI(base_url=first.url, api_key=key, max_retries=0)
        body = lambda i: {"model": "steady", "messages": HELLO, "max_tokens": 4}
        batch = client.batches.create(input_file_id=upload(client, lines("/v1/chat/completions", 200, body)).id,
                                      endpoint="/v1/chat/completions", completion_window="24h")
        wait_for_completed(client, batch.id, 20)
        ran_before = lines_run(first)
        first.process.send_signal(signal.SIGKILL)
        first.process.wait()
        again = started(sections, {"ACME_API_KEY": key}, "alone", models)
        client = openai.OpenAI(base_url=again.url, api_key=key, max_retries=0)
        batch = wait_until_ended(client, batch.id, timeout=120)
        assert batch.status == "completed" and batch.request_counts.completed == 200, batch
        ids = [row["custom_id"] for row in results(client, batch.output_file_id)]
        assert sorted(ids) == sorted(f"req-{i}" for i in range(200))
        # Answers are kept as they come: the new replica ran only what had none, give or take
        # the two lines under way (and two answered but not yet written) when the first died.
        assert lines_run(again) <= 200 - ran_before + 4, (lines_run(again), ran_before)
    finally:
        redis.stop()
