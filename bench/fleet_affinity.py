"""Prefix affinity, measured by the nodes' own prefix caches: two Turnpike nodes running the
default engine on the CPU (SmolLM2-135M, the GGUF tests/run.sh fetches), each with its own
prefix cache, behind several fronts. A workload of conversations that share long system prompts
(each conversation's turns interleaved with the others') goes through each front; the hit rate
is the share of prompt tokens the nodes report as cached (`usage.prompt_tokens_details`).

Fronts: Turnpike's upstream plugin with prefix affinity and with load only (power of two
choices), and sglang-router with `cache_aware` and with `random`. Nodes are restarted between
fronts so every front starts from cold caches.

  python3 bench/fleet_affinity.py TURNPIKE_BIN UPSTREAM_SO CUDA_SO GGUF FOLDER ROUTERS_VENV OUT_PREFIX
"""

import json
import platform
import subprocess
import sys
import time
import urllib.error
import urllib.request

BIN, UPSTREAM, CUDA, GGUF, FOLDER, ROUTERS, OUT = sys.argv[1:8]
WORK = "target/bench"
NODES = [4120, 4121]
FRONT = 4122
# Odd, so round-robin order alone cannot line conversations up with nodes.
CONVERSATIONS, TURNS = 7, 6


def post(url, body):
    req = urllib.request.Request(url, json.dumps(body).encode(), {"content-type": "application/json"})
    try:
        return json.load(urllib.request.urlopen(req, timeout=300))
    except urllib.error.HTTPError as e:
        raise SystemExit(f"{url}: {e.code} {e.read()[:500]!r}") from None


def wait_ready(url):
    for _ in range(240):
        try:
            urllib.request.urlopen(url, timeout=2)
            return
        except OSError:
            time.sleep(0.5)
    raise SystemExit(f"{url} never became ready")


def start(name, args):
    log = open(f"{WORK}/{name}.log", "w")
    return subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=log)


def node_config(port):
    return "\n".join([
        "[server]", f'listen = "127.0.0.1:{port}"', "[auth]", 'mode = "none"',
        "[[engines]]", 'name = "default"', f'plugin = "{CUDA}"', "[engines.config]",
        "[[engines.config.models]]", 'id = "smollm2"', f'path = "{GGUF}"', 'device = "cpu"', "threads = 1", "",
    ])


def front_config(affinity):
    vocab = json.load(open(f"{FOLDER}/tokenizer.json"))
    size = max([*vocab["model"]["vocab"].values(), *(t["id"] for t in vocab["added_tokens"])]) + 1
    endpoints = ", ".join(f'"http://127.0.0.1:{p}"' for p in NODES)
    return "\n".join([
        "[server]", f'listen = "127.0.0.1:{FRONT}"', "[auth]", 'mode = "none"',
        "[[engines]]", 'name = "fleet"', f'plugin = "{UPSTREAM}"', "[engines.config]",
        "[[engines.config.models]]", 'id = "smollm2"', 'upstream_model = "smollm2"', f"endpoints = [{endpoints}]",
        f"vocab_size = {size}", "eos_token_ids = [2]", f"affinity_tokens = {affinity}",
        "[[models]]", 'name = "smollm2"', 'engine = "fleet"', f'folder = "{FOLDER}"', "",
    ])


def workload():
    topics = ["rivers", "castles", "volcanoes", "orchards", "harbours", "glaciers", "deserts", "libraries"]
    for turn in range(TURNS):
        for c in range(CONVERSATIONS):
            system = (f"You are a guide who knows everything about {topics[c]}. Answer briefly, in one sentence, "
                      f"and never mention anything but {topics[c]}. ") * 6
            yield [{"role": "system", "content": system}, {"role": "user", "content": f"Tell me fact number {turn}."}]


def wait_model(base):
    """Listening comes before the model is loaded (a node) or its workers are known (a router)."""
    wait_ready(f"{base}/health")
    for _ in range(240):
        try:
            models = json.load(urllib.request.urlopen(f"{base}/v1/models", timeout=5))
            if any(m["id"] == "smollm2" for m in models.get("data", [])):
                return
        except OSError:
            pass
        time.sleep(0.5)
    raise SystemExit(f"{base} never listed the model")


def warm_up(front_url):
    """A router answers 404 until it has read its workers' models: one short request, retried."""
    for _ in range(120):
        try:
            post(f"{front_url}/v1/chat/completions", {"model": "smollm2", "max_tokens": 1,
                                                      "messages": [{"role": "user", "content": "Hi"}]})
            return
        except SystemExit:
            time.sleep(0.5)
    raise SystemExit(f"{front_url} never served the model")


def drive(front_url):
    warm_up(front_url)
    prompt = cached = 0
    started = time.monotonic()
    for messages in workload():
        r = post(f"{front_url}/v1/chat/completions", {"model": "smollm2", "messages": messages, "max_tokens": 1,
                                                      "temperature": 0})
        prompt += r["usage"]["prompt_tokens"]
        cached += (r["usage"].get("prompt_tokens_details") or {}).get("cached_tokens", 0)
    return {"prompt_tokens": prompt, "cached_tokens": cached, "hit_rate": cached / prompt,
            "seconds": round(time.monotonic() - started, 2)}


def with_nodes(run):
    procs = []
    try:
        for i, port in enumerate(NODES):
            path = f"{WORK}/affinity-node{i}.toml"
            open(path, "w").write(node_config(port))
            procs.append(start(f"affinity-node{i}", [BIN, "--log-format", "json", "serve", "--config", path]))
        for port in NODES:
            wait_model(f"http://127.0.0.1:{port}")
        return run(procs)
    finally:
        for p in procs:
            p.terminate()
            p.wait()


def turnpike_front(affinity):
    def run(procs):
        path = f"{WORK}/affinity-front.toml"
        open(path, "w").write(front_config(affinity))
        front = start("affinity-front", [BIN, "--log-format", "json", "serve", "--config", path])
        procs.append(front)
        wait_ready(f"http://127.0.0.1:{FRONT}/health")
        return drive(f"http://127.0.0.1:{FRONT}")
    return run


def sglang_front(policy):
    def run(procs):
        workers = [f"http://127.0.0.1:{p}" for p in NODES]
        router = start("affinity-sglang-router", [f"{ROUTERS}/bin/python", "-m", "sglang_router.launch_router",
                                                  "--host", "127.0.0.1", "--port", str(FRONT), "--policy", policy,
                                                  "--log-level", "warn", "--worker-urls", *workers])
        procs.append(router)
        wait_ready(f"http://127.0.0.1:{FRONT}/health")
        return drive(f"http://127.0.0.1:{FRONT}")
    return run


fronts = {
    "turnpike (prefix affinity, 64 tokens)": turnpike_front(64),
    "turnpike (load only)": turnpike_front(0),
    "sglang-router cache_aware": sglang_front("cache_aware"),
    "sglang-router random": sglang_front("random"),
}
results = {}
for name, run in fronts.items():
    results[name] = with_nodes(run)
    print(name, results[name], flush=True)

cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), "?")
doc = {"cpu": cpu, "machine": platform.machine(), "conversations": CONVERSATIONS, "turns": TURNS,
       "model": "SmolLM2-135M-Instruct Q4_1 (default engine, CPU device, 1 thread per node)", "results": results}
json.dump(doc, open(f"{OUT}.json", "w"), indent=2)
lines = ["# Prefix affinity: cached prompt tokens by front", "",
         f"CPU: {cpu}. Two Turnpike nodes (default engine, CPU device, SmolLM2-135M Q4_1, one thread each, "
         f"own prefix caches, restarted cold for each front); {CONVERSATIONS} conversations with distinct long "
         f"system prompts, {TURNS} turns each, interleaved; `max_tokens` 1. Hit rate: the share of prompt tokens "
         "the nodes reported cached. Command: `bench/run-fleet-affinity.sh`.", "",
         "| front | prompt tokens | cached | hit rate | seconds |", "|---|---|---|---|---|"]
for name, r in results.items():
    lines.append(f"| {name} | {r['prompt_tokens']} | {r['cached_tokens']} | {r['hit_rate']:.1%} | {r['seconds']} |")
open(f"{OUT}.md", "w").write("\n".join(lines) + "\n")
