"""Gateways with tenants (and Redis) for the tenancy tests: a config writer, keys, a process
wrapper and a throwaway `redis-server`.

The binary, plugin, tokenizer and model folder come from conftest, like every other test.
"""

import base64
import http.client
import json
import os
import re
import secrets
import shutil
import socket
import subprocess
import time
from pathlib import Path

import httpx

from conftest import BIN, FOLDER, SIM, SIM_MODELS, TOKENIZER

# The simulator models these tests use: conftest's `chat` and `slow`, and two more.
TENANCY_MODELS = {
    "chat": SIM_MODELS["chat"],
    "slow": SIM_MODELS["slow"],
    # A stream of 200 tokens, 20 ms apart: about 4 s unless max_tokens cuts it.
    "long": 'latency = { ttft_ms = 50, itl_ms = 20 }\noutput = { mode = "random", length = [200, 200] }',
    # Exactly max_tokens completion tokens (up to 200), at once: token budgets come out exact.
    "fixed": 'output = { mode = "random", length = [200, 200] }',
}

HELLO = [{"role": "user", "content": "Hello there"}]


def make_key() -> str:
    """A fresh Turnpike API key: `tp-` + 12 hex + `-` + 43 chars of unpadded base64url."""
    secret = base64.urlsafe_b64encode(secrets.token_bytes(32)).rstrip(b"=").decode()
    return f"tp-{secrets.token_hex(6)}-{secret}"


def tenant(extra: str = "") -> str:
    """The [auth] and [tenants.acme] sections: tenant `acme`, every model, its key from
    ACME_API_KEY, and `extra` (its limits, or more sections) verbatim."""
    return f"""
[auth]
mode = "required"

[tenants.acme]
models = ["*"]
keys = [{{ env = "ACME_API_KEY" }}]
{extra}
"""


def config_text(sections: str, models: dict[str, str] | None = None, seed: int = 11, server: str = "") -> str:
    """A whole config: a loopback listener (with `server`'s extra [server] keys), the simulator
    engine with `models` (default TENANCY_MODELS), and `sections` (the [auth], [tenants.*],
    [state], ... TOML) verbatim."""
    models = TENANCY_MODELS if models is None else models
    lines = [
        "[server]",
        'listen = "127.0.0.1:0"',
        server.strip(),
        "",
        "[defaults]",
        "max_output_tokens = 256",
        "",
        sections.strip(),
        "",
        "[[engines]]",
        'name = "sim"',
        f'plugin = "{SIM}"',
        "[engines.config]",
        f"seed = {seed}",
    ]
    for name, extra in models.items():
        lines += [
            "[[engines.config.models]]",
            f'id = "{name}"',
            f'tokenizer = "{TOKENIZER}"',
            "eos_token_id = 4",
            extra,
        ]
    for name in models:
        lines += ["[[models]]", f'name = "{name}"', 'engine = "sim"', f'folder = "{FOLDER}"', 'owned_by = "tests"']
    return "\n".join(lines) + "\n"


class Gateway:
    """A running `turnpike serve` with a config written into `directory`; its stderr goes to
    a log file there, shown when a test asks for it."""

    def __init__(self, directory: Path, text: str, env: dict[str, str], name: str = "turnpike"):
        for artifact in (BIN, SIM):
            assert artifact.exists(), f"{artifact} is missing: build the workspace first (tests/run.sh does)"
        directory.mkdir(parents=True, exist_ok=True)
        self.config = directory / f"{name}.toml"
        self.config.write_text(text)
        self.log = directory / f"{name}.log"
        self._log_file = open(self.log, "w")
        self.process = subprocess.Popen(
            [str(BIN), "--log-format", "json", "serve", "--config", str(self.config)],
            stdout=subprocess.PIPE,
            stderr=self._log_file,
            text=True,
            env={**os.environ, "RUST_LOG": "warn", **env},
        )
        line = self.process.stdout.readline()
        match = re.match(r"turnpike listening on (https?://\S+)", line)
        if not match:
            self.stop()
            raise AssertionError(f"gateway did not start: first line {line!r}; log:\n{self.log.read_text()}")
        self.base = match.group(1)
        self.url = f"{self.base}/v1"
        # The plain-HTTP health listener's address, on the next line when configured.
        self.health = None
        if "health_listen" in text:
            health = re.match(r"turnpike health on (http://\S+)", self.process.stdout.readline())
            assert health, f"no health listener line; log:\n{self.log.read_text()}"
            self.health = health.group(1)

    def client(self, key: str | None, **kwargs) -> httpx.Client:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=30, **kwargs)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._log_file.close()


def chat_body(model: str = "chat", max_tokens: int = 20, **extra) -> dict:
    return {"model": model, "messages": HELLO, "max_tokens": max_tokens, **extra}


def timed_stream(client: httpx.Client, body: dict, headers: dict):
    """POSTs a streamed request; returns (response, text, when its first line came, when it
    ended), times from time.monotonic()."""
    with client.stream("POST", "/chat/completions", json=body, headers=headers) as response:
        lines, first = [], None
        for line in response.iter_lines():
            first = first or time.monotonic()
            lines.append(line)
        return response, "\n".join(lines), first, time.monotonic()


def error_of(response: httpx.Response) -> dict:
    """The OpenAI error object of an error response, checked for its shape."""
    body = response.json()
    assert set(body) == {"error"}, body
    assert {"message", "type", "param", "code"} <= set(body["error"]), body
    return body["error"]


def post_once(base: str, path: str, key: str, body: dict, headers: dict | None = None):
    """POSTs `body` as JSON on a fresh connection, headers and body in a single write, and
    returns (status, lower-cased headers, parsed JSON body).

    httpx writes the headers and the body separately; the gateway answers 401 and
    request-rate 429 before reading the body and then closes the connection, so under load
    httpx sometimes loses that answer (see test_early_rejection_keeps_connection_usable). The
    load tests count limits, not that, so they send each request whole."""
    host, port = base.removeprefix("http://").rsplit(":", 1)
    data = json.dumps(body).encode()
    lines = [f"POST {path} HTTP/1.1", f"Host: {host}:{port}", f"Authorization: Bearer {key}",
             "Content-Type: application/json", f"Content-Length: {len(data)}", "Connection: close"]
    lines += [f"{name}: {value}" for name, value in (headers or {}).items()]
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode() + data)
        response = http.client.HTTPResponse(sock)
        response.begin()
        payload = response.read()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, json.loads(payload)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Redis:
    """A `redis-server` on a free loopback port, no persistence; `stop` and `start` keep the port."""

    def __init__(self, directory: Path):
        self.binary = shutil.which("redis-server")
        assert self.binary, "redis-server is not installed (tests/run.sh installs it: apt-get install -y redis-server)"
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.process = None
        self.start()

    def start(self) -> None:
        assert self.process is None
        self.process = subprocess.Popen(
            [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--dir", str(self.directory)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            assert self.process.poll() is None, f"redis-server exited with {self.process.returncode}"
            if self.ping():
                return
            time.sleep(0.02)
        raise AssertionError(f"redis-server did not answer on port {self.port}")

    def ping(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1) as s:
                s.sendall(b"PING\r\n")
                return s.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    def pause_writes(self, ms: int) -> None:
        """Holds every client's writes for `ms` (`CLIENT PAUSE ... WRITE`)."""
        with socket.create_connection(("127.0.0.1", self.port), timeout=1) as s:
            s.sendall(f"CLIENT PAUSE {ms} WRITE\r\n".encode())
            assert s.recv(16).startswith(b"+OK")

    def stop(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait()
            self.process = None
