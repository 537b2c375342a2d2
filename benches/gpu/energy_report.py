#!/usr/bin/env python3
"""The exporter's GPU energy against NVML's own counter, read by pynvml, in a real-GPU check.

Reads OUTDIR/scrapes.txt (the exporter's /metrics every second) and OUTDIR/reference.csv
(gpm_reference.py: per second and GPU, `energy_mj` from nvmlDeviceGetTotalEnergyConsumption and
`power_watts`) of benches/gpu/real_gpu_check.sh, and for each GPU prints:
- the exporter's `gpuledger_gpu_energy_joules_total` rise between its first and last scrape and
  the reference counter's rise over the same seconds (both in J), and their relative difference;
- per second, |exporter − reference| / reference: median and p95;
- the same for board power × 1 s against the counter, to show what the counter adds.
The ledger (OUTDIR/ledger.duckdb, if DuckDB's Python module is there) must hold the exporter's
sum: Σ energy_gpu_1m.energy_j is printed beside it. Runs here, not on the GPU machine.
Usage: energy_report.py OUTDIR
"""

import csv
import re
import statistics
import sys
from collections import defaultdict

out = sys.argv[1]

# Exporter: per GPU UUID, (scrape time, counter) pairs.
exporter = defaultdict(list)
t = None
pattern = re.compile(r'^gpuledger_gpu_energy_joules_total\{([^}]*)\} ([0-9.e+-]+)')
for line in open(f"{out}/scrapes.txt"):
    if line.startswith("# scrape "):
        t = float(line.split()[2])
        continue
    m = pattern.match(line)
    if m and t is not None:
        labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1)))
        exporter[labels["gpu_uuid"]].append((t, float(m.group(2))))

# Reference: per GPU index, {second: (energy_mj, power_watts)}.
reference = defaultdict(dict)
for row in csv.DictReader(open(f"{out}/reference.csv")):
    if row.get("energy_mj"):
        reference[int(row["gpu"])][int(row["ts"])] = (int(row["energy_mj"]), float(row["power_watts"]))

if not exporter or not reference:
    sys.exit("energy_report: no energy in the scrapes or the reference (an older run?)")

# GPUs in UUID order match NVML index order only by chance; pair them by the order of their
# first scrape lines, which the exporter writes in NVML index order.
uuids = sorted(exporter, key=lambda u: min(x[0] for x in exporter[u]))
for index, uuid in enumerate(uuids):
    ref = reference.get(index)
    if not ref:
        continue
    points = exporter[uuid]
    # A scrape at time s shows the seconds up to floor(s); the reference row `ts` is read at ts.
    per_second = []
    for (s0, e0), (s1, e1) in zip(points, points[1:]):
        a, b = int(s0), int(s1)
        if a in ref and b in ref and b > a:
            r = (ref[b][0] - ref[a][0]) / 1000.0
            p = sum(ref[k][1] for k in range(a + 1, b + 1) if k in ref)
            if r > 0:
                per_second.append(((e1 - e0) / (b - a), r / (b - a), p / (b - a)))
    first = next((p for p in points if int(p[0]) in ref), None)
    last = next((p for p in reversed(points) if int(p[0]) in ref), None)
    if not per_second or first is None or last is None:
        print(f"{uuid}: too few aligned seconds")
        continue
    e_total = last[1] - first[1]
    r_total = (ref[int(last[0])][0] - ref[int(first[0])][0]) / 1000.0
    diffs = sorted(abs(e - r) / r for e, r, _ in per_second)
    pdiffs = sorted(abs(p - r) / r for _, r, p in per_second)
    q = lambda v, x: v[min(len(v) - 1, int(x * len(v)))]
    print(
        f"{uuid} (index {index}): exporter {e_total:.1f} J, counter {r_total:.1f} J, "
        f"relative difference {abs(e_total - r_total) / r_total:.2e}; per second median "
        f"{statistics.median(diffs):.2e} p95 {q(diffs, 0.95):.2e}; power x 1 s median "
        f"{statistics.median(pdiffs):.2e} p95 {q(pdiffs, 0.95):.2e} ({len(per_second)} intervals)"
    )

try:
    import duckdb

    con = duckdb.connect(f"{out}/ledger.duckdb", read_only=True)
    for uuid, j in con.execute(
        "SELECT gpu_uuid, sum(energy_j) FROM energy_gpu_1m GROUP BY ALL ORDER BY 1"
    ).fetchall():
        print(f"ledger {uuid}: {j:.1f} J stored")
except ImportError:
    print("energy_report: no DuckDB Python module; the ledger's sums are not shown")
