"""The `mcp` gateway plugin against a real MCP server (the official `mcp` SDK's server, over
streamable HTTP on loopback), driven by the openai SDK: the server's tools offered to the model,
a call made through the server with the model's arguments, its result in the answer (an
`mcp_call` item in the Responses API), a tool error shown to the model, and a refused start when
the server cannot be reached."""

import json
import subprocess
import sys
import textwrap
import time

import httpx
import openai
import pytest

from conftest import BIN
from tenancy_support import free_port, make_key
from test_server_tools import server_tools_config, started

MCP = BIN.parent / "libturnpike_plugin_mcp.so"

SERVER = textwrap.dedent('''
    import sys
    from mcp.server.mcpserver import MCPServer

    server = MCPServer("shop")
    calls = []

    @server.tool()
    def stock(item: str) -> str:
        """How many of an item are in stock."""
        calls.append(item)
        return f"{len(item) * 7} {item} in stock"

    @server.tool()
    def broken(item: str) -> str:
        """Always fails."""
        raise ValueError("the warehouse is closed")

    server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[1]))
''')


@pytest.fixture
def mcp_server(tmp_path):
    port = free_port()
    script = tmp_path / "shop.py"
    script.write_text(SERVER)
    log = open(tmp_path / "shop.log", "w")
    process = subprocess.Popen([sys.executable, str(script), str(port)], stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/mcp"
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            httpx.get(url, timeout=1)
            break
        except httpx.HTTPError:
            time.sleep(0.1)
    yield url
    process.terminate()
    process.wait(10)
    log.close()


def mcp_plugin(url: str, allowed: list[str]) -> str:
    return f"""
[[plugins]]
library = "{MCP}"
[[plugins.config.servers]]
label = "shop"
url = "{url}"
allowed_tools = {json.dumps(allowed)}
"""


def test_a_tool_of_an_mcp_server_runs_and_the_model_answers(tmp_path, mcp_server):
    key = make_key()
    gateway, client = started(tmp_path, key, mcp_plugin(mcp_server, ["stock"]))
    try:
        response = client.responses.create(model="agent", input="Do you have apples?", max_output_tokens=60)
        call = response.output[0]
        assert call.type == "mcp_call" and call.server_label == "shop" and call.name == "stock", response.output
        item = json.loads(call.arguments)["item"]
        assert call.output == f"{len(item) * 7} {item} in stock"
        assert response.output[-1].type == "message" and response.output_text
        chat = client.chat.completions.create(model="agent", messages=[{"role": "user", "content": "Apples?"}],
                                              max_tokens=60)
        assert chat.choices[0].finish_reason == "stop" and chat.choices[0].message.content
    finally:
        gateway.stop()


def test_a_tool_error_is_shown_to_the_model(tmp_path, mcp_server):
    key = make_key()
    gateway, client = started(tmp_path, key, mcp_plugin(mcp_server, ["broken"]))
    try:
        response = client.responses.create(model="agent", input="Try it", max_output_tokens=60)
        call = response.output[0]
        assert call.type == "mcp_call" and call.status == "failed" and "broken" in call.error  # as the server words it
        assert response.output[-1].type == "message"
    finally:
        gateway.stop()


def test_an_unreachable_server_stops_the_start(tmp_path):
    key = make_key()
    path = tmp_path / "bad.toml"
    path.write_text(server_tools_config(mcp_plugin(f"http://127.0.0.1:{free_port()}/mcp", ["stock"])))
    run = subprocess.run([str(BIN), "serve", "--config", str(path)], capture_output=True,
                         text=True, timeout=60, env={"ACME_KEY": key})
    assert run.returncode != 0 and "shop" in run.stderr, run.stderr


def test_the_plugin_passes_the_conformance_kit_against_a_live_server(mcp_server):
    config = json.dumps({"servers": [{"label": "shop", "url": mcp_server}]})
    run = subprocess.run([str(BIN), "plugin", "gateway-conformance", str(MCP), "--config", config],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "tool `stock`: answers within its deadline" in run.stdout
    assert "destroy answers the calls still running" in run.stdout


def test_the_responses_mcp_tool_names_a_configured_server(tmp_path, mcp_server):
    key = make_key()
    gateway, client = started(tmp_path, key, mcp_plugin(mcp_server, ["stock", "broken"]))
    try:
        shop = {"type": "mcp", "server_label": "shop", "server_url": mcp_server, "require_approval": "never",
                "allowed_tools": ["stock"]}
        response = client.responses.create(model="agent", input="Apples?", tools=[shop], max_output_tokens=60)
        assert response.output[0].type == "mcp_call" and response.output[0].name == "stock"
        with pytest.raises(openai.BadRequestError) as unknown:
            client.responses.create(model="agent", input="Apples?", tools=[{**shop, "server_label": "bank"}])
        assert unknown.value.body["param"] == "tools[0].server_label" and "bank" in unknown.value.message
        with pytest.raises(openai.BadRequestError) as approval:
            client.responses.create(model="agent", input="Apples?", tools=[{**shop, "require_approval": "always"}])
        assert approval.value.body["param"] == "tools[0].require_approval"
    finally:
        gateway.stop()
