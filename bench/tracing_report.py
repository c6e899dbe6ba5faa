"""Turns the oha runs of bench/run-tracing.sh into bench/results/tracing.json and tracing.md.

    python3 bench/tracing_report.py RUNS_DIR RESULTS_DIR SECONDS EXPORTED_BYTES
"""

import datetime
import json
import sys
from pathlib import Path

from gateway_report import cpu, load

GOAL = 0.9


def main(runs: Path, results: Path, seconds: str, exported: str, spans: str, dropped: str) -> None:
    doc = {"date": datetime.date.today().isoformat(), "cpu": cpu(), "seconds_per_run": int(seconds),
           "exported_bytes": int(exported or 0), "exported_spans": int(float(spans or 0)),
           "dropped_spans": int(float(dropped or 0)), "runs": []}
    lines = ["# What tracing costs the gateway", "",
             f"The simulator at zero latency (about 20 output tokens); {doc['cpu']}, one machine, {seconds} s per "
             "run, oha, with `bench/run-tracing.sh`. Traced: every request sampled (`sample_ratio = 1.0`), ten "
             "spans each, exported as OTLP/HTTP protobuf in batches to a local sink "
             f"({doc['exported_spans']} spans, {doc['exported_bytes'] / 1e6:.1f} MB received, "
             f"{doc['dropped_spans']} dropped at a full queue). Ratios are traced over untraced "
             f"(goal ≥ {GOAL}); the sink runs on the same two cores.", "",
             "| case | requests/s untraced | requests/s traced | ratio | p99 untraced (ms) | p99 traced (ms) |",
             "|---|---:|---:|---:|---:|---:|"]
    for mode in ("plain", "stream"):
        for c in (1, 64):
            off, on = load(runs, "tracing-off", mode, c), load(runs, "tracing-on", mode, c)
            ratio = on["requests_per_s"] / off["requests_per_s"]
            label = "non-streamed" if mode == "plain" else "streamed"
            doc["runs"].append({"case": label, "concurrency": c, "off": off, "on": on, "rate_ratio": ratio})
            lines.append(f"| {label}, c={c} | {off['requests_per_s']:.0f} | {on['requests_per_s']:.0f} | "
                         f"{ratio:.2f} | {off['p99_ms']:.2f} | {on['p99_ms']:.2f} |")
    worst = min(r["rate_ratio"] for r in doc["runs"])
    doc["worst_ratio"] = worst
    lines += ["", f"Worst ratio: {worst:.2f} (goal ≥ {GOAL}).", ""]
    results.mkdir(parents=True, exist_ok=True)
    (results / "tracing.json").write_text(json.dumps(doc, indent=2) + "\n")
    (results / "tracing.md").write_text("\n".join(lines))
    print("\n".join(lines))


main(Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3], *(sys.argv[4:7] + ["0"] * (7 - len(sys.argv))))
