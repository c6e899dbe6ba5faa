"""Beam search's cost on a GGUF file: the default engine (CPU device) answering the same
completions greedily and with `best_of` beams (`n` 1), for the same output length
(`ignore_eos`, so every answer has MAX_TOKENS tokens), one request at a time, over interleaved
rounds. Figures per width: wall seconds per request, the server's CPU seconds per request, and
the ratio to greedy (median over rounds, with the spread).

Usage: python beam_bench.py TURNPIKE PLUGIN MODEL.gguf OUT_JSON
Environment: ROUNDS (3), WIDTHS ("2,4"), MAX_TOKENS (64).
"""

import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

turnpike, plugin, gguf, out = (os.path.abspath(a) for a in sys.argv[1:5])
ROUNDS = int(os.environ.get("ROUNDS", "3"))
WIDTHS = [int(w) for w in os.environ.get("WIDTHS", "2,4").split(",")]
MAX_TOKENS = int(os.environ.get("MAX_TOKENS", "64"))
PROMPTS = [  # lengths that are not multiples of the block size
    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "Explain how a bicycle stays upright while it moves, in simple words.",
    "List the steps to brew a good cup of tea, and say why each one matters.",
]


def cpu_seconds(pid):
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_model():
    for line in open("/proc/cpuinfo"):
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


def start(tmp):
    config = os.path.join(tmp, "turnpike.toml")
    with open(config, "w") as f:
        f.write("\n".join(["[server]", 'listen = "127.0.0.1:0"', "[auth]", 'mode = "none"', "[[engines]]",
                           'name = "default"', f'plugin = "{plugin}"', "[engines.config]", "seed = 1",
                           "[[engines.config.models]]", 'id = "model"', f'path = "{gguf}"', 'device = "cpu"',
                           f"max_n = {max(WIDTHS)}"]) + "\n")
    log = open(os.path.join(tmp, "turnpike.log"), "w")
    process = subprocess.Popen([turnpike, "serve", "--config", config], stdout=subprocess.PIPE,
                               stderr=log, text=True)
    line = process.stdout.readline()
    assert "listening on" in line, open(os.path.join(tmp, "turnpike.log")).read()[-2000:]
    return process, line.split()[-1]


def complete(base, prompt, width):
    body = {"model": "model", "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0,
            "ignore_eos": True}
    if width > 1:
        body["best_of"] = width
    request = urllib.request.Request(f"{base}/v1/completions", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
    reply = json.loads(urllib.request.urlopen(request, timeout=600).read())
    assert reply["usage"]["completion_tokens"] == MAX_TOKENS, reply["usage"]
    return reply


def main():
    with tempfile.TemporaryDirectory() as tmp:
        process, base = start(tmp)
        try:
            complete(base, PROMPTS[0], 1)  # warm
            kinds = [1] + WIDTHS
            wall = {k: [] for k in kinds}
            cpu = {k: [] for k in kinds}
            for _ in range(ROUNDS):
                for kind in kinds:  # interleaved: every kind once per round
                    for prompt in PROMPTS:
                        before, started = cpu_seconds(process.pid), time.perf_counter()
                        complete(base, prompt, kind)
                        wall[kind].append(time.perf_counter() - started)
                        cpu[kind].append(cpu_seconds(process.pid) - before)
        finally:
            process.terminate()
            process.wait(timeout=30)
    rounds = {k: [statistics.mean(v[i * len(PROMPTS):(i + 1) * len(PROMPTS)]) for i in range(ROUNDS)]
              for k, v in wall.items()}
    doc = {"benchmark": "beams", "cpu": cpu_model(), "cores": os.cpu_count(), "model": os.path.basename(gguf),
           "max_tokens": MAX_TOKENS, "rounds": ROUNDS, "prompts": len(PROMPTS), "widths": {}}
    for k in [1] + WIDTHS:
        ratios = [r / g for r, g in zip(rounds[k], rounds[1])]
        doc["widths"][str(k)] = {"seconds_per_request": statistics.median(wall[k]),
                                 "cpu_seconds_per_request": statistics.median(cpu[k]),
                                 "ratio_to_greedy": statistics.median(ratios),
                                 "ratio_spread": [min(ratios), max(ratios)]}
        print(k, doc["widths"][str(k)])
    with open(out, "w") as f:
        json.dump(doc, f, indent=2)


main()
