#!/usr/bin/env python3
"""Convert a gpuledger trace CSV (schema/TRACE.md) to OpenMetrics text for
`promtool tsdb create-blocks-from openmetrics`, and tally per-tenant GPU-seconds straight
from the CSV (the ground truth both services must reproduce).

Modes:
  counters  the 8 per-second counters, one gauge family each, as a DCGM-exporter-style
            setup would carry them (labels node, gpu_uuid, gpu_model, mig_profile,
            gpu_instance_id, tenant, workload, slo_class; an empty CSV field is an absent
            label; an empty counter is no sample).
  alloc     only gpu_allocated_gpu_equivalents{tenant,workload,node,gpu_uuid,gpu_instance_id}
            = the instance's size (compute slices / 7, whole GPU 1), for each second the
            instance is allocated to a tenant.

Output is one file per 2-hour-aligned window, OUT_DIR/<window start>.om, each ending with
`# EOF`, so that promtool (which re-parses its whole input once per 2 h block it writes)
reads every file only once per block. Timestamps are the sample's second `t` (the sample
covers [t, t+1)), in seconds.

--tally FROM:TO (repeatable, Unix seconds) adds per-tenant allocated GPU-seconds over
[FROM, TO) to the JSON summary printed on stdout. They are kept exact as integer
slice-seconds (size x 7) and divided by 7 only at the end.

--from T skips the rows before second T (counted as "skipped", not in "rows").

--promtool PROMTOOL --tsdb DIR backfills each window as soon as its file is written:
`PROMTOOL tsdb create-blocks-from openmetrics -q FILE DIR` runs beside the conversion of the
next window (one at a time), and the file is deleted once promtool is done, so at most about
two windows of text are on disk. promtool's output goes to standard error.
"""

import argparse
import csv
import json
import os
import resource
import subprocess
import sys
from datetime import datetime

WINDOW = 7200

COUNTERS = [
    ("sm_active", "gpu_sm_active"),
    ("sm_occupancy", "gpu_sm_occupancy"),
    ("tensor_active", "gpu_tensor_active"),
    ("dram_active", "gpu_dram_active"),
    ("fb_used_bytes", "gpu_fb_used_bytes"),
    ("fb_total_bytes", "gpu_fb_total_bytes"),
    ("nvlink_tx_bytes", "gpu_nvlink_tx_bytes"),
    ("nvlink_rx_bytes", "gpu_nvlink_rx_bytes"),
]
ALLOC = "gpu_allocated_gpu_equivalents"


def esc(v):
    return v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def labels(pairs):
    return ",".join(f'{k}="{esc(v)}"' for k, v in pairs if v != "")


def slices(profile):
    """Compute slices of a MIG profile ('3g.40gb' -> 3); a whole GPU is 7."""
    if not profile:
        return 7
    return int(profile.split("g", 1)[0])


def parse_ts(s):
    if s.isdigit():
        return int(s)
    return int(datetime.fromisoformat(s.replace("Z", "+00:00")).timestamp())


class Backfill:
    """Runs promtool on each finished window file, one at a time, beside the conversion."""

    def __init__(self, promtool, tsdb):
        self.cmd = [promtool, "tsdb", "create-blocks-from", "openmetrics", "-q"]
        self.tsdb = tsdb
        self.proc = None
        self.path = None

    def submit(self, path):
        self.wait()
        self.proc = subprocess.Popen(self.cmd + [path, self.tsdb], stdout=sys.stderr, stderr=sys.stderr)
        self.path = path

    def wait(self):
        if self.proc is None:
            return
        rc = self.proc.wait()
        self.proc = None
        if rc != 0:
            sys.exit(f"trace_to_openmetrics: promtool exited {rc} on {self.path}")
        os.remove(self.path)


class Writer:
    """Writes one window's families: each family to its own part file, joined at close."""

    def __init__(self, out_dir, families, backfill=None):
        self.out_dir = out_dir
        self.families = families
        self.backfill = backfill
        self.window = None
        self.parts = {}
        self.files = []

    def open(self, window):
        self.close()
        self.window = window
        self.parts = {}
        for fam in self.families:
            path = os.path.join(self.out_dir, f"{window}.{fam}.part")
            f = open(path, "w", buffering=1 << 20)
            f.write(f"# TYPE {fam} gauge\n")
            self.parts[fam] = (path, f)

    def close(self):
        if self.window is None:
            return
        out = os.path.join(self.out_dir, f"{self.window}.om")
        with open(out, "wb") as dst:
            for fam in self.families:
                path, f = self.parts[fam]
                f.close()
                with open(path, "rb") as src:
                    while True:
                        buf = src.read(1 << 22)
                        if not buf:
                            break
                        dst.write(buf)
                os.remove(path)
            dst.write(b"# EOF\n")
        self.files.append(out)
        self.window = None
        if self.backfill is not None:
            self.backfill.submit(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mode", choices=["counters", "alloc"])
    ap.add_argument("trace")
    ap.add_argument("out_dir")
    ap.add_argument("--tally", action="append", default=[], metavar="FROM:TO")
    ap.add_argument("--from", dest="from_", type=int, default=None, metavar="T")
    ap.add_argument("--promtool")
    ap.add_argument("--tsdb")
    a = ap.parse_args()
    if (a.promtool is None) != (a.tsdb is None):
        ap.error("--promtool and --tsdb go together")

    ranges = [tuple(int(x) for x in r.split(":")) for r in a.tally]
    tallies = [{} for _ in ranges]
    os.makedirs(a.out_dir, exist_ok=True)

    families = [m for _, m in COUNTERS] if a.mode == "counters" else [ALLOC]
    backfill = Backfill(a.promtool, a.tsdb) if a.promtool else None
    w = Writer(a.out_dir, families, backfill)
    skip_before = a.from_ if a.from_ is not None else -(1 << 62)
    rows = skipped = 0
    opens = []  # (window start, rows before it)
    samples = {fam: 0 for fam in families}
    first = last = None
    label_cache = {}
    ts_cache = (None, None)

    with open(a.trace, newline="") as f:
        r = csv.reader(f)
        header = next(r)
        col = {name: i for i, name in enumerate(header)}
        i_ts, i_node, i_uuid, i_model = (col[c] for c in ("timestamp", "node", "gpu_uuid", "gpu_model"))
        opt = lambda c: col.get(c, -1)  # noqa: E731
        i_prof, i_gi, i_ten, i_wl, i_slo = (opt(c) for c in ("mig_profile", "gpu_instance_id", "tenant", "workload", "slo_class"))
        counters = [(col[c], m, []) for c, m in COUNTERS if c in col]
        get = lambda row, i: row[i] if i >= 0 else ""  # noqa: E731
        fam_out = None

        for row in r:
            s = row[i_ts]
            if s == ts_cache[0]:
                t = ts_cache[1]
            else:
                t = parse_ts(s)
                ts_cache = (s, t)
                if t >= skip_before:
                    if first is None:
                        first = t
                    last = t
                    win = t - t % WINDOW
                    if win != w.window:
                        w.open(win)
                        fam_out = {fam: w.parts[fam][1] for fam in families}
                        opens.append((win, rows))
            if t < skip_before:
                skipped += 1
                continue
            rows += 1
            prof, gi, ten = get(row, i_prof), get(row, i_gi), get(row, i_ten)
            key = (row[i_node], row[i_uuid], row[i_model], prof, gi, ten, get(row, i_wl), get(row, i_slo))
            lab = label_cache.get(key)
            if lab is None:
                node, uuid, model, _, _, _, wl, slo = key
                if a.mode == "counters":
                    lab = labels([("node", node), ("gpu_uuid", uuid), ("gpu_model", model),
                                  ("mig_profile", prof), ("gpu_instance_id", gi),
                                  ("tenant", ten), ("workload", wl), ("slo_class", slo)])
                    lab = (lab, 0)
                else:
                    n = slices(prof)
                    lab = (labels([("tenant", ten), ("workload", wl), ("node", node),
                                   ("gpu_uuid", uuid), ("gpu_instance_id", gi)]),
                           n, "1" if n == 7 else repr(n / 7))
                label_cache[key] = lab
            if a.mode == "counters":
                for i, m, _ in counters:
                    v = row[i]
                    if v != "":
                        fam_out[m].write(f"{m}{{{lab[0]}}} {v} {t}\n")
                        samples[m] += 1
            elif ten != "":
                fam_out[ALLOC].write(f"{ALLOC}{{{lab[0]}}} {lab[2]} {t}\n")
                samples[ALLOC] += 1
            if ten != "" and ranges:
                n = slices(prof)
                for (lo, hi), tally in zip(ranges, tallies):
                    if lo <= t < hi:
                        tally[ten] = tally.get(ten, 0) + n
    w.close()
    if backfill is not None:
        backfill.wait()
    ends = [n for _, n in opens[1:]] + [rows]
    window_rows = {win: end - n for (win, n), end in zip(opens, ends)}
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)  # the promtool runs, all waited for

    json.dump({
        "rows": rows,
        "skipped": skipped,
        "window_rows": {str(k): v for k, v in window_rows.items()},
        "promtool_cpu_s": ru.ru_utime + ru.ru_stime if backfill is not None else None,
        "first": first,
        "last": last,
        "samples": samples,
        "files": w.files,
        "tally_slice_seconds": [{"from": lo, "to": hi, "tenants": t} for (lo, hi), t in zip(ranges, tallies)],
    }, sys.stdout)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
