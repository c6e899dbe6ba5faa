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


def per_request(suffix):
    """Each run's file with `suffix`, per request of that run: run name -> [(round, values)]."""
    out = {}
    for f in sorted(runs.glob("*" + suffix)):
        name, _, round_ = f.stem.rpartition("-r")
        run = next((r for r in rows.get(name, []) if r["round"] == int(round_)), None)
        if run and run["requests"]:
            values = [float(x) for x in f.read_text().split()]
            out.setdefault(name, []).append((int(round_), values, run["requests"]))
    return out


# The gateway's CPU time per request of each run.
cpu_ms = {name: [v[0] / int(ticks_per_s) * 1e3 / n for _, v, n in values]
          for name, values in per_request(".ticks").items()}
# Redis' CPU time and script calls per request of each run.
redis_load = {name: [((v[0] - v[1]) * 1e3 / n, v[2] / n) for _, v, n in values]
              for name, values in per_request(".redis").items()}

result = {"seconds_per_run": int(seconds), "rounds": int(rounds), "cpu": cpu, "memory_bandwidth_gb_s": bandwidth,
          "runs": rows, "cpu_ms_per_request": cpu_ms, "redis_ms_and_calls_per_request": redis_load,
          "ratios": {}}
lines = ["# Cost of spend: prices, budgets and usage records", "",
         f"`bench/run-spend.sh {seconds} {rounds}` on {cpu} (memory read bandwidth {bandwidth} GB/s): "
         f"Turnpike with the simulator engine (zero latency), oha, {seconds} s per run, {rounds} interleaved "
         "rounds; one gateway per state, switched between off and on by a configuration reload, so both are "
         "measured on the same process; each cell runs off and on back to back, off first "
         "in odd rounds and on first in even ones. `on`: the model priced, a daily, monthly and total budget on the tenant and on "
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
lines += ["", "Gateway CPU time per request (ms) and, on Redis, Redis' CPU time per request (ms) and "
          "script calls per request, median over rounds:", "",
          "| state | mode | c | gateway off | gateway on | Redis off | Redis on | calls off | calls on |",
          "|---|---|---|---|---|---|---|---|---|"]
for state in ["memory", "redis"]:
    for mode in ["plain", "stream"]:
        for c in [1, 64]:
            cell = f"{state}-{mode}-c{c}"
            gw = [cpu_ms.get(f"{spend}-{cell}") for spend in ("off", "on")]
            if not all(gw):
                continue
            row = f"| {state} | {mode} | {c} | {statistics.median(gw[0]):.3f} | {statistics.median(gw[1]):.3f}"
            rl = [redis_load.get(f"{spend}-{cell}") for spend in ("off", "on")]
            if all(rl):
                row += "".join(f" | {statistics.median(v[0] for v in values):.3f}" for values in rl)
                row += "".join(f" | {statistics.median(v[1] for v in values):.2f}" for values in rl)
            else:
                row += " | – | – | – | –"
            lines.append(row + " |")
bad = {name: r["status"] for name, rs in rows.items() for r in rs if set(r["status"]) - {"200"}}
lines += ["", "Every run answered 200 only." if not bad else f"Non-200 answers: {bad}"]
(out / "spend.json").write_text(json.dumps(result, indent=2) + "\n")
(out / "spend.md").write_text("\n".join(lines) + "\n")
print("\n".join(lines))
