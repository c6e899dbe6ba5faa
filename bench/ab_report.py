"""Turns the runs of bench/run-ab.sh into bench/results/ab.json and ab.md: each cell's median
over the rounds, for the base build and the head build, and head against base.

    python3 bench/ab_report.py RUNS_DIR RESULTS_DIR SECONDS ROUNDS BASE_REV HEAD_REV
"""

import datetime
import json
import statistics
import sys
from pathlib import Path

from gateway_report import cpu, load
from responses_report import load_ws

CELLS = [(endpoint, mode) for endpoint in ("chat", "responses") for mode in ("plain", "stream")]


def median_cell(cells: list) -> dict:
    keys = [k for k in cells[0] if isinstance(cells[0][k], (int, float))]
    out = {k: statistics.median(c[k] for c in cells) for k in keys}
    out["rounds"] = [{k: c[k] for k in keys} for c in cells]
    return out


def side(runs: Path, name: str, rounds: int) -> dict:
    out = {}
    for endpoint, mode in CELLS:
        for c in (1, 64):
            cells = [load(runs, f"{name}-r{r}-{endpoint}", mode, c) for r in range(1, rounds + 1)]
            out[f"{endpoint} {mode} c{c}"] = median_cell(cells)
    for c in (1, 64):
        cells = [load_ws(runs, f"{name}-r{r}", c) for r in range(1, rounds + 1)]
        out[f"responses ws c{c}"] = median_cell(cells)
    return out


def main(runs: Path, results: Path, seconds: str, rounds: str, base_rev: str, head_rev: str) -> None:
    n = int(rounds)
    base, head = side(runs, "base", n), side(runs, "head", n)
    compared = {}
    for cell in base:
        rate = "turns_per_s" if "ws" in cell else "requests_per_s"
        compared[cell] = {
            "rate": head[cell][rate] / base[cell][rate],
            "p50": base[cell]["p50_ms"] / head[cell]["p50_ms"],
            "p99": base[cell]["p99_ms"] / head[cell]["p99_ms"],
        }
    report = {
        "date": datetime.date.today().isoformat(),
        "cpu": cpu(),
        "seconds_per_run": int(seconds),
        "rounds": n,
        "base": base_rev,
        "head": head_rev,
        "load_tools": "oha 1.16.0 (HTTP), ws-turns (WebSocket, bench/src/ws_turns.rs)",
        "base_results": base,
        "head_results": head,
        "head_vs_base": compared,
    }
    results.mkdir(parents=True, exist_ok=True)
    (results / "ab.json").write_text(json.dumps(report, indent=2) + "\n")
    lines = [
        f"# Gateway A/B: {head_rev} against {base_rev}",
        "",
        f"Measured {report['date']} on {report['cpu']} (2 cores shared by server and load tool), "
        f"{seconds} s per run, {n} rounds interleaved (base first in odd rounds, head first in even "
        "ones), medians over the rounds, "
        "with `bench/run-ab.sh`. Turnpike serves the simulator engine at zero latency; the "
        "requests are run-gateway.sh's and run-responses.sh's (about 20 output tokens, "
        "`store: false`).",
        "",
        "| cell | base rate | head rate | rate head/base | p50 base (ms) | p50 head (ms) | p99 base (ms) | p99 head (ms) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for cell, ratio in compared.items():
        rate = "turns_per_s" if "ws" in cell else "requests_per_s"
        b, h = base[cell], head[cell]
        lines.append(
            f"| {cell} | {b[rate]:.0f} | {h[rate]:.0f} | {ratio['rate']:.2f}x | "
            f"{b['p50_ms']:.2f} | {h['p50_ms']:.2f} | {b['p99_ms']:.2f} | {h['p99_ms']:.2f} |"
        )
    spread = [
        (max(r["requests_per_s"] if "requests_per_s" in r else r["turns_per_s"] for r in cell["rounds"])
         / max(1e-9, min(r["requests_per_s"] if "requests_per_s" in r else r["turns_per_s"] for r in cell["rounds"])))
        for cell in list(base.values()) + list(head.values())
    ]
    lines += [
        "",
        f"Noise: within one build the rate of a cell varies up to {max(spread):.2f}x between rounds "
        f"(median {statistics.median(spread):.2f}x).",
    ]
    (results / "ab.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]), *sys.argv[3:7])
