"""The tracking API's overhead on the tracked interpreter: ours against the Python
resource-tracker 0.5.0, and no tracker at all.

Each run is a fresh interpreter that tracks itself for about DURATION seconds at a
1 s interval while it does a fixed job (10 times a second: 20,000 empty loop
iterations, then 0.1 s of sleep: a job that runs, not an idle one), then stops the
tracker. It reports:

- self CPU: the interpreter's own user+system CPU (getrusage RUSAGE_SELF) from
  just before the import of the tracker package to just after stop(), minus the
  median of the same in the runs without a tracker (the job's own CPU);
- RSS: the interpreter's VmRSS in the middle of the run, and its VmHWM (peak);
- helper CPU: what the tracker's own processes used (RUSAGE_CHILDREN after stop:
  0.5.0's forked tracker processes, our binary), for context.

Modes run interleaved (none, 0.5.0, ours, none, …) so that the shared machine's
load changes touch each alike. Usage:

    python overhead.py OURS_VENV_PYTHON PEERS_VENV_PYTHON [RUNS] [DURATION]
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys

CHILD = r"""
import json, os, resource, sys, time
mode, duration = sys.argv[1], float(sys.argv[2])

def rss(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024.0  # MiB

def cpu(who=resource.RUSAGE_SELF):
    r = resource.getrusage(who)
    return r.ru_utime + r.ru_stime

c0, k0 = cpu(), cpu(resource.RUSAGE_CHILDREN)
rss0 = rss("VmRSS")
if mode == "ours":
    from resource_tracker_ebpf import ResourceTracker
    t = ResourceTracker(interval=1)
elif mode == "old":
    from resource_tracker import ResourceTracker
    # No cloud probe (it would ask metadata addresses over the network) and no
    # server discovery thread: 0.5.0 at its cheapest.
    t = ResourceTracker(interval=1, discover_server=False, discover_cloud=False)
else:
    t = None
if t is not None:
    t.start()
ticks = int(duration * 10)
mid = None
for i in range(ticks):
    for _ in range(20000):  # the same work in every run, whatever the load
        pass
    if i == ticks // 2:
        mid = rss("VmRSS")
    time.sleep(0.1)
n = None
if t is not None:
    n = t.n_samples
    t.stop()
print(json.dumps({
    "mode": mode,
    "self_cpu": cpu() - c0,
    "children_cpu": cpu(resource.RUSAGE_CHILDREN) - k0,
    "rss_start": rss0,
    "rss_mid": mid,
    "rss_peak": rss("VmHWM"),
    "samples": n,
}))
"""


def main() -> None:
    ours, old = sys.argv[1], sys.argv[2]
    runs = int(sys.argv[3]) if len(sys.argv) > 3 else 5
    duration = float(sys.argv[4]) if len(sys.argv) > 4 else 10.0
    results: dict = {"none": [], "old": [], "ours": []}
    for i in range(runs):
        for mode, py in (("none", ours), ("old", old), ("ours", ours)):
            out = subprocess.run([py, "-c", CHILD, mode, str(duration)], capture_output=True, text=True)
            if out.returncode != 0:
                sys.exit(f"{mode}: {out.stderr}")
            r = json.loads(out.stdout.strip().splitlines()[-1])
            results[mode].append(r)
            print(f"run {i} {mode}: {r}", file=sys.stderr)
    base_cpu = statistics.median(r["self_cpu"] for r in results["none"])
    base_mid = statistics.median(r["rss_mid"] for r in results["none"])

    def row(mode: str) -> dict:
        rs = results[mode]
        cpu = [r["self_cpu"] - base_cpu for r in rs]
        mid = [r["rss_mid"] - base_mid for r in rs]
        return {
            "mode": mode,
            "self_cpu_ms": [round(c * 1000, 1) for c in sorted(cpu)],
            "self_cpu_ms_median": round(statistics.median(cpu) * 1000, 1),
            "rss_mid_mib": [round(m, 1) for m in sorted(r["rss_mid"] for r in rs)],
            "rss_added_mib_median": round(statistics.median(mid), 1),
            "rss_peak_mib_median": round(statistics.median(r["rss_peak"] for r in rs), 1),
            "helper_cpu_ms_median": round(statistics.median(r["children_cpu"] for r in rs) * 1000, 1),
            "helper_cpu_ms": [round(r["children_cpu"] * 1000, 1) for r in sorted(rs, key=lambda r: r["children_cpu"])],
        }

    print(json.dumps({"runs": runs, "duration": duration, "rows": [row(m) for m in ("none", "old", "ours")]}, indent=1))


if __name__ == "__main__":
    main()
