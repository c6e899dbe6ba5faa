"""The cost of a resumption: two Turnpike nodes (the default engine's CPU device on SmolLM2, one
thread each) behind a front whose upstream plugin speaks `protocol = "turnpike"`. A greedy
stream is read through the front; after `k` tokens the node serving it is killed (SIGKILL) and
the stream goes on from the other node. Measured per kill: the time from the kill to the next
token at the client, over the stream's own inter-token latency before it; beside it, on the
surviving node, the prefill a resumption needs (a fresh prompt as long as the original prompt
plus the `k` tokens) and the prefill of `k` tokens after a cached prompt. Rounds interleave the
values of `k`; the killed node is restarted on its port between kills.

    python3 bench/resume_cost.py TURNPIKE CUDA_SO UPSTREAM_SO GGUF FOLDER OUT.json
"""

import json
import os
import random
import re
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import httpx

BIN, CUDA, UPSTREAM, GGUF, FOLDER, OUT = sys.argv[1:7]
ROUNDS = int(os.environ.get("ROUNDS", "5"))
KS = [int(k) for k in os.environ.get("KS", "16,64,160").split(",")]
AFTER = 24  # tokens read after the resumption
work = Path(os.environ.get("WORK", "target/bench/resume"))
work.mkdir(parents=True, exist_ok=True)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve(name, config):
    path = work / f"{name}.toml"
    path.write_text(config)
    log = open(work / f"{name}.log", "w")
    p = subprocess.Popen([BIN, "serve", "--config", str(path)], stdout=subprocess.PIPE, stderr=log, text=True,
                         env={**os.environ, "RUST_LOG": "warn"})
    line = p.stdout.readline()
    found = re.search(r"listening on (http://\S+)", line)
    assert found, (line, (work / f"{name}.log").read_text()[-2000:])
    return p, found.group(1)


def node(port):
    return serve(f"node-{port}", "\n".join([
        "[server]", f'listen = "127.0.0.1:{port}"', "[auth]", 'mode = "none"',
        "[[engines]]", 'name = "default"', f'plugin = "{CUDA}"', "[engines.config]",
        "[[engines.config.models]]", 'id = "smollm2"', f'path = "{GGUF}"', 'device = "cpu"', "threads = 1", ""]))


tokenizer_config = json.loads((Path(FOLDER) / "tokenizer_config.json").read_text())
vocab = json.loads((Path(FOLDER) / "tokenizer.json").read_text())
vocab_size = len(vocab["model"]["vocab"]) + len(vocab.get("added_tokens", []))
eos = next(t["id"] for t in vocab["added_tokens"] if t["content"] == tokenizer_config["eos_token"])
ports = [free_port(), free_port()]
nodes = {p: node(p)[0] for p in ports}
endpoints = ", ".join(f'"http://127.0.0.1:{p}"' for p in ports)
front, FRONT = serve("front", "\n".join([
    "[server]", 'listen = "127.0.0.1:0"', "[auth]", 'mode = "none"',
    "[[engines]]", 'name = "fleet"', f'plugin = "{UPSTREAM}"', "[engines.config]",
    "[[engines.config.models]]", 'id = "smollm2"', 'protocol = "turnpike"', f"endpoints = [{endpoints}]",
    f"vocab_size = {vocab_size}", f"eos_token_ids = [{eos}]", "max_context = 2048", "affinity_tokens = 0",
    "retries = 4", "health_interval_ms = 0", "breaker = { failures = 1000, cooldown_ms = 100 }",
    "[[models]]", 'name = "smollm2"', 'engine = "fleet"', f'folder = "{FOLDER}"', ""]))


def metrics(base):
    return urllib.request.urlopen(f"{base}/metrics", timeout=10).read().decode()


def serving_port():
    text = metrics(FRONT)
    for p in ports:
        m = re.search(rf'turnpike_engine_replica_stat{{[^}}]*replica="http://127.0.0.1:{p}"[^}}]*stat="in_flight"}} (\S+)',
                      text)
        if m and float(m.group(1)) > 0:
            return p
    return None


def ttft(port, ids):
    start = time.perf_counter()
    with httpx.stream("POST", f"http://127.0.0.1:{port}/generate", timeout=120, json={
            "input_ids": ids, "stream": True, "sampling_params": {"max_new_tokens": 1, "temperature": 0}}) as r:
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                return (time.perf_counter() - start) * 1000


def one_kill(k, round_):
    body = {"model": "smollm2", "max_tokens": k + AFTER, "temperature": 0, "stream": True, "ignore_eos": True,
            "stream_options": {"include_usage": True},
            "messages": [{"role": "user", "content": f"Round {round_}, {k}: tell me a long story about a river."}]}
    times, killed_at, victim, prompt_tokens = [], None, None, None
    with httpx.stream("POST", f"{FRONT}/v1/chat/completions", json=body, timeout=120) as r:
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                prompt_tokens = chunk["usage"]["prompt_tokens"]
            if not any(c["delta"].get("content") for c in chunk.get("choices", [])):
                continue
            times.append(time.perf_counter())
            if len(times) == k:
                victim = serving_port()
                killed_at = time.perf_counter()
                nodes[victim].send_signal(signal.SIGKILL)
    assert victim and len(times) == k + AFTER, (victim, len(times))
    gaps = [b - a for a, b in zip(times[1:k], times[2:k])]
    itl = statistics.median(gaps) * 1000
    resumed = (times[k] - killed_at) * 1000
    survivor = next(p for p in ports if p != victim)
    nodes[victim].wait()
    nodes[victim] = node(victim)[0]
    rng = random.Random(round_ * 1000 + k)
    fresh = [rng.randrange(1000, vocab_size - 100) for _ in range(prompt_tokens + k)]
    prefill_all = ttft(survivor, fresh)
    cached = [rng.randrange(1000, vocab_size - 100) for _ in range(prompt_tokens)]
    ttft(survivor, cached)
    prefill_k = ttft(survivor, cached + [rng.randrange(1000, vocab_size - 100) for _ in range(k)])
    return {"k": k, "prompt_tokens": prompt_tokens, "itl_ms": itl, "kill_to_token_ms": resumed,
            "added_ms": resumed - itl, "prefill_prompt_and_k_ms": prefill_all, "prefill_k_after_cached_ms": prefill_k}


try:
    runs = []
    for r in range(ROUNDS):
        for k in KS:
            runs.append(one_kill(k, r))
            print(json.dumps(runs[-1]), flush=True)
    stats = metrics(FRONT)
    resume_mean = re.search(r'turnpike_engine_stat{[^}]*stat="resume_ms_mean"[^}]*} (\S+)', stats)
    json.dump({"model": Path(GGUF).name, "rounds": ROUNDS, "ks": KS, "after": AFTER, "runs": runs,
               "front_resume_ms_mean": float(resume_mean.group(1)) if resume_mean else None},
              open(OUT, "w"), indent=2)
finally:
    for proc in [front, *nodes.values()]:
        proc.kill()
        proc.wait()
