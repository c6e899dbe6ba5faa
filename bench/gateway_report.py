"""Turns the oha runs of bench/run-gateway.sh into bench/results/gateway.json and gateway.md.

    python3 bench/gateway_report.py RUNS_DIR RESULTS_DIR SECONDS
"""

import datetime
import json
import platform
import sys
from pathlib import Path

SERVERS = ["turnpike", "litellm", "llmsim"]
PEERS = ["litellm", "llmsim"]


def load(runs: Path, name: str, mode: str, c: int) -> dict:
    data = json.loads((runs / f"{name}-{mode}-c{c}.json").read_text())
    summary = data["summary"]
    pct = data.get("latencyPercentiles", {})
    statuses = data.get("statusCodeDistribution", {})
    return {
        "requests_per_s": summary["requestsPerSec"],
        "success_rate": summary["successRate"],
        "p50_ms": pct.get("p50", 0) * 1e3,
        "p99_ms": pct.get("p99", 0) * 1e3,
        "status_codes": statuses,
    }


def cpu() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def main(runs: Path, results: Path, seconds: str) -> None:
    table = {
        name: {mode: {f"c{c}": load(runs, name, mode, c) for c in (1, 64)} for mode in ("plain", "stream")}
        for name in SERVERS
    }
    ratios = {}
    for mode in ("plain", "stream"):
        t = table["turnpike"][mode]
        for peer in PEERS:
            p = table[peer][mode]
            ratios[f"{mode}_vs_{peer}"] = {
                "requests_per_s_at_64": t["c64"]["requests_per_s"] / p["c64"]["requests_per_s"],
                "p50_at_1": p["c1"]["p50_ms"] / t["c1"]["p50_ms"],
                "p99_at_1": p["c1"]["p99_ms"] / t["c1"]["p99_ms"],
                "p50_at_64": p["c64"]["p50_ms"] / t["c64"]["p50_ms"],
                "p99_at_64": p["c64"]["p99_ms"] / t["c64"]["p99_ms"],
            }
    report = {
        "benchmark": "gateway",
        "date": datetime.date.today().isoformat(),
        "cpu": cpu(),
        "seconds_per_run": int(seconds),
        "load_tool": "oha 1.16.0",
        "request": "POST chat completion, 1 user message, max_tokens 20 (about 20 output tokens from each server)",
        "results": table,
        "turnpike_ratios": ratios,
        "notes": "Ratios of requests/s are Turnpike / peer; ratios of latency are peer / Turnpike (above 1: Turnpike is faster).",
    }
    results.mkdir(parents=True, exist_ok=True)
    (results / "gateway.json").write_text(json.dumps(report, indent=2) + "\n")

    lines = [
        "# Gateway: Turnpike against LiteLLM's proxy and llmsim",
        "",
        f"Measured {report['date']} on {report['cpu']} (2 cores shared by server and load tool), "
        f"{seconds} s per run after a 2 s warm-up, with `bench/run-gateway.sh`. Same load tool (oha) and same "
        "request for all: a chat completion of about 20 output tokens. Turnpike serves the simulator engine at "
        "zero latency, llmsim runs its `instant` profile, LiteLLM's proxy answers with `mock_response` behind a "
        "master key.",
        "",
        "| server | mode | req/s at 64 | p50 at 1 (ms) | p99 at 1 (ms) | p50 at 64 (ms) | p99 at 64 (ms) | success |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name in SERVERS:
        for mode in ("plain", "stream"):
            r = table[name][mode]
            lines.append(
                f"| {name} | {mode} | {r['c64']['requests_per_s']:.0f} | {r['c1']['p50_ms']:.2f} | {r['c1']['p99_ms']:.2f} "
                f"| {r['c64']['p50_ms']:.2f} | {r['c64']['p99_ms']:.2f} | {min(r['c1']['success_rate'], r['c64']['success_rate']):.0%} |"
            )
    lines += [
        "",
        "Turnpike's ratios (requests/s: Turnpike / peer; latency: peer / Turnpike; above 1 means Turnpike is better):",
        "",
        "| mode | peer | req/s at 64 | p50 at 1 | p99 at 1 | p50 at 64 | p99 at 64 |",
        "|---|---|---|---|---|---|---|",
    ]
    for key, r in ratios.items():
        mode, peer = key.split("_vs_")
        lines.append(
            f"| {mode} | {peer} | {r['requests_per_s_at_64']:.2f}x | {r['p50_at_1']:.2f}x | {r['p99_at_1']:.2f}x "
            f"| {r['p50_at_64']:.2f}x | {r['p99_at_64']:.2f}x |"
        )
    (results / "gateway.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3])
