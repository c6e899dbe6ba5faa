"""Spend on the real binary: prices per model with effective dates, the cost of each response
(`x-turnpike-cost` and `usage.cost`, streamed and not), and budgets in money per tenant and
per key that hold across two replicas on a real `redis-server`, refusing with 429
`budget_exceeded` and the time the budget resets."""

import json
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta, timezone

import httpx
import openai
import pytest

from tenancy_support import HELLO, Gateway, Redis, chat_body, config_text, make_key, post_once, tenant
from test_admin import Admin, admin_config, audit_secret

NANOS = 10**9

# Per million tokens. `fixed` always generates max_tokens, so its cost is known in advance.
PRICES = {"chat": (0.15, 0.075, 0.60), "fixed": (0.0, 0.0, 8.0)}


def prices(extra: str = "") -> str:
    lines = ["[spend]", 'currency = "USD"']
    for model, (input_, cached, output) in PRICES.items():
        lines += ["[[spend.prices]]", f'model = "{model}"', f"input = {input_}", f"cached_input = {cached}",
                  f"output = {output}"]
    return "\n".join(lines) + "\n" + extra


def state(redis) -> str:
    return f'[state]\nbackend = "redis"\nredis_url = "{redis.url}"\ntimeout_ms = 1000\n'


def expected_nanos(usage: dict, model: str) -> int:
    """The cost the gateway must have computed, in nano-dollars, rounded once."""
    input_, cached_price, output = PRICES[model]
    cached = usage.get("prompt_tokens_details", {}).get("cached_tokens", 0)
    per_million = ((usage["prompt_tokens"] - cached) * round(input_ * NANOS) + cached * round(cached_price * NANOS)
                   + usage["completion_tokens"] * round(output * NANOS))
    return (per_million + 500_000) // 1_000_000


@pytest.fixture
def started(tmp_path):
    gateways = []

    def start(sections: str, env: dict, name: str = "spend"):
        gateway = Gateway(tmp_path, config_text(sections), env, f"{name}{len(gateways)}")
        gateways.append(gateway)
        return gateway

    yield start
    for gateway in gateways:
        gateway.stop()


def test_each_response_carries_its_cost_streamed_or_not(started):
    key = make_key()
    gateway = started(tenant() + prices(), {"ACME_API_KEY": key})
    client = openai.OpenAI(base_url=gateway.url, api_key=key, max_retries=0)
    for _ in range(2):  # the second prompt may be served from the prefix cache
        raw = client.chat.completions.with_raw_response.create(model="chat", messages=HELLO, max_tokens=12)
        usage = raw.parse().usage.model_dump()
        nanos = expected_nanos(usage, "chat")
        assert round(usage["cost"] * NANOS) == nanos, usage
        assert round(float(raw.headers["x-turnpike-cost"]) * NANOS) == nanos, raw.headers
    chunks = list(client.chat.completions.create(
        model="chat", messages=HELLO, max_tokens=12, stream=True, stream_options={"include_usage": True}))
    usage = chunks[-1].usage.model_dump()
    assert round(usage["cost"] * NANOS) == expected_nanos(usage, "chat"), usage
    completion = client.completions.create(model="fixed", prompt="Hello", max_tokens=5)
    assert completion.usage.model_dump()["cost"] == pytest.approx(5 * 8.0 / 1e6)
    response = client.responses.create(model="chat", input="Hello", max_output_tokens=16)
    assert response.usage.model_dump()["cost"] > 0
    # A model without a price costs nothing and says nothing.
    plain = httpx.post(f"{gateway.url}/chat/completions", json=chat_body("long", max_tokens=2),
                       headers={"Authorization": f"Bearer {key}"}, timeout=30)
    assert plain.status_code == 200 and "x-turnpike-cost" not in plain.headers
    assert "cost" not in plain.json()["usage"]


def test_a_price_applies_from_its_date(started):
    key = make_key()
    switch = datetime.now(timezone.utc) + timedelta(seconds=3)
    later = f'[[spend.prices]]\nmodel = "fixed"\nfrom = "{switch.strftime("%Y-%m-%dT%H:%M:%SZ")}"\ninput = 0\noutput = 16.0\n'
    gateway = started(tenant() + prices(later), {"ACME_API_KEY": key})
    body = chat_body("fixed", max_tokens=10)

    def cost() -> str:
        status, headers, _ = post_once(gateway.base, "/v1/chat/completions", key, body)
        assert status == 200
        return headers["x-turnpike-cost"]

    assert cost() == "0.00008"
    time.sleep(max(0.0, (switch - datetime.now(timezone.utc)).total_seconds()) + 1.1)
    assert cost() == "0.00016"


def test_a_budget_shared_by_two_replicas_is_never_passed(tmp_path, started):
    """300 requests at once, streamed and not, half to each replica, against a daily budget that
    fits 50 of them: every admission held its whole cost first, so the budget is never passed,
    exactly 50 fit (`fixed` spends all it held), and each refusal says when the budget resets."""
    redis = Redis(tmp_path / "redis")
    try:
        key = make_key()
        one = 50 * 8.0 / 1e6  # 50 tokens at 8 per million
        budget = f"[tenants.acme.budget]\nper_day = {one * 50.5:.6f}\nsoft = 0.5\n"
        gateways = [started(tenant(budget) + prices() + state(redis), {"ACME_API_KEY": key}) for _ in range(2)]
        body = chat_body("fixed", max_tokens=50)

        def plain(i):
            status, headers, answer = post_once(gateways[i % 2].base, "/v1/chat/completions", key, body)
            cost = answer["usage"]["cost"] if status == 200 else None
            return status, headers, answer, cost

        def streamed(i):
            stream_body = {**body, "stream": True, "stream_options": {"include_usage": True}}
            headers = {"Authorization": f"Bearer {key}"}
            with httpx.stream("POST", f"{gateways[i % 2].url}/chat/completions", json=stream_body,
                              headers=headers, timeout=30) as response:
                if response.status_code != 200:
                    response.read()
                    return response.status_code, dict(response.headers), response.json(), None
                events = [json.loads(line[6:]) for line in response.iter_lines()
                          if line.startswith("data: ") and line != "data: [DONE]"]
                return 200, dict(response.headers), events, events[-1]["usage"]["cost"]

        with ThreadPoolExecutor(32) as pool:
            answers = list(pool.map(lambda i: (plain if i % 2 else streamed)(i), range(300)))
        costs = [cost for status, _, _, cost in answers if status == 200]
        refused = [(headers, body) for status, headers, body, _ in answers if status == 429]
        assert len(costs) + len(refused) == 300, {status for status, *_ in answers}
        assert len(costs) == 50, len(costs)
        assert round(sum(costs) * NANOS) <= round(one * 50.5 * NANOS)
        assert all(round(c * NANOS) == round(one * NANOS) for c in costs)
        for headers, answer in refused:
            error = answer["error"]
            assert (error["type"], error["code"]) == ("insufficient_quota", "budget_exceeded"), error
            assert "tenant `acme`'s daily budget" in error["message"] and "resets at" in error["message"]
            assert headers["x-should-retry"] == "false" and int(headers["retry-after"]) >= 1
        warned = [headers for status, headers, _, _ in answers
                  if status == 200 and "x-turnpike-budget-warning" in headers]
        assert warned, "past half of the budget, responses carry the soft threshold's warning"
        # Both replicas refuse now, whichever admitted what.
        for gateway in gateways:
            status, _, answer = post_once(gateway.base, "/v1/chat/completions", key, body)
            assert status == 429 and answer["error"]["code"] == "budget_exceeded"
        # A model without a price still serves: it costs nothing.
        status, _, _ = post_once(gateways[0].base, "/v1/chat/completions", key, chat_body("long", max_tokens=2))
        assert status == 200
    finally:
        redis.stop()


def test_a_key_budget_stops_that_key_only(tmp_path):
    """Budgets set through the admin API: a key's own total budget refuses that key once two
    requests spent it, while its tenant's other key goes on; bad budgets are 400s naming the
    field."""
    keys = {"OPS_KEY": make_key(), "ACME_KEY": make_key(), "AUDIT_KEY": audit_secret()}
    # Exactly 50 tokens per answer, only output priced: each request costs 50 * 0.60 / 1e6.
    spend = '[spend]\n[[spend.prices]]\nmodel = "chat"\ninput = 0\noutput = 0.6\n'
    text = admin_config().replace("[admin]", spend + "\n[admin]", 1)
    text = text.replace('output = { mode = "echo" }', 'output = { mode = "random", length = [50, 50] }')
    gateway = Gateway(tmp_path, text, keys)
    try:
        admin = Admin(gateway, keys["OPS_KEY"])
        bad = admin("POST", "/keys", {"tenant": "acme", "budget": {"per_day": -1}})
        assert bad.status_code == 400 and "budget.per_day" in bad.json()["error"]["message"], bad.text
        unknown = admin("POST", "/keys", {"tenant": "acme", "budget": {"per_week": 1}})
        assert unknown.status_code == 400, unknown.text
        negative = admin("PUT", "/tenants/beta", {"budget": {"total": -5}})
        assert negative.status_code == 400 and "budget.total" in negative.json()["error"]["message"], negative.text
        made = admin.ok("POST", "/keys", {"tenant": "acme", "budget": {"total": 2.5 * 50 * 0.6e-6}})
        limited = made["key"]
        body = {"model": "chat", "messages": HELLO, "max_tokens": 50}
        answers = [post_once(gateway.base, "/v1/chat/completions", limited, body) for _ in range(3)]
        assert [status for status, _, _ in answers] == [200, 200, 429], answers
        message = answers[2][2]["error"]["message"]
        assert f"key `{made['record']['id']}`'s total budget" in message and "does not reset" in message, message
        assert "retry-after" not in answers[2][1]
        # The tenant's other key is not limited by it.
        assert post_once(gateway.base, "/v1/chat/completions", keys["ACME_KEY"], body)[0] == 200
    finally:
        gateway.stop()


@pytest.mark.parametrize("spend, named", [
    ('[[spend.prices]]\nmodel = "chat"\ninput = -1\noutput = 1\n', "spend.prices[0].input"),
    ('[[spend.prices]]\nmodel = "nope"\ninput = 1\noutput = 1\n', "`nope`"),
    ('[[spend.prices]]\nmodel = "chat"\nfrom = "soon"\ninput = 1\noutput = 1\n', "spend.prices[0].from"),
    ('[[spend.prices]]\nmodel = "chat"\ninput = 1\noutput = 1\nsurprise = 2\n', "surprise"),
])
def test_bad_prices_stop_the_start_and_name_the_field(tmp_path, spend, named):
    key = make_key()
    with pytest.raises(AssertionError) as failed:
        Gateway(tmp_path, config_text(tenant() + "[spend]\n" + spend), {"ACME_API_KEY": key}).stop()
    assert named in str(failed.value), str(failed.value)
