"""Turns the runs of bench/run-responses.sh into bench/results/responses.json and responses.md.

    python3 bench/responses_report.py RUNS_DIR RESULTS_DIR SECONDS
"""

import datetime
import json
import sys
from pathlib import Path

from gateway_report import cpu, load

HTTP = ["turnpike-responses", "turnpike-chat", "llmsim-responses", "litellm-responses"]
WS = ["turnpike", "llmsim"]
MODES = ("plain", "stream")


def load_ws(runs: Path, name: str, c: int) -> dict:
    data = json.loads((runs / f"{name}-ws-c{c}.json").read_text())
    return {
        "turns_per_s": data["turns_per_s"],
        "p50_ms": data["p50_ms"],
        "p99_ms": data["p99_ms"],
        "errors": data["errors"] + data["failed_connections"],
    }


def ratios(t: dict, p: dict, rate: str) -> dict:
    """Turnpike `t` against peer `p`: rate as t / p, latency as p / t (above 1: Turnpike better)."""
    return {
        f"{rate}_at_64": t["c64"][rate] / p["c64"][rate],
        "p50_at_1": p["c1"]["p50_ms"] / t["c1"]["p50_ms"],
        "p99_at_1": p["c1"]["p99_ms"] / t["c1"]["p99_ms"],
        "p50_at_64": p["c64"]["p50_ms"] / t["c64"]["p50_ms"],
        "p99_at_64": p["c64"]["p99_ms"] / t["c64"]["p99_ms"],
    }


def main(runs: Path, results: Path, seconds: str) -> None:
    http = {name: {mode: {f"c{c}": load(runs, name, mode, c) for c in (1, 64)} for mode in MODES} for name in HTTP}
    ws = {name: {f"c{c}": load_ws(runs, name, c) for c in (1, 64)} for name in WS}
    compared = {}
    for mode in MODES:
        t = http["turnpike-responses"][mode]
        for peer in ("llmsim-responses", "litellm-responses", "turnpike-chat"):
            compared[f"responses {mode} vs {peer}"] = ratios(t, http[peer][mode], "requests_per_s")
    compared["ws vs llmsim ws"] = ratios(ws["turnpike"], ws["llmsim"], "turns_per_s")
    # A turn over an open WebSocket against the same response streamed over HTTP.
    stream = {c: {"turns_per_s": r["requests_per_s"], **r} for c, r in http["turnpike-responses"]["stream"].items()}
    compared["ws vs http stream (turnpike)"] = ratios(ws["turnpike"], stream, "turns_per_s")
    report = {
        "benchmark": "responses",
        "date": datetime.date.today().isoformat(),
        "cpu": cpu(),
        "seconds_per_run": int(seconds),
        "load_tools": "oha 1.16.0 (HTTP), ws-turns (WebSocket, bench/src/ws_turns.rs)",
        "request": "a Responses request with one user message, max_output_tokens 20, store false "
        "(chat: the same message, max_tokens 20)",
        "http": http,
        "websocket": ws,
        "turnpike_ratios": compared,
        "notes": "Rates are Turnpike / peer and latencies peer / Turnpike: above 1 means Turnpike is better.",
    }
    results.mkdir(parents=True, exist_ok=True)
    (results / "responses.json").write_text(json.dumps(report, indent=2) + "\n")

    lines = [
        "# Responses API and WebSocket turns: Turnpike against llmsim and LiteLLM's proxy",
        "",
        f"Measured {report['date']} on {report['cpu']} (2 cores shared by server and load tool), "
        f"{seconds} s per run after a warm-up, with `bench/run-responses.sh`. Turnpike serves the simulator "
        "engine at zero latency, llmsim runs its `instant` profile, LiteLLM's proxy answers with "
        "`mock_response`. The request: one user message, `max_output_tokens` 20, `store: false`.",
        "",
        "HTTP (oha):",
        "",
        "| server | endpoint | mode | req/s at 64 | p50 at 1 (ms) | p99 at 1 (ms) | p50 at 64 (ms) | p99 at 64 (ms) | success |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name in HTTP:
        server, endpoint = name.split("-")
        for mode in MODES:
            r = http[name][mode]
            lines.append(
                f"| {server} | {endpoint} | {mode} | {r['c64']['requests_per_s']:.0f} | {r['c1']['p50_ms']:.2f} "
                f"| {r['c1']['p99_ms']:.2f} | {r['c64']['p50_ms']:.2f} | {r['c64']['p99_ms']:.2f} "
                f"| {min(r['c1']['success_rate'], r['c64']['success_rate']):.0%} |"
            )
    lines += [
        "",
        "WebSocket turns (ws-turns; 1 and 64 connections, turns one after another on each):",
        "",
        "| server | turns/s at 64 | p50 at 1 (ms) | p99 at 1 (ms) | p50 at 64 (ms) | p99 at 64 (ms) | errors |",
        "|---|---|---|---|---|---|---|",
    ]
    for name in WS:
        r = ws[name]
        lines.append(
            f"| {name} | {r['c64']['turns_per_s']:.0f} | {r['c1']['p50_ms']:.2f} | {r['c1']['p99_ms']:.2f} "
            f"| {r['c64']['p50_ms']:.2f} | {r['c64']['p99_ms']:.2f} | {r['c1']['errors'] + r['c64']['errors']} |"
        )
    lines += [
        "",
        "Turnpike's ratios (rates: Turnpike / peer; latency: peer / Turnpike; above 1 means Turnpike is better):",
        "",
        "| comparison | rate at 64 | p50 at 1 | p99 at 1 | p50 at 64 | p99 at 64 |",
        "|---|---|---|---|---|---|",
    ]
    for key, r in compared.items():
        rate = next(v for k, v in r.items() if k.endswith("_at_64") and not k.startswith("p"))
        lines.append(
            f"| {key} | {rate:.2f}x | {r['p50_at_1']:.2f}x | {r['p99_at_1']:.2f}x | {r['p50_at_64']:.2f}x "
            f"| {r['p99_at_64']:.2f}x |"
        )
    (results / "responses.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3])
