"""Upstream nodes that misbehave, behind a real Turnpike front (the upstream plugin) with a real
Turnpike node beside them: one that accepts requests and never answers (its breaker opens after
the first-token limit, and every request is served by the good node), one that stalls after its
first token (the request ends with an error after the stall limit, and the replica is charged),
and one that streams a line that never ends (the front reads at most the line bound, then moves
on)."""

import json
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest

from conftest import config_text
from tenancy_support import Gateway
from test_upstream import front_config, replicas  # noqa: F401 (replicas: for a failure's context)

import re
import urllib.request

MAX_LINE = 16 << 20


class HostileNode:
    """A node on loopback that reads each request and then answers as `mode` says:
    `hang` (nothing, ever), `stall` (headers and one token, then nothing), `endless` (headers,
    then one line that never ends, until the peer closes)."""

    def __init__(self, mode: str):
        self.mode = mode
        self.server = socket.socket()
        self.server.bind(("127.0.0.1", 0))
        self.server.listen(64)
        self.base = f"http://127.0.0.1:{self.server.getsockname()[1]}"
        self.requests = 0
        self.sent_after_headers: list[int] = []
        self.connections: list[socket.socket] = []
        self.closed = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.closed.is_set():
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            self.connections.append(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _read_request(self, conn: socket.socket) -> bool:
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = conn.recv(65536)
            if not chunk:
                return False
            data += chunk
        head, body = data.split(b"\r\n\r\n", 1)
        length = int(re.search(rb"content-length: (\d+)", head, re.I).group(1))
        while len(body) < length:
            body += conn.recv(65536)
        return True

    def _serve(self, conn: socket.socket) -> None:
        try:
            if not self._read_request(conn):
                return
            self.requests += 1
            if self.mode == "hang":
                self.closed.wait()
                return
            conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n")
            if self.mode == "stall":
                chunk = {"index": 0, "output_ids": [7], "meta_info": {"completion_tokens": 1, "prompt_tokens": 3}}
                conn.sendall(f"data: {json.dumps(chunk)}\n\n".encode())
                self.closed.wait()
                return
            sent, block = 0, b"a" * 65536
            try:
                while sent < 4 * MAX_LINE and not self.closed.is_set():
                    conn.sendall(block)
                    sent += len(block)
            except OSError:
                pass
            self.sent_after_headers.append(sent)
        except OSError:
            pass
        finally:
            conn.close()

    def stop(self) -> None:
        self.closed.set()
        self.server.close()
        for conn in self.connections:
            try:
                conn.close()
            except OSError:
                pass


def breaker(front: Gateway, replica: str) -> str | None:
    text = urllib.request.urlopen(f"{front.base}/metrics", timeout=10).read().decode()
    found = re.search(rf'turnpike_engine_replica_breaker{{engine="fleet",model="chat",'
                      rf'replica="{re.escape(replica)}"}} (\S+)', text)
    return found.group(1) if found else None


def fleet_with(tmp_path, hostile: HostileNode, limits: str):
    good = Gateway(tmp_path / "good", config_text(), {}, name="good")
    pool = [f'endpoints = ["{hostile.base}", "{good.base}"]', limits]
    front = Gateway(tmp_path / "front", front_config([hostile, good], affinity=0, health_ms=0, pool=pool), {},
                    name="front")
    client = openai.OpenAI(base_url=f"{front.base}/v1", api_key="sk-unused", max_retries=0, timeout=60)
    return good, front, client


@pytest.fixture
def hostile(request):
    node = HostileNode(request.param)
    yield node
    node.stop()


@pytest.mark.parametrize("hostile", ["hang"], indirect=True)
def test_a_node_that_never_answers_opens_its_breaker_and_costs_no_request(tmp_path, hostile):
    good, front, client = fleet_with(tmp_path, hostile, "first_token_timeout_ms = 500")
    try:
        started = time.monotonic()

        def ask(i: int) -> str:
            r = client.completions.create(model="chat", prompt=f"question {i}", max_tokens=3)
            return r.choices[0].finish_reason

        with ThreadPoolExecutor(4) as pool:
            reasons = list(pool.map(ask, range(10)))
        took = time.monotonic() - started
        assert all(reasons), reasons
        # front_config: two failures open a breaker; the rest go to the good node at once.
        assert breaker(front, hostile.base) == "2"
        assert hostile.requests <= 4, hostile.requests
        assert took < 10, f"10 requests took {took:.1f} s"
        # Later requests never wait on the hung node.
        t0 = time.monotonic()
        client.completions.create(model="chat", prompt="after", max_tokens=3)
        assert time.monotonic() - t0 < 0.5 + 2
    finally:
        front.stop()
        good.stop()


@pytest.mark.parametrize("hostile", ["stall"], indirect=True)
@pytest.mark.parametrize("failover", [True, False])
def test_a_stream_that_stalls_charges_the_node_and_goes_on_elsewhere(tmp_path, hostile, failover):
    """With `mid_stream_failover` (the default) the stalled streams finish on the good node;
    without it they end with an error whose body says little."""
    extra = "stall_timeout_ms = 400" + ("" if failover else "\nmid_stream_failover = false")
    good, front, client = fleet_with(tmp_path, hostile, extra)
    try:
        failures = 0
        for i in range(6):
            try:
                stream = client.completions.create(model="chat", prompt=f"q{i}", max_tokens=5, stream=True)
                for _ in stream:
                    pass
            except openai.APIError as e:
                failures += 1
                assert "no token for 400 ms" not in str(e), "the 5xx body says little"
        if failover:
            assert failures == 0
        else:
            assert 1 <= failures <= 2, failures
        assert breaker(front, hostile.base) == "2"
        log = front.log.read_text()
        assert "no token for 400 ms" in log
        assert ("resumes after" in log) == failover
    finally:
        front.stop()
        good.stop()


def socket_buffers():
    """The most a TCP receive and send buffer may hold together on this machine."""
    ceiling = 0
    for name in ("tcp_rmem", "tcp_wmem"):
        try:
            ceiling += int(open(f"/proc/sys/net/ipv4/{name}").read().split()[2])
        except (OSError, IndexError, ValueError):
            ceiling += 8 << 20
    return max(ceiling, 8 << 20)


@pytest.mark.parametrize("hostile", ["endless"], indirect=True)
def test_a_line_that_never_ends_is_cut_at_the_bound(tmp_path, hostile):
    good, front, client = fleet_with(tmp_path, hostile, "first_token_timeout_ms = 30000")
    try:
        for i in range(3):
            r = client.completions.create(model="chat", prompt=f"line {i}", max_tokens=3)
            assert r.choices[0].finish_reason
        deadline = time.monotonic() + 10
        while len(hostile.sent_after_headers) < hostile.requests and time.monotonic() < deadline:
            time.sleep(0.05)
        assert hostile.requests >= 1
        # The front stopped reading at the line bound, plus what the kernel let sit in the two
        # socket buffers (their ceilings, which autotuning reaches on a busy machine).
        assert all(sent < MAX_LINE + socket_buffers() for sent in hostile.sent_after_headers), hostile.sent_after_headers
        assert "passed 16777216 bytes" in front.log.read_text() or hostile.requests == 0
    finally:
        front.stop()
        good.stop()
