"""Turns the oha runs of bench/run-fleet.sh into bench/results/fleet.json and fleet.md.

    python3 bench/fleet_report.py RUNS_DIR RESULTS_DIR SECONDS ROUNDS

Each front ran ROUNDS times, the fronts (and a node alone, the baseline of that round's added
latency) taking turns in an order rotated each round: a figure is the median of its rounds, a
rate carries its spread (lowest-highest). CPU time per request is what the front (and the two
nodes behind it) spent over the run at 64, divided by the requests it completed.
"""

import datetime
import json
import statistics
import sys
from pathlib import Path

from gateway_report import cpu, load

FRONTS = ["turnpike", "sglang-router", "vllm-router"]
ROUTERS = ["sglang-router", "vllm-router"]


def cpu_us_per_request(runs: Path, name: str, mode: str) -> dict:
    """Microseconds of CPU per request at 64 for the front and the nodes, or {} if not recorded."""
    path = runs / f"{name}-{mode}-c64.cpu.json"
    if not path.exists():
        return {}
    ticks = json.loads(path.read_text())
    data = json.loads((runs / f"{name}-{mode}-c64.json").read_text())
    # Answered requests: oha's rate also counts those the deadline cut off.
    requests = sum(n for code, n in data.get("statusCodeDistribution", {}).items() if code.startswith("2"))
    per = 1e6 / ticks["hz"] / max(requests, 1)
    return {"front_cpu_us": ticks["front_ticks"] * per, "nodes_cpu_us": ticks["nodes_ticks"] * per}


def one_round(runs: Path, name: str, mode: str, direct: dict) -> dict:
    """A front's figures in one round, its latency over the node's own in the same round."""
    one, many = load(runs, name, mode, 1), load(runs, name, mode, 64)
    return {
        "added_p50_ms": one["p50_ms"] - direct["p50_ms"],
        "added_p99_ms": one["p99_ms"] - direct["p99_ms"],
        "requests_per_s_64": many["requests_per_s"],
        "success_rate_64": many["success_rate"],
        "status_codes_64": many["status_codes"],
        **cpu_us_per_request(runs, name, mode),
    }


def median_of(rounds: list) -> dict:
    row = {k: statistics.median(r[k] for r in rounds) for k in rounds[0] if k != "status_codes_64"}
    rates = [r["requests_per_s_64"] for r in rounds]
    row["requests_per_s_64_spread"] = [min(rates), max(rates)]
    row["rounds"] = rounds
    return row


def main(runs: Path, results: Path, seconds: str, rounds: int) -> None:
    doc = {"date": datetime.date.today().isoformat(), "cpu": cpu(), "seconds_per_run": int(seconds),
           "rounds": rounds, "modes": {}}
    lines = ["# A fleet behind a front: Turnpike's upstream plugin vs the field's routers", "",
             f"Two Turnpike nodes (simulator, zero latency) behind each front; {doc['cpu']}, one machine, "
             f"{seconds} s per run, oha, `bench/run-fleet.sh {seconds} {rounds}`: the fronts and a node alone "
             f"took turns, {rounds} rounds in a rotated order, each figure the median of its rounds (rates "
             "with their lowest-highest). Added latency is the front's p50/p99 at concurrency 1 minus a "
             "node's own in the same round; rate is "
             "requests/s at concurrency 64; CPU is the microseconds of CPU time per request at 64 of "
             "the front and of the two nodes behind it (the nodes serve the routers' chat requests and "
             "Turnpike's token-level `/generate`; on one machine all of them share the cores).", ""]
    for mode in ("plain", "stream"):
        # A node alone, measured in every round: the baseline each front's round is set against.
        direct_rounds = [{c: load(runs, f"fleet-direct-r{r}", mode, c) for c in (1, 64)}
                         for r in range(1, rounds + 1)]
        direct = median_of([{"p50_ms_1": d[1]["p50_ms"], "p99_ms_1": d[1]["p99_ms"],
                             "requests_per_s_64": d[64]["requests_per_s"], "success_rate_64": d[64]["success_rate"],
                             **cpu_us_per_request(runs, f"fleet-direct-r{r}", mode)}
                            for r, d in enumerate(direct_rounds, 1)])
        rows = {front: median_of([one_round(runs, f"fleet-{front}-r{r}", mode, direct_rounds[r - 1][1])
                                  for r in range(1, rounds + 1)])
                for front in FRONTS}
        best_p99 = min(rows[r]["added_p99_ms"] for r in ROUTERS)
        best_rate = max(rows[r]["requests_per_s_64"] for r in ROUTERS)
        doc["modes"][mode] = {"direct": direct, "fronts": rows,
                              "turnpike_rate_vs_best_router": rows["turnpike"]["requests_per_s_64"] / best_rate,
                              "turnpike_added_p99_minus_best_router_ms": rows["turnpike"]["added_p99_ms"] - best_p99}
        lines += [f"## {'non-streamed' if mode == 'plain' else 'streamed'}", "",
                  "| front | added p50 (ms) | added p99 (ms) | requests/s at 64 (spread) | success at 64 "
                  "| front CPU µs/request | nodes CPU µs/request |",
                  "|---|---:|---:|---:|---:|---:|---:|",
                  f"| (a node directly) | 0 | 0 | {direct['requests_per_s_64']:.0f} "
                  f"({direct['requests_per_s_64_spread'][0]:.0f}–{direct['requests_per_s_64_spread'][1]:.0f}) | "
                  f"{direct['success_rate_64']:.3f} | – | {direct.get('nodes_cpu_us', 0):.0f} |"]
        for front, r in rows.items():
            low, high = r["requests_per_s_64_spread"]
            lines.append(f"| {front} | {r['added_p50_ms']:.2f} | {r['added_p99_ms']:.2f} | "
                         f"{r['requests_per_s_64']:.0f} ({low:.0f}–{high:.0f}) | {r['success_rate_64']:.3f} | "
                         f"{r.get('front_cpu_us', 0):.0f} | {r.get('nodes_cpu_us', 0):.0f} |")
        m = doc["modes"][mode]
        lines += ["", f"Turnpike's rate is {m['turnpike_rate_vs_best_router']:.2f}x the best router's; its added "
                  f"p99 is {m['turnpike_added_p99_minus_best_router_ms']:+.2f} ms against the best router's.", ""]
    results.mkdir(parents=True, exist_ok=True)
    (results / "fleet.json").write_text(json.dumps(doc, indent=2) + "\n")
    (results / "fleet.md").write_text("\n".join(lines))
    print("\n".join(lines))


main(Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3], int(sys.argv[4]) if len(sys.argv) > 4 else 1)
