"""The field's routers in front of Turnpike nodes: `sglang-router` (sgl-model-gateway) and
`vllm-router`, from their PyPI wheels, register two real Turnpike nodes (the simulator) as
workers (health, `/model_info`, `/server_info`) and route to them, driven by the official
`openai` SDK and by SGLang's token-level `/generate`."""

import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai
import pytest

from conftest import config_text
from tenancy_support import Gateway

BIN = Path(sys.executable).parent
ROUTERS = {
    "sglang-router": lambda port, urls: [str(BIN / "python"), "-m", "sglang_router.launch_router", "--host",
                                         "127.0.0.1", "--port", str(port), "--worker-urls", *urls,
                                         "--policy", "cache_aware", "--log-level", "warn"],
    "vllm-router": lambda port, urls: [str(BIN / "vllm-router"), "--host", "127.0.0.1", "--port", str(port),
                                       "--worker-urls", *urls, "--policy", "power_of_two"],
}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("router", list(ROUTERS))
def test_a_field_router_routes_to_turnpike_nodes(tmp_path, router):
    nodes = [Gateway(tmp_path / f"node{i}", config_text(), {}, name=f"node{i}") for i in range(2)]
    port = free_port()
    log = open(tmp_path / "router.log", "w")
    process = subprocess.Popen(ROUTERS[router](port, [n.base for n in nodes]), stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{base}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert process.poll() is None, (tmp_path / "router.log").read_text()
            time.sleep(0.2)
        client = openai.OpenAI(base_url=f"{base}/v1", api_key="sk-unused", max_retries=2)
        messages = [{"role": "user", "content": "Hello through a router"}]
        for _ in range(4):
            r = client.chat.completions.create(model="chat", messages=messages, max_tokens=8)
            assert r.choices[0].message.content
        streamed = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
            model="chat", messages=messages, max_tokens=8, stream=True) if c.choices)
        assert streamed
        if router == "sglang-router":
            g = httpx.post(f"{base}/generate", json={"model": "echo", "input_ids": [10, 11, 12],
                                                     "sampling_params": {"max_new_tokens": 3}}, timeout=10)
            assert g.status_code == 200 and g.json()["output_ids"] == [10, 11, 12], g.text
    finally:
        process.terminate()
        process.wait(timeout=10)
        log.close()
        for n in nodes:
            n.stop()
