"""No stream dies: a node that fails mid-stream hands each unfinished choice, with exactly the
tokens it delivered, to another node, and the client's stream goes on with no gap, repeat or
error event. Real Turnpike nodes (the simulator with a latency profile, and the default engine's
CPU device on SmolLM2) behind a real front whose upstream plugin speaks
`protocol = "turnpike"`; nodes are killed with SIGKILL or stalled with SIGSTOP in the middle of
concurrent streams driven by the official `openai` SDK. The resumption itself is checked on a
node's `/generate`: a choice resumed from its own first tokens ends as the uninterrupted run."""

import json
import os
import re
import signal
import subprocess
import threading
import time
import urllib.request
from pathlib import Path

import httpx
import openai
import pytest
from tokenizers import Tokenizer

from conftest import BIN, FOLDER, ROOT, TOKENIZER, config_text
from tenancy_support import Gateway

UPSTREAM = Path(os.environ.get("TURNPIKE_UPSTREAM", ROOT / "target/debug/libturnpike_upstream.so"))
CUDA = Path(os.environ.get("TURNPIKE_CUDA", ROOT / "target/debug/libturnpike_cuda.so"))
GGUF = os.environ.get("TURNPIKE_SMOLLM2_GGUF")


def front_config(nodes, models, vocab, eos, folder, stall_ms=30000, failover=True):
    endpoints = ", ".join(f'"{n.base}"' for n in nodes)
    lines = ["[server]", 'listen = "127.0.0.1:0"', "[auth]", 'mode = "none"',
             "[[engines]]", 'name = "fleet"', f'plugin = "{UPSTREAM}"', "[engines.config]"]
    for model in models:
        lines += ["[[engines.config.models]]", f'id = "{model}"', f'upstream_model = "{model}"',
                  'protocol = "turnpike"', f"endpoints = [{endpoints}]", f"vocab_size = {vocab}",
                  f"eos_token_ids = [{eos}]", "affinity_tokens = 0", "retries = 2", "grammar = true",
                  "breaker = { failures = 2, cooldown_ms = 60000 }", "health_interval_ms = 0",
                  "first_token_timeout_ms = 5000", f"stall_timeout_ms = {stall_ms}",
                  f"mid_stream_failover = {'true' if failover else 'false'}"]
    for model in models:
        lines += ["[[models]]", f'name = "{model}"', 'engine = "fleet"', f'folder = "{folder}"']
    return "\n".join(lines) + "\n"


def front_stat(front, stat, model):
    text = urllib.request.urlopen(f"{front.base}/metrics", timeout=10).read().decode()
    found = re.search(rf'turnpike_engine_stat{{[^}}]*model="{model}"[^}}]*stat="{stat}"[^}}]*}} (\S+)', text)
    return float(found.group(1)) if found else 0.0


class Streams:
    """`count` SDK streams at once, each with its text, usage, events and error."""

    def __init__(self, client, model, count, max_tokens, extra):
        self.results = [None] * count
        self.events = [0] * count
        self.threads = [threading.Thread(target=self._run, args=(client, model, i, max_tokens, extra))
                        for i in range(count)]
        for t in self.threads:
            t.start()

    def _run(self, client, model, i, max_tokens, extra):
        text, usage, finish = [], None, None
        try:
            stream = client.chat.completions.create(
                model=model, messages=[{"role": "user", "content": f"Stream {i}: tell me a long story"}],
                max_tokens=max_tokens, stream=True, stream_options={"include_usage": True}, **extra(i))
            for chunk in stream:
                if chunk.usage:
                    usage = chunk.usage
                for c in chunk.choices:
                    text.append(c.delta.content or "")
                    finish = c.finish_reason or finish
                self.events[i] += 1
            self.results[i] = ("".join(text), usage.completion_tokens if usage else None, finish)
        except Exception as e:  # noqa: BLE001 - the test reports every failure
            self.results[i] = ("error", repr(e), None)

    def started(self, at_least):
        return sum(1 for e in self.events if e >= at_least)

    def join(self):
        for t in self.threads:
            t.join(timeout=120)
        return self.results


def run_through(front_client, model, count, max_tokens, extra, disturb=None):
    streams = Streams(front_client, model, count, max_tokens, extra)
    if disturb:
        deadline = time.monotonic() + 30
        while streams.started(3) < count // 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        disturb()
    return streams.join()


@pytest.fixture
def sim_fleet(tmp_path):
    assert UPSTREAM.exists(), f"{UPSTREAM} is missing: build the workspace first"
    nodes = [Gateway(tmp_path / f"node{i}", config_text(), {}, name=f"node{i}") for i in range(3)]
    vocab = Tokenizer.from_file(str(TOKENIZER)).get_vocab_size(with_added_tokens=True)
    fronts = {}

    def front(**kwargs):
        name = f"front{len(fronts)}"
        fronts[name] = Gateway(tmp_path / name, front_config(nodes, ["slow", "midfail"], vocab, 4, FOLDER, **kwargs),
                               {"RUST_LOG": "info"}, name=name)
        return fronts[name]

    yield nodes, front
    for g in [*fronts.values(), *nodes]:
        if g.process.poll() is None:
            os.kill(g.process.pid, signal.SIGCONT)
        g.stop()


def seeded(i):
    return {"seed": 1000 + i}


def assert_unbroken(results, baseline):
    errors = [r for r in results if r[0] == "error"]
    assert not errors, errors[:3]
    for got, want in zip(results, baseline):
        assert got == want


def test_a_node_killed_mid_stream_loses_no_token(sim_fleet):
    nodes, front = sim_fleet
    f = front()
    client = openai.OpenAI(base_url=f"{f.base}/v1", api_key="sk-unused", max_retries=0, timeout=60)
    baseline = run_through(client, "slow", 100, 40, seeded)
    assert all(r[0] != "error" and r[1] for r in baseline), baseline[:3]
    killed = run_through(client, "slow", 100, 40, seeded, disturb=nodes[0].process.kill)
    assert_unbroken(killed, baseline)
    assert front_stat(f, "resumptions", "slow") > 0
    # What the front counted is what the clients were told they used: each token once.
    text = urllib.request.urlopen(f"{f.base}/metrics", timeout=10).read().decode()
    counted = re.search(r'turnpike_tokens_total{[^}]*kind="completion"[^}]*model="slow"[^}]*} (\S+)', text) or \
        re.search(r'turnpike_tokens_total{[^}]*model="slow"[^}]*kind="completion"[^}]*} (\S+)', text)
    assert counted and float(counted.group(1)) == sum(r[1] for r in baseline + killed), text
    log = f.log.read_text()
    assert "resumes after" in log and "served by" in log


def test_a_stalled_node_is_left_and_its_streams_go_on(sim_fleet):
    nodes, front = sim_fleet
    f = front(stall_ms=400)
    client = openai.OpenAI(base_url=f"{f.base}/v1", api_key="sk-unused", max_retries=0, timeout=60)
    baseline = run_through(client, "slow", 60, 40, seeded)
    stalled = run_through(client, "slow", 60, 40, seeded,
                          disturb=lambda: os.kill(nodes[1].process.pid, signal.SIGSTOP))
    os.kill(nodes[1].process.pid, signal.SIGCONT)
    assert_unbroken(stalled, baseline)
    assert front_stat(f, "resumptions", "slow") > 0
    assert "no token for 400 ms" in f.log.read_text()


def test_an_error_event_mid_stream_resumes_and_the_switch_turns_it_off(sim_fleet):
    _, front = sim_fleet
    f = front()
    client = openai.OpenAI(base_url=f"{f.base}/v1", api_key="sk-unused", max_retries=0, timeout=60)
    # Each node fails its stream after 3 tokens: 3 from the first, 2 from the one that resumes.
    results = run_through(client, "midfail", 4, 5, seeded)
    assert all(r[0] != "error" and r[1] == 5 and r[2] == "length" for r in results), results
    off = front(failover=False)
    client = openai.OpenAI(base_url=f"{off.base}/v1", api_key="sk-unused", max_retries=0, timeout=60)
    results = run_through(client, "midfail", 2, 5, seeded)
    assert all(r[0] == "error" for r in results), results


def generate(base, body):
    r = httpx.post(f"{base}/generate", json=body, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def resumed_rest(base, model, prompt, params, output, k, choice=0):
    """What a node answers for a choice resumed after its first `k` tokens."""
    rest = dict(params, max_new_tokens=params["max_new_tokens"] - k, n=1)
    body = {"model": model, "input_ids": prompt + output[:k], "sampling_params": rest,
            "resume": {"tokens": k, "choice": choice}}
    return generate(base, body)["output_ids"]


def test_a_resumed_choice_ends_as_the_uninterrupted_one_on_the_simulator(gateway):
    prompt = [20, 21, 22]
    params = {"max_new_tokens": 12, "n": 2, "ignore_eos": True, "seed": 3}
    both = generate(gateway, {"model": "chat", "input_ids": prompt, "sampling_params": params})
    for choice in (0, 1):
        output = both[choice]["output_ids"]
        assert resumed_rest(gateway, "chat", prompt, params, output, 5, choice) == output[5:]


def test_bad_resumptions_are_clear_errors(gateway):
    cases = [
        ({"input_ids": [1, 2], "resume": {"tokens": 2, "choice": 0}}, "resume.tokens"),
        ({"input_ids": [1, 2, 3], "resume": {"tokens": 1, "choice": 0}, "sampling_params": {"n": 2}}, "resume"),
    ]
    for body, param in cases:
        r = httpx.post(f"{gateway}/generate", json={"model": "chat", **body}, timeout=30)
        assert r.status_code == 400, r.text
        assert r.json()["error"]["param"] == param, r.text


def tiny_node(work, name):
    model = work / "tiny"
    if not model.exists():
        subprocess.run([str(BIN), "make-model", "--preset", "tiny", "--out", str(model)], check=True,
                       capture_output=True)
    config = "\n".join([
        "[server]", 'listen = "127.0.0.1:0"', "[auth]", 'mode = "none"',
        "[[engines]]", 'name = "default"', f'plugin = "{CUDA}"', "[engines.config]", "seed = 5",
        "[[engines.config.models]]", 'id = "tiny"', f'path = "{model}"', 'device = "cpu"', "threads = 1",
        "[[models]]", 'name = "tiny"', 'engine = "default"', f'folder = "{model}"', "",
    ])
    return Gateway(work / name, config, {}, name=name), model


def test_the_default_engine_resumes_exactly(tmp_path):
    node, _ = tiny_node(tmp_path, "node")
    try:
        prompt = [5, 17, 300, 42, 9, 77, 18]
        greedy = {"max_new_tokens": 24, "temperature": 0, "ignore_eos": True}
        sampled = {"max_new_tokens": 24, "temperature": 0.9, "top_p": 0.95, "seed": 11, "ignore_eos": True,
                   "presence_penalty": 0.6, "frequency_penalty": 0.4, "n": 2}
        for params in (greedy, sampled):
            whole = generate(node.base, {"model": "tiny", "input_ids": prompt, "sampling_params": params})
            whole = whole if isinstance(whole, list) else [whole]
            for choice, answer in enumerate(whole):
                output = answer["output_ids"]
                assert len(output) == 24
                rest = resumed_rest(node.base, "tiny", prompt, params, output, 9, choice)
                assert rest == output[9:], (params, choice)
    finally:
        node.stop()


def smollm2_node(work, name):
    """A node serving SmolLM2's GGUF on the CPU device, and the gateway's folder for it."""
    folder = work / "smollm2"
    if not folder.exists():
        subprocess.run([str(BIN.parent / "turnpike-gguf"), "tokenizer", GGUF, str(folder)], check=True,
                       capture_output=True)
    config = "\n".join([
        "[server]", 'listen = "127.0.0.1:0"', "[auth]", 'mode = "none"',
        "[[engines]]", 'name = "default"', f'plugin = "{CUDA}"', "[engines.config]",
        "[[engines.config.models]]", 'id = "smollm2"', f'path = "{GGUF}"', 'device = "cpu"', "threads = 1", "",
    ])
    return Gateway(work / name, config, {"TURNPIKE_CACHE_DIR": str(work / "cache")}, name=name), folder


def test_a_killed_cpu_node_loses_no_token_of_a_greedy_answer(tmp_path):
    """Two CPU-engine nodes on SmolLM2 (the `tiny` model where the GGUF is not fetched): one is
    killed under greedy streams, and every text is token for token an undisturbed run's."""
    make = smollm2_node if GGUF else tiny_node
    nodes = [make(tmp_path, f"node{i}")[0] for i in range(2)]
    folder = tmp_path / ("smollm2" if GGUF else "tiny")
    model = "smollm2" if GGUF else "tiny"
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    eos = tokenizer.token_to_id(json.loads((folder / "tokenizer_config.json").read_text())["eos_token"])
    vocab = tokenizer.get_vocab_size(with_added_tokens=True)
    f = Gateway(tmp_path / "front", front_config(nodes, [model], vocab, eos, folder), {"RUST_LOG": "info"},
                name="front")
    try:
        client = openai.OpenAI(base_url=f"{f.base}/v1", api_key="sk-unused", max_retries=0, timeout=120)

        def greedy(i):
            return {"temperature": 0, "extra_body": {"ignore_eos": True}}

        baseline = run_through(client, model, 8, 64, greedy)
        assert all(r[0] != "error" and r[1] == 64 for r in baseline), baseline[:2]
        killed = run_through(client, model, 8, 64, greedy, disturb=nodes[0].process.kill)
        assert_unbroken(killed, baseline)
        assert front_stat(f, "resumptions", model) > 0
    finally:
        for g in [f, *nodes]:
            g.stop()


def test_a_standby_engine_takes_over_a_failed_request_mid_stream(tmp_path):
    """Turnpike's own engines: the model's engine fails every request after 3 tokens; its
    standby takes each choice from there, and the answers equal the standby's own."""
    from conftest import SIM

    story = 'output = { mode = "random", length = [10, 30] }'
    lines = ["[server]", 'listen = "127.0.0.1:0"', "[auth]", 'mode = "none"']
    for engine, extra in (("failing", "errors = { fail_midstream_rate = 1.0, fail_after_tokens = 3 }"),
                          ("standing", "")):
        lines += ["[[engines]]", f'name = "{engine}"', f'plugin = "{SIM}"', "[engines.config]", "seed = 11",
                  "[[engines.config.models]]", 'id = "story"', f'tokenizer = "{TOKENIZER}"', "eos_token_id = 4",
                  "max_n = 4", story, extra]
    lines += ["[[models]]", 'name = "story"', 'engine = "failing"', f'folder = "{FOLDER}"',
              'standby = [{ engine = "standing", engine_model = "story" }]',
              "[[models]]", 'name = "direct"', 'engine = "standing"', 'engine_model = "story"', f'folder = "{FOLDER}"']
    g = Gateway(tmp_path / "gw", "\n".join(lines) + "\n", {"RUST_LOG": "warn"}, name="gw")
    try:
        client = openai.OpenAI(base_url=f"{g.base}/v1", api_key="sk-unused", max_retries=0, timeout=60)
        for n in (1, 3):
            for i in range(4):
                ask = dict(messages=[{"role": "user", "content": f"Tale {i}"}], max_tokens=24, seed=i, n=n)
                want = client.chat.completions.create(model="direct", **ask)
                got = client.chat.completions.create(model="story", **ask)
                assert [c.message.content for c in got.choices] == [c.message.content for c in want.choices]
                assert [c.finish_reason for c in got.choices] == [c.finish_reason for c in want.choices]
                assert got.usage.completion_tokens == want.usage.completion_tokens
                assert got.usage.prompt_tokens == want.usage.prompt_tokens
                streamed = {}
                for chunk in client.chat.completions.create(model="story", stream=True, **ask):
                    for c in chunk.choices:
                        streamed[c.index] = streamed.get(c.index, "") + (c.delta.content or "")
                assert [streamed[k] for k in sorted(streamed)] == [c.message.content for c in want.choices]
        text = urllib.request.urlopen(f"{g.base}/metrics", timeout=10).read().decode()
        assert re.search(r'turnpike_model_resumed_total\{[^}]*engine="standing"[^}]*\} [1-9]', text), text
        assert "resuming on the next" in g.log.read_text()
    finally:
        g.stop()
