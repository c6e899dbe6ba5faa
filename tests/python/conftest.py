"""The real `turnpike` binary with the simulator plugin, on a free loopback port, for the
official `openai` SDK tests and schemathesis.

The binary and plugin come from `TURNPIKE_BIN` and `TURNPIKE_SIM` (defaults: the debug build),
which `tests/run.sh` builds first.
"""

import os
import re
import time
from pathlib import Path

import openai
import pytest
from tokenizers import Tokenizer

ROOT = Path(__file__).resolve().parents[2]


def pytest_configure(config):
    # `tests/run.sh js` runs these alone (they need node and target/js); `python` runs the rest.
    config.addinivalue_line("markers", "js: drives a JavaScript SDK with node")


BIN = Path(os.environ.get("TURNPIKE_BIN", ROOT / "target/debug/turnpike"))
SIM = Path(os.environ.get("TURNPIKE_SIM", ROOT / "target/debug/libturnpike_sim.so"))
FOLDER = ROOT / "examples/models/sim-small"
TOKENIZER = FOLDER / "tokenizer.json"

# What the `tools` model answers: a Llama 3 JSON tool call, as its chat template asks for.
TOOL_CALL = '{"name": "get_weather", "arguments": {"city": "Paris"}}'
# What the `thinker` model (a reasoning model to the gateway) answers.
THOUGHT, ANSWER = "Let me think about it.", "The answer is 4."
THINKING = f"<think>{THOUGHT}</think>\n\n{ANSWER}"
# What the `strays` model answers: a hermes call whose city its tools' schemas do not allow.
STRAY_CALL = 'Checking.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call>'
# What the chat template puts before a tool's result (the `agent` model answers it with text).
TOOL_RESULT = "<|start_header_id|>ipython<|end_header_id|>"
# What the `repeater` model answers: the same hermes call three times (a small model forced to
# call does so until max_tokens).
REPEATED_CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>\n' * 3 + "Done."
SCRIPTS = {"tools": TOOL_CALL, "thinker": THINKING, "strays": STRAY_CALL, "repeater": REPEATED_CALL}

# Each simulator model has one job in the tests.
SIM_MODELS = {
    "chat": 'output = { mode = "random", length = [5, 40] }',
    "echo": 'output = { mode = "echo" }',
    "slow": 'latency = { ttft_ms = 50, itl_ms = 20 }',
    "overloaded": "errors = { overload_rate = 1.0 }",
    "down": "errors = { unavailable_rate = 1.0 }",
    "broken": "errors = { refuse_rate = 1.0 }",
    "midfail": "errors = { fail_midstream_rate = 1.0, fail_after_tokens = 3 }",
    "tools": "output = { mode = \"script\", tokens = %s }",
    "thinker": "output = { mode = \"script\", tokens = %s }",
    # Reasons before a random 8-token answer, as long as the request's effort asks.
    "reasoner": "output = { mode = \"random\", length = [8, 8] }\nreasoning = { start = %s, end = %s }",
    # Echoes its prompt, in a context of 512 tokens (truncation, compaction).
    "short": 'output = { mode = "echo" }',
    "strays": "output = { mode = \"script\", tokens = %s }",
    "repeater": "output = { mode = \"script\", tokens = %s }",
    # Calls one of the tools offered, then answers a tool's result with text.
    "agent": 'output = { mode = "random", length = [4, 12] }\ntool_calls = { rate = 1.0, result_marker = %s }',
}
# Extra keys of the gateway's own model entries.
GATEWAY_MODELS = {"tools": 'tool_call_parser = "llama3_json"', "thinker": "reasoning = {}", "reasoner": "reasoning = {}",
                  "short": "context_length = 512", "strays": 'tool_call_parser = "hermes"', "repeater": 'tool_call_parser = "hermes"',
                  "agent": 'tool_call_parser = "llama3_json"'}


def config_text() -> str:
    lines = [
        "[server]",
        'listen = "127.0.0.1:0"',
        "max_body_bytes = 262144",
        "",
        "[defaults]",
        "max_output_tokens = 256",
        "",
        "[auth]",
        'mode = "none"',
        "",
        "[[engines]]",
        'name = "sim"',
        f'plugin = "{SIM}"',
        "[engines.config]",
        "seed = 11",
    ]
    tokenizer = Tokenizer.from_file(str(TOKENIZER))
    for name, extra in SIM_MODELS.items():
        if name in SCRIPTS:
            extra = extra % tokenizer.encode(SCRIPTS[name], add_special_tokens=False).ids
        if name == "agent":
            extra = extra % tokenizer.encode(TOOL_RESULT, add_special_tokens=False).ids
        if name == "reasoner":
            extra = extra % tuple(tokenizer.encode(m, add_special_tokens=False).ids for m in ("<think>", "</think>"))
        lines += [
            "[[engines.config.models]]",
            f'id = "{name}"',
            f'tokenizer = "{TOKENIZER}"',
            "eos_token_id = 4",
            extra,
        ]
    for name in SIM_MODELS:
        lines += ["[[models]]", f'name = "{name}"', 'engine = "sim"', f'folder = "{FOLDER}"', 'owned_by = "tests"']
        lines += [GATEWAY_MODELS[name]] if name in GATEWAY_MODELS else []
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="session")
def gateway(tmp_path_factory):
    """The base URL of a running gateway."""
    from tenancy_support import Gateway  # it imports this module's constants

    running = Gateway(tmp_path_factory.mktemp("turnpike"), config_text(), {})
    yield running.base
    running.stop()


@pytest.fixture
def client(gateway):
    """An SDK client that does not retry, so each error surfaces once."""
    return openai.OpenAI(base_url=f"{gateway}/v1", api_key="sk-unused", max_retries=0)


def engine_counter(base: str, outcome: str) -> int:
    """The simulator's own count of requests ended with `outcome`, from /metrics."""
    import urllib.request

    text = urllib.request.urlopen(f"{base}/metrics", timeout=10).read().decode()
    pattern = rf'turnpike_engine_requests_total\{{[^}}]*engine="sim"[^}}]*outcome="{outcome}"[^}}]*\}} (\d+)'
    found = re.search(pattern, text)
    if not found:
        pattern = rf'turnpike_engine_requests_total\{{[^}}]*outcome="{outcome}"[^}}]*engine="sim"[^}}]*\}} (\d+)'
        found = re.search(pattern, text)
    return int(found.group(1)) if found else 0


def wait_for(condition, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.02)
    return False
