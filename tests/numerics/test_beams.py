"""Beam search (`best_of` above `n`) against Hugging Face `transformers`' `generate(num_beams=…)`.

A random-weight model from `turnpike make-model` is served by the real gateway on the default
engine's CPU device (exact activations) and asked through the `openai` SDK for completions
with `best_of` beams, `n` (below `best_of`) results and a `length_penalty`; `transformers` runs beam search on the
same weights with `num_beams=best_of`, `num_return_sequences=n`. The model's end tokens are set
to a few that its beams reach, so beams end by an end token as well as by length.
Each returned choice must be the same sequence in the same place, end the same way, and carry
the same per-token log-probabilities. The gateway's refusals (a stream, `n` above `best_of`, a
width the model does not allow, a grammar) and the KV cache after many beam requests, some
cancelled, are checked on the same server.
"""

import concurrent.futures
import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(os.environ.get("TURNPIKE_BIN", ROOT / "target/debug/turnpike"))
PLUGIN = Path(os.environ.get("TURNPIKE_CUDA", ROOT / "target/debug/libturnpike_cuda.so"))
END_TOKENS = [388, 592, 403, 4]
MAX_WIDTH = 8

torch.set_num_threads(2)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("beams") / "tiny"
    subprocess.run([str(BIN), "make-model", "--preset", "tiny", "--out", str(out)], check=True,
                   stdout=subprocess.DEVNULL)
    for name in ("config.json", "generation_config.json"):
        doc = json.loads((out / name).read_text())
        doc["eos_token_id"] = END_TOKENS
        (out / name).write_text(json.dumps(doc))
    return out


@pytest.fixture(scope="module")
def hf(model_dir):
    return AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32,
                                                attn_implementation="eager").eval()


@pytest.fixture(scope="module")
def tokenizer(model_dir):
    return PreTrainedTokenizerFast(tokenizer_file=str(model_dir / "tokenizer.json"))


@pytest.fixture(scope="module")
def server(model_dir, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("beam-server")
    config = tmp / "turnpike.toml"
    config.write_text("\n".join([
        "[server]", 'listen = "127.0.0.1:0"', "[auth]", 'mode = "none"', "[[engines]]", 'name = "default"',
        f'plugin = "{PLUGIN}"', "[engines.config]", "seed = 7", "[[engines.config.models]]", 'id = "tiny"',
        f'path = "{model_dir}"', 'device = "cpu"', 'cpu_activations = "exact"', f"max_n = {MAX_WIDTH}",
        "max_running = 64", "max_batch_tokens = 512"]) + "\n")
    env = dict(os.environ, TURNPIKE_CACHE_DIR=str(tmp / "cache"))
    process = subprocess.Popen([str(BIN), "serve", "--config", str(config)], stdout=subprocess.PIPE,
                               stderr=subprocess.DEVNULL, text=True, env=env)
    line = process.stdout.readline()
    assert "listening on" in line, line
    base = line.split()[-1]
    yield base
    process.terminate()
    process.wait(timeout=30)


@pytest.fixture(scope="module")
def client(server):
    import openai

    return openai.OpenAI(base_url=server + "/v1", api_key="unused", max_retries=0)


def prompt(seed: int, length: int = 11):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(5, 668, (length,), generator=g).tolist()


def hf_beams(hf, ids, width, n, max_tokens, length_penalty):
    out = hf.generate(torch.tensor([ids]), num_beams=width, num_return_sequences=n, max_new_tokens=max_tokens,
                      do_sample=False, length_penalty=length_penalty, early_stopping=False,
                      output_scores=True, return_dict_in_generate=True, pad_token_id=0)
    steps = hf.compute_transition_scores(out.sequences, out.scores, out.beam_indices, normalize_logits=False)
    results = []
    for i in range(n):
        generated = out.sequences[i, len(ids):].tolist()
        scores = steps[i].tolist()
        length = int((out.beam_indices[i] >= 0).sum())
        generated, scores = generated[:length], scores[:length]
        ended = bool(generated) and generated[-1] in END_TOKENS
        results.append({"tokens": generated[:-1] if ended else generated,
                        "logprobs": scores[:-1] if ended else scores,
                        "finish": "stop" if ended else "length",
                        "score": float(out.sequences_scores[i])})
    return results


def assert_same_choices(ours, theirs, n, tokenizer):
    """Our `n` choices are the reference's, in order: text, finish and each token's log-probability."""
    assert len(ours.choices) == n
    for choice, want in zip(sorted(ours.choices, key=lambda c: c.index), theirs):
        assert choice.text == tokenizer.decode(want["tokens"], skip_special_tokens=True), f"choice {choice.index}"
        assert choice.finish_reason == want["finish"], f"choice {choice.index}"
        got = choice.logprobs.token_logprobs
        assert len(got) == len(want["logprobs"])
        assert max((abs(a - b) for a, b in zip(got, want["logprobs"])), default=0.0) < 1e-3


CASES = [  # width, n, max_tokens, length_penalty, prompt seed
    (2, 1, 12, 1.0, 1),
    (3, 2, 16, 0.0, 2),
    (3, 1, 12, 2.0, 3),
    (4, 1, 20, 1.0, 4),
    (5, 4, 14, -1.0, 5),
    (5, 3, 16, 1.0, 6),
    (6, 2, 12, 0.5, 7),
    (8, 7, 12, 1.0, 8),
    (8, 3, 24, 1.5, 9),
]


@pytest.mark.parametrize("width,n,max_tokens,penalty,seed", CASES,
                         ids=[f"w{c[0]}-n{c[1]}-lp{c[3]}" for c in CASES])
def test_the_same_beams_as_transformers(client, hf, tokenizer, width, n, max_tokens, penalty, seed):
    ids = prompt(seed)
    theirs = hf_beams(hf, ids, width, n, max_tokens, penalty)
    ours = client.completions.create(model="tiny", prompt=ids, best_of=width, n=n, max_tokens=max_tokens,
                                     logprobs=0, extra_body={"length_penalty": penalty})
    assert_same_choices(ours, theirs, n, tokenizer)
    assert ours.usage.completion_tokens == sum(len(w["tokens"]) + (w["finish"] == "stop") for w in theirs)


GROUP_CASES = [  # width, groups, n, max_tokens, length_penalty, diversity_penalty, prompt seed
    (4, 2, 2, 12, 1.0, 1.0, 11),
    (6, 3, 3, 10, 1.0, 0.5, 12),
    (8, 4, 2, 14, 0.0, 2.0, 13),
    (4, 4, 3, 12, 1.0, 1.0, 14),
    (6, 2, 5, 16, 2.0, 1.5, 15),
]
GROUP_REFERENCE = os.environ.get("TURNPIKE_GROUP_BEAMS_REFERENCE")


@pytest.fixture(scope="module")
def group_reference(model_dir):
    """transformers' group beam search on every case, by its last release that has it."""
    if not GROUP_REFERENCE:
        pytest.skip("TURNPIKE_GROUP_BEAMS_REFERENCE is not set (tests/run.sh sets it)")
    job = {"model": str(model_dir), "end_tokens": END_TOKENS,
           "cases": [{"ids": prompt(seed), "width": w, "groups": g, "n": n, "max_tokens": m, "length_penalty": lp,
                      "diversity_penalty": dp} for w, g, n, m, lp, dp, seed in GROUP_CASES]}
    env = dict(os.environ, PYTHONPATH=GROUP_REFERENCE)
    done = subprocess.run([sys.executable, str(Path(__file__).with_name("group_beams_reference.py"))],
                          input=json.dumps(job), capture_output=True, text=True, env=env, check=True)
    reply = json.loads(done.stdout)
    assert reply["version"].startswith("4.55"), reply["version"]
    return reply["results"]


@pytest.mark.parametrize("case", range(len(GROUP_CASES)),
                         ids=[f"w{c[0]}-g{c[1]}-n{c[2]}-dp{c[5]}" for c in GROUP_CASES])
def test_diverse_groups_as_transformers(client, tokenizer, group_reference, case):
    width, groups, n, max_tokens, penalty, diversity, seed = GROUP_CASES[case]
    theirs = group_reference[case]
    ours = client.completions.create(model="tiny", prompt=prompt(seed), best_of=width, n=n, max_tokens=max_tokens,
                                     logprobs=0, extra_body={"length_penalty": penalty, "num_beam_groups": groups,
                                                             "diversity_penalty": diversity})
    assert_same_choices(ours, theirs, n, tokenizer)


def test_groups_that_do_not_divide_the_beams_are_refused(client):
    refused = refusal(lambda: client.completions.create(model="tiny", prompt=prompt(40), best_of=6, max_tokens=4,
                                                        extra_body={"num_beam_groups": 4}))
    assert refused["param"] == "num_beam_groups"
    alone = refusal(lambda: client.completions.create(model="tiny", prompt=prompt(40), max_tokens=4,
                                                      extra_body={"num_beam_groups": 2}))
    assert alone["param"] == "num_beam_groups"


def test_ends_by_end_token_are_exercised(hf):
    """The cases above include beams that end on an end token, not only by length."""
    finishes = set()
    for width, n, max_tokens, penalty, seed in CASES:
        finishes.update(r["finish"] for r in hf_beams(hf, prompt(seed), width, n, max_tokens, penalty))
    assert finishes == {"stop", "length"}


def test_chat_takes_best_of_as_an_extension(client):
    reply = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hello"}],
                                           max_tokens=8, n=2, extra_body={"best_of": 4})
    assert len(reply.choices) == 2


def refusal(call):
    import openai

    with pytest.raises(openai.BadRequestError) as raised:
        call()
    return raised.value.body


def test_refusals_name_best_of(client):
    ids = prompt(30)
    streamed = refusal(lambda: list(client.completions.create(model="tiny", prompt=ids, best_of=3, max_tokens=4,
                                                               stream=True)))
    assert streamed["param"] == "best_of" and "stream" in streamed["message"]
    below = refusal(lambda: client.completions.create(model="tiny", prompt=ids, best_of=2, n=3, max_tokens=4))
    assert below["param"] == "best_of"
    wide = refusal(lambda: client.completions.create(model="tiny", prompt=ids, best_of=MAX_WIDTH + 1,
                                                     max_tokens=4))
    assert wide["param"] == "best_of"
    constrained = refusal(lambda: client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=4,
        response_format={"type": "json_object"}, extra_body={"best_of": 2}))
    assert constrained["param"] == "best_of"
    chat_stream = refusal(lambda: list(client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=4, stream=True,
        extra_body={"best_of": 2})))
    assert chat_stream["param"] == "best_of"
    response = refusal(lambda: client.responses.create(model="tiny", input="hi", max_output_tokens=4,
                                                      extra_body={"best_of": 2}))
    assert response["param"] == "best_of"


def engine_stat(server, name):
    text = urllib.request.urlopen(f"{server}/metrics", timeout=10).read().decode()
    found = re.search(rf'turnpike_engine_stat\{{[^}}]*stat="{name}"[^}}]*\}} (\S+)', text)
    assert found, f"no engine stat {name}"
    return float(found.group(1))


def test_no_block_is_held_after_many_beam_requests_some_cancelled(client, server):
    import openai

    def one(i):
        # Every fourth client gives up almost at once: the engine cancels its search.
        impatient = client.with_options(timeout=0.02 if i % 4 == 0 else 60)
        try:
            impatient.completions.create(model="tiny", prompt=prompt(100 + i, 5 + i % 23), best_of=2 + i % 7,
                                         n=1 + i % 2, max_tokens=6 + i % 17,
                                         extra_body={"length_penalty": (i % 5) - 1.0})
        except openai.APITimeoutError:
            pass

    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        list(pool.map(one, range(120)))
    client.completions.create(model="tiny", prompt=prompt(999), max_tokens=2)
    for _ in range(100):
        if engine_stat(server, "kv_blocks_used") == 0:
            break
        time.sleep(0.1)
    assert engine_stat(server, "kv_blocks_used") == 0
