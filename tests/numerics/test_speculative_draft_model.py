"""Speculative decoding with a draft model gives exactly the tokens of plain decoding.

SmolLM2-135M-Instruct is served by the real gateway plainly and with drafts from a model:
its own first 10 of 30 layers (self-speculation), and a second copy of the whole model run
as a separate draft model with a confidence threshold. Every answer through the `openai` SDK
(greedy and seeded sampling, streamed and not, stop strings, log probabilities, penalties, a
JSON Schema, many requests at once) must be identical to plain decoding; the counters show
drafts were made and kept, and the draft model's cache is empty once requests end. A request's
`assistant_confidence_threshold` is taken where drafts come from a model and refused where
they cannot carry one; a draft model whose vocabulary differs is refused at start.
"""

import concurrent.futures
import os
import subprocess
import time
from pathlib import Path

import pytest

from test_speculative import BIN, EDIT, GGUF, OPEN, PLUGIN, Gateway, answer

pytestmark = pytest.mark.skipif(not GGUF, reason="TURNPIKE_SMOLLM2_GGUF is not set (tests/run.sh sets it)")

SELF = "{ tokens = 4, draft_layers = 10 }"
MODEL = f'{{ tokens = 6, draft_model = "{GGUF}", confidence = 0.3 }}'


@pytest.fixture(scope="module")
def gateways(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("draft-model")
    started = [Gateway(tmp, "plain", None), Gateway(tmp, "self", SELF), Gateway(tmp, "model", MODEL)]
    yield started
    for gateway in started:
        gateway.close()


CASES = [
    (EDIT, {"max_tokens": 48, "temperature": 0}),
    (EDIT, {"max_tokens": 48, "temperature": 0.8, "seed": 11}),
    (EDIT, {"max_tokens": 48, "temperature": 0, "stop": ["tide"]}),
    (EDIT, {"max_tokens": 32, "temperature": 0, "logprobs": True, "top_logprobs": 2}),
    (OPEN, {"max_tokens": 40, "temperature": 0, "frequency_penalty": 0.5}),
    (OPEN, {"max_tokens": 40, "temperature": 1.0, "top_p": 0.9, "seed": 3}),
]


@pytest.mark.parametrize("content,kwargs", CASES)
def test_answers_drafted_by_a_model_are_the_plain_answers(gateways, content, kwargs):
    plain, *drafting = gateways
    want = answer(plain.chat(content, **kwargs))
    for gateway in drafting:
        got = answer(gateway.chat(content, **kwargs))
        if "stop" in kwargs:
            # Usage counts tokens sent before the gateway's cut landed (timing).
            assert got[:2] == want[:2]
        else:
            assert got == want


def test_drafts_are_made_kept_and_their_cache_emptied(gateways):
    _, self_draft, model = gateways
    fixed = {"num_assistant_tokens": 4}
    for gateway in (self_draft, model):
        before = gateway.stat("spec_drafted_tokens")
        gateway.chat(OPEN, max_tokens=40, temperature=0, extra_body=fixed)
        assert gateway.stat("spec_drafted_tokens") - before >= 4 * 5
        assert gateway.stat("spec_drafted_tokens") >= gateway.stat("spec_accepted_tokens")
        assert gateway.stat("spec_draft_kv_blocks_total") > 0
        assert gateway.stat("spec_draft_kv_blocks_used") == 0
    # The whole model drafting for itself: nearly every greedy draft is kept.
    before = model.stat("spec_accepted_tokens")
    model.chat(OPEN, max_tokens=40, temperature=0, extra_body=fixed)
    assert model.stat("spec_accepted_tokens") - before >= 20


def test_drafts_that_do_not_pay_for_themselves_stop_being_made(gateways):
    """A third of the layers, untrained to exit early, guess far worse than they cost (each
    drafted token is a third of a step, and must also be caught up on): once enough were
    judged, a request that leaves the draft length to the engine drafts nothing."""
    _, self_draft, _ = gateways
    for _ in range(3):
        self_draft.chat(EDIT, max_tokens=40, temperature=0, extra_body={"num_assistant_tokens": 8})
    assert self_draft.stat("spec_drafted_tokens") >= 64
    assert self_draft.stat("spec_acceptance_rate") < 0.3
    before = self_draft.stat("spec_drafted_tokens")
    self_draft.chat(OPEN, max_tokens=40, temperature=0)
    assert self_draft.stat("spec_drafted_tokens") == before


def test_streams_grammars_and_many_requests_at_once_match(gateways):
    plain, self_draft, model = gateways
    for kwargs in ({"max_tokens": 40, "temperature": 0}, {"max_tokens": 40, "temperature": 0.7, "seed": 5}):
        want = plain.streamed(EDIT, **kwargs)
        assert self_draft.streamed(EDIT, **kwargs) == want
        assert model.streamed(EDIT, **kwargs) == want
    schema = {"type": "object", "properties": {"text": {"type": "string"}, "changed": {"type": "boolean"}},
              "required": ["text", "changed"]}
    shaped = {"type": "json_schema", "json_schema": {"name": "t", "schema": schema}}
    want = answer(plain.chat(EDIT, response_format=shaped, max_tokens=60, temperature=0))
    assert answer(model.chat(EDIT, response_format=shaped, max_tokens=60, temperature=0)) == want
    requests = [(EDIT if i % 2 else OPEN, {"max_tokens": 16 + i % 5, "temperature": 0.5 * (i % 3), "seed": i})
                for i in range(12)]

    def run(gateway):
        with concurrent.futures.ThreadPoolExecutor(6) as pool:
            return list(pool.map(lambda r: answer(gateway.chat(r[0], **r[1])), requests))

    want = run(plain)
    assert run(self_draft) == want
    assert run(model) == want
    for _ in range(50):
        if model.stat("spec_draft_kv_blocks_used") == 0:
            break
        time.sleep(0.1)
    assert model.stat("spec_draft_kv_blocks_used") == 0


def test_a_request_sets_its_confidence_where_drafts_come_from_a_model(gateways):
    import openai

    plain, self_draft, model = gateways
    want = answer(plain.chat(OPEN, max_tokens=32, temperature=0))
    for gateway in (self_draft, model):
        for threshold in (0.05, 0.9, 1.0):
            body = {"assistant_confidence_threshold": threshold}
            assert answer(gateway.chat(OPEN, max_tokens=32, temperature=0, extra_body=body)) == want
    # Sure of nothing: a threshold of 1 drafts (almost) nothing, a low one drafts freely.
    before = self_draft.stat("spec_drafted_tokens")
    self_draft.chat(OPEN, max_tokens=32, temperature=0, extra_body={"assistant_confidence_threshold": 0.01})
    low = self_draft.stat("spec_drafted_tokens") - before
    before = self_draft.stat("spec_drafted_tokens")
    self_draft.chat(OPEN, max_tokens=32, temperature=0, extra_body={"assistant_confidence_threshold": 1.0})
    high = self_draft.stat("spec_drafted_tokens") - before
    assert low > high, (low, high)
    for gateway, body, param in [
        (plain, {"assistant_confidence_threshold": 0.5}, "assistant_confidence_threshold"),
        (model, {"assistant_confidence_threshold": 0}, "assistant_confidence_threshold"),
        (model, {"assistant_confidence_threshold": 1.5}, "assistant_confidence_threshold"),
        (model, {"assistant_confidence_threshold": 0.5, "num_assistant_tokens": 3}, "assistant_confidence_threshold"),
    ]:
        with pytest.raises(openai.BadRequestError) as refused:
            gateway.chat(OPEN, max_tokens=8, extra_body=body)
        assert refused.value.body["param"] == param, refused.value.body


def test_a_draft_model_with_another_vocabulary_is_refused_at_start(tmp_path):
    other = tmp_path / "tiny"
    subprocess.run([str(BIN), "make-model", "--preset", "tiny", "--out", str(other)], check=True,
                   stdout=subprocess.DEVNULL)
    config = tmp_path / "bad.toml"
    config.write_text("\n".join([
        "[server]", 'listen = "127.0.0.1:0"', "[auth]", 'mode = "none"', "[[engines]]", 'name = "default"',
        f'plugin = "{PLUGIN}"', "[[engines.config.models]]", 'id = "smollm2"', f'path = "{GGUF}"',
        'device = "cpu"', f'speculative = {{ draft_model = "{other}" }}']) + "\n")
    run = subprocess.run([str(BIN), "serve", "--config", str(config)], capture_output=True, text=True,
                         timeout=120, env=dict(os.environ, TURNPIKE_CACHE_DIR=str(tmp_path / "cache")))
    assert run.returncode != 0
    assert "draft model" in run.stderr and "vocabulary" in run.stderr, run.stderr[-2000:]
    for bad, says in [("{ draft_layers = 0 }", "draft_layers"), ("{ draft_layers = 99 }", "draft_layers"),
                      ("{ confidence = 0.5 }", "confidence")]:
        config.write_text(config.read_text().rsplit("speculative", 1)[0] + f"speculative = {bad}\n")
        run = subprocess.run([str(BIN), "serve", "--config", str(config)], capture_output=True, text=True,
                             timeout=120, env=dict(os.environ, TURNPIKE_CACHE_DIR=str(tmp_path / "cache")))
        assert run.returncode != 0 and says in run.stderr, run.stderr[-2000:]


def test_speculation_settings_travel_through_the_upstream_plugin_to_a_node(gateways, tmp_path):
    """A front serving the model through the upstream plugin (`speculative = true`) in front
    of the draft-model node: a request's draft length and threshold reach the node's engine."""
    import json

    import openai
    from tokenizers import Tokenizer

    plain, _, node = gateways
    upstream = Path(os.environ.get("TURNPIKE_UPSTREAM", BIN.parent / "libturnpike_upstream.so"))
    folder = tmp_path / "smollm2"
    subprocess.run([str(BIN.parent / "turnpike-gguf"), "tokenizer", GGUF, str(folder)], check=True,
                   stdout=subprocess.DEVNULL)
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    eos = tokenizer.token_to_id(json.loads((folder / "tokenizer_config.json").read_text())["eos_token"])
    config = tmp_path / "front.toml"
    config.write_text("\n".join([
        "[server]", 'listen = "127.0.0.1:0"', "[auth]", 'mode = "none"', "[[engines]]", 'name = "fleet"',
        f'plugin = "{upstream}"', "[engines.config]", "[[engines.config.models]]", 'id = "smollm2"',
        'protocol = "turnpike"', f'endpoints = ["{node.base}"]', f"vocab_size = {tokenizer.get_vocab_size()}",
        f"eos_token_ids = [{eos}]", "max_context = 4096", "speculative = true",
        "[[models]]", 'name = "smollm2"', 'engine = "fleet"', f'folder = "{folder}"']) + "\n")
    front = subprocess.Popen([str(BIN), "serve", "--config", str(config)], stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL, text=True, env=dict(os.environ, TURNPIKE_CACHE_DIR=str(tmp_path)))
    try:
        line = front.stdout.readline()
        assert "listening on" in line, line
        client = openai.OpenAI(base_url=line.split()[-1] + "/v1", api_key="unused", max_retries=0)

        def ask(**body):
            r = client.chat.completions.create(model="smollm2", messages=[{"role": "user", "content": OPEN}],
                                               max_tokens=24, temperature=0, extra_body=body)
            return r.choices[0].message.content

        want = answer(plain.chat(OPEN, max_tokens=24, temperature=0))[0]
        before = node.stat("spec_drafted_tokens")
        assert ask(num_assistant_tokens=0) == want
        assert node.stat("spec_drafted_tokens") == before, "zero drafts reached the node"
        assert ask(num_assistant_tokens=5) == want
        assert node.stat("spec_drafted_tokens") - before >= 5 * 4, "five per step"
        before = node.stat("spec_drafted_tokens")
        assert ask(assistant_confidence_threshold=1.0) == want
        sure = node.stat("spec_drafted_tokens") - before
        before = node.stat("spec_drafted_tokens")
        assert ask(assistant_confidence_threshold=0.01) == want
        assert node.stat("spec_drafted_tokens") - before > sure, "the threshold reached the node"
    finally:
        front.terminate()
        front.wait(timeout=30)
