"""Spend on the real binary: prices per model with effective dates, the cost of each response
(`x-turnpike-cost` and `usage.cost`, streamed and not), and budgets in money per tenant and
per key that hold across two replicas on a real `redis-server`, refusing with 429
`budget_exceeded` and the time the budget resets."""

import json
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta, timezone

import httpx
import openai
import pytest

from conftest import BIN
from tenancy_support import HELLO, Gateway, Redis, chat_body, config_text, make_key, post_once, tenant
from test_admin import Admin, admin_config, audit_secret

NANOS = 10**9

# Per million tokens. `fixed` always generates max_tokens, so its cost is known in advance.
PRICES = {"chat": (0.15, 0.075, 0.60), "fixed": (0.0, 0.0, 8.0)}


def prices(extra: str = "") -> str:
    """[spend] with PRICES, and `extra` tables after."""
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


def test_usage_records_equal_the_responses_when_a_replica_is_killed(tmp_path):
    """Two replicas on Redis, each with its usage journal and exporting to its own JSONL file;
    one is killed with SIGKILL in the middle of 160 requests, while Redis holds writes, so it
    dies with records only in its journal, and is started again on the same journal. Every
    completed response has its record, once, with its usage and cost to the nano-dollar (cached
    tokens priced as cached), the report's sums equal the records', every record reaches an
    export file, and a usage-scoped key reads its own tenant's report only."""
    redis = Redis(tmp_path / "redis")
    keys = {"OPS_KEY": make_key(), "ACME_KEY": make_key(), "AUDIT_KEY": audit_secret()}
    gateways, texts = [], []
    try:
        for i in range(2):
            input_, cached, output = PRICES["chat"]
            spend = (f'[spend]\nusage_file = "{tmp_path}/usage{i}.jsonl"\nusage_journal = "{tmp_path}/usage{i}.journal"\n'
                     f'[[spend.prices]]\nmodel = "chat"\n'
                     f"input = {input_}\ncached_input = {cached}\noutput = {output}\n")
            text = admin_config(state=state(redis)).replace("[admin]", spend + "\n[admin]", 1)
            text = text.replace('[tenants.acme]\nmodels = ["*"]\nkeys = [{ env = "ACME_KEY" }]',
                                '[tenants.acme]\nmodels = ["*"]\nkeys = [{ env = "ACME_KEY" }, '
                                '{ env = "READER_KEY", endpoints = ["usage"] }]')
            keys["READER_KEY"] = keys.get("READER_KEY") or make_key()
            text = text.replace('output = { mode = "echo" }', 'latency = { ttft_ms = 10, itl_ms = 2 }\n'
                                'output = { mode = "random", length = [5, 40] }')
            texts.append(text)
            gateways.append(Gateway(tmp_path, text, keys, f"usage{i}"))
        key = keys["ACME_KEY"]

        def one(i):
            gateway = gateways[i % 2]
            body = {"model": "chat", "messages": [{"role": "user", "content": f"Count to {i % 7}"}],
                    "max_tokens": 40}
            try:
                if i % 3:
                    status, _, answer = post_once(gateway.base, "/v1/chat/completions", key, body)
                    return (answer["id"], answer["usage"]) if status == 200 else None
                stream_body = {**body, "stream": True, "stream_options": {"include_usage": True}}
                with httpx.stream("POST", f"{gateway.url}/chat/completions", json=stream_body,
                                  headers={"Authorization": f"Bearer {key}"}, timeout=30) as response:
                    events = [json.loads(line[6:]) for line in response.iter_lines()
                              if line.startswith("data: ") and line != "data: [DONE]"]
                    done = response.status_code == 200 and events and events[-1].get("usage")
                    return (events[-1]["id"], events[-1]["usage"]) if done else None
            except (OSError, httpx.HTTPError, json.JSONDecodeError, KeyError):
                return None  # the killed replica's requests in flight

        with ThreadPoolExecutor(16) as pool:
            futures = [pool.submit(one, i) for i in range(160)]
            # The kill lands mid-load on any host: after a third of the answers, not after a time.
            deadline = time.monotonic() + 30
            while sum(f.done() for f in futures) < 50 and time.monotonic() < deadline:
                time.sleep(0.01)
            redis.pause_writes(700)
            time.sleep(0.3)
            gateways[1].process.kill()
            completed = [f.result() for f in futures]
        completed = [c for c in completed if c]
        # Started again on its journal, the killed replica ships what Redis lacks.
        gateways.append(Gateway(tmp_path, texts[1], keys, "usage1-again"))
        assert 40 < len(completed) < 160, len(completed)
        admin = Admin(gateways[0], keys["OPS_KEY"])

        def acme_row():
            report = admin.ok("GET", "/usage?group_by=tenant,model")
            return next((r for r in report["data"] if r["tenant"] == "acme"), {"requests": 0})

        deadline = time.monotonic() + 15
        while acme_row()["requests"] < len(completed) and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(1)
        row = acme_row()
        # Every record reaches an export file (the killed replica's unacknowledged ones through
        # the survivor, 10 s later), once each file.
        deadline = time.monotonic() + 25
        while True:
            records = {}
            for i in range(2):
                path = tmp_path / f"usage{i}.jsonl"
                lines = path.read_text().splitlines() if path.exists() else []
                records.update((r["request_id"], r) for r in map(json.loads, lines))
            if len(records) >= row["requests"] or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert len(records) == row["requests"], (len(records), row)
        # The sums are the records' sums, to the nano-dollar.
        for column, field in [("input_tokens", "input_tokens"), ("cached_tokens", "cached_tokens"),
                              ("output_tokens", "output_tokens"), ("cost_nanos", "cost_nanos")]:
            assert row[column] == sum(r[field] for r in records.values()), column
        # Each completed response has its record, with its usage and cost (cached tokens priced
        # as cached). The only records beyond them are of answers the killed replica finished
        # as it died (at most one per client thread).
        for response_id, usage in completed:
            record = records[response_id]
            assert record["status"] == "ok" and record["tenant"] == "acme", record
            assert (record["input_tokens"], record["cached_tokens"], record["output_tokens"]) == (
                usage["prompt_tokens"], usage["prompt_tokens_details"]["cached_tokens"], usage["completion_tokens"])
            assert record["cost_nanos"] == expected_nanos(usage, "chat") == round(usage["cost"] * NANOS)
        assert len(records) - len(completed) <= 16, (len(records), len(completed))
        csv_text = admin("GET", "/usage?group_by=model&format=csv").text
        assert csv_text.splitlines()[0].startswith("model,requests,") and "\nchat," in csv_text, csv_text
        # A usage-scoped key reads its own tenant only; other keys may not read usage.
        reader = httpx.Client(base_url=gateways[0].url, headers={"Authorization": f"Bearer {keys['READER_KEY']}"})
        own = reader.get("/usage", params={"group_by": "tenant"}).json()["data"]
        assert [r["tenant"] for r in own] == ["acme"] and own[0]["requests"] == row["requests"]
        assert reader.get("/usage", params={"tenant": "ops"}).status_code == 403
        assert reader.get("/usage", params={"group_by": "week"}).json()["error"]["param"] == "group_by"
        plain = httpx.get(f"{gateways[0].url}/usage", headers={"Authorization": f"Bearer {key}"})
        assert plain.status_code == 403, plain.text
        # The same report from the command line.
        out = subprocess.run([str(BIN), "admin", "--url", gateways[0].base, "--key", keys["OPS_KEY"], "usage",
                              "--group-by", "tenant", "--format", "csv"], capture_output=True, text=True, timeout=30)
        assert out.returncode == 0 and f"acme,{row['requests']}," in out.stdout, (out.stdout, out.stderr)
    finally:
        for gateway in gateways:
            gateway.stop()
        redis.stop()


def test_prices_and_budgets_set_through_the_admin_api_reach_the_other_replica(tmp_path):
    """Two replicas on Redis: prices and a tenant's budget set through one replica's admin API
    apply on the other within the sync interval, and each change is in the audit log. Bad
    prices and budgets are 400s naming the field, and change nothing."""
    redis = Redis(tmp_path / "redis")
    keys = {"OPS_KEY": make_key(), "ACME_KEY": make_key(), "AUDIT_KEY": audit_secret()}
    gateways = []
    try:
        for name in ("first", "second"):
            text = admin_config(state=state(redis))
            text = text.replace('output = { mode = "echo" }', 'output = { mode = "random", length = [50, 50] }')
            gateways.append(Gateway(tmp_path, text, keys, name))
        first, second = Admin(gateways[0], keys["OPS_KEY"]), Admin(gateways[1], keys["OPS_KEY"])
        bad = first("PUT", "/models/prices/chat", {"prices": [{"input": -1, "output": 1}]})
        assert bad.status_code == 400 and "models.prices.chat[0].input" in bad.json()["error"]["message"], bad.text
        unknown = first("PUT", "/models/prices/nope", {"prices": [{"input": 1, "output": 1}]})
        assert unknown.status_code == 400 and "`nope`" in unknown.json()["error"]["message"], unknown.text
        first.ok("PUT", "/models/prices/chat", {"prices": [{"input": 0, "output": 0.6}]})
        first.ok("PUT", "/tenants/beta", {"models": ["*"], "budget": {"total": 2.5 * 50 * 0.6e-6}})
        key = first.ok("POST", "/keys", {"tenant": "beta"})["key"]
        body = {"model": "chat", "messages": HELLO, "max_tokens": 50}
        made = time.monotonic()
        while True:
            status, headers, _ = post_once(gateways[1].base, "/v1/chat/completions", key, body)
            if status == 200 and "x-turnpike-cost" in headers:
                break
            assert time.monotonic() - made < 2.0, "the second replica did not converge"
            time.sleep(0.02)
        assert headers["x-turnpike-cost"] == "0.00003"
        status, _, _ = post_once(gateways[1].base, "/v1/chat/completions", key, body)
        status_third, _, answer = post_once(gateways[0].base, "/v1/chat/completions", key, body)
        assert (status, status_third) == (200, 429), answer
        assert "tenant `beta`'s total budget" in answer["error"]["message"]
        actions = [e["action"] for e in second.ok("GET", "/audit")["data"]]
        assert actions == ["prices.put", "tenant.put", "key.create"], actions
        # Removing the prices makes the model free again (the configuration prices nothing).
        first.ok("DELETE", "/models/prices/chat")
        made = time.monotonic()
        while post_once(gateways[1].base, "/v1/chat/completions", key, body)[0] != 200:
            assert time.monotonic() - made < 2.0, "the removal did not reach the second replica"
            time.sleep(0.02)
    finally:
        for gateway in gateways:
            gateway.stop()
        redis.stop()
