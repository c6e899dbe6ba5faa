"""KV-cache events in vLLM's format: a default-engine node (CPU, the tiny model) publishes its
prefix cache's stored and removed blocks over ZeroMQ, and a subscriber written as vLLM's
consumers are (pyzmq, msgspec with vLLM's event structs in their array layout) receives them.
Every hash is checked against vLLM's algorithm (`sha256_cbor`) computed here from its
definition with cbor2 and hashlib on the same token ids."""

import hashlib
import socket
import threading
import time
import urllib.request
import json

import cbor2
import msgspec
import pytest
import zmq

from conftest import BIN
from tenancy_support import Gateway
from test_failover import CUDA, generate

BLOCK = 16


# vLLM's event schema (vllm/distributed/kv_events.py), array layout.
class EventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list
    data_parallel_rank: int | None = None


class KVCacheEvent(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, tag=True):
    pass


class BlockStored(KVCacheEvent):
    block_hashes: list[int | bytes]
    parent_block_hash: int | bytes | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None


class BlockRemoved(KVCacheEvent):
    block_hashes: list[int | bytes]
    medium: str | None


class AllBlocksCleared(KVCacheEvent):
    pass


class KVEventBatch(EventBatch):
    events: list[BlockStored | BlockRemoved | AllBlocksCleared]


def sha256_cbor(value) -> bytes:
    return hashlib.sha256(cbor2.dumps(value, canonical=True)).digest()


def reference_chain(tokens, seed="vllm-none-hash"):
    """vLLM's block hashes of every full block of `tokens`, as events carry them (int)."""
    parent = sha256_cbor(seed)
    out = []
    for i in range(len(tokens) // BLOCK):
        parent = sha256_cbor((parent, tuple(tokens[i * BLOCK:(i + 1) * BLOCK]), None))
        out.append(int.from_bytes(parent, "big") & ((1 << 64) - 1))
    return out


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Subscriber:
    """A SUB socket collecting decoded batches (with their sequence numbers) on a thread."""

    def __init__(self, port, topic=b"kv@"):
        self.socket = zmq.Context.instance().socket(zmq.SUB)
        self.socket.setsockopt(zmq.SUBSCRIBE, topic)
        self.socket.setsockopt(zmq.RCVTIMEO, 200)
        self.socket.connect(f"tcp://127.0.0.1:{port}")
        self.decoder = msgspec.msgpack.Decoder(type=KVEventBatch)
        self.batches, self.topics, self.seqs = [], [], []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run)
        self.thread.start()

    def _run(self):
        while not self.stop.is_set():
            try:
                topic, seq, payload = self.socket.recv_multipart()
            except zmq.Again:
                continue
            self.topics.append(topic)
            self.seqs.append(int.from_bytes(seq, "big"))
            self.batches.append(self.decoder.decode(payload))

    def events(self):
        return [e for b in list(self.batches) for e in b.events]

    def close(self):
        self.stop.set()
        self.thread.join()
        self.socket.close(linger=0)


def node_config(model, port, extra=""):
    return "\n".join([
        "[server]", 'listen = "127.0.0.1:0"', "[auth]", 'mode = "none"',
        "[[engines]]", 'name = "default"', f'plugin = "{CUDA}"', "[engines.config]", "seed = 5",
        "[[engines.config.models]]", 'id = "tiny"', f'path = "{model}"', 'device = "cpu"', "threads = 1",
        f'kv_events = {{ endpoint = "tcp://127.0.0.1:{port}", topic = "kv@node0@tiny" }}', extra,
        "[[models]]", 'name = "tiny"', 'engine = "default"', f'folder = "{model}"', "",
    ])


@pytest.fixture
def tiny_model(tmp_path):
    import subprocess
    model = tmp_path / "tiny"
    subprocess.run([str(BIN), "make-model", "--preset", "tiny", "--out", str(model)], check=True, capture_output=True)
    return model


def engine_stat(node, stat):
    text = urllib.request.urlopen(f"{node.base}/metrics", timeout=10).read().decode()
    for line in text.splitlines():
        if line.startswith("turnpike_engine_stat{") and f'stat="{stat}"' in line:
            return float(line.rsplit(" ", 1)[1])
    return None


def test_stored_blocks_carry_vllms_hashes_for_the_same_token_ids(tmp_path, tiny_model):
    port = free_port()
    node = Gateway(tmp_path / "node", node_config(tiny_model, port), {}, name="node")
    sub = Subscriber(port)
    try:
        deadline = time.monotonic() + 10
        while engine_stat(node, "kv_events_subscribers") != 1.0:
            assert time.monotonic() < deadline, "the subscriber never connected"
            time.sleep(0.05)
        time.sleep(0.3)  # the subscription itself travels after the handshake
        prompt = [(7 * i + 3) % 200 + 5 for i in range(45)]  # two full blocks and 13 tokens
        answer = generate(node.base, {"model": "tiny", "input_ids": prompt,
                                      "sampling_params": {"max_new_tokens": 24, "temperature": 0, "ignore_eos": True}})
        tokens = prompt + answer["output_ids"]
        deadline = time.monotonic() + 10
        while sum(len(e.block_hashes) for e in sub.events() if isinstance(e, BlockStored)) < 4:
            assert time.monotonic() < deadline, sub.events()
            time.sleep(0.05)
        events = sub.events()
        assert isinstance(events[0], AllBlocksCleared), events[:2]
        assert set(sub.topics) == {b"kv@node0@tiny"}
        assert sub.seqs == sorted(sub.seqs)
        chain = reference_chain(tokens)
        stored = [e for e in events if isinstance(e, BlockStored)]
        hashes = [h for e in stored for h in e.block_hashes]
        # Prompt and output blocks, in chain order, each with its parent and its own tokens.
        assert hashes == chain[:len(hashes)] and len(hashes) >= 3, (hashes, chain)
        assert stored[0].parent_block_hash is None and stored[0].block_size == BLOCK
        assert [t for e in stored for t in e.token_ids] == tokens[:BLOCK * len(hashes)]
        assert all(e.medium == "GPU" and e.lora_id is None for e in stored)
        for e in stored[1:]:
            assert e.parent_block_hash == chain[chain.index(e.block_hashes[0]) - 1]
    finally:
        sub.close()
        node.stop()


def test_evicted_blocks_are_removed_events(tmp_path, tiny_model):
    """A cache of a few blocks: distinct prompts evict each other's blocks, and each removed
    hash is one stored before."""
    port = free_port()
    # About six blocks (the tiny model keeps 8 KiB of f32 K and V per block of 16 tokens).
    config = node_config(tiny_model, port, "max_context = 64\nkv_cache_bytes = 49152")
    node = Gateway(tmp_path / "node", config, {}, name="node")
    sub = Subscriber(port)
    try:
        deadline = time.monotonic() + 10
        while engine_stat(node, "kv_events_subscribers") != 1.0:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        time.sleep(0.3)
        for k in range(6):
            prompt = [(k * 31 + i * 7) % 200 + 5 for i in range(33)]
            generate(node.base, {"model": "tiny", "input_ids": prompt,
                                 "sampling_params": {"max_new_tokens": 4, "temperature": 0, "ignore_eos": True}})
        deadline = time.monotonic() + 10
        while not any(isinstance(e, BlockRemoved) for e in sub.events()):
            assert time.monotonic() < deadline, sub.events()
            time.sleep(0.05)
        events = sub.events()
        seen = set()
        for e in events:
            if isinstance(e, BlockStored):
                seen.update(e.block_hashes)
            elif isinstance(e, BlockRemoved):
                assert set(e.block_hashes) <= seen, (e, seen)
                seen -= set(e.block_hashes)
    finally:
        sub.close()
        node.stop()


def replica_stat(front, replica, stat):
    text = urllib.request.urlopen(f"{front.base}/metrics", timeout=10).read().decode()
    for line in text.splitlines():
        if (line.startswith("turnpike_engine_replica_stat{") and f'replica="{replica}"' in line
                and f'stat="{stat}"' in line):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def wait_subscribed(nodes):
    """Until a subscriber is connected to every node's events: a node's PUB socket drops what it
    publishes before then, so a front that has not joined yet would never hear of those blocks."""
    deadline = time.monotonic() + 10
    while any(engine_stat(n, "kv_events_subscribers") < 1.0 for n in nodes):
        assert time.monotonic() < deadline, "no subscriber joined every node's events"
        time.sleep(0.05)
    time.sleep(0.3)


def generate_count(node) -> int:
    text = urllib.request.urlopen(f"{node.base}/metrics", timeout=10).read().decode()
    return int(sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith("turnpike_http_requests_total{") and 'endpoint="/generate"' in line))


def assert_returns_to(client, nodes, holder, shared):
    """Six prompts that begin with `shared` all land on node `holder`, whose cache serves
    their three shared blocks."""
    before = [generate_count(n) for n in nodes]
    cached = []
    for k in range(6):
        r = client.completions.create(model="tiny", prompt=shared + [20 + k], max_tokens=2, temperature=0)
        cached.append(r.usage.prompt_tokens_details.cached_tokens if r.usage.prompt_tokens_details else 0)
    landed = [generate_count(n) - b for n, b in zip(nodes, before)]
    assert landed[holder] == 6 and sum(landed) == 6, landed
    assert all(c >= 3 * BLOCK for c in cached), cached


def test_a_front_routes_by_the_blocks_its_replicas_hold(tmp_path, tiny_model):
    """Two default-engine nodes publishing KV events, behind a Turnpike front whose upstream
    pool follows them (and routes by load otherwise, no prefix hashing): a prompt asked again
    goes to the node that holds its blocks, whose cache then serves it."""
    import openai
    from test_failover import UPSTREAM

    ports = [free_port(), free_port()]
    nodes = [Gateway(tmp_path / f"node{i}", node_config(tiny_model, p).replace("kv@node0", f"kv@node{i}"), {},
                     name=f"node{i}") for i, p in enumerate(ports)]
    vocab = json.load(open(tiny_model / "config.json"))["vocab_size"]
    endpoints = ", ".join(f'"{n.base}"' for n in nodes)
    events = ", ".join(f'"{n.base}" = "tcp://127.0.0.1:{p}"' for n, p in zip(nodes, ports))
    front_text = "\n".join([
        "[server]", 'listen = "127.0.0.1:0"', "[auth]", 'mode = "none"',
        "[[engines]]", 'name = "fleet"', f'plugin = "{UPSTREAM}"', "[engines.config]",
        "[[engines.config.models]]", 'id = "tiny"', 'upstream_model = "tiny"', 'protocol = "turnpike"',
        f"endpoints = [{endpoints}]", f"vocab_size = {vocab}", "eos_token_ids = [1, 4]", "affinity_tokens = 0",
        "refresh_ms = 200", f"kv_events = {{ endpoints = {{ {events} }}, topic = \"kv@\" }}",
        "[[models]]", 'name = "tiny"', 'engine = "fleet"', f'folder = "{tiny_model}"', "",
    ])
    front = Gateway(tmp_path / "front", front_text, {}, name="front")
    client = openai.OpenAI(base_url=front.url, api_key="sk-unused", max_retries=0)
    shared = [(11 * i + 5) % 200 + 5 for i in range(50)]  # three full blocks and two tokens
    try:
        wait_subscribed(nodes)
        first = [generate_count(n) for n in nodes]
        client.completions.create(model="tiny", prompt=shared + [9], max_tokens=2, temperature=0)
        holder = next(i for i, n in enumerate(nodes) if generate_count(n) > first[i])
        deadline = time.monotonic() + 10
        while replica_stat(front, nodes[holder].base, "kv_blocks_known") < 3:
            assert time.monotonic() < deadline, "the front never learned the holder's blocks"
            time.sleep(0.05)
        assert_returns_to(client, nodes, holder, shared)
    finally:
        front.stop()
        for n in nodes:
            n.stop()


def test_the_endpoint_picker_routes_token_prompts_by_the_blocks_nodes_hold(tmp_path, tiny_model):
    """The same through Turnpike's endpoint picker: it follows the nodes' events (prefix hashing
    off), and a front that asks it (`picker`) sends each request where the picker says."""
    import openai
    from epp_support import Picker
    from test_failover import UPSTREAM

    ports = [free_port(), free_port()]
    nodes = [Gateway(tmp_path / f"node{i}", node_config(tiny_model, p).replace("kv@node0", f"kv@node{i}"), {},
                     name=f"node{i}") for i, p in enumerate(ports)]
    events = ", ".join(f'"{n.base.removeprefix("http://")}" = "tcp://127.0.0.1:{p}"' for n, p in zip(nodes, ports))
    picker = Picker(tmp_path / "epp", [n.base for n in nodes],
                    f"affinity_tokens = 0\nrefresh_ms = 200\nkv_events = {{ endpoints = {{ {events} }} }}")
    vocab = json.load(open(tiny_model / "config.json"))["vocab_size"]
    endpoints = ", ".join(f'"{n.base}"' for n in nodes)
    front = Gateway(tmp_path / "front", "\n".join([
        "[server]", 'listen = "127.0.0.1:0"', "[auth]", 'mode = "none"',
        "[[engines]]", 'name = "fleet"', f'plugin = "{UPSTREAM}"', "[engines.config]",
        "[[engines.config.models]]", 'id = "tiny"', 'upstream_model = "tiny"', 'protocol = "turnpike"',
        f"endpoints = [{endpoints}]", f"vocab_size = {vocab}", "eos_token_ids = [1, 4]", "affinity_tokens = 0",
        f'picker = "http://127.0.0.1:{picker.port}"', "picker_timeout_ms = 1000",
        "[[models]]", 'name = "tiny"', 'engine = "fleet"', f'folder = "{tiny_model}"', "",
    ]), {}, name="front")
    client = openai.OpenAI(base_url=front.url, api_key="sk-unused", max_retries=0)
    shared = [(13 * i + 7) % 200 + 5 for i in range(50)]
    try:
        wait_subscribed(nodes)
        first = [generate_count(n) for n in nodes]
        client.completions.create(model="tiny", prompt=shared + [9], max_tokens=2, temperature=0)
        holder = next(i for i, n in enumerate(nodes) if generate_count(n) > first[i])
        time.sleep(1.0)  # the picker reads the holder's events
        assert_returns_to(client, nodes, holder, shared)
    finally:
        for p in (front, picker, *nodes):
            p.stop()
