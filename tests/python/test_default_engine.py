"""The real gateway serving the `tiny` model through the default engine's plugin
(`libturnpike_cuda.so`, CPU device), driven by the official `openai` SDK."""

import os
import re
import subprocess
from pathlib import Path

import openai
import pytest

from conftest import BIN, ROOT
from tenancy_support import Gateway

PLUGIN = Path(os.environ.get("TURNPIKE_CUDA", ROOT / "target/debug/libturnpike_cuda.so"))


@pytest.fixture(scope="module")
def tiny_gateway(tmp_path_factory):
    work = tmp_path_factory.mktemp("default-engine")
    model = work / "tiny"
    subprocess.run([str(BIN), "make-model", "--preset", "tiny", "--out", str(model)], check=True, capture_output=True)
    config = "\n".join(
        [
            "[server]",
            'listen = "127.0.0.1:0"',
            "[auth]",
            'mode = "none"',
            "[[engines]]",
            'name = "default"',
            f'plugin = "{PLUGIN}"',
            "[engines.config]",
            "seed = 5",
            "[[engines.config.models]]",
            'id = "tiny"',
            f'path = "{model}"',
            'device = "cpu"',
            "threads = 2",
            "[[models]]",
            'name = "tiny"',
            'engine = "default"',
            f'folder = "{model}"',
            "",
        ]
    )
    running = Gateway(work, config, {})
    yield running.base
    running.stop()


@pytest.fixture
def tiny(tiny_gateway):
    return openai.OpenAI(base_url=f"{tiny_gateway}/v1", api_key="sk-unused", max_retries=0)


def test_models_lists_tiny(tiny):
    assert [m.id for m in tiny.models.list().data] == ["tiny"]


def test_chat_answers_and_counts_tokens(tiny):
    r = tiny.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "Hello there"}], max_tokens=12, temperature=0
    )
    choice = r.choices[0]
    assert choice.finish_reason in ("stop", "length")
    assert r.usage.prompt_tokens > 5
    assert 1 <= r.usage.completion_tokens <= 12
    if choice.finish_reason == "length":
        assert r.usage.completion_tokens == 12


def test_streamed_chat_matches_the_non_streamed_answer(tiny):
    messages = [{"role": "user", "content": "Tell me about the road"}]
    whole = tiny.chat.completions.create(model="tiny", messages=messages, max_tokens=16, temperature=0)
    chunks = list(
        tiny.chat.completions.create(
            model="tiny",
            messages=messages,
            max_tokens=16,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens


def test_completions_with_logprobs(tiny):
    r = tiny.completions.create(model="tiny", prompt="The gateway", max_tokens=6, logprobs=3, temperature=0)
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) >= 1
    for token, logprob, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
        assert logprob <= 0.0
        assert len(top) == 3
        # Greedy: the chosen token is the most likely one.
        assert max(top.values()) == pytest.approx(logprob, abs=1e-5)


def test_embeddings_are_unit_vectors_of_the_hidden_size(tiny):
    r = tiny.embeddings.create(model="tiny", input=["a road", "a toll booth"])
    assert len(r.data) == 2
    for item in r.data:
        assert len(item.embedding) == 64
        assert sum(x * x for x in item.embedding) == pytest.approx(1.0, abs=1e-4)
    assert r.data[0].embedding != r.data[1].embedding
    short = tiny.embeddings.create(model="tiny", input="a road", dimensions=16)
    assert len(short.data[0].embedding) == 16


def test_n_two_gives_two_choices(tiny):
    r = tiny.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "Pick a word"}], n=2, max_tokens=8, seed=3
    )
    assert sorted(c.index for c in r.choices) == [0, 1]
    assert all(c.finish_reason in ("stop", "length") for c in r.choices)


def test_a_seed_reproduces_sampled_text(tiny):
    def ask(seed):
        r = tiny.completions.create(model="tiny", prompt="Once upon", max_tokens=12, temperature=1.0, seed=seed)
        return r.choices[0].text

    assert ask(42) == ask(42)
    assert len({ask(s) for s in (1, 2, 3, 4)}) > 1


def test_a_prompt_longer_than_the_context_is_a_clear_400(tiny):
    with pytest.raises(openai.BadRequestError) as e:
        tiny.completions.create(model="tiny", prompt=[5] * 3000, max_tokens=1)
    assert e.value.status_code == 400


def stat(base, name):
    import urllib.request

    text = urllib.request.urlopen(f"{base}/metrics", timeout=10).read().decode()
    pattern = rf'turnpike_engine_stat\{{[^}}]*stat="{name}"[^}}]*\}} (\S+)'
    found = re.search(pattern, text)
    assert found, f"no turnpike_engine_stat for {name}"
    return float(found.group(1))


def test_a_repeated_prompt_hits_the_prefix_cache_and_metrics_show_the_cache(tiny, tiny_gateway):
    prompt = "The toll road runs along the coast for many miles " * 6
    first = tiny.completions.create(model="tiny", prompt=prompt, max_tokens=2, temperature=0)
    again = tiny.completions.create(model="tiny", prompt=prompt, max_tokens=2, temperature=0)
    assert first.usage.prompt_tokens == again.usage.prompt_tokens > 32
    # Reuse is token-granular: only the last prompt token is computed again.
    cached = again.usage.prompt_tokens_details.cached_tokens
    assert cached == again.usage.prompt_tokens - 1, cached
    assert again.choices[0].text == first.choices[0].text
    assert stat(tiny_gateway, "kv_blocks_total") > 0
    assert stat(tiny_gateway, "prefix_hit_rate") > 0
    assert stat(tiny_gateway, "kv_blocks_cached") >= 2
    # The load figures the field's routers read, in vLLM's names.
    import urllib.request

    text = urllib.request.urlopen(f"{tiny_gateway}/metrics", timeout=10).read().decode()
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
                 "vllm:gpu_cache_usage_perc"):
        assert re.search(rf'^{name}\{{model_name="tiny"\}} \S+$', text, re.M), name


def test_ready_reports_the_engine_healthy(tiny_gateway):
    import json
    import urllib.request

    with urllib.request.urlopen(f"{tiny_gateway}/ready", timeout=10) as r:
        assert r.status == 200
        json.loads(r.read())


def engine_requests(base, outcome):
    import urllib.request

    text = urllib.request.urlopen(f"{base}/metrics", timeout=10).read().decode()
    for line in text.splitlines():
        if line.startswith("turnpike_engine_requests_total{") and 'engine="default"' in line and f'outcome="{outcome}"' in line:
            return int(float(line.rsplit(" ", 1)[1]))
    return 0


def test_each_request_counts_once_in_the_engine_counters(tiny, tiny_gateway):
    before = engine_requests(tiny_gateway, "completed")
    for _ in range(3):
        tiny.completions.create(model="tiny", prompt="Count me once", max_tokens=2, temperature=0)
    assert engine_requests(tiny_gateway, "completed") - before == 3


def test_a_model_folders_generation_config_sets_what_a_request_leaves_unset(tmp_path):
    import json

    model = tmp_path / "tiny"
    subprocess.run([str(BIN), "make-model", "--preset", "tiny", "--out", str(model)], check=True, capture_output=True)
    generation = model / "generation_config.json"
    recommended = json.loads(generation.read_text()) if generation.exists() else {}
    # The makers recommend greedy decoding (as some code models do).
    generation.write_text(json.dumps({**recommended, "do_sample": False, "temperature": 0.0}))
    config = "\n".join(["[server]", 'listen = "127.0.0.1:0"', "[auth]", 'mode = "none"', "[[engines]]",
                        'name = "default"', f'plugin = "{PLUGIN}"', "[engines.config]", "[[engines.config.models]]",
                        'id = "tiny"', f'path = "{model}"', 'device = "cpu"', "threads = 2", "[[models]]",
                        'name = "tiny"', 'engine = "default"', f'folder = "{model}"', ""])
    running = Gateway(tmp_path, config, {})
    try:
        client = openai.OpenAI(base_url=f"{running.base}/v1", api_key="sk-unused", max_retries=0)
        ask = [{"role": "user", "content": "Tell me something"}]

        def say(**kw) -> str:
            return client.chat.completions.create(model="tiny", messages=ask, max_tokens=24, **kw).choices[0].message.content

        greedy = say(temperature=0)
        assert say() == greedy and say() == greedy, "an unset temperature takes the model's 0"
        sampled = {say(temperature=1.5, seed=s) for s in range(4)}
        assert sampled != {greedy}, "a request's own temperature still wins"
    finally:
        running.stop()
