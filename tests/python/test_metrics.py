"""The metric set on the real binary with the default engine (CPU device, the `tiny` model):
every metric the shipped Grafana dashboard queries is exported, names follow Prometheus's
conventions, and the engine's batch, queue and cache figures and the per-token latency move
with real traffic."""

import json
import os
import re
import socket
import subprocess
import time
from pathlib import Path

import httpx
import openai
import pytest

from conftest import BIN, ROOT
from tenancy_support import Gateway, make_key

PLUGIN = Path(os.environ.get("TURNPIKE_CUDA", ROOT / "target/debug/libturnpike_cuda.so"))
DASHBOARD = ROOT / "examples/grafana/turnpike-dashboard.json"
# Exported only where they apply: a GPU device, and a TLS listener whose files changed.
NOT_HERE = {"turnpike_gpu_memory_used_bytes", "turnpike_gpu_memory_total_bytes", "turnpike_tls_reloads_total"}


def scrape(base: str) -> str:
    return httpx.get(f"{base}/metrics", timeout=10).text


def families(text: str) -> dict[str, str]:
    """Metric family -> type, from the `# TYPE` lines."""
    return dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M))


def samples(text: str, name: str) -> list[tuple[str, float]]:
    out = []
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            labels, value = line.rsplit(" ", 1)
            out.append((labels, float(value)))
    return out


def total(text: str, name: str, *labels: str) -> float:
    return sum(v for l, v in samples(text, name) if all(x in l for x in labels))


def dashboard_metrics() -> set[str]:
    names = set()
    for panel in json.loads(DASHBOARD.read_text())["panels"]:
        for target in panel["targets"]:
            for name in re.findall(r"\b(turnpike_[a-z_]+)", target["expr"]):
                names.add(re.sub(r"_(bucket|sum|count)$", "", name))
    return names


@pytest.fixture(scope="module")
def gateway(tmp_path_factory):
    work = tmp_path_factory.mktemp("metrics")
    model = work / "tiny"
    subprocess.run([str(BIN), "make-model", "--preset", "tiny", "--out", str(model)], check=True, capture_output=True)
    key = make_key()
    config = f"""[server]
listen = "127.0.0.1:0"
header_read_timeout_ms = 300

[auth]
mode = "required"
reload_interval_ms = 100

[tenants.acme]
models = ["*"]
keys = [{{ env = "ACME_API_KEY" }}]
requests_per_minute = 8

[[engines]]
name = "default"
plugin = "{PLUGIN}"
[engines.config]
seed = 5
[[engines.config.models]]
id = "tiny"
path = "{model}"
device = "cpu"
threads = 2

[[models]]
name = "tiny"
engine = "default"
folder = "{model}"
"""
    running = Gateway(work, config, {"ACME_API_KEY": key})
    running.key = key
    yield running
    running.stop()


def drive(gateway) -> None:
    client = openai.OpenAI(base_url=gateway.url, api_key=gateway.key, max_retries=0)
    messages = [{"role": "user", "content": "Tell me about the road ahead"}]
    client.chat.completions.create(model="tiny", messages=messages, max_tokens=12, temperature=0)
    for _ in client.chat.completions.create(model="tiny", messages=messages, max_tokens=12, stream=True):
        pass
    # The same prompt again: the prefix cache answers its leading blocks.
    client.chat.completions.create(model="tiny", messages=messages, max_tokens=12, temperature=0)
    # Past the tenant's request rate.
    with pytest.raises(openai.RateLimitError):
        for _ in range(10):
            client.models.list()
    # An idle connection cut at the header-read deadline.
    url = httpx.URL(gateway.base)
    with socket.create_connection((url.host, url.port)) as idle:
        idle.settimeout(5)
        assert idle.recv(1) == b""
    # A reload of the config file.
    gateway.config.write_text(gateway.config.read_text() + "\n")
    os.utime(gateway.config, (time.time() + 5, time.time() + 5))


def test_every_dashboard_metric_is_exported_with_conventional_names(gateway):
    drive(gateway)
    wanted = dashboard_metrics() - NOT_HERE
    deadline = time.monotonic() + 20
    while True:
        text = scrape(gateway.base)
        missing = sorted(wanted - set(families(text)))
        if not missing or time.monotonic() > deadline:
            break
        time.sleep(0.5)  # the generation rate is set every few seconds
    assert not missing, f"the dashboard queries metrics the gateway does not export: {missing}"
    for name, kind in families(text).items():
        if kind == "counter":
            assert name.endswith("_total"), name
        else:
            assert not name.endswith("_total"), (name, kind)
        if kind == "histogram":
            assert name.endswith("_seconds"), name


def test_engine_figures_move_with_traffic(gateway):
    text = scrape(gateway.base)
    if total(text, "turnpike_engine_steps_total") == 0:
        drive(gateway)
        text = scrape(gateway.base)
    steps = total(text, "turnpike_engine_steps_total", 'model="tiny"')
    assert steps > 0
    assert total(text, "turnpike_engine_batched_sequences_total", 'phase="prefill"') >= 1
    assert total(text, "turnpike_engine_batched_sequences_total", 'phase="decode"') >= 1
    assert total(text, "turnpike_engine_computed_tokens_total", 'phase="prefill"') > 5
    assert total(text, "turnpike_engine_prefix_cache_hit_tokens_total", 'model="tiny"') > 0
    assert 0 < total(text, "turnpike_engine_busy_seconds_total", 'model="tiny"') < 600
    assert {l for l, _ in samples(text, "turnpike_engine_queue_depth")} >= {
        f'turnpike_engine_queue_depth{{engine="default",model="tiny",phase="{p}"}}' for p in ("waiting", "prefill", "decode")
    }
    assert total(text, "turnpike_time_per_output_token_seconds_count", 'model="tiny"') >= 2
    assert total(text, "turnpike_time_to_first_token_seconds_count", 'model="tiny"') >= 2
    # Rate-limit drops are counted by limit, without a per-tenant series unless asked for.
    drops = samples(text, "turnpike_rate_limit_dropped_total")
    assert drops and all("tenant=" not in l for l, _ in drops)
    assert total(text, "turnpike_rate_limit_dropped_total", 'limit="requests"') >= 1
    assert total(text, "turnpike_http_connections_closed_total", 'reason="header_timeout"') >= 1
