"""Speculative decoding by prompt lookup gives exactly the tokens of plain decoding.

SmolLM2-135M-Instruct (its Q4_1 GGUF; `tests/run.sh` sets TURNPIKE_SMOLLM2_GGUF) is served by
the real gateway twice: plainly, and with the default engine's `speculative` setting. Both
answer the same requests through the `openai` SDK: greedy and seeded sampling, streamed and
not, with stop strings, log probabilities and a grammar, alone and many at once, on text that
repeats its prompt (where drafts are kept) and text that does not, and under a JSON Schema. The drafts are checked by
sampling each position as a plain step would, so the answers must be identical, not merely
alike; the engine's counters show that drafts were made and kept.
"""

import concurrent.futures
import os
import re
import subprocess
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(os.environ.get("TURNPIKE_BIN", ROOT / "target/debug/turnpike"))
PLUGIN = Path(os.environ.get("TURNPIKE_CUDA", ROOT / "target/debug/libturnpike_cuda.so"))
GGUF = os.environ.get("TURNPIKE_SMOLLM2_GGUF")

pytestmark = pytest.mark.skipif(not GGUF, reason="TURNPIKE_SMOLLM2_GGUF is not set (tests/run.sh sets it)")

PARAGRAPH = ("The old lighthouse stood at the end of the harbour wall. Every evening the keeper climbed "
             "the stairs, lit the lamp and watched the fishing boats come home before the tide turned.")
EDIT = f"Rewrite this paragraph, changing 'evening' to 'morning' and nothing else:\n\n{PARAGRAPH}"
OPEN = "Write a short poem about a cat who learns to fly."


class Gateway:
    def __init__(self, tmp: Path, name: str, speculative: str | None, activations: str = "int8"):
        config = tmp / f"{name}.toml"
        lines = ["[server]", 'listen = "127.0.0.1:0"', "[auth]", 'mode = "none"', "[[engines]]",
                 'name = "default"', f'plugin = "{PLUGIN}"', "[engines.config]", "seed = 7",
                 "[[engines.config.models]]", 'id = "smollm2"', f'path = "{GGUF}"', 'device = "cpu"',
                 f'cpu_activations = "{activations}"', "max_running = 16", "max_batch_tokens = 512"]
        if speculative:
            lines.append(f"speculative = {speculative}")
        config.write_text("\n".join(lines) + "\n")
        env = dict(os.environ, TURNPIKE_CACHE_DIR=str(tmp / "cache"))
        self.process = subprocess.Popen([str(BIN), "serve", "--config", str(config)],
                                        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
        line = self.process.stdout.readline()
        assert "listening on" in line, line
        self.base = line.split()[-1]
        import openai

        self.client = openai.OpenAI(base_url=self.base + "/v1", api_key="unused", max_retries=0)

    def chat(self, content: str, **kwargs):
        return self.client.chat.completions.create(model="smollm2", messages=[{"role": "user", "content": content}],
                                                   **kwargs)

    def streamed(self, content: str, **kwargs) -> str:
        chunks = self.chat(content, stream=True, **kwargs)
        return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)

    def stat(self, name: str) -> float:
        """An engine stat; 0 for the speculative counters before any draft (they are
        reported once the model speculates), an error for any other stat that is missing."""
        text = urllib.request.urlopen(f"{self.base}/metrics", timeout=10).read().decode()
        found = re.search(rf'turnpike_engine_stat\{{[^}}]*stat="{name}"[^}}]*\}} (\S+)', text)
        assert found or name.startswith("spec_"), f"no engine stat {name}"
        return float(found.group(1)) if found else 0.0

    def close(self):
        self.process.terminate()
        self.process.wait(timeout=30)


def answer(response):
    choice = response.choices[0]
    logprobs = None
    if choice.logprobs is not None:
        logprobs = [(t.token, round(t.logprob, 4)) for t in choice.logprobs.content]
    return choice.message.content, choice.finish_reason, response.usage.completion_tokens, logprobs


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("speculative")
    plain = Gateway(tmp, "plain", None)
    drafting = Gateway(tmp, "drafting", "{ tokens = 6 }")
    yield plain, drafting
    plain.close()
    drafting.close()


CASES = [
    (EDIT, {"max_tokens": 60, "temperature": 0}),
    (EDIT, {"max_tokens": 60, "temperature": 0.8, "seed": 11}),
    (EDIT, {"max_tokens": 60, "temperature": 0, "stop": ["tide"]}),
    (EDIT, {"max_tokens": 40, "temperature": 0, "logprobs": True, "top_logprobs": 2}),
    (EDIT, {"max_tokens": 40, "temperature": 0, "frequency_penalty": 0.5}),
    (OPEN, {"max_tokens": 40, "temperature": 0}),
    (OPEN, {"max_tokens": 40, "temperature": 1.0, "top_p": 0.9, "seed": 3}),
]


@pytest.mark.parametrize("content,kwargs", CASES)
def test_drafted_answers_are_the_plain_answers(pair, content, kwargs):
    plain, drafting = pair
    got, want = answer(drafting.chat(content, **kwargs)), answer(plain.chat(content, **kwargs))
    if "stop" in kwargs:
        # Usage counts every token the engine sent, also those after the stop string that the
        # gateway cut: how many came before the cut landed depends on timing, drafts or not.
        got, want = got[:2], want[:2]
    assert got == want


def test_drafts_are_made_and_kept_on_text_that_repeats_its_prompt(pair):
    _, drafting = pair
    before = drafting.stat("spec_accepted_tokens")
    drafting.chat(EDIT, max_tokens=60, temperature=0)
    assert drafting.stat("spec_accepted_tokens") - before >= 10
    assert drafting.stat("spec_drafted_tokens") >= drafting.stat("spec_accepted_tokens")


def test_streamed_answers_and_grammars_match(pair):
    plain, drafting = pair
    for kwargs in ({"max_tokens": 60, "temperature": 0}, {"max_tokens": 50, "temperature": 0.7, "seed": 5}):
        assert drafting.streamed(EDIT, **kwargs) == plain.streamed(EDIT, **kwargs)
    # Under a grammar: drafts are sampled under its mask, forced text ends a check.
    schema = {"type": "object", "properties": {"text": {"type": "string"}, "changed": {"type": "boolean"}},
              "required": ["text", "changed"]}
    shaped = {"type": "json_schema", "json_schema": {"name": "t", "schema": schema}}
    before = drafting.stat("spec_accepted_tokens")
    for kwargs in ({"max_tokens": 80, "temperature": 0}, {"max_tokens": 80, "temperature": 0.7, "seed": 4},
                   {"max_tokens": 40, "temperature": 0, "logprobs": True}):
        assert answer(drafting.chat(EDIT, response_format=shaped, **kwargs)) == \
            answer(plain.chat(EDIT, response_format=shaped, **kwargs))
    assert drafting.stat("spec_accepted_tokens") > before


def test_many_requests_at_once_match(pair):
    """More requests than drafts are made for (drafting backs off above four running), with
    prompts of every kind in one batch."""
    plain, drafting = pair
    requests = [(EDIT if i % 2 else OPEN, {"max_tokens": 24 + i % 5, "temperature": 0.5 * (i % 3), "seed": i})
                for i in range(24)]

    def run(gateway):
        with concurrent.futures.ThreadPoolExecutor(12) as pool:
            return list(pool.map(lambda r: answer(gateway.chat(r[0], **r[1])), requests))

    assert run(drafting) == run(plain)


@pytest.mark.parametrize("tokens,activations", [(1, "int8"), (8, "exact")])
def test_every_draft_length_and_both_activation_paths(tmp_path, tokens, activations):
    plain = Gateway(tmp_path, "plain", None, activations)
    drafting = Gateway(tmp_path, "drafting", f"{{ tokens = {tokens} }}", activations)
    try:
        for kwargs in ({"max_tokens": 48, "temperature": 0}, {"max_tokens": 48, "temperature": 0.9, "seed": 2}):
            assert answer(drafting.chat(EDIT, **kwargs)) == answer(plain.chat(EDIT, **kwargs))
        assert drafting.stat("spec_accepted_tokens") > 0
    finally:
        plain.close()
        drafting.close()


def test_a_request_names_its_draft_length_and_a_model_that_does_not_draft_refuses(pair):
    import openai

    plain, drafting = pair
    want = answer(plain.chat(EDIT, max_tokens=40, temperature=0))
    for k in (0, 2, 16):
        assert answer(drafting.chat(EDIT, max_tokens=40, temperature=0, extra_body={"num_assistant_tokens": k})) == want
    # Zero drafts nothing.
    before = drafting.stat("spec_drafted_tokens")
    drafting.chat(EDIT, max_tokens=40, temperature=0, extra_body={"num_assistant_tokens": 0})
    assert drafting.stat("spec_drafted_tokens") == before
    # Plain decoding is all a model that does not speculate does: asking for none is fine.
    assert answer(plain.chat(EDIT, max_tokens=40, temperature=0, extra_body={"num_assistant_tokens": 0})) == want
    for gateway, body, param in [
        (plain, {"num_assistant_tokens": 3}, "num_assistant_tokens"),
        (drafting, {"num_assistant_tokens": 17}, "num_assistant_tokens"),
        (drafting, {"assistant_confidence_threshold": 0.4}, "assistant_confidence_threshold"),
    ]:
        with pytest.raises(openai.BadRequestError) as refused:
            gateway.chat(EDIT, max_tokens=8, extra_body=body)
        assert refused.value.body["param"] == param, refused.value.body


def test_cancelled_drafting_streams_leave_every_block_free(pair):
    """Streams dropped mid-answer while their drafts are being checked: once the engine is
    idle again, no KV block is held."""
    import time

    _, drafting = pair

    def cut(i):
        stream = drafting.chat(EDIT, max_tokens=60, temperature=0.3 * (i % 3), seed=i, stream=True)
        for n, _ in enumerate(stream):
            if n >= 2 + i % 4:
                break
        stream.close()

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        list(pool.map(cut, range(12)))
    drafting.chat(EDIT, max_tokens=8, temperature=0)
    for _ in range(100):
        if drafting.stat("kv_blocks_used") == 0:
            break
        time.sleep(0.1)
    assert drafting.stat("kv_blocks_used") == 0
