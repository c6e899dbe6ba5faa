"""Turns the oha runs of bench/run-tls.sh into bench/results/tls.json and tls.md.

    python3 bench/tls_report.py RUNS_DIR RESULTS_DIR SECONDS
"""

import datetime
import json
import sys
from pathlib import Path

from gateway_report import cpu, load

GOAL = 0.85


def main(runs: Path, results: Path, seconds: str) -> None:
    doc = {"date": datetime.date.today().isoformat(), "cpu": cpu(), "seconds_per_run": int(seconds), "runs": []}
    lines = ["# What TLS costs the gateway", "",
             f"The simulator at zero latency (about 20 output tokens); {doc['cpu']}, one machine, {seconds} s per "
             "run, oha, with `bench/run-tls.sh`. TLS: rustls (ring), TLS 1.3, ECDSA P-256. Ratios are TLS on over "
             f"TLS off (rate: higher is better; goal ≥ {GOAL}).", "",
             "| case | requests/s off | requests/s on | rate ratio | p99 off (ms) | p99 on (ms) |",
             "|---|---:|---:|---:|---:|---:|"]
    cases = [(mode, c) for mode in ("plain", "stream") for c in (1, 64)] + [("fresh", 64)]
    for mode, c in cases:
        off, on = load(runs, "tls-off", mode, c), load(runs, "tls-on", mode, c)
        ratio = on["requests_per_s"] / off["requests_per_s"]
        label = {"plain": "non-streamed", "stream": "streamed", "fresh": "non-streamed, a connection per request"}[mode]
        doc["runs"].append({"case": label, "concurrency": c, "off": off, "on": on, "rate_ratio": ratio})
        lines.append(f"| {label}, c={c} | {off['requests_per_s']:.0f} | {on['requests_per_s']:.0f} | {ratio:.2f} | "
                     f"{off['p99_ms']:.2f} | {on['p99_ms']:.2f} |")
    kept = [r["rate_ratio"] for r in doc["runs"] if "per request" not in r["case"]]
    doc["worst_kept_alive_ratio"] = min(kept)
    lines += ["", f"Worst ratio over kept-alive connections: {min(kept):.2f} (goal ≥ {GOAL}). A connection per request "
              "pays a full handshake each time; clients and SDKs keep connections alive.", ""]
    results.mkdir(parents=True, exist_ok=True)
    (results / "tls.json").write_text(json.dumps(doc, indent=2) + "\n")
    (results / "tls.md").write_text("\n".join(lines))
    print("\n".join(lines))


main(Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3])
