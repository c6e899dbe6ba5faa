"""The `mcp` gateway plugin against a real MCP server (the official `mcp` SDK's server, over
streamable HTTP on loopback), driven by the openai SDK: the server's tools offered to the model,
a call made through the server with the model's arguments, its result in the answer (an
`mcp_call` item in the Responses API), a tool error shown to the model, and a refused start when
the server cannot be reached. And what a hostile or careless server cannot do: hold an answer
behind an event stream it keeps open, fail a request with a 9 MB answer (the model sees it cut to
tokens, and so told), or widen a request's `allowed_tools` in a later round."""

import json
import socket
import subprocess
import sys
import textwrap
import time

import httpx
import openai
import pytest

from conftest import BIN
from tenancy_support import Gateway, free_port, make_key
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


# --- What a hostile or careless MCP server cannot do --------------------------------------------

HOSTILE = textwrap.dedent('''
    """An MCP server that answers every request on an event stream it then keeps open, and whose
    `lookup` tool answers with `sys.argv[2]` bytes."""
    import json, socket, sys, threading, time

    size = int(sys.argv[2])

    def serve(conn):
        data = b""
        while b"\\r\\n\\r\\n" not in data:
            data += conn.recv(65536)
        head, body = data.split(b"\\r\\n\\r\\n", 1)
        length = int([l.split(b":")[1] for l in head.split(b"\\r\\n") if l.lower().startswith(b"content-length")][0])
        while len(body) < length:
            body += conn.recv(65536)
        message = json.loads(body)
        if "id" not in message:
            conn.sendall(b"HTTP/1.1 202 Accepted\\r\\ncontent-length: 0\\r\\n\\r\\n")
            conn.close()
            return
        method = message["method"]
        if method == "initialize":
            result = {"protocolVersion": "2025-06-18", "capabilities": {"tools": {}}, "serverInfo": {"name": "open", "version": "1"}}
        elif method == "tools/list":
            result = {"tools": [{"name": "lookup", "description": "Looks an item up.", "inputSchema": {
                "type": "object", "properties": {"item": {"type": "string"}}, "required": ["item"]}}]}
        else:
            result = {"content": [{"type": "text", "text": "x" * size}]}
        answer = json.dumps({"jsonrpc": "2.0", "id": message["id"], "result": result})
        conn.sendall(b"HTTP/1.1 200 OK\\r\\ncontent-type: text/event-stream\\r\\nmcp-session-id: s1\\r\\n\\r\\n")
        conn.sendall(f"event: message\\ndata: {answer}\\n\\n".encode())
        time.sleep(3600)  # the stream stays open

    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("127.0.0.1", int(sys.argv[1])))
    server.listen(64)
    while True:
        conn, _ = server.accept()
        threading.Thread(target=serve, args=(conn,), daemon=True).start()
''')


@pytest.fixture
def open_stream_server(tmp_path, request):
    port = free_port()
    script = tmp_path / "open.py"
    script.write_text(HOSTILE)
    process = subprocess.Popen([sys.executable, str(script), str(port), str(request.param)])
    url = f"http://127.0.0.1:{port}/mcp"
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                break
        except OSError:
            time.sleep(0.05)
    yield url
    process.kill()
    process.wait(10)


@pytest.mark.parametrize("open_stream_server", [40], indirect=True)
def test_an_answer_on_a_stream_the_server_keeps_open_is_taken_at_once(tmp_path, open_stream_server):
    key = make_key()
    started_at = time.monotonic()
    gateway, client = started(tmp_path, key, mcp_plugin(open_stream_server, ["lookup"]))
    try:
        # Starting took three answers on open streams (initialize, tools/list, and none for the
        # notification): not three start-up timeouts.
        assert time.monotonic() - started_at < 8
        t0 = time.monotonic()
        response = client.responses.create(model="agent", input="Look it up", max_output_tokens=60)
        assert time.monotonic() - t0 < 8, "the tool call waited for the stream to end"
        call = response.output[0]
        assert call.type == "mcp_call" and call.output == "x" * 40, response.output
    finally:
        gateway.stop()


@pytest.mark.parametrize("open_stream_server", [9 << 20], indirect=True)
def test_a_huge_tool_answer_is_cut_to_tokens_and_says_so(tmp_path, open_stream_server):
    key = make_key()
    gateway, client = started(tmp_path, key, mcp_plugin(open_stream_server, ["lookup"]))
    try:
        response = client.responses.create(model="agent", input="Look it up", max_output_tokens=60)
        call = response.output[0]
        assert call.type == "mcp_call" and call.status == "completed", response.output
        assert f"it held {9 << 20} bytes; only its first 4096 tokens are shown" in call.output
        assert len(call.output) < 64 << 10
        assert response.output[-1].type == "message" and response.usage.input_tokens < 3 * 4096 + 2000
    finally:
        gateway.stop()


def test_allowed_tools_hold_in_every_round(tmp_path, mcp_server):
    key = make_key()
    text = server_tools_config(mcp_plugin(mcp_server, ["stock", "broken"]))
    assert "tool_calls = { rate = 1.0," in text
    # The agent calls a tool in three rounds before it answers.
    text = text.replace("tool_calls = { rate = 1.0,", "tool_calls = { rate = 1.0, rounds = 3,")
    gateway = Gateway(tmp_path, text, {"ACME_KEY": key})
    client = openai.OpenAI(base_url=gateway.url, api_key=key, max_retries=0)
    shop = {"type": "mcp", "server_label": "shop", "server_url": mcp_server, "require_approval": "never",
            "allowed_tools": ["stock"]}
    try:
        names = []
        for i in range(6):
            response = client.responses.create(model="agent", input=f"Apples {i}?", tools=[shop],
                                               max_output_tokens=200, extra_body={"seed": i})
            kinds = [item.type for item in response.output]
            assert "function_call" not in kinds, response.output
            names += [item.name for item in response.output if item.type == "mcp_call"]
            assert kinds[-1] == "message", kinds
        assert len(names) == 18 and set(names) == {"stock"}, names
    finally:
        gateway.stop()
