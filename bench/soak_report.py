"""Writes bench/results/soak.{json,md} from a run of bench/run-soak.sh: oha's JSON of the two
loads and the RSS samples.

    python3 bench/soak_report.py RUNS_DIR RESULTS_DIR SECONDS MAX_RATE RATE
"""

import json, platform, sys, time
runs, out, seconds, max_rate, rate = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5])
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), platform.processor())
samples = [tuple(map(int, l.split())) for l in open(f"{runs}/soak-rss.txt") if len(l.split()) == 2]
loads = {}
for mode in ("plain", "stream"):
    r = json.load(open(f"{runs}/soak-{mode}.json"))
    codes = {k: v for k, v in r.get("statusCodeDistribution", {}).items()}
    errors = r.get("errorDistribution", {})
    total = sum(codes.values()) + sum(errors.values())
    # oha cuts the requests in flight when its run time is up; those are the load tool's, not errors.
    cut = errors.pop("aborted due to deadline", 0)
    loads[mode] = {"requests": total - cut, "req_per_s": r["summary"]["requestsPerSec"], "status_codes": codes,
                   "errors": errors, "cut_at_end": cut, "non_200": total - cut - codes.get("200", 0)}
first, last = samples[0][1], samples[-1][1]
peak = max(s[1] for s in samples)
result = {
    "date": time.strftime("%Y-%m-%d"), "cpu": cpu, "cores": __import__("os").cpu_count(), "seconds": seconds,
    "max_req_per_s": max_rate, "target_req_per_s": rate, "loads": loads,
    "rss_kib": [{"t": t - samples[0][0], "rss": v} for t, v in samples],
    "rss_growth_pct": round(100 * (last - first) / first, 2), "rss_peak_kib": peak,
    "errors": sum(l["non_200"] for l in loads.values()),
}
json.dump(result, open(f"{out}/soak.json", "w"), indent=2)
ok = lambda b: "met" if b else "missed"
lines = [
    "# Soak: steady load at half the maximum rate",
    "",
    f"Measured {result['date']} on {cpu} ({result['cores']} cores shared by the gateway and the load tool), with "
    f"`bench/run-soak.sh {seconds}`: the release gateway with the simulator engine at zero latency (the gateway "
    f"benchmark's config), {seconds} s at {rate} req/s (half of the {max_rate:.0f} req/s measured just before, "
    "64 connections, plain chat), half plain and half streamed chat completions of about 20 tokens, load by oha. "
    "RSS read from /proc every 30 s.",
    "",
    "| load | requests | req/s | non-200 | transport errors | cut by oha at the end |",
    "|---|---|---|---|---|---|",
]
for mode, l in loads.items():
    lines.append(f"| {mode} | {l['requests']} | {l['req_per_s']:.0f} | {l['non_200']} | {sum(l['errors'].values())} | {l['cut_at_end']} |")
lines += [
    "",
    "| t (s) | RSS (MiB) |",
    "|---|---|",
    *[f"| {s['t']} | {s['rss'] / 1024:.1f} |" for s in result["rss_kib"]],
    "",
    f"RSS growth, first sample to last: {result['rss_growth_pct']}% (goal < 5%: {ok(result['rss_growth_pct'] < 5)}); "
    f"peak {peak / 1024:.1f} MiB. Errors: {result['errors']} (goal 0: {ok(result['errors'] == 0)}).",
]
open(f"{out}/soak.md", "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
