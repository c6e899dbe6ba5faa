"""Turns the runs of bench/run-admin.sh into bench/results/admin.json and admin.md.

    python3 bench/admin_report.py RUNS_DIR RESULTS_DIR
"""

import datetime
import json
import sys
from pathlib import Path

from gateway_report import cpu


def main(runs: Path, results: Path) -> None:
    found = [json.loads(p.read_text()) for p in sorted(runs.glob("admin-*.json"))]
    found.sort(key=lambda r: -r["sync_interval_ms"])
    doc = {"date": datetime.date.today().isoformat(), "cpu": cpu(), "runs": found}
    lines = ["# How fast an admin change reaches every replica", "",
             f"Two release gateways sharing one redis-server on {doc['cpu']} (one machine), with "
             "`bench/run-admin.sh`. Each change is a tenant put through the first replica; convergence is the time "
             "from its answer until the second replica's `/admin/v1/state` shows the new revision. The bound is "
             "`admin.sync_interval_ms` plus one store round trip. Each change follows the previous one's convergence at "
             "once, so it lands just after the second replica's check: the convergence times are the worst case, close "
             "to the interval; a change at a random moment waits half of it on average.", "",
             "| sync interval (ms) | changes | commit p50 (ms) | commit p99 (ms) | converge p50 (ms) | "
             "converge p99 (ms) | converge max (ms) |",
             "|---:|---:|---:|---:|---:|---:|---:|"]
    for r in found:
        c, v = r["commit_ms"], r["converge_ms"]
        lines.append(f"| {r['sync_interval_ms']} | {r['changes']} | {c['p50']:.2f} | {c['p99']:.2f} | "
                     f"{v['p50']:.1f} | {v['p99']:.1f} | {v['max']:.1f} |")
    lines.append("")
    results.mkdir(parents=True, exist_ok=True)
    (results / "admin.json").write_text(json.dumps(doc, indent=2) + "\n")
    (results / "admin.md").write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
