"""Writes bench/results/batch.{json,md} from a batch_bench.py run, with the CPU and its
measured memory bandwidth.

  python3 bench/batch_report.py RUN_JSON CPU BANDWIDTH_GBPS
"""

import json
import statistics
import sys
from pathlib import Path

run, cpu, bandwidth = sys.argv[1:4]
result = json.loads(Path(run).read_text())
result["cpu"] = cpu
result["bandwidth_gbps"] = float(bandwidth)
out = Path(__file__).resolve().parent / "results"
(out / "batch.json").write_text(json.dumps(result, indent=2) + "\n")

ratios = result["throughput_ratios"]
best = str(result["best_concurrency"])
client = result["client"][best]
batch = result["batch"]
median = lambda rows, key: statistics.median(r[key] for r in rows)
ttft = result["ttft_ms"]
lines = [
    "# Batch API on SmolLM2 (default engine, CPU)",
    "",
    f"{cpu}, {result['threads']} threads, {bandwidth} GB/s measured read bandwidth. "
    f"{result['lines']} greedy chat lines of up to {result['max_tokens']} tokens, prompts of different lengths; "
    f"{result['rounds']} interleaved rounds. Command: `bench/run-batch.sh {result['rounds']}`.",
    "",
    "## Throughput",
    "",
    "| side | lines/s (median) | CPU ms per line |",
    "|---|---|---|",
]
for c, rows in result["client"].items():
    lines.append(f"| client, {c} at once | {median(rows, 'lines_per_s'):.2f} | {median(rows, 'cpu_ms_per_line'):.0f} |")
lines += [
    f"| batch | {median(batch, 'lines_per_s'):.2f} | {median(batch, 'cpu_ms_per_line'):.0f} |",
    "",
    f"Batch over the best client ({best} at once): median **{statistics.median(ratios):.2f}x** "
    f"(rounds: {', '.join(f'{r:.2f}' for r in ratios)}). Goal: at least 0.9x.",
    "",
    "## Interactive time to first token",
    "",
    "| | p50 ms | p99 ms | samples |",
    "|---|---|---|---|",
    f"| no batch | {ttft['idle']['p50']:.1f} | {ttft['idle']['p99']:.1f} | {ttft['idle']['samples']} |",
    f"| batch running | {ttft['batch']['p50']:.1f} | {ttft['batch']['p99']:.1f} | {ttft['batch']['samples']} |",
    "",
    f"With a batch over without: p50 **{result['ttft_ratio']['p50']:.2f}x**, p99 **{result['ttft_ratio']['p99']:.2f}x**. "
    "Goal: p99 at most 1.15x.",
    "",
]
(out / "batch.md").write_text("\n".join(lines))
print("\n".join(lines))
