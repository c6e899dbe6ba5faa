"""Turns the oha runs of bench/run-fleet.sh into bench/results/fleet.json and fleet.md.

    python3 bench/fleet_report.py RUNS_DIR RESULTS_DIR SECONDS
"""

import datetime
import json
import sys
from pathlib import Path

from gateway_report import cpu, load

FRONTS = ["turnpike", "sglang-router", "vllm-router"]
ROUTERS = ["sglang-router", "vllm-router"]


def main(runs: Path, results: Path, seconds: str) -> None:
    doc = {"date": datetime.date.today().isoformat(), "cpu": cpu(), "seconds_per_run": int(seconds), "modes": {}}
    lines = ["# A fleet behind a front: Turnpike's upstream plugin vs the field's routers", "",
             f"Two Turnpike nodes (simulator, zero latency) behind each front; {doc['cpu']}, one machine, "
             f"{seconds} s per run, oha, with `bench/run-fleet.sh`. Added latency is the front's p50/p99 at "
             "concurrency 1 minus a node's own; rate is requests/s at concurrency 64.", ""]
    for mode in ("plain", "stream"):
        direct = {c: load(runs, "fleet-direct", mode, c) for c in (1, 64)}
        rows = {}
        for front in FRONTS:
            one, many = load(runs, f"fleet-{front}", mode, 1), load(runs, f"fleet-{front}", mode, 64)
            rows[front] = {
                "added_p50_ms": one["p50_ms"] - direct[1]["p50_ms"],
                "added_p99_ms": one["p99_ms"] - direct[1]["p99_ms"],
                "requests_per_s_64": many["requests_per_s"],
                "success_rate_64": many["success_rate"],
            }
        best_p99 = min(rows[r]["added_p99_ms"] for r in ROUTERS)
        best_rate = max(rows[r]["requests_per_s_64"] for r in ROUTERS)
        doc["modes"][mode] = {"direct": direct, "fronts": rows,
                              "turnpike_rate_vs_best_router": rows["turnpike"]["requests_per_s_64"] / best_rate,
                              "turnpike_added_p99_minus_best_router_ms": rows["turnpike"]["added_p99_ms"] - best_p99}
        lines += [f"## {'non-streamed' if mode == 'plain' else 'streamed'}", "",
                  "| front | added p50 (ms) | added p99 (ms) | requests/s at 64 | success at 64 |",
                  "|---|---:|---:|---:|---:|",
                  f"| (a node directly) | 0 | 0 | {direct[64]['requests_per_s']:.0f} | {direct[64]['success_rate']:.3f} |"]
        for front, r in rows.items():
            lines.append(f"| {front} | {r['added_p50_ms']:.2f} | {r['added_p99_ms']:.2f} | "
                         f"{r['requests_per_s_64']:.0f} | {r['success_rate_64']:.3f} |")
        m = doc["modes"][mode]
        lines += ["", f"Turnpike's rate is {m['turnpike_rate_vs_best_router']:.2f}x the best router's; its added "
                  f"p99 is {m['turnpike_added_p99_minus_best_router_ms']:+.2f} ms against the best router's.", ""]
    results.mkdir(parents=True, exist_ok=True)
    (results / "fleet.json").write_text(json.dumps(doc, indent=2) + "\n")
    (results / "fleet.md").write_text("\n".join(lines))
    print("\n".join(lines))


main(Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3])
