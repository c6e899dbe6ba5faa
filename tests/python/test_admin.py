"""The admin API on the real binary: tenants, plans, keys and the model map changed while
serving, validated as the configuration is, refused clearly, shared by two replicas through a
real `redis-server` within the sync interval, audited in a chain, over mTLS when required, and
driven by `turnpike admin`."""

import base64
import json
import secrets
import subprocess
import threading
import time

import httpx
import openai
import pytest
import trustme

from conftest import BIN
from tenancy_support import HELLO, Gateway, Redis, config_text, make_key
from test_operations import issue, trusting

CHAT = {"chat": 'output = { mode = "echo" }'}
SYNC_MS = 100


def admin_config(state: str = "", admin: str = "", server: str = "") -> str:
    sections = f"""
[auth]
mode = "required"

[tenants.ops]
keys = [{{ env = "OPS_KEY", endpoints = ["admin"] }}]

[tenants.acme]
models = ["*"]
keys = [{{ env = "ACME_KEY" }}]

[admin]
enabled = true
audit_keys = [{{ id = "k1", env = "AUDIT_KEY" }}]
{admin if "sync_interval_ms" in admin else f"sync_interval_ms = {SYNC_MS}" + chr(10) + admin}
{state}
"""
    return config_text(sections, CHAT, server=server)


class Admin:
    """An admin client of one gateway."""

    def __init__(self, gateway: Gateway, key: str, **kwargs):
        self.http = httpx.Client(
            base_url=f"{gateway.base}/admin/v1", headers={"Authorization": f"Bearer {key}"}, timeout=10, **kwargs
        )

    def __call__(self, method: str, path: str, body=None, **kwargs) -> httpx.Response:
        return self.http.request(method, path, json=body, **kwargs)

    def ok(self, method: str, path: str, body=None) -> dict:
        response = self(method, path, body)
        assert response.status_code in (200, 201), (response.status_code, response.text)
        return response.json()


def chat_status(gateway: Gateway, key: str, model: str = "chat") -> int:
    body = {"model": model, "messages": HELLO, "max_tokens": 4}
    headers = {"Authorization": f"Bearer {key}"}
    return httpx.post(f"{gateway.url}/chat/completions", json=body, headers=headers, timeout=10).status_code


def error(response: httpx.Response) -> dict:
    assert set(response.json()) == {"error"}, response.text
    return response.json()["error"]


def audit_secret() -> str:
    return base64.urlsafe_b64encode(secrets.token_bytes(48)).decode()


@pytest.fixture
def keys():
    return {"OPS_KEY": make_key(), "ACME_KEY": make_key(), "AUDIT_KEY": audit_secret()}


def test_tenants_keys_and_models_change_while_serving_with_an_audit_trail(tmp_path, keys):
    audit_file = tmp_path / "audit.jsonl"
    gateway = Gateway(tmp_path, admin_config(admin=f'audit_file = "{audit_file}"'), keys)
    admin = Admin(gateway, keys["OPS_KEY"])
    try:
        # Only administrators reach the API, and an admin key reaches nothing else.
        assert httpx.get(f"{gateway.base}/admin/v1/state").status_code == 401
        refused = Admin(gateway, keys["ACME_KEY"])("GET", "/state")
        assert refused.status_code == 403 and error(refused)["code"] == "admin_scope_required"
        assert chat_status(gateway, keys["OPS_KEY"]) == 403
        assert admin.ok("GET", "/state")["revision"] == 0

        # A plan, a tenant on it, a key for it: the SDK can use the key at once.
        admin.ok("PUT", "/plans/pro", {"requests_per_minute": 1000, "models": ["*"]})
        admin.ok("PUT", "/tenants/beta", {"plan": "pro"})
        made = admin.ok("POST", "/keys", {"tenant": "beta"})
        beta_key = made["key"]
        client = openai.OpenAI(base_url=gateway.url, api_key=beta_key, max_retries=0)
        assert client.chat.completions.create(model="chat", messages=HELLO, max_tokens=4).choices
        assert made["revision"] == 3

        # Refusals say why, in the error shape, with the right status.
        bad = admin("PUT", "/tenants/bad", {"priority_weight": 0})
        assert bad.status_code == 400 and "priority_weight" in error(bad)["message"]
        unknown = admin("PUT", "/tenants/bad", {"request_per_minute": 5})
        assert unknown.status_code == 400 and "request_per_minute" in error(unknown)["message"]
        no_plan = admin("PUT", "/tenants/bad", {"plan": "gold"})
        assert no_plan.status_code == 400 and "gold" in error(no_plan)["message"]
        configured = admin("PUT", "/tenants/acme", {})
        assert configured.status_code == 409 and error(configured)["code"] == "managed_elsewhere"
        assert admin("DELETE", "/tenants/nobody").status_code == 404
        assert admin("POST", "/keys", {"tenant": "nobody"}).status_code == 400
        stale = admin("PUT", "/tenants/gamma", {}, headers={"If-Match": '"1"'})
        assert stale.status_code == 412 and error(stale)["code"] == "precondition_failed"
        fresh = admin("PUT", "/tenants/gamma", {}, headers={"If-Match": '"3"'})
        assert fresh.status_code == 200 and fresh.headers["etag"] == '"4"'

        # Keys are listed without secrets or hashes.
        listed = admin.ok("GET", "/keys?tenant=beta")["data"]
        assert [k["id"] for k in listed] == [made["record"]["id"]]
        assert beta_key not in json.dumps(listed) and "hash" not in listed[0]

        # Rotation with a grace: both keys work until it ends, then only the new one.
        rotated = admin.ok("POST", f"/keys/{made['record']['id']}/rotate", {"grace_seconds": 2})
        assert rotated["replaces"] == made["record"]["id"]
        assert chat_status(gateway, beta_key) == 200 and chat_status(gateway, rotated["key"]) == 200
        time.sleep(2.5)
        assert chat_status(gateway, beta_key) == 401
        admin.ok("POST", f"/keys/{rotated['record']['id']}/revoke")
        assert chat_status(gateway, rotated["key"]) == 401

        # The model map: an alias and a shutdown date, seen by the SDK and /v1/models.
        admin.ok("PUT", "/models/aliases/stable", {"model": "chat"})
        admin.ok("PUT", "/models/shutdown_dates/stable", {"date": "2027-06-30"})
        acme = openai.OpenAI(base_url=gateway.url, api_key=keys["ACME_KEY"], max_retries=0)
        assert acme.chat.completions.create(model="stable", messages=HELLO, max_tokens=4).choices
        assert acme.models.retrieve("stable").shutdown_date == "2027-06-30"
        assert "stable" in [m.id for m in acme.models.list()]
        assert admin("PUT", "/models/aliases/other", {"model": "nope"}).status_code == 400
        # Alias names are model names: what a config's model name may not be, an alias may not be.
        for name in ["*", "x" * 300, "%2e%2e", "org/", "a%22b", "a%3Fb"]:
            bad_alias = admin("PUT", f"/models/aliases/{name}", {"model": "chat"})
            assert bad_alias.status_code == 400 and "model name" in error(bad_alias)["message"], (name, bad_alias.text)
        assert admin("PUT", "/models/shutdown_dates/chat", {"date": "2027-02-30"}).status_code == 400
        admin.ok("DELETE", "/models/aliases/stable")
        assert chat_status(gateway, keys["ACME_KEY"], model="stable") == 404

        # Every change is in the audit log, in order, chained, attributed.
        ops_id = keys["OPS_KEY"][3:15]
        audit = admin.ok("GET", "/audit")
        actions = [e["action"] for e in audit["data"]]
        assert actions == ["plan.put", "tenant.put", "key.create", "tenant.put", "key.rotate", "key.revoke",
                           "alias.put", "shutdown_date.put", "alias.delete"]
        assert audit["chain_intact"] is True
        assert {e["actor"] for e in audit["data"]} == {f"ops/{ops_id}"}
        assert [e["revision"] for e in audit["data"]] == list(range(1, 10))
        assert all(e["before"] != e["after"] for e in audit["data"])
        only = admin.ok("GET", "/audit?action=key.rotate")["data"]
        assert len(only) == 1 and only[0]["target"] == rotated["record"]["id"]
        lines = [json.loads(line) for line in audit_file.read_text().splitlines()]
        assert lines == audit["data"]
    finally:
        gateway.stop()


def test_the_cli_drives_the_api(tmp_path, keys):
    gateway = Gateway(tmp_path, admin_config(), keys)
    try:
        def cli(*args: str) -> subprocess.CompletedProcess:
            return subprocess.run([str(BIN), "admin", "--url", gateway.base, *args], capture_output=True, text=True,
                                  timeout=30, env={"TURNPIKE_ADMIN_KEY": keys["OPS_KEY"]})

        assert cli("put-tenant", "delta", "--limits", '{"requests_per_minute": 60}').returncode == 0
        made = cli("create-key", "--tenant", "delta", "--endpoint", "chat")
        assert made.returncode == 0, made.stderr
        key = json.loads(made.stdout)["key"]
        assert chat_status(gateway, key) == 200
        listed = json.loads(cli("keys", "--tenant", "delta").stdout)["data"]
        assert len(listed) == 1 and key not in json.dumps(listed)
        refused = cli("delete-tenant", "acme")
        assert refused.returncode != 0 and "409" in refused.stderr and "configuration" in refused.stderr
        stale = cli("--if-match", "1", "put-tenant", "epsilon")
        assert stale.returncode != 0 and "412" in stale.stderr
        audit = json.loads(cli("audit", "--action", "key.create").stdout)
        assert [e["action"] for e in audit["data"]] == ["key.create"]
    finally:
        gateway.stop()


def test_two_replicas_sharing_redis_converge_within_the_sync_interval(tmp_path, keys):
    redis = Redis(tmp_path / "redis")
    state = f'[state]\nbackend = "redis"\nredis_url = "{redis.url}"\n'
    first = Gateway(tmp_path, admin_config(state), keys, name="first")
    second = Gateway(tmp_path, admin_config(state), keys, name="second")
    try:
        admin_first, admin_second = Admin(first, keys["OPS_KEY"]), Admin(second, keys["OPS_KEY"])
        # A tenant and its key made through one replica work on the other within the bound.
        admin_first.ok("PUT", "/tenants/beta", {"models": ["*"]})
        key = admin_first.ok("POST", "/keys", {"tenant": "beta"})["key"]
        made = time.monotonic()
        while chat_status(second, key) != 200:
            assert time.monotonic() - made < SYNC_MS / 1000 + 1.0, "the second replica did not converge"
            time.sleep(0.01)
        admin_second.ok("PUT", "/models/aliases/stable", {"model": "chat"})
        made = time.monotonic()
        while chat_status(first, key, model="stable") != 200:
            assert time.monotonic() - made < SYNC_MS / 1000 + 1.0, "the first replica did not converge"
            time.sleep(0.01)

        # Changes racing from both replicas all land, each at its own revision, one chain.
        def put_many(admin: Admin, prefix: str) -> None:
            for i in range(10):
                admin.ok("PUT", f"/tenants/{prefix}{i}", {"concurrent_streams": i + 1})

        racers = [threading.Thread(target=put_many, args=(a, p)) for a, p in ((admin_first, "a"), (admin_second, "b"))]
        for racer in racers:
            racer.start()
        for racer in racers:
            racer.join(30)
        audit = admin_second.ok("GET", "/audit?limit=1000")
        assert audit["chain_intact"] is True
        assert [e["revision"] for e in audit["data"]] == list(range(1, 24))
        names = {e["target"] for e in audit["data"] if e["action"] == "tenant.put"}
        assert {f"{p}{i}" for p in "ab" for i in range(10)} <= names
        time.sleep(SYNC_MS / 1000 + 0.5)
        for admin in (admin_first, admin_second):
            state_now = admin.ok("GET", "/state")
            assert state_now["revision"] == 23
            assert len(state_now["state"]["directory"]["tenants"]) == 21
    finally:
        first.stop()
        second.stop()
        redis.stop()


def test_admin_calls_need_a_verified_client_certificate_when_required(tmp_path, keys):
    server_ca, client_ca = trustme.CA(), trustme.CA()
    chain, key_file = issue(server_ca, tmp_path, "server")
    client_ca.cert_pem.write_to_path(str(tmp_path / "clients.pem"))
    server_ca.cert_pem.write_to_path(str(tmp_path / "server-ca.pem"))
    tls = f'\n[server.tls]\ncert_file = "{chain}"\nkey_file = "{key_file}"\nclient_ca_file = "clients.pem"\nclient_auth = "optional"\n'
    text = admin_config(admin='client_certificate = "required"') + tls
    gateway = Gateway(tmp_path, text, keys)
    try:
        without = Admin(gateway, keys["OPS_KEY"], verify=trusting(server_ca))("GET", "/state")
        assert without.status_code == 403 and error(without)["code"] == "client_certificate_required"
        operator = client_ca.issue_cert("ops@example.com")
        with_cert = Admin(gateway, keys["OPS_KEY"], verify=trusting(server_ca, operator))
        assert with_cert.ok("PUT", "/tenants/beta", {})["revision"] == 1
        entry = with_cert.ok("GET", "/audit")["data"][0]
        assert entry["certificate"].startswith("sha256:")
        # The CLI presents a certificate too.
        operator.cert_chain_pems[0].write_to_path(str(tmp_path / "operator.crt"))
        operator.private_key_pem.write_to_path(str(tmp_path / "operator.key"))
        listed = subprocess.run(
            [str(BIN), "admin", "--url", gateway.base, "--ca-file", str(tmp_path / "server-ca.pem"),
             "--cert-file", str(tmp_path / "operator.crt"), "--key-file", str(tmp_path / "operator.key"), "tenants"],
            capture_output=True, text=True, timeout=30, env={"TURNPIKE_ADMIN_KEY": keys["OPS_KEY"]})
        assert listed.returncode == 0, listed.stderr
        assert "beta" in [t["name"] for t in json.loads(listed.stdout)["data"]]
    finally:
        gateway.stop()


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ('[auth]\nmode = "none"\n\n[admin]\nenabled = true\n', "needs authentication"),
        (admin_config(admin='client_certificate = "required"'), "client_ca_file"),
        (admin_config(admin="sync_interval_ms = 0"), "sync_interval_ms"),
        (admin_config(admin="bogus = 1"), "bogus"),
        (admin_config().replace('audit_keys = [{ id = "k1", env = "AUDIT_KEY" }]', ""), "audit_keys"),
        (admin_config().replace('env = "AUDIT_KEY"', 'env = "NO_SUCH_VAR"'), "NO_SUCH_VAR"),
    ],
)
def test_a_bad_admin_configuration_is_refused_at_startup(tmp_path, keys, text, says):
    if "[[engines]]" not in text:
        text = config_text(text, CHAT)
    path = tmp_path / "bad.toml"
    path.write_text(text)
    run = subprocess.run([str(BIN), "serve", "--config", str(path)], capture_output=True, text=True, timeout=30,
                         env={**keys})
    assert run.returncode != 0 and says in run.stderr, run.stderr
