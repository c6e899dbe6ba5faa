"""Speculative decoding on a GGUF file: Turnpike's default engine with and without drafts, and
llama.cpp's `llama-server` with and without its n-gram drafts (`--spec-type ngram-simple`,
sized as Turnpike's lookup: 3-token n-grams, DRAFT_TOKENS drafted), each alone on the machine
in turn, over interleaved rounds. KINDS picks the servers; besides those four, draft models:
`turnpike-self` (the model's own first layers), `turnpike-model` and `llama-model` (a draft
model file, see DRAFT_MODEL below).

Workloads, one request at a time, greedy, through each server's OpenAI chat endpoint (the
file's own chat template), streamed:
- `edit`: rewrite a paragraph with one change (the answer repeats the prompt);
- `open`: open chat (nothing to copy).
Figures per server and workload: decode tokens/s (completion tokens after the first over the
time after the first), time to first token, and the server's CPU seconds per request.

Usage: python speculative_bench.py TURNPIKE PLUGIN LLAMA_SERVER MODEL.gguf OUT_JSON
"""

import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

turnpike, plugin, llama_server, gguf, out = sys.argv[1:6]
ROUNDS = int(os.environ.get("ROUNDS", "3"))
REPEATS = int(os.environ.get("REPEATS", "3"))
DRAFT = int(os.environ.get("DRAFT_TOKENS", "4"))
MAX_TOKENS = 160
# Draft models: `turnpike-self` drafts with the model's own first SELF_LAYERS layers,
# `turnpike-model` and `llama-model` with DRAFT_MODEL (the model itself by default), drafts
# ending below P_MIN (llama.cpp's --draft-p-min, Turnpike's `confidence`).
SELF_LAYERS = int(os.environ.get("SELF_LAYERS", "24"))
DRAFT_MODEL = os.environ.get("DRAFT_MODEL") or gguf
P_MIN = float(os.environ.get("P_MIN", "0.75"))

PARAGRAPHS = [
    "The old lighthouse stood at the end of the harbour wall. Every evening the keeper climbed the "
    "stairs, lit the lamp and watched the fishing boats come home before the tide turned. In winter "
    "the storms came from the north, and the waves broke over the wall so high that the spray "
    "reached the lamp room windows.",
    "Our team meets every Monday at nine to plan the week. Each person says what they finished, "
    "what they will work on next, and what is blocking them. The meeting lasts fifteen minutes, "
    "and notes are posted in the shared channel before lunch so that nobody needs to attend to "
    "stay informed.",
    "To install the package, download the archive, unpack it into a folder of your choice, and run "
    "the setup script from that folder. The script checks your system, installs the libraries it "
    "needs, and writes a configuration file to your home directory. Restart your terminal when it "
    "finishes.",
]
EDITS = [f"Rewrite this paragraph, changing the word '{w}' to '{r}' and nothing else:\n\n{p}"
         for p, (w, r) in zip(PARAGRAPHS, [("evening", "morning"), ("Monday", "Tuesday"), ("archive", "bundle")])]
OPENS = ["Write a short story about a cat who learns to fly.",
         "Explain why the sky is blue to a ten year old.",
         "Give me five ideas for a birthday party for a book lover."]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_seconds(pid):
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def start(kind, tmp):
    port = free_port()
    if kind.startswith("turnpike"):
        config = os.path.join(tmp, f"{kind}.toml")
        lines = ["[server]", f'listen = "127.0.0.1:{port}"', "[auth]", 'mode = "none"', "[[engines]]",
                 'name = "default"', f'plugin = "{plugin}"', "[engines.config]", "[[engines.config.models]]",
                 'id = "model"', f'path = "{gguf}"', 'device = "cpu"']
        if kind == "turnpike-drafts":
            extra = os.environ.get("SPECULATIVE_EXTRA", "")
            lines.append(f"speculative = {{ tokens = {DRAFT}{extra} }}")
        elif kind == "turnpike-self":
            lines.append(f"speculative = {{ tokens = {DRAFT}, draft_layers = {SELF_LAYERS} }}")
        elif kind == "turnpike-model":
            lines.append(f'speculative = {{ tokens = {DRAFT}, draft_model = "{DRAFT_MODEL}", confidence = {P_MIN} }}')
        open(config, "w").write("\n".join(lines) + "\n")
        env = dict(os.environ, TURNPIKE_CACHE_DIR=os.path.join(tmp, "cache"))
        proc = subprocess.Popen([turnpike, "serve", "--config", config], stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, env=env)
    else:
        args = [llama_server, "-m", gguf, "--host", "127.0.0.1", "--port", str(port), "-t", str(os.cpu_count()),
                "-np", "1", "-c", "4096", "--no-webui", "--jinja"]
        if kind == "llama-drafts":
            # Its lookup sized as Turnpike's: the last 3 tokens looked up, DRAFT tokens drafted.
            args += ["--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", "3",
                     "--spec-ngram-simple-size-m", str(DRAFT)]
        if kind == "llama-model":
            # Its draft model, with drafts ending below the same probability as Turnpike's.
            args += ["-md", DRAFT_MODEL, "--spec-type", "draft-simple", "--spec-draft-n-max", str(DRAFT),
                     "--spec-draft-n-min", "0", "--spec-draft-p-min", str(P_MIN)]
        proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    for _ in range(600):
        try:
            with urllib.request.urlopen(f"{base}/v1/models", timeout=1) as r:
                if r.status == 200:
                    break
        except OSError:
            time.sleep(0.1)
    return proc, base


def chat(base, content, extra=None):
    """Seconds to the first token and to the end, and completion tokens."""
    body = {"model": "model", "messages": [{"role": "user", "content": content}], "max_tokens": MAX_TOKENS,
            "temperature": 0, "stream": True, "stream_options": {"include_usage": True}, **(extra or {})}
    req = urllib.request.Request(f"{base}/v1/chat/completions", json.dumps(body).encode(),
                                 {"content-type": "application/json"})
    start = time.perf_counter()
    first, tokens, chunks = None, None, 0
    with urllib.request.urlopen(req, timeout=600) as resp:
        for line in resp:
            if not line.startswith(b"data: ") or line.strip() == b"data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
            for choice in chunk.get("choices", []):
                if (choice.get("delta") or {}).get("content"):
                    chunks += 1
                    if first is None:
                        first = time.perf_counter() - start
    end = time.perf_counter() - start
    return first or end, end, tokens if tokens is not None else chunks


KINDS = os.environ.get("KINDS", "turnpike,turnpike-drafts,llama,llama-drafts").split(",")
results = {k: {"edit": [], "open": []} for k in KINDS}
with tempfile.TemporaryDirectory() as tmp:
    for round_ in range(ROUNDS):
        order = KINDS if round_ % 2 == 0 else KINDS[::-1]
        for kind in order:
            proc, base = start(kind, tmp)
            try:
                chat(base, "Hello!")
                for workload, prompts in (("edit", EDITS), ("open", OPENS)):
                    for _ in range(REPEATS):
                        for content in prompts:
                            before = cpu_seconds(proc.pid)
                            first, end, tokens = chat(base, content)
                            cpu = cpu_seconds(proc.pid) - before
                            results[kind][workload].append(
                                {"round": round_, "ttft_s": first, "end_s": end, "tokens": tokens, "cpu_s": cpu,
                                 "decode_tokens_per_s": (tokens - 1) / max(end - first, 1e-9)})
            finally:
                proc.terminate()
                proc.wait()


def summary(rows):
    by_round = {}
    for r in rows:
        by_round.setdefault(r["round"], []).append(r)
    rates = [sum(r["tokens"] - 1 for r in rs) / sum(r["end_s"] - r["ttft_s"] for r in rs) for rs in by_round.values()]
    return {"decode_tokens_per_s": statistics.median(rates), "rounds": rates,
            "ttft_ms": statistics.median(r["ttft_s"] for r in rows) * 1000,
            "cpu_s_per_request": statistics.median(r["cpu_s"] for r in rows),
            "tokens_per_request": statistics.median(r["tokens"] for r in rows)}



def paired():
    """Turnpike's drafts over its plain decoding on one server, request by request: each prompt
    decoded plainly (`num_assistant_tokens` 0) and with drafts back to back, which goes first
    alternating, so a host whose speed drifts between the rounds above (each server alone for
    a minute) weighs on both sides alike. Greedy answers are the same either way."""
    with tempfile.TemporaryDirectory() as tmp:
        proc, base = start("turnpike-drafts", tmp)
        try:
            chat(base, "Hello!")
            found = {}
            for workload, prompts in (("edit", EDITS), ("open", OPENS)):
                pairs = []
                for i in range(ROUNDS * REPEATS):
                    for content in prompts:
                        order = [{"num_assistant_tokens": 0}, {}]
                        if (i + len(pairs)) % 2:
                            order.reverse()
                        runs = {}
                        for extra in order:
                            first, end, tokens = chat(base, content, extra)
                            runs["plain" if extra else "drafts"] = (end - first, tokens)
                        pairs.append(runs)
                plain = sum(p["plain"][0] for p in pairs)
                drafts = sum(p["drafts"][0] for p in pairs)
                each = [p["plain"][0] / max(p["drafts"][0], 1e-9) for p in pairs]
                found[workload] = {"requests": len(pairs), "plain_decode_s": plain, "drafts_decode_s": drafts,
                                   "speedup": plain / drafts, "pair_median": statistics.median(each),
                                   "pair_min": min(each), "pair_max": max(each),
                                   "same_tokens": all(p["plain"][1] == p["drafts"][1] for p in pairs)}
            return found
        finally:
            proc.terminate()
            proc.wait()


doc = {"benchmark": "speculative", "model": os.path.basename(gguf), "rounds": ROUNDS, "repeats": REPEATS,
       "draft_tokens": DRAFT, "max_tokens": MAX_TOKENS, "self_layers": SELF_LAYERS,
       "draft_model": os.path.basename(DRAFT_MODEL), "p_min": P_MIN,
       "servers": {k: {w: summary(rows) for w, rows in v.items()} for k, v in results.items()}, "raw": results}
if "turnpike-drafts" in KINDS and os.environ.get("PAIRED", "1") == "1":
    doc["paired"] = paired()
json.dump(doc, open(out, "w"), indent=2)
print(json.dumps(doc["servers"], indent=2))
