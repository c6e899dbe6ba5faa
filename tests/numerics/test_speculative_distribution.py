"""Speculative decoding leaves the sampled distribution as it was.

A tiny random-weight model from `turnpike make-model` is served by the real gateway twice on
the default engine's CPU device: plainly, and drafting by prompt lookup. Each answers the same
fixed prompt 2,000 times, 10 sampled tokens each (temperature 1 with top-p, top-k and a
presence penalty, so the filters and penalties are in play), every request with its own seed,
different between the two servers, so the two samples are independent. The 20,000 tokens of
each are compared position by position with a chi-square test of homogeneity (scipy, which
the numerics venv has through sentence-transformers): every position must pass at p > 0.01
(Bonferroni over the positions). The drafting server's counters show that drafts were made
and kept, so the test is not vacuous.
"""

import concurrent.futures
import os
import re
import subprocess
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from scipy.stats import chi2_contingency

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(os.environ.get("TURNPIKE_BIN", ROOT / "target/debug/turnpike"))
PLUGIN = Path(os.environ.get("TURNPIKE_CUDA", ROOT / "target/debug/libturnpike_cuda.so"))
REQUESTS, TOKENS = 2000, 10
# Repeats itself, so prompt lookup finds n-grams to draft from.
PROMPT = [17, 42, 99, 17, 42, 99, 17, 42, 99, 250, 17, 42]
SAMPLING = {"temperature": 1.0, "top_p": 0.9, "presence_penalty": 0.4}


class Server:
    def __init__(self, tmp: Path, model: Path, name: str, speculative: str | None):
        config = tmp / f"{name}.toml"
        lines = ["[server]", 'listen = "127.0.0.1:0"', "[auth]", 'mode = "none"', "[[engines]]",
                 'name = "default"', f'plugin = "{PLUGIN}"', "[engines.config]", "seed = 3",
                 "[[engines.config.models]]", 'id = "tiny"', f'path = "{model}"', 'device = "cpu"',
                 'cpu_activations = "exact"', "max_running = 16"]
        if speculative:
            lines.append(f"speculative = {speculative}")
        config.write_text("\n".join(lines) + "\n")
        env = dict(os.environ, TURNPIKE_CACHE_DIR=str(tmp / f"{name}-cache"))
        self.process = subprocess.Popen([str(BIN), "serve", "--config", str(config)], stdout=subprocess.PIPE,
                                        stderr=subprocess.DEVNULL, text=True, env=env)
        line = self.process.stdout.readline()
        assert "listening on" in line, line
        self.base = line.split()[-1]
        import openai

        self.client = openai.OpenAI(base_url=self.base + "/v1", api_key="unused", max_retries=0)

    def tokens(self, seed: int) -> list[int]:
        reply = self.client.completions.create(model="tiny", prompt=PROMPT, max_tokens=TOKENS, seed=seed,
                                               logprobs=0, extra_body={"top_k": 8, "ignore_eos": True},
                                               **SAMPLING)
        # Token strings stand for ids: the same id always renders the same.
        return reply.choices[0].logprobs.tokens

    def stat(self, name: str) -> float:
        text = urllib.request.urlopen(f"{self.base}/metrics", timeout=10).read().decode()
        found = re.search(rf'turnpike_engine_stat\{{[^}}]*stat="{name}"[^}}]*\}} (\S+)', text)
        return float(found.group(1)) if found else 0.0

    def close(self):
        self.process.terminate()
        self.process.wait(timeout=30)


def sample(server: Server, first_seed: int) -> list[list[str]]:
    # Four at a time: speculation backs off above its `max_running`.
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        return list(pool.map(server.tokens, range(first_seed, first_seed + REQUESTS)))


def test_drafting_keeps_the_distribution_of_every_position(tmp_path):
    model = tmp_path / "tiny"
    subprocess.run([str(BIN), "make-model", "--preset", "tiny", "--out", str(model)], check=True,
                   stdout=subprocess.DEVNULL)
    plain = Server(tmp_path, model, "plain", None)
    drafting = Server(tmp_path, model, "drafting", "{ tokens = 4, max_running = 8 }")
    try:
        ours = sample(plain, 1)
        theirs = sample(drafting, 1_000_001)
        drafted, accepted = drafting.stat("spec_drafted_tokens"), drafting.stat("spec_accepted_tokens")
    finally:
        plain.close()
        drafting.close()
    assert drafted > 1000 and accepted > 500, (drafted, accepted)
    assert all(len(t) == TOKENS for t in ours + theirs)
    for position in range(TOKENS):
        a = [t[position] for t in ours]
        b = [t[position] for t in theirs]
        categories = sorted(set(a) | set(b))
        table = np.array([[a.count(c) for c in categories], [b.count(c) for c in categories]])
        # Pool the rare tokens (expected counts under 5 break the test's approximation).
        common = table.sum(axis=0) >= 10
        pooled = np.column_stack([table[:, common], table[:, ~common].sum(axis=1)])
        pooled = pooled[:, pooled.sum(axis=0) > 0]
        if pooled.shape[1] < 2:
            continue
        p = chi2_contingency(pooled).pvalue
        assert p > 0.01 / TOKENS, f"position {position}: p = {p:.2e}"
