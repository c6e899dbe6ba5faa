"""The Batch API on SmolLM2 (default engine, CPU device), one gateway, one run:

  throughput  the same chat lines run as a batch, and sent by a client at 1, 2, 4, 8 and 16
              concurrent requests; lines/s of the batch against the best client concurrency;
  interference  interactive streamed chats (a passage of 150 to 250 words no cache has seen),
              one after another, timed to their first token, with no batch running and with a
              batch running; p50 and p99 with over without.

Rounds interleave the two sides of each ratio, so a busy host hits both. Greedy decoding: both
sides do the same work. Prompts are of different lengths, none a multiple of the block size.

  python3 bench/batch_bench.py TURNPIKE PLUGIN GGUF OUT_JSON ROUNDS
"""

import json
import os
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

turnpike, plugin, gguf, out, rounds = sys.argv[1:6]
rounds = int(rounds)
LINES = 48
MAX_TOKENS = 48
TOPICS = ["rivers", "bridges", "the moon", "bread", "trains", "winter", "maps", "bees", "clocks", "paper",
          "salt", "glass"]


def question(i: int) -> str:
    topic = TOPICS[i % len(TOPICS)]
    extra = " Please be specific and give one example." * (i % 4)
    return f"Write two sentences about {topic}.{extra}"


def body(i: int, max_tokens: int = MAX_TOKENS, stream: bool = False) -> dict:
    b = {"model": "smollm2", "messages": [{"role": "user", "content": question(i)}], "max_tokens": max_tokens,
         "temperature": 0}
    if stream:
        b["stream"] = True
    return b


def call(base: str, method: str, path: str, payload=None, raw: bytes | None = None, headers=None):
    data = raw if raw is not None else (json.dumps(payload).encode() if payload is not None else None)
    request = urllib.request.Request(f"{base}{path}", data=data, method=method,
                                     headers={"Content-Type": "application/json", **(headers or {})})
    with urllib.request.urlopen(request, timeout=600) as response:
        return response.read()


def upload(base: str, count: int, start: int = 0) -> str:
    rows = [json.dumps({"custom_id": f"r{i}", "method": "POST", "url": "/v1/chat/completions", "body": body(i)})
            for i in range(start, start + count)]
    content = ("\n".join(rows) + "\n").encode()
    boundary = "benchboundary"
    form = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nbatch\r\n"
            f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"lines.jsonl\"\r\n"
            "Content-Type: application/jsonl\r\n\r\n").encode() + content + f"\r\n--{boundary}--\r\n".encode()
    answer = call(base, "POST", "/v1/files", raw=form,
                  headers={"Content-Type": f"multipart/form-data; boundary={boundary}"})
    return json.loads(answer)["id"]


def create(base: str, file_id: str) -> str:
    answer = call(base, "POST", "/v1/batches",
                  {"input_file_id": file_id, "endpoint": "/v1/chat/completions", "completion_window": "24h"})
    return json.loads(answer)["id"]


def wait(base: str, batch_id: str) -> dict:
    while True:
        batch = json.loads(call(base, "GET", f"/v1/batches/{batch_id}"))
        if batch["status"] in ("completed", "failed", "cancelled", "expired"):
            return batch
        time.sleep(0.05)


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_batch(base: str, pid: int) -> dict:
    file_id = upload(base, LINES)
    cpu = cpu_seconds(pid)
    start = time.monotonic()
    batch = wait(base, create(base, file_id))
    elapsed = time.monotonic() - start
    assert batch["status"] == "completed" and batch["request_counts"]["completed"] == LINES, batch
    return {"lines_per_s": LINES / elapsed, "cpu_ms_per_line": (cpu_seconds(pid) - cpu) * 1e3 / LINES}


def run_client(base: str, pid: int, concurrency: int) -> dict:
    cpu = cpu_seconds(pid)
    start = time.monotonic()
    with ThreadPoolExecutor(concurrency) as pool:
        list(pool.map(lambda i: call(base, "POST", "/v1/chat/completions", body(i)), range(LINES)))
    elapsed = time.monotonic() - start
    return {"lines_per_s": LINES / elapsed, "cpu_ms_per_line": (cpu_seconds(pid) - cpu) * 1e3 / LINES}


WORDS = ("river stone bridge water morning light garden letter window market winter harbour forest "
         "station lantern meadow orchard kettle ribbon pocket candle valley thunder village mirror").split()


def probe_body(i: int) -> dict:
    """An interactive request no cache has seen: a passage of 150 to 250 words to summarise."""
    rng = random.Random(i)
    passage = " ".join(rng.choice(WORDS) for _ in range(150 + rng.randrange(100)))
    return {"model": "smollm2", "max_tokens": 8, "temperature": 0, "stream": True,
            "messages": [{"role": "user", "content": f"Summarise in one line: {passage}"}]}


def ttft(base: str, i: int) -> float:
    request = urllib.request.Request(f"{base}/v1/chat/completions", data=json.dumps(probe_body(i)).encode(),
                                     headers={"Content-Type": "application/json"})
    start = time.monotonic()
    with urllib.request.urlopen(request, timeout=600) as response:
        for line in response:
            if line.startswith(b"data: {") and b'"content"' in line:
                first = time.monotonic() - start
                response.read()
                return first
    raise AssertionError("no content in the stream")


PROBED = [0]


def probes(base: str, count: int) -> list[float]:
    times = []
    for _ in range(count):
        PROBED[0] += 1
        times.append(ttft(base, PROBED[0]))
        time.sleep(0.05)
    return times


def p(values, q):
    values = sorted(values)
    return values[min(len(values) - 1, round(q * (len(values) - 1)))]


def main():
    work = Path(tempfile.mkdtemp())
    threads = os.cpu_count()
    config = work / "turnpike.toml"
    config.write_text("\n".join([
        "[server]", 'listen = "127.0.0.1:0"', "[auth]", 'mode = "none"',
        "[files]", f'dir = "{work}/files"', "[batches]", "chunk_lines = 4",
        "[[engines]]", 'name = "default"', f'plugin = "{plugin}"', "[engines.config]",
        "[[engines.config.models]]", 'id = "smollm2"', f'path = "{gguf}"', 'device = "cpu"', f"threads = {threads}",
        "",
    ]))
    process = subprocess.Popen([turnpike, "serve", "--config", str(config)], stdout=subprocess.PIPE,
                               stderr=open(work / "turnpike.log", "w"), text=True,
                               env={**os.environ, "RUST_LOG": "warn", "TURNPIKE_CACHE_DIR": str(work / "cache")})
    line = process.stdout.readline()
    base = re.match(r"turnpike listening on (\S+)", line).group(1)
    try:
        # Warm: the model's pages and the prefix cache see every prompt once.
        run_client(base, process.pid, 8)
        concurrencies = [1, 2, 4, 8, 16]
        client = {c: [] for c in concurrencies}
        batch = []
        for _ in range(rounds):
            for c in concurrencies:
                client[c].append(run_client(base, process.pid, c))
            batch.append(run_batch(base, process.pid))
        best = max(concurrencies, key=lambda c: statistics.median(r["lines_per_s"] for r in client[c]))
        ratios = [b["lines_per_s"] / c["lines_per_s"] for b, c in zip(batch, client[best])]
        # Interference: probes alone, then probes over a long batch, interleaved.
        idle, busy = [], []
        for _ in range(rounds):
            idle += probes(base, 40)
            batch_id = create(base, upload(base, 400, 100))
            time.sleep(1.0)  # the batch is under way
            busy += probes(base, 40)
            call(base, "POST", f"/v1/batches/{batch_id}/cancel", {})
            wait(base, batch_id)
        result = {
            "rounds": rounds,
            "lines": LINES,
            "max_tokens": MAX_TOKENS,
            "threads": threads,
            "client": {str(c): client[c] for c in concurrencies},
            "best_concurrency": best,
            "batch": batch,
            "throughput_ratios": ratios,
            "ttft_ms": {
                "idle": {"p50": p(idle, 0.5) * 1e3, "p99": p(idle, 0.99) * 1e3, "samples": len(idle)},
                "batch": {"p50": p(busy, 0.5) * 1e3, "p99": p(busy, 0.99) * 1e3, "samples": len(busy)},
            },
        }
        result["ttft_ratio"] = {q: result["ttft_ms"]["batch"][q] / result["ttft_ms"]["idle"][q] for q in ("p50", "p99")}
        Path(out).write_text(json.dumps(result, indent=2))
    finally:
        process.terminate()
        process.wait(timeout=30)


main()
