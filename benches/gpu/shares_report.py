#!/usr/bin/env python3
"""Per-phase means of what the exporter's per-process view said in the shared-GPU check.

Reads OUTDIR/scrapes.txt and OUTDIR/run.log of benches/gpu/shared_gpu_check.sh and prints, for
each phase, the seconds wholly inside it and the means of the instance's SM activity and of each
share's `gpuledger_share_sm_active_ratio` (`absent` counts the seconds a share had no series:
not attributable). A scrape at time t shows the second that ended before it, so a second counts
in a phase when [t-1, t) lies inside the phase's start and end. Usage: shares_report.py OUTDIR
"""

import re
import sys
from collections import defaultdict

out = sys.argv[1]

# The phases: from the gpuload lines of job 101 (the job that runs in every phase), named by the
# marker lines of run.log that precede them.
phases = []
section = "sliced"
for line in open(f"{out}/run.log"):
    if line.startswith("# mps, both"):
        section = "mps"
    elif line.startswith("# mps "):
        section = "mps-one"
    m = re.match(r"phase (\w+) ([\d.]+) ([\d.]+)", line)
    if not m:
        continue
    name, start, end = m.group(1), float(m.group(2)), float(m.group(3))
    label = section
    if section == "sliced" and any(p[0] == "sliced" for p in phases if p[1] <= start - 1):
        label = "alone"
    if section == "sliced" and name == "idle":
        continue  # job 102's idle phase: the same window as job 101's second FMA phase
    if not any(abs(p[1] - start) < 1 and p[0] == label for p in phases):
        phases.append((label, start, end))

seconds = []
current = None
for line in open(f"{out}/scrapes.txt"):
    if line.startswith("# scrape"):
        current = {"t": float(line.split()[2]), "shares": {}}
        seconds.append(current)
        continue
    m = re.match(r"(\w+)\{(.*)\} (\S+)", line)
    if not m or current is None:
        continue
    name, labels, value = m.groups()
    workload = dict(re.findall(r'(\w+)="([^"]*)"', labels)).get("workload") or "(no owner)"
    if name == "gpuledger_instance_sm_active_ratio":
        current["sm"] = float(value)
    elif name == "gpuledger_share_processes":
        current["shares"].setdefault(workload, None)
    elif name == "gpuledger_share_sm_active_ratio":
        current["shares"][workload] = float(value)

print("phase | seconds | instance SM active | share SM active, mean (seconds absent)")
for label, start, end in phases:
    inside = [s for s in seconds if start <= int(s["t"]) - 1 and int(s["t"]) <= end]
    if not inside:
        continue
    sm = sum(s.get("sm", 0.0) for s in inside) / len(inside)
    shares = defaultdict(list)
    for s in inside:
        for w, v in s["shares"].items():
            shares[w].append(v)
    parts = []
    for w in sorted(shares):
        known = [v for v in shares[w] if v is not None]
        mean = f"{sum(known) / len(known):.3f}" if known else "-"
        parts.append(f"{w}: {mean} ({len(shares[w]) - len(known)} absent)")
    print(f"{label} | {len(inside)} | {sm:.3f} | " + ", ".join(parts))
