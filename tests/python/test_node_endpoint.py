"""Turnpike as an engine node: `POST /generate` (SGLang's native, token-level API) on the real
binary with the simulator, as a router or Turnpike's upstream plugin calls it: token ids in,
token ids (and log probabilities) out, streamed and not, with the gateway's limits and errors."""

import json

import httpx


def generate(gateway, body, stream=False):
    body = dict(body, stream=stream)
    if not stream:
        return httpx.post(f"{gateway}/generate", json=body, timeout=30)
    chunks = []
    with httpx.stream("POST", f"{gateway}/generate", json=body, timeout=30) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunks.append(json.loads(line[6:]))
            elif line == "data: [DONE]":
                chunks.append("[DONE]")
    return chunks


def test_tokens_in_tokens_out(gateway):
    body = {"model": "echo", "input_ids": [10, 11, 12, 13], "sampling_params": {"max_new_tokens": 3},
            "rid": "req-1", "router_hint": {"ignored": True}}
    r = generate(gateway, body)
    assert r.status_code == 200, r.text
    out = r.json()
    # The echo model answers with its prompt's tokens.
    assert out["output_ids"] == [10, 11, 12]
    meta = out["meta_info"]
    assert meta["id"] == "req-1" and meta["prompt_tokens"] == 4 and meta["completion_tokens"] == 3
    assert meta["finish_reason"] == {"type": "length", "length": 3}
    chunks = generate(gateway, body, stream=True)
    assert chunks[-1] == "[DONE]"
    ids = [i for c in chunks[:-1] for i in c["output_ids"]]
    assert ids == [10, 11, 12]
    assert chunks[-2]["meta_info"]["finish_reason"]["type"] == "length"


def test_choices_logprobs_and_stops(gateway):
    body = {"model": "chat", "input_ids": [20, 21], "return_logprob": True, "top_logprobs_num": 2,
            "sampling_params": {"max_new_tokens": 6, "n": 2, "ignore_eos": True, "seed": 3}}
    both = generate(gateway, body).json()
    assert [c["index"] for c in both] == [0, 1]
    for c in both:
        assert len(c["output_ids"]) == 6 == len(c["meta_info"]["output_token_logprobs"])
        lp, token, _ = c["meta_info"]["output_token_logprobs"][0]
        assert token == c["output_ids"][0] and lp <= 0
        assert len(c["meta_info"]["output_top_logprobs"][0]) == 2
    # The same seed streams the same tokens, by index.
    streamed = {0: [], 1: []}
    for c in generate(gateway, body, stream=True)[:-1]:
        streamed[c["index"]] += c["output_ids"]
    assert [streamed[0], streamed[1]] == [both[0]["output_ids"], both[1]["output_ids"]]
    # A stop id ends a choice with what matched it.
    plain = {"model": "chat", "input_ids": [20, 21], "sampling_params": {"max_new_tokens": 6, "seed": 3,
                                                                         "ignore_eos": True}}
    stop = generate(gateway, plain).json()["output_ids"][2]
    plain["sampling_params"]["stop_token_ids"] = [stop]
    one = generate(gateway, plain).json()
    assert one["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}


def test_bad_requests_are_clear_errors(gateway):
    cases = [
        ({"model": "chat", "text": "hello"}, 400, "text"),
        ({"model": "chat"}, 400, "input_ids"),
        ({"model": "chat", "input_ids": [10**7]}, 400, "input_ids[0]"),
        ({"model": "nope", "input_ids": [1]}, 404, "model"),
        ({"model": "chat", "input_ids": [1], "sampling_params": {"ebnf": "root ::= \"a\""}}, 400,
         "sampling_params.ebnf"),
    ]
    for body, status, param in cases:
        r = generate(gateway, body)
        assert r.status_code == status, (body, r.text)
        assert r.json()["error"]["param"] == param, r.text
