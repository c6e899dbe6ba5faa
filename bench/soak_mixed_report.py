"""Writes bench/results/soak-mixed.{json,md} from a run of bench/run-soak-mixed.sh: the mixed
load's report and the samples (time, RSS, stored responses and their bytes, idempotency
records and their bytes).

    python3 bench/soak_mixed_report.py RUNS_DIR RESULTS_DIR SECONDS RATE STORE_BYTES
"""

import json
import os
import platform
import sys
import time

runs, out, seconds, rate, store_bytes = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5])
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), platform.processor())
rows = [list(map(float, l.split())) for l in open(f"{runs}/soak-mixed-rss.txt") if len(l.split()) == 6]
t0 = rows[0][0]
samples = [{"t": int(r[0] - t0), "rss_kib": int(r[1]), "stored": int(r[2]), "stored_bytes": int(r[3]),
            "idempotency": int(r[4]), "idempotency_bytes": int(r[5])} for r in rows]
load = json.load(open(f"{runs}/soak-mixed-load.json"))
after = [s for s in samples if s["t"] >= 120]
base = after[0]["rss_kib"] if after else samples[0]["rss_kib"]
last = samples[-1]["rss_kib"]
growth = round(100 * (last - base) / base, 2)
non_2xx = sum(n for kind in load["statuses"].values() for code, n in kind.items() if not code.startswith("2"))
errors = sum(load["errors"].values())
result = {
    "date": time.strftime("%Y-%m-%d"), "cpu": cpu, "cores": os.cpu_count(), "seconds": seconds,
    "target_req_per_s": rate, "store_bytes": store_bytes, "load": load, "samples": samples,
    "rss_growth_after_2min_pct": growth, "rss_peak_kib": max(s["rss_kib"] for s in samples),
    "non_2xx": non_2xx, "transport_errors": errors,
}
json.dump(result, open(f"{out}/soak-mixed.json", "w"), indent=2)
ok = lambda b: "met" if b else "missed"
mib = lambda k: f"{k / 1024:.1f}"
lines = [
    "# Mixed soak: every protocol at a steady rate",
    "",
    f"Measured {result['date']} on {cpu} ({result['cores']} cores shared by the gateway and the load tool), with "
    f"`bench/run-soak-mixed.sh {seconds} {rate:g} {store_bytes}`: the release gateway with the simulator engine at zero "
    f"latency and state in memory, {seconds} s at {rate:g} req/s over 32 connections, an even mix of chat (plain and "
    "streamed), Responses (stored), Anthropic Messages, embeddings and chat with a fresh `Idempotency-Key` each "
    f"(`mixed-load`). The in-memory stores are bounded at {store_bytes >> 20} MiB each so they fill within the first "
    "two minutes; their gauges are shown beside the RSS, read every 30 s.",
    "",
    f"Requests: {load['requests']} ({load['req_per_s']:.0f} req/s); non-2xx {non_2xx}; transport errors {errors}.",
    "",
    "| kind | statuses |",
    "|---|---|",
    *[f"| {kind} | {', '.join(f'{c}: {n}' for c, n in codes.items())} |" for kind, codes in load["statuses"].items()],
    "",
    "| t (s) | RSS (MiB) | stored responses | their MiB | idempotency records | their MiB |",
    "|---|---|---|---|---|---|",
    *[f"| {s['t']} | {mib(s['rss_kib'])} | {s['stored']} | {s['stored_bytes'] / 2**20:.1f} | {s['idempotency']} | "
      f"{s['idempotency_bytes'] / 2**20:.1f} |" for s in samples],
    "",
    f"RSS growth from the first sample at or after 120 s to the last: {growth}% (goal < 2%: {ok(growth < 2)}); "
    f"peak {mib(result['rss_peak_kib'])} MiB. Errors: {non_2xx + errors} (goal 0: {ok(non_2xx + errors == 0)}).",
]
open(f"{out}/soak-mixed.md", "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
