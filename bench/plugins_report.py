"""Turns the runs of bench/run-plugins.sh into bench/results/plugins.json and plugins.md.

    python3 bench/plugins_report.py RUNS_DIR RESULTS_DIR SECONDS
"""

import datetime
import json
import statistics
import sys
from pathlib import Path

from gateway_report import cpu, load

RATE_GOAL, P99_GOAL_MS = 0.9, 0.1


def latency(runs: Path, name: str) -> dict:
    data = json.loads((runs / f"plugins-tools-{name}.json").read_text())
    pct = data.get("latencyPercentiles", {})
    return {"requests_per_s": data["summary"]["requestsPerSec"], "success_rate": data["summary"]["successRate"],
            "p50_ms": pct.get("p50", 0) * 1e3, "p99_ms": pct.get("p99", 0) * 1e3}


def main(runs: Path, results: Path, seconds: str) -> None:
    doc = {"date": datetime.date.today().isoformat(), "cpu": cpu(), "seconds_per_run": int(seconds), "cases": []}
    lines = ["# What gateway plugins cost", "",
             f"The simulator at zero latency (about 20 output tokens); {doc['cpu']}, one machine, {seconds} s per run, "
             "oha, with `bench/run-plugins.sh`. *On*: the shipped `guard` (a deny-list and the injection heuristic) and "
             "`redact` (every built-in kind) run on every request. Two rounds each, interleaved; ratios of the means "
             f"(goals: rate ≥ {RATE_GOAL} at c=64, p99 at most {P99_GOAL_MS * 1000:.0f} µs more at c=1).", "",
             "| case | requests/s none | requests/s on | rate ratio | p99 none (ms) | p99 on (ms) | p99 added (µs) |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for mode in ("plain", "stream"):
        for c in (1, 64):
            none = [load(runs, f"plugins-none-r{r}", mode, c) for r in (1, 2)]
            on = [load(runs, f"plugins-on-r{r}", mode, c) for r in (1, 2)]
            rate = statistics.mean(x["requests_per_s"] for x in on) / statistics.mean(x["requests_per_s"] for x in none)
            p99_none = statistics.mean(x["p99_ms"] for x in none)
            p99_on = statistics.mean(x["p99_ms"] for x in on)
            label = {"plain": "non-streamed", "stream": "streamed"}[mode]
            doc["cases"].append({"case": label, "concurrency": c, "none": none, "on": on, "rate_ratio": rate,
                                 "p99_added_ms": p99_on - p99_none})
            lines.append(f"| {label}, c={c} | {statistics.mean(x['requests_per_s'] for x in none):.0f} | "
                         f"{statistics.mean(x['requests_per_s'] for x in on):.0f} | {rate:.2f} | {p99_none:.3f} | "
                         f"{p99_on:.3f} | {(p99_on - p99_none) * 1000:+.0f} |")
    loop, call, answer = (latency(runs, n) for n in ("loop", "call", "answer"))
    added = loop["p50_ms"] - call["p50_ms"] - answer["p50_ms"]
    doc["tool_loop"] = {"loop": loop, "call_round": call, "answer_round": answer, "added_p50_ms": added}
    lines += ["", "## The server-tool loop", "",
              "One request whose model calls the C example's `unix_time` tool (answered at once, inside the call) and "
              "then answers its result, against the two requests a client makes to do the same itself (the call; then "
              "the call and its result sent back). c=1, non-streamed.", "",
              "| request | p50 (ms) | p99 (ms) |", "|---|---:|---:|",
              f"| the tool loop (2 rounds) | {loop['p50_ms']:.3f} | {loop['p99_ms']:.3f} |",
              f"| round 1 alone (returns the call) | {call['p50_ms']:.3f} | {call['p99_ms']:.3f} |",
              f"| round 2 alone (answers the result) | {answer['p50_ms']:.3f} | {answer['p99_ms']:.3f} |", "",
              f"What the loop adds beyond its two rounds (p50): {added * 1000:+.0f} µs per tool round, the tool's own "
              "time excluded (it answers inside the call).", ""]
    results.mkdir(parents=True, exist_ok=True)
    (results / "plugins.json").write_text(json.dumps(doc, indent=2) + "\n")
    (results / "plugins.md").write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3])
