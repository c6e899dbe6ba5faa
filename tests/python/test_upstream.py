"""More than one machine: two real Turnpike nodes (the simulator behind `POST /generate`) on
loopback, and a Turnpike gateway in front that serves their model through the upstream engine
plugin (`libturnpike_upstream.so`). The official SDK through two hops, streamed and not;
prefix affinity sends a repeated prompt to one node; a node killed under load fails over with
no client error; its breaker opens and the other node carries the traffic."""

import os
import re
import time
from pathlib import Path

import openai
import pytest
from tokenizers import Tokenizer

from conftest import FOLDER, ROOT, SIM, TOKENIZER, config_text, engine_counter
from tenancy_support import Gateway

UPSTREAM = Path(os.environ.get("TURNPIKE_UPSTREAM", ROOT / "target/debug/libturnpike_upstream.so"))


def front_config(nodes, affinity=16, health_ms=5000, pool=None):
    """`pool`: the TOML lines that say where the replicas are (default: the nodes' URLs)."""
    vocab = Tokenizer.from_file(str(TOKENIZER)).get_vocab_size(with_added_tokens=True)
    endpoints = ", ".join(f'"{n.base}"' for n in nodes)
    pool = pool or [f"endpoints = [{endpoints}]"]
    lines = ["[server]", 'listen = "127.0.0.1:0"', "[auth]", 'mode = "none"',
             "[[engines]]", 'name = "fleet"', f'plugin = "{UPSTREAM}"', "[engines.config]"]
    for model in ("chat", "slow"):
        lines += ["[[engines.config.models]]", f'id = "{model}"', f'upstream_model = "{model}"',
                  *pool, f"vocab_size = {vocab}", "eos_token_ids = [4]",
                  f"affinity_tokens = {affinity}", "retries = 2", "breaker = { failures = 2, cooldown_ms = 60000 }",
                  # Turnpike nodes constrain output by grammar (the simulator does, with its tokenizer).
                  "grammar = true", f"health_interval_ms = {health_ms}"]
    for model in ("chat", "slow"):
        lines += ["[[models]]", f'name = "{model}"', 'engine = "fleet"', f'folder = "{FOLDER}"',
                  'tool_call_parser = "llama3_json"']
    return "\n".join(lines) + "\n"


@pytest.fixture
def fleet(tmp_path):
    assert UPSTREAM.exists(), f"{UPSTREAM} is missing: build the workspace first"
    nodes = [Gateway(tmp_path / f"node{i}", config_text(), {}, name=f"node{i}") for i in range(2)]
    front = Gateway(tmp_path / "front", front_config(nodes), {}, name="front")
    client = openai.OpenAI(base_url=f"{front.base}/v1", api_key="sk-unused", max_retries=0)
    yield nodes, front, client
    for g in [front, *nodes]:
        g.stop()


def completed(node):
    return engine_counter(node.base, "completed")


def test_the_sdk_works_through_two_hops(fleet):
    nodes, _, client = fleet
    messages = [{"role": "user", "content": "Hello through the fleet"}]
    r = client.chat.completions.create(model="chat", messages=messages, max_tokens=12, seed=5)
    assert r.choices[0].message.content and r.usage.completion_tokens > 0
    streamed = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
        model="chat", messages=messages, max_tokens=12, seed=5, stream=True) if c.choices)
    assert streamed == r.choices[0].message.content
    many = client.chat.completions.create(model="chat", messages=messages, max_tokens=6, n=3, logprobs=True,
                                          top_logprobs=2)
    assert len(many.choices) == 3 and all(len(c.logprobs.content) > 0 for c in many.choices)
    text = client.completions.create(model="chat", prompt="Once upon a time", max_tokens=5)
    assert text.choices[0].text
    response = client.responses.create(model="chat", input="Hello", max_output_tokens=8)
    assert response.status in ("completed", "incomplete") and response.output_text
    assert completed(nodes[0]) + completed(nodes[1]) >= 5


def test_a_repeated_prefix_reaches_one_node(fleet):
    nodes, _, client = fleet
    before = [completed(n) for n in nodes]
    prompt = "The same long system prompt that every request of this conversation shares. " * 4
    for i in range(6):
        client.completions.create(model="chat", prompt=prompt + f"turn {i}", max_tokens=2)
    grew = [completed(n) - b for n, b in zip(nodes, before)]
    assert sorted(grew) == [0, 6], grew


def test_a_dead_node_fails_over_before_the_first_token(fleet):
    nodes, front, client = fleet
    nodes[0].stop()
    for i in range(8):
        r = client.completions.create(model="chat", prompt=f"request {i} " * (i + 1), max_tokens=3)
        assert r.choices[0].text is not None
    import json
    import urllib.request

    stats = urllib.request.urlopen(f"{front.base}/metrics", timeout=10).read().decode()
    # Per replica: the dead node's breaker is open, the live one's closed.
    breaker = {n.base: re.search(
        rf'turnpike_engine_replica_breaker{{engine="fleet",model="chat",replica="{re.escape(n.base)}"}} (\S+)', stats)
        for n in nodes}
    assert breaker[nodes[0].base] and breaker[nodes[0].base].group(1) == "2", stats
    assert breaker[nodes[1].base] and breaker[nodes[1].base].group(1) == "0", stats
    assert re.search(r'turnpike_engine_replica_stat\{[^}]*model="chat"[^}]*stat="errors"\} [1-9]', stats), stats
    assert completed(nodes[1]) >= 8


def test_a_client_that_leaves_cancels_the_work_on_the_node(fleet):
    nodes, _, client = fleet
    before = sum(engine_counter(n.base, "cancelled") for n in nodes)
    stream = client.chat.completions.create(model="slow", messages=[{"role": "user", "content": "Go on"}],
                                            max_tokens=200, stream=True)
    for i, _ in enumerate(stream):
        if i == 2:
            break
    stream.close()
    from conftest import wait_for

    assert wait_for(lambda: sum(engine_counter(n.base, "cancelled") for n in nodes) > before)


def test_grammars_travel_to_the_nodes(fleet):
    import json

    import jsonschema

    _, _, client = fleet
    schema = {"type": "object", "properties": {"colour": {"enum": ["red", "blue"]}, "n": {"type": "integer"}},
              "required": ["colour", "n"], "additionalProperties": False}
    r = client.chat.completions.create(model="chat", messages=[{"role": "user", "content": "Fill it in"}],
                                       max_tokens=60, response_format={"type": "json_schema", "json_schema": {
                                           "name": "form", "schema": schema, "strict": True}})
    jsonschema.validate(json.loads(r.choices[0].message.content), schema)
    # A forced call is a Lark grammar on the wire.
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": schema}}]
    r = client.chat.completions.create(model="chat", messages=[{"role": "user", "content": "Weather?"}],
                                       max_tokens=80, tools=tools, tool_choice="required")
    [call] = r.choices[0].message.tool_calls
    jsonschema.validate(json.loads(call.function.arguments), schema)
    r = client.chat.completions.create(model="chat", messages=[{"role": "user", "content": "Yes or no?"}],
                                       max_tokens=10, extra_body={"guided_regex": "(yes|no)"})
    assert r.choices[0].message.content in ("yes", "no")


def test_probes_open_a_breaker_without_traffic_and_close_it_when_the_node_returns(tmp_path):
    import socket

    from conftest import wait_for

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    fixed = config_text().replace('listen = "127.0.0.1:0"', f'listen = "127.0.0.1:{port}"')
    nodes = [Gateway(tmp_path / "node0", fixed, {}, name="node0"),
             Gateway(tmp_path / "node1", config_text(), {}, name="node1")]
    front = Gateway(tmp_path / "front", front_config(nodes, health_ms=100), {}, name="front")
    import urllib.request

    def breaker():
        text = urllib.request.urlopen(f"{front.base}/metrics", timeout=10).read().decode()
        found = re.search(rf'turnpike_engine_replica_breaker{{engine="fleet",model="chat",'
                          rf'replica="{re.escape(nodes[0].base)}"}} (\S+)', text)
        return found.group(1) if found else None

    try:
        assert wait_for(lambda: breaker() == "0")
        nodes[0].stop()
        assert wait_for(lambda: breaker() == "2"), breaker()
        nodes[0] = Gateway(tmp_path / "node0-again", fixed, {}, name="node0")
        assert wait_for(lambda: breaker() == "0"), breaker()
        client = openai.OpenAI(base_url=f"{front.base}/v1", api_key="sk-unused", max_retries=0)
        assert client.completions.create(model="chat", prompt="back again", max_tokens=2).choices[0].text is not None
    finally:
        for g in [front, *nodes]:
            g.stop()


def replicas(front, model="chat"):
    import urllib.request

    text = urllib.request.urlopen(f"{front.base}/metrics", timeout=10).read().decode()
    return set(re.findall(rf'turnpike_engine_replica_breaker{{engine="fleet",model="{model}",replica="([^"]+)"}}', text))


def test_an_endpoints_file_changes_the_pool_while_it_serves(tmp_path):
    from conftest import wait_for

    nodes = [Gateway(tmp_path / f"node{i}", config_text(), {}, name=f"node{i}") for i in range(2)]
    listing = tmp_path / "fleet.txt"
    listing.write_text(f"# the pool\n{nodes[0].base}\n")
    front = Gateway(tmp_path / "front", front_config(nodes, pool=[f'endpoints_file = "{listing}"', "refresh_ms = 100"]),
                    {}, name="front")
    client = openai.OpenAI(base_url=f"{front.base}/v1", api_key="sk-unused", max_retries=0)
    try:
        assert replicas(front) == {nodes[0].base}
        for i in range(3):
            client.completions.create(model="chat", prompt=f"first {i}", max_tokens=2)
        assert (completed(nodes[0]), completed(nodes[1])) == (3, 0)
        # The operator moves the pool to the other node: traffic follows, nothing fails.
        listing.write_text(f"{nodes[1].base}  # moved\n")
        assert wait_for(lambda: replicas(front) == {nodes[1].base})
        for i in range(3):
            client.completions.create(model="chat", prompt=f"then {i}", max_tokens=2)
        assert (completed(nodes[0]), completed(nodes[1])) == (3, 3)
        # A bad line changes nothing (and the log says why).
        listing.write_text("ftp://nowhere\n")
        time.sleep(0.5)
        assert replicas(front) == {nodes[1].base}
        assert "replicas unchanged" in front.log.read_text()
    finally:
        for g in [front, *nodes]:
            g.stop()


def test_a_host_name_stands_for_each_of_its_addresses(tmp_path):
    nodes = [Gateway(tmp_path / "node0", config_text(), {}, name="node0")]
    port = nodes[0].base.rsplit(":", 1)[1]
    front = Gateway(tmp_path / "front", front_config(nodes, pool=[f'endpoints = ["http://localhost:{port}"]',
                                                                  "resolve = true", "refresh_ms = 100"]),
                    {}, name="front")
    client = openai.OpenAI(base_url=f"{front.base}/v1", api_key="sk-unused", max_retries=0)
    try:
        # `localhost` resolves to 127.0.0.1 (and ::1 where the host lists it): one replica per address.
        found = replicas(front)
        assert f"http://127.0.0.1:{port}" in found and all(u.endswith(f":{port}") for u in found), found
        assert not any("localhost" in u for u in found)
        for i in range(4):
            assert client.completions.create(model="chat", prompt=f"req {i}", max_tokens=2).choices[0].text is not None
    finally:
        for g in [front, *nodes]:
            g.stop()


def test_standby_pools_take_over_and_a_canary_takes_its_share(tmp_path):
    """Two pools of one node each; the model map names pool `a` with `b` as its standby, and a
    second public model sends every tenant to `b` as its canary."""
    from conftest import wait_for

    nodes = [Gateway(tmp_path / f"node{i}", config_text(), {}, name=f"node{i}") for i in range(2)]
    vocab = Tokenizer.from_file(str(TOKENIZER)).get_vocab_size(with_added_tokens=True)
    lines = ["[server]", 'listen = "127.0.0.1:0"', "[auth]", 'mode = "none"',
             "[[engines]]", 'name = "fleet"', f'plugin = "{UPSTREAM}"', "[engines.config]"]
    for pool, node in (("a", nodes[0]), ("b", nodes[1])):
        lines += ["[[engines.config.models]]", f'id = "{pool}"', 'upstream_model = "chat"',
                  f'endpoints = ["{node.base}"]', f"vocab_size = {vocab}", "eos_token_ids = [4]",
                  "retries = 0", "breaker = { failures = 1, cooldown_ms = 60000 }", "health_interval_ms = 100"]
    lines += ["[[models]]", 'name = "chat"', 'engine = "fleet"', 'engine_model = "a"', f'folder = "{FOLDER}"',
              'standby = [{ engine = "fleet", engine_model = "b" }]',
              "[[models]]", 'name = "tried"', 'engine = "fleet"', 'engine_model = "a"', f'folder = "{FOLDER}"',
              'canary = { engine = "fleet", engine_model = "b", percent = 100 }']
    front = Gateway(tmp_path / "front", "\n".join(lines) + "\n", {}, name="front")
    client = openai.OpenAI(base_url=f"{front.base}/v1", api_key="sk-unused", max_retries=0)

    def routes():
        import urllib.request

        text = urllib.request.urlopen(f"{front.base}/metrics", timeout=10).read().decode()
        return {(m, r): float(v) for m, r, v in re.findall(
            r'turnpike_model_route_total\{[^}]*model="(\w+)"[^}]*route="(\w+)"[^}]*\} (\S+)', text)}

    try:
        for i in range(3):
            client.completions.create(model="chat", prompt=f"primary {i}", max_tokens=2)
            client.completions.create(model="tried", prompt=f"canary {i}", max_tokens=2)
        assert (completed(nodes[0]), completed(nodes[1])) == (3, 3)
        assert routes()[("chat", "primary")] == 3 and routes()[("tried", "canary")] == 3
        # Pool a's only node goes: once its breaker is open, `chat` is served by the standby,
        # with no error to the client.
        nodes[0].stop()
        assert wait_for(lambda: not replicas_closed(front, "a"))
        for i in range(4):
            assert client.completions.create(model="chat", prompt=f"standby {i}", max_tokens=2).choices[0].text is not None
        assert completed(nodes[1]) == 7
        assert routes()[("chat", "standby")] == 4
        raw = client.completions.with_raw_response.create(model="chat", prompt="which way", max_tokens=2)
        assert raw.headers["x-turnpike-route"] == "standby fleet"
        raw = client.completions.with_raw_response.create(model="tried", prompt="which way", max_tokens=2,
                                                          stream=True)
        assert raw.headers["x-turnpike-route"] == "canary fleet"
        assert "trying the next" in front.log.read_text()
    finally:
        for g in [front, *nodes]:
            g.stop()


def replicas_closed(front, model):
    import urllib.request

    text = urllib.request.urlopen(f"{front.base}/metrics", timeout=10).read().decode()
    states = re.findall(rf'turnpike_engine_replica_breaker{{engine="fleet",model="{model}",replica="[^"]+"}} (\S+)', text)
    return any(s == "0" for s in states)


def test_a_front_reaches_nodes_that_require_a_key_with_the_generate_scope(tmp_path):
    from tenancy_support import make_key

    key = make_key()
    sections = f"""
[auth]
mode = "required"

[tenants.fleet]
models = ["*"]
keys = [{{ env = "NODE_KEY", endpoints = ["generate"] }}]
"""
    text = config_text()
    assert '[auth]\nmode = "none"\n' in text
    node = Gateway(tmp_path / "node", text.replace('[auth]\nmode = "none"\n', sections, 1), {"NODE_KEY": key}, name="node")
    try:
        pool = [f'endpoints = ["{node.base}"]', 'api_key_env = "NODE_KEY"']
        front = Gateway(tmp_path / "front", front_config([node], health_ms=0, pool=pool), {"NODE_KEY": key}, name="front")
        try:
            client = openai.OpenAI(base_url=f"{front.base}/v1", api_key="sk-unused", max_retries=0)
            r = client.completions.create(model="chat", prompt="through a keyed node", max_tokens=3)
            assert r.choices[0].finish_reason and completed(node) == 1
        finally:
            front.stop()
        # Without the key the node refuses the front: not the client's fault (503, not 400), and
        # the front's log says why.
        bare = Gateway(tmp_path / "bare", front_config([node], health_ms=0), {}, name="bare")
        try:
            client = openai.OpenAI(base_url=f"{bare.base}/v1", api_key="sk-unused", max_retries=0)
            with pytest.raises(openai.APIStatusError) as refused:
                client.completions.create(model="chat", prompt="no key", max_tokens=3)
            assert refused.value.status_code == 503
            assert "401" in bare.log.read_text()
        finally:
            bare.stop()
    finally:
        node.stop()
