"""Report of bench/run-spend.sh: request rate and latency with spend on (prices, budgets on the
tenant and the key, usage records) over off, per state store, mode and concurrency, as the
median of the interleaved rounds with their spread, and the gateway's CPU time per request."""

import json
import statistics
import sys
from pathlib import Path

runs, out, seconds, rounds, cpu, bandwidth, ticks_per_s = sys.argv[1:8]
runs, out = Path(runs), Path(out)
rows = {}
for f in sorted(runs.glob("*.json")):
    d = json.loads(f.read_text())
    name, _, round_ = f.stem.rpartition("-r")
    rows.setdefault(name, []).append({
        "round": int(round_),
        "rps": d["summary"]["requestsPerSec"],
        "p50_ms": d["latencyPercentiles"]["p50"] * 1e3,
        "p99_ms": d["latencyPercentiles"]["p99"] * 1e3,
        "status": d.get("statusCodeDistribution", {}),
        "requests": sum(d.get("statusCodeDistribution", {}).values()),
    })
cpu_ms = {}
for f in sorted(runs.glob("*.ticks")):
    name, _, round_ = f.stem.rpartition("-r")
    requests = sum(r["requests"] for key, rs in rows.items() if key.startswith(name + "-") for r in rs
                   if r["round"] == int(round_))
    if requests:
        cpu_ms.setdefault(name, []).append(int(f.read_text()) / int(ticks_per_s) * 1e3 / requests)

# Redis' CPU and script calls per request, over every run of a round (warm-ups included, so
# both are slightly low; the same for off and on).
redis_load = {}
for f in sorted(runs.glob("*.redis")):
    name, _, round_ = f.stem.rpartition("-r")
    after, before, calls = (float(x) for x in f.read_text().split())
    requests = sum(r["requests"] for key, rs in rows.items() if key.startswith(name + "-") for r in rs
                   if r["round"] == int(round_))
    if requests:
        redis_load.setdefault(name, []).append(((after - before) * 1e3 / requests, calls / requests))

result = {"seconds_per_run": int(seconds), "rounds": int(rounds), "cpu": cpu, "memory_bandwidth_gb_s": bandwidth,
          "runs": rows, "cpu_ms_per_request": cpu_ms, "redis_ms_and_calls_per_request": redis_load,
          "ratios": {}}
lines = ["# Cost of spend: prices, budgets and usage records", "",
         f"`bench/run-spend.sh {seconds} {rounds}` on {cpu} (memory read bandwidth {bandwidth} GB/s): "
         f"Turnpike with the simulator engine (zero latency), oha, {seconds} s per run, {rounds} interleaved "
         "rounds of off and on. `on`: the model priced, a daily, monthly and total budget on the tenant and on "
         "its key (never refusing), a usage record per request (on Redis through a usage journal). Ratios are on/off per round: median "
         "(min–max).", "",
         "| state | mode | c | req/s off | req/s on | on/off | p50 off (ms) | p50 on (ms) | p99 off (ms) | p99 on (ms) |",
         "|---|---|---|---|---|---|---|---|---|---|"]
for state in ["memory", "redis"]:
    for mode in ["plain", "stream"]:
        for c in [1, 64]:
            off, on = rows.get(f"off-{state}-{mode}-c{c}"), rows.get(f"on-{state}-{mode}-c{c}")
            if not (off and on):
                continue
            by_round = {r["round"]: r for r in off}
            ratios = [r["rps"] / by_round[r["round"]]["rps"] for r in on if r["round"] in by_round]
            med = lambda rs, k: statistics.median(r[k] for r in rs)
            ratio = statistics.median(ratios)
            result["ratios"][f"{state}-{mode}-c{c}"] = {"median": ratio, "min": min(ratios), "max": max(ratios)}
            lines.append(f"| {state} | {mode} | {c} | {med(off, 'rps'):.0f} | {med(on, 'rps'):.0f} | "
                         f"{ratio:.2f} ({min(ratios):.2f}–{max(ratios):.2f}) | {med(off, 'p50_ms'):.2f} | "
                         f"{med(on, 'p50_ms'):.2f} | {med(off, 'p99_ms'):.2f} | {med(on, 'p99_ms'):.2f} |")
lines += ["", "Gateway CPU time per request (ms, median over rounds, all modes and concurrencies of a round):", ""]
for name, values in sorted(cpu_ms.items()):
    lines.append(f"- {name}: {statistics.median(values):.3f}")
if redis_load:
    lines += ["", "Redis (the same host) per request: CPU time (ms) and script calls, median over rounds:", ""]
    for name, values in sorted(redis_load.items()):
        ms, calls = statistics.median(v[0] for v in values), statistics.median(v[1] for v in values)
        lines.append(f"- {name}: {ms:.3f} ms, {calls:.2f} calls")
bad = {name: r["status"] for name, rs in rows.items() for r in rs if set(r["status"]) - {"200"}}
lines += ["", "Every run answered 200 only." if not bad else f"Non-200 answers: {bad}"]
(out / "spend.json").write_text(json.dumps(result, indent=2) + "\n")
(out / "spend.md").write_text("\n".join(lines) + "\n")
print("\n".join(lines))
