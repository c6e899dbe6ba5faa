"""The llama.cpp peer of `engine-bench`: the same workloads through `llama-server` on the same
GGUF file (token-id prompts over its HTTP API, greedy, `ignore_eos`, every core), and its
resident memory after load and at peak.

Usage: python llama_peer.py LLAMA_SERVER MODEL.gguf OUT_JSON
"""

import json
import os
import random
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.request

RUNS = 5
server, gguf, out = sys.argv[1], sys.argv[2], sys.argv[3]
rng = random.Random(7)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


port = free_port()
proc = subprocess.Popen(
    [server, "-m", gguf, "--host", "127.0.0.1", "--port", str(port), "-t", str(os.cpu_count()),
     "-np", "16", "-c", str(16 * 1024), "--no-webui", "--cache-reuse", "0"],
    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def rss_kib(field):
    for line in open(f"/proc/{proc.pid}/status"):
        if line.startswith(field):
            return int(line.split()[1])
    return 0


def post(body):
    req = urllib.request.Request(f"http://127.0.0.1:{port}/completion", json.dumps(body).encode(),
                                 {"content-type": "application/json"})
    return urllib.request.urlopen(req, timeout=600)


def complete(prompt, n, cache=False):
    """Wall seconds to the first streamed token and to the end, and tokens generated."""
    start = time.perf_counter()
    first, count = None, 0
    body = {"prompt": prompt, "n_predict": n, "temperature": 0, "ignore_eos": True,
            "cache_prompt": cache, "stream": True}
    with post(body) as resp:
        for line in resp:
            if not line.startswith(b"data: "):
                continue
            chunk = json.loads(line[6:])
            if chunk.get("content") is not None and first is None and not chunk.get("stop"):
                first = time.perf_counter() - start
            if not chunk.get("stop"):
                count += 1
    return first or (time.perf_counter() - start), time.perf_counter() - start, count


def prompt(length):
    return [rng.randrange(5, 668) for _ in range(length)]


def concurrent(n, length, new):
    results = [None] * n
    prompts = [prompt(length) for _ in range(n)]

    def one(i):
        results[i] = complete(prompts[i], new)

    start = time.perf_counter()
    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(r[2] for r in results) / (time.perf_counter() - start)


try:
    for _ in range(600):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as r:
                if r.status == 200:
                    break
        except OSError:
            time.sleep(0.1)
    rss_after_load = rss_kib("VmRSS")
    rss_load_peak = rss_kib("VmHWM")
    complete(prompt(64), 4)
    prefill, d1, d8, d16, cold, warm = [], [], [], [], [], []
    length = int(os.environ.get("PROMPT_LEN", "512"))
    for _ in range(RUNS):
        _, end, _ = complete(prompt(length), 1)
        prefill.append(length / end)
        d1.append(concurrent(1, 16, 128))
        d8.append(concurrent(8, 16, 128))
        d16.append(concurrent(16, 16, 128))
        p = prompt(length)
        cold.append(complete(p, 1, cache=True)[0] * 1000)
        warm.append(complete(p, 1, cache=True)[0] * 1000)
    version = subprocess.run([server, "--version"], capture_output=True, text=True)
    results = {
        "runs": RUNS,
        "statistic": "median",
        "version": (version.stdout + version.stderr).strip().splitlines()[0:1],
        "prompt_len": length,
        "prefill_tokens_per_s": statistics.median(prefill),
        "decode_1_tokens_per_s": statistics.median(d1),
        "decode_8_tokens_per_s": statistics.median(d8),
        "decode_16_tokens_per_s": statistics.median(d16),
        "ttft_cold_ms": statistics.median(cold),
        "ttft_prefix_hit_ms": statistics.median(warm),
        "rss_after_load_mib": rss_after_load / 1024,
        "rss_load_peak_mib": rss_load_peak / 1024,
        "rss_peak_mib": rss_kib("VmHWM") / 1024,
    }
finally:
    proc.terminate()
    proc.wait()
with open(out, "w") as f:
    json.dump(results, f, indent=2)
print(json.dumps(results))
