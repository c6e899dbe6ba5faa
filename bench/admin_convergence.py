"""Makes admin changes through one replica and times when another shows them (one run of
bench/run-admin.sh); prints JSON.

    python3 bench/admin_convergence.py FIRST_URL SECOND_URL SYNC_INTERVAL_MS CHANGES
"""

import http.client
import json
import os
import sys
import time
from urllib.parse import urlparse


class Client:
    """A kept-alive admin connection."""

    def __init__(self, url: str, key: str):
        parsed = urlparse(url)
        self.connection = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=10)
        self.headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}

    def call(self, method: str, path: str, body: dict | None = None) -> dict:
        data = json.dumps(body).encode() if body is not None else None
        self.connection.request(method, f"/admin/v1{path}", body=data, headers=self.headers)
        response = self.connection.getresponse()
        payload = json.loads(response.read())
        assert response.status in (200, 201), (response.status, payload)
        return payload


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main(first_url: str, second_url: str, interval_ms: int, changes: int) -> None:
    key = os.environ["ADMIN_KEY"]
    first, second = Client(first_url, key), Client(second_url, key)
    commit_ms, converge_ms = [], []
    for i in range(changes):
        started = time.perf_counter()
        revision = first.call("PUT", f"/tenants/t{i}", {"requests_per_minute": 1000 + i})["revision"]
        committed = time.perf_counter()
        while second.call("GET", "/state")["revision"] < revision:
            time.sleep(0.0005)
        seen = time.perf_counter()
        commit_ms.append((committed - started) * 1000)
        converge_ms.append((seen - committed) * 1000)
    summary = lambda xs: {"p50": percentile(xs, 0.5), "p99": percentile(xs, 0.99), "max": max(xs)}  # noqa: E731
    print(json.dumps({"sync_interval_ms": interval_ms, "changes": changes,
                      "commit_ms": summary(commit_ms), "converge_ms": summary(converge_ms)}))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
