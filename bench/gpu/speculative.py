"""Speculative decoding and beam search on the CUDA device, end to end through the real gateway.

1. Exactness, on the `tiny` preset: greedy and seeded answers with drafts from prompt lookup,
   from the model's own first layer (self-speculation) and from the model itself as a draft
   model must equal the answers of plain decoding on the same device, token for token (the
   drafted steps read their logits back and are checked on the host; the plain steps sample
   on the GPU, so the greedy answers must agree, and the seeded ones are compared too). Beam
   search (best_of 4, n 2) must return two distinct finished choices.
2. Speed at batch 1 on the Llama-3.2-1B-shaped preset (random weights): decode tokens/s with
   each drafter over plain decoding, and each drafter's acceptance. Random weights settle into
   loops that prompt lookup copies, and the model drafting for itself is always right, so
   these figures bound what verification costs and gains on this GPU; they are not a
   workload's speedup.
  python bench/gpu/speculative.py --dist bench/gpu/dist --work DIR --out bench/results/gpu-speculative.json
For a dry run without a GPU: --device cpu --speed-preset tiny."""

import argparse
import json
import pathlib
import re
import subprocess
import time
import urllib.request

import models

parser = argparse.ArgumentParser()
parser.add_argument("--dist", type=pathlib.Path, required=True)
parser.add_argument("--work", type=pathlib.Path, required=True)
parser.add_argument("--out", type=pathlib.Path, required=True)
parser.add_argument("--device", default="cuda")
parser.add_argument("--speed-preset", default="llama-3.2-1b")
args = parser.parse_args()

DRAFTERS = {
    "plain": None,
    "lookup": "{ tokens = 4 }",
    "self": "{ tokens = 4, draft_layers = 1 }",
    "model": "{ tokens = 4, draft_model = \"FOLDER\" }",
}
PROMPTS = ["Fill in the form.", "Repeat after me: one two three, one two three, one two three.",
           "Tell me a story about the sea.", "List the colours of the rainbow twice."]


def post(base, path, body):
    request = urllib.request.Request(f"{base}{path}", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=300) as reply:
        return json.loads(reply.read())


def stat(base, name):
    text = urllib.request.urlopen(f"{base}/metrics", timeout=10).read().decode()
    found = re.search(rf'turnpike_engine_stat\{{[^}}]*stat="{name}"[^}}]*\}} (\S+)', text)
    return float(found.group(1)) if found else 0.0


class Gateway:
    def __init__(self, folder, name, speculative):
        config = args.work / f"speculative-{name}.toml"
        lines = ["[server]", 'listen = "127.0.0.1:0"', "[auth]", 'mode = "none"', "[[engines]]",
                 'name = "default"', f'plugin = "{args.dist.resolve() / "libturnpike_cuda.so"}"', "[engines.config]",
                 "seed = 7", "[[engines.config.models]]", 'id = "m"', f'path = "{folder}"',
                 f'device = "{args.device}"', "max_n = 4", "max_running = 8"]
        if speculative:
            lines.append(f"speculative = {speculative.replace('FOLDER', str(folder))}")
        config.write_text("\n".join(lines) + "\n")
        self.process = subprocess.Popen([str(args.dist / "turnpike"), "serve", "--config", str(config)],
                                        stdout=subprocess.PIPE, text=True)
        line = self.process.stdout.readline()
        found = re.match(r"turnpike listening on (http://\S+)", line)
        if not found:
            self.close()
            raise SystemExit(f"the gateway ({name}) did not start: {line!r}")
        self.base = found.group(1)

    def chat(self, content, **body):
        reply = post(self.base, "/v1/chat/completions",
                     {"model": "m", "messages": [{"role": "user", "content": content}], **body})
        choice = reply["choices"][0]
        return choice["message"]["content"], choice["finish_reason"], reply["usage"]["completion_tokens"]

    def close(self):
        self.process.terminate()
        self.process.wait(timeout=30)


def exactness():
    folder = models.make(args.dist, args.work, "tiny")
    cases = [(p, {"max_tokens": 64, "temperature": 0}) for p in PROMPTS]
    cases += [(p, {"max_tokens": 48, "temperature": 0.8, "seed": i}) for i, p in enumerate(PROMPTS)]
    answers, checks, failures = {}, [], 0
    for name, speculative in DRAFTERS.items():
        gateway = Gateway(folder, name, speculative)
        try:
            answers[name] = [gateway.chat(p, **body) for p, body in cases]
            drafted, accepted = stat(gateway.base, "spec_drafted_tokens"), stat(gateway.base, "spec_accepted_tokens")
            if name == "plain":
                beams = post(gateway.base, "/v1/completions", {"model": "m", "prompt": PROMPTS[2], "max_tokens": 16,
                                                              "best_of": 4, "n": 2, "temperature": 0})
                texts = [c["text"] for c in beams["choices"]]
                ok = len(texts) == 2 and texts[0] != texts[1]
                failures += not ok
                checks.append({"check": "beams best_of 4 n 2", "ok": ok, "texts": texts})
        finally:
            gateway.close()
        if name != "plain":
            for (prompt, body), got, want in zip(cases, answers[name], answers["plain"]):
                # Sampled answers: the host's sampler and the GPU's draw from the same
                # distribution but need not pick alike, so only greedy ones must be equal.
                ok = got == want or body["temperature"] > 0
                failures += not ok
                checks.append({"check": f"{name} equals plain", "prompt": prompt, "body": body, "ok": ok,
                               "same": got == want, "got": got, "want": want})
            checks.append({"check": f"{name} drafts", "drafted": drafted, "accepted": accepted,
                           "ok": drafted > 0})
            failures += drafted == 0
    return checks, failures


def speed():
    folder = models.make(args.dist, args.work, args.speed_preset)
    figures = {}
    for name, speculative in DRAFTERS.items():
        gateway = Gateway(folder, name, speculative)
        try:
            gateway.chat("Hello", max_tokens=8, temperature=0)
            tokens, seconds = 0, 0.0
            for prompt in PROMPTS:
                start = time.perf_counter()
                tokens += gateway.chat(prompt, max_tokens=128, temperature=0, ignore_eos=True)[2]
                seconds += time.perf_counter() - start
            drafted, accepted = stat(gateway.base, "spec_drafted_tokens"), stat(gateway.base, "spec_accepted_tokens")
        finally:
            gateway.close()
        figures[name] = {"tokens_per_s": tokens / seconds, "tokens": tokens, "drafted": drafted,
                         "accepted": accepted, "acceptance": accepted / max(drafted, 1)}
    for name, f in figures.items():
        f["over_plain"] = f["tokens_per_s"] / figures["plain"]["tokens_per_s"]
    return figures


def main():
    gpu = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                         text=True).stdout.strip() if args.device == "cuda" else "none (CPU dry run)"
    checks, failures = exactness()
    figures = speed()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"device": args.device, "gpu": gpu, "speed_preset": args.speed_preset,
                                    "failures": failures, "speed": figures, "checks": checks}, indent=1) + "\n")
    for name, f in figures.items():
        print(f"{name}: {f['tokens_per_s']:.1f} tokens/s ({f['over_plain']:.2f}x), "
              f"acceptance {f['acceptance']:.2f}")
    print(f"speculative on {args.device}: {len(checks) - failures}/{len(checks)} checks hold")
    raise SystemExit(1 if failures else 0)


main()
