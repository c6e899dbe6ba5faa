"""The admin state survives its store, and its audit log shows tampering, on the real binary:
a real `redis-server` restarted empty in the middle of admin traffic through two replicas
(nothing the API answered 200 for is lost, and every replica converges on one state); every
replica restarting with the store (the state file puts it back); and the audit chain, keyed and
anchored in the state record, after an entry is edited with its hashes recomputed, the newest
entries are dropped, or an entry is garbage."""

import hashlib
import json
import subprocess
import threading
import time

import httpx

from test_admin import SYNC_MS, Admin, admin_config, chat_status, keys  # noqa: F401 (fixture)
from tenancy_support import Gateway, Redis
from test_hardening import metric

AUDIT_LOG = "tp:admin:audit"


def redis_cli(redis: Redis, *args: str) -> str:
    run = subprocess.run(["redis-cli", "-p", str(redis.port), *args], capture_output=True, text=True, timeout=10)
    assert run.returncode == 0, run.stderr
    return run.stdout.strip()


def converged(admins: list[Admin], within: float) -> dict:
    """The state every replica shows once they agree (within `within` seconds)."""
    deadline = time.monotonic() + within
    while True:
        states = [a.ok("GET", "/state") for a in admins]
        if all(s == states[0] for s in states[1:]):
            return states[0]
        assert time.monotonic() < deadline, [s["revision"] for s in states]
        time.sleep(0.05)


def test_a_store_restarted_empty_mid_traffic_loses_nothing_the_api_accepted(tmp_path, keys):  # noqa: F811
    redis = Redis(tmp_path / "redis")
    state = f'[state]\nbackend = "redis"\nredis_url = "{redis.url}"\n'
    gateways = [Gateway(tmp_path, admin_config(state), keys, name=n) for n in ("first", "second")]
    admins = [Admin(g, keys["OPS_KEY"]) for g in gateways]
    accepted: list[str] = []
    refused: list[int] = []
    try:
        before = admins[0].ok("POST", "/keys", {"tenant": "acme"})["key"]
        admins[0].ok("PUT", "/tenants/base", {"models": ["*"]})
        base_key = admins[0].ok("POST", "/keys", {"tenant": "base"})["key"]
        stop = threading.Event()

        def traffic(admin: Admin, prefix: str) -> None:
            i = 0
            while not stop.is_set():
                name = f"{prefix}{i}"
                try:
                    response = admin("PUT", f"/tenants/{name}", {"concurrent_streams": 1 + i % 7})
                except httpx.HTTPError:
                    response = None
                if response is not None and response.status_code == 200:
                    accepted.append(name)
                else:
                    refused.append(0 if response is None else response.status_code)
                i += 1
                time.sleep(0.005)

        threads = [threading.Thread(target=traffic, args=(a, p)) for a, p in zip(admins, "ab")]
        for t in threads:
            t.start()
        time.sleep(1.5)
        held = max(a.ok("GET", "/state")["revision"] for a in admins)
        assert held > 20, "the traffic made changes before the store went away"
        redis.stop()
        redis.start()  # empty: no persistence
        time.sleep(1.5)
        stop.set()
        for t in threads:
            t.join(30)

        assert set(refused) <= {503}, f"refusals while the store was away or behind: {set(refused)}"
        final = converged(admins, within=SYNC_MS / 1000 * 4 + 2)
        tenants = final["state"]["directory"]["tenants"]
        missing = [name for name in accepted if name not in tenants]
        assert not missing, f"{len(missing)} accepted changes lost: {missing[:5]}"
        assert "base" in tenants and final["revision"] > held
        # Keys made before the store went away work on both replicas.
        for gateway in gateways:
            assert chat_status(gateway, base_key) == 200 and chat_status(gateway, before) == 200
        # Said loudly, and no longer so.
        restores = sum(metric(g.base, "turnpike_admin_state_restores_total") for g in gateways)
        assert restores >= 1
        for gateway in gateways:
            assert metric(gateway.base, "turnpike_admin_state_regressed") == 0
            assert httpx.get(f"{gateway.base}/ready").json()["admin_state"] == "ok"
        logs = "".join(g.log.read_text() for g in gateways)
        assert "admin_store_regressed" in logs and "admin_store_restored" in logs
        # The store's chain starts again at the restore, intact from there.
        audit = admins[1].ok("GET", "/audit?limit=1000")
        assert audit["chain_intact"] is True, audit["chain_breaks"]
        assert audit["data"][0]["action"] == "state.restore" and audit["data"][0]["actor"] == "replica"
        assert audit["data"][-1]["revision"] == final["revision"] == audit["revision"]
    finally:
        for g in gateways:
            g.stop()
        redis.stop()


def test_replicas_restarted_with_the_store_put_the_state_back_from_their_file(tmp_path, keys):  # noqa: F811
    redis = Redis(tmp_path / "redis")
    state = f'[state]\nbackend = "redis"\nredis_url = "{redis.url}"\n'
    text = admin_config(state, admin=f'state_file = "{tmp_path / "admin-state.json"}"')
    gateway = Gateway(tmp_path, text, keys)
    try:
        admin = Admin(gateway, keys["OPS_KEY"])
        admin.ok("PUT", "/plans/pro", {"requests_per_minute": 1000, "models": ["*"]})
        admin.ok("PUT", "/tenants/beta", {"plan": "pro"})
        key = admin.ok("POST", "/keys", {"tenant": "beta"})["key"]
        assert admin.ok("GET", "/state")["revision"] == 3
        gateway.stop()
        redis.stop()
        redis.start()
        gateway = Gateway(tmp_path, text, keys)
        admin = Admin(gateway, keys["OPS_KEY"])
        restored = admin.ok("GET", "/state")
        assert restored["revision"] == 4 and "beta" in restored["state"]["directory"]["tenants"]
        assert chat_status(gateway, key) == 200
        assert redis_cli(redis, "HGET", "tp:admin:state", "rev") == "4"
        # The next change follows the restored state.
        assert admin.ok("PUT", "/tenants/gamma", {})["revision"] == 5
        assert admin.ok("GET", "/audit")["chain_intact"] is True
    finally:
        gateway.stop()
        redis.stop()


def test_the_audit_chain_shows_edits_dropped_entries_and_garbage(tmp_path, keys):  # noqa: F811
    redis = Redis(tmp_path / "redis")
    state = f'[state]\nbackend = "redis"\nredis_url = "{redis.url}"\n'
    gateway = Gateway(tmp_path, admin_config(state), keys)
    try:
        admin = Admin(gateway, keys["OPS_KEY"])
        for name in ("beta", "gamma", "delta"):
            admin.ok("PUT", f"/tenants/{name}", {})
        audit = admin.ok("GET", "/audit")
        assert audit["chain_intact"] is True and audit["chain_breaks"] == []
        entries = audit["data"]
        assert [e["key_id"] for e in entries] == ["k1"] * 3 and len(entries[0]["hash"]) == 64

        # An edit with every hash recomputed, as one who lacks the key can.
        forged = dict(entries[0], actor="ops/someone-else")
        fields = [str(forged["revision"]), forged["at"], forged["actor"], "", forged["action"], forged["target"],
                  forged["before"], forged["after"], forged["previous"], forged["key_id"]]
        forged["hash"] = hashlib.sha256("\x1f".join(fields).encode()).hexdigest()
        follower = dict(entries[1], previous=forged["hash"])
        redis_cli(redis, "LSET", AUDIT_LOG, "0", json.dumps(forged))
        redis_cli(redis, "LSET", AUDIT_LOG, "1", json.dumps(follower))
        edited = admin.ok("GET", "/audit")
        assert edited["chain_intact"] is False
        assert {b["revision"] for b in edited["chain_breaks"]} == {1, 2}

        # Put back, then the newest entry dropped.
        redis_cli(redis, "LSET", AUDIT_LOG, "0", json.dumps(entries[0]))
        redis_cli(redis, "LSET", AUDIT_LOG, "1", json.dumps(entries[1]))
        assert admin.ok("GET", "/audit")["chain_intact"] is True
        redis_cli(redis, "RPOP", AUDIT_LOG)
        dropped = admin.ok("GET", "/audit")
        assert dropped["chain_intact"] is False and "missing" in dropped["chain_breaks"][0]["reason"]
        redis_cli(redis, "RPUSH", AUDIT_LOG, json.dumps(entries[2]))

        # An unreadable entry is a break, not a 500; the readable ones are still shown.
        redis_cli(redis, "LSET", AUDIT_LOG, "1", "{not json")
        garbage = admin("GET", "/audit")
        assert garbage.status_code == 200, garbage.text
        body = garbage.json()
        assert body["chain_intact"] is False and [e["revision"] for e in body["data"]] == [1, 3]
        assert body["chain_breaks"][0]["revision"] is None and body["chain_breaks"][0]["position"] == 1
    finally:
        gateway.stop()
        redis.stop()
