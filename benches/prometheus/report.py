#!/usr/bin/env python3
"""Print compare.sh's report from its results directory; exit 1 if the per-tenant totals of
gpuledger, Prometheus and the trace itself disagree."""

import glob
import json
import os
import statistics
import sys
from datetime import datetime, timezone

REL_TOL = 1e-9


def load_kv(path):
    kv = {}
    with open(path) as f:
        for line in f:
            k, _, v = line.rstrip("\n").partition(" ")
            kv[k] = v
    return kv


def load_json_stream(path):
    """Concatenated JSON documents (several meta.json files cat'ed together)."""
    text = open(path).read()
    dec = json.JSONDecoder()
    out, i = [], 0
    while True:
        while i < len(text) and text[i].isspace():
            i += 1
        if i >= len(text):
            return out
        obj, i = dec.raw_decode(text, i)
        out.append(obj)


def iso(ts):
    return datetime.fromtimestamp(int(ts), timezone.utc).strftime("%Y-%m-%dT%H:%MZ")


def mib(kib):
    return f"{int(kib) / 1024:,.0f} MiB"


def main():
    res = sys.argv[1]
    kv = load_kv(os.path.join(res, "kv"))
    f = lambda k: float(kv[k])  # noqa: E731
    days = int(kv["days"])
    out = []
    p = out.append

    conv = json.load(open(os.path.join(res, "storage_convert.json")))
    rows = conv["rows"]
    metas = load_json_stream(os.path.join(res, "storage_prom_meta.json"))
    prom_samples = sum(m["stats"]["numSamples"] for m in metas)
    prom_series = sum(m["stats"]["numSeries"] for m in metas)

    p("gpuledger vs Prometheus, fed the same simulated trace (benches/prometheus/compare.sh)")
    p(f"  {kv['gpuledger_version'].replace('_', ' ')} (DuckDB {kv.get('duckdb_version') or '?'}), "
      f"Prometheus {kv['prometheus_version']}; {kv['nproc']} CPUs, load avg at start {kv['loadavg_start']}, "
      f"during queries {kv['loadavg_queries']}")
    p(f"  trace: built-in fleet, 1 s per MIG instance / whole GPU; ends {iso(kv['end'])} (on a 2 h boundary); "
      f"the 2 h trace is byte-identical to the last 2 h of the {days}-day one: {kv.get('same_trace', '?')}")
    p("")

    # ------------------------------------------------------------ storage
    csv_b = int(kv["storage_csv_bytes"])
    led_b = int(kv["storage_ledger_bytes"]) + int(kv["storage_ledger_wal_bytes"])
    prom_b = int(kv["storage_prom_bytes"])
    p(f"1. STORAGE: 2 h trace = {rows:,} instance-seconds (CSV rows)")
    p(f"   {'':34} {'bytes':>13} {'B/instance-s':>13}")
    p(f"   {'CSV trace':34} {csv_b:>13,} {csv_b / rows:>13.2f}")
    wal = int(kv["storage_ledger_wal_bytes"])
    p(f"   {'gpuledger ledger (DuckDB file)':34} {led_b:>13,} {led_b / rows:>13.2f}   "
      f"after import, checkpointed; WAL {'absent' if wal == 0 else f'{wal:,} B (counted)'}")
    bd_path = os.path.join(res, "ledger_breakdown.json")
    if os.path.exists(bd_path):
        bd = json.load(open(bd_path))
        bs = bd["block_size"]
        for t, v in sorted(bd["tables"].items(), key=lambda kv_: -kv_[1]["bytes"]):
            if v["bytes"] == 0:
                continue
            label = f"{t} ({v['rows']:,} rows)"
            p(f"     {label:32} {v['bytes']:>13,} {v['bytes'] / rows:>13.2f}")
        p(f"     {'other (metadata, indexes, free)':32} {bd['other_bytes']:>13,} {bd['other_bytes'] / rows:>13.2f}")
        p(f"     (per table = its column segments' share of the {bs // 1024} KiB blocks, from pragma_storage_info;"
          f" a small table still takes a whole block)")
    else:
        p("     (no per-table breakdown: no duckdb Python package of the file's version)")
    p(f"   {'Prometheus TSDB (du -sb)':34} {prom_b:>13,} {prom_b / rows:>13.2f}   "
      f"{len(metas)} block(s), {prom_samples:,} samples of {len(conv['samples'])} gauges in {prom_series:,} series,"
      f" {prom_b / prom_samples:.2f} B/sample")
    p(f"     chunks {int(kv['storage_prom_chunks_bytes']):,} B, index {int(kv['storage_prom_index_bytes']):,} B; "
      f"samples per gauge: " + ", ".join(f"{k.removeprefix('gpu_')} {v:,}" for k, v in conv["samples"].items()))
    p(f"   ratio gpuledger / Prometheus bytes: {led_b / prom_b:.2f}")
    p(f"   ingest (information): gpuledger import {f('storage_import_s'):.1f} s; Prometheus: CSV -> OpenMetrics "
      f"{f('storage_convert_s'):.1f} s ({int(kv['storage_om_bytes']):,} B of text) + promtool {f('storage_promtool_s'):.1f} s")
    p("")

    # ------------------------------------------------------------ month question
    dayfiles = sorted(glob.glob(os.path.join(res, "long", "day-*.json")), key=lambda s: int(s.rsplit("-", 1)[1][:-5]))
    long_rows = 0
    long_samples = 0
    truth = {}  # range name -> tenant -> slice-seconds
    names = ["2h", "24h", f"{days}d"]
    for path in dayfiles:
        d = json.load(open(path))
        long_rows += d["rows"]
        long_samples += sum(d["samples"].values())
        for name, t in zip(names, d["tally_slice_seconds"]):
            for ten, n in t["tenants"].items():
                truth.setdefault(name, {}).setdefault(ten, 0)
                truth[name][ten] += n
    p(f"2. PER-TENANT ALLOCATED GPU-SECONDS over the last 2 h, 24 h and {days} days "
      f"({long_rows:,} instance-seconds; {long_samples:,} allocated ones = Prometheus samples)")
    p(f"   gpuledger: GET /api/v1/showback?from=&to=&group_by=tenant -> rows[].allocated_gpu_seconds")
    p(f"   Prometheus: sum by (tenant) (sum_over_time(gpu_allocated_gpu_equivalents[RANGE])) at to - 0.5 s "
      f"(samples stamped at the second's start; 2.x ranges are closed, so this is exactly [from, to))")
    p(f"   ingest (information), {days} x 24 h CSV files: simulate {f('long_simulate_s'):.0f} s; gpuledger import "
      f"{f('long_import_s'):.0f} s; Prometheus: CSV -> OpenMetrics {f('long_convert_s'):.0f} s + promtool "
      f"{f('long_promtool_s'):.0f} s + compaction at startup {f('prom_compaction_s'):.1f} s "
      f"({kv['long_prom_blocks_backfilled']} 2 h blocks -> {kv['long_prom_blocks']} after {kv['prom_compactions']} compactions)")
    p(f"   stores (information, not comparable: the ledger holds all 8 counters, raw for the last 48 h and rollups for "
      f"all; Prometheus only the one gauge): ledger {int(kv['long_ledger_bytes']):,} B after import, "
      f"{int(kv['long_ledger_bytes_stopped']):,} B after the aggregator's analytics and shutdown checkpoint; Prometheus "
      f"{int(kv['long_prom_bytes']):,} B")
    p(f"   startup: aggregator ready {f('gl_ready_s'):.1f} s, first analytics pass {f('gl_evaluate_s'):.1f} s; "
      f"Prometheus ready {f('prom_ready_s'):.1f} s")
    p("")

    times = {}
    with open(os.path.join(res, "q", "times")) as fh:
        for line in fh:
            side, name, i, secs = line.split()
            if int(i) == 0:
                continue  # warm-up
            times.setdefault((side, name), []).append(float(secs) * 1000)
    runs = int(kv["runs"])
    p(f"   latency, ms: median of {runs} runs after 1 warm-up (min-max), curl time_total, both services warm and up together")
    p(f"   {'range':6} {'gpuledger ms':>12} {'(min-max)':>15} {'Prometheus ms':>14} {'(min-max)':>17} {'Prometheus/gpuledger':>21}")
    for name in names:
        g = times[("gpuledger", name)]
        pr = times[("prometheus", name)]
        gm, pm = statistics.median(g), statistics.median(pr)
        gr, prr = f"({min(g):.1f}-{max(g):.1f})", f"({min(pr):.1f}-{max(pr):.1f})"
        p(f"   {name:6} {gm:>12.1f} {gr:>15} {pm:>14.1f} {prr:>17} {pm / gm:>20.1f}x")
    reset = kv.get("hwm_reset") == "yes"
    g_start, p_start = int(kv["gl_hwm_startup_kib"]), int(kv["prom_hwm_startup_kib"])
    g_q, p_q = int(kv["gl_hwm_kib"]), int(kv["prom_hwm_kib"])
    if reset:
        p(f"   peak RSS (VmHWM), reset once both were idle: during the queries gpuledger {mib(g_q)}, Prometheus {mib(p_q)}; "
          f"before (startup, first analytics pass / block compaction): gpuledger {mib(g_start)}, Prometheus {mib(p_start)}")
    else:
        p(f"   peak RSS (VmHWM) over the whole life: gpuledger {mib(max(g_q, g_start))}, Prometheus {mib(max(p_q, p_start))}")
    p("")

    # ------------------------------------------------------------ check
    p("   per-tenant allocated GPU-seconds: trace CSV (exact) / gpuledger / Prometheus")
    ok = True
    worst = 0.0
    for name in names:
        gl = {r["tenant"]: r["allocated_gpu_seconds"]
              for r in json.load(open(os.path.join(res, "q", f"gpuledger-{name}.json")))["rows"]}
        pj = json.load(open(os.path.join(res, "q", f"prometheus-{name}.json")))
        pr = {r["metric"].get("tenant", ""): float(r["value"][1]) for r in pj["data"]["result"]}
        tr = {k: v / 7 for k, v in truth.get(name, {}).items()}
        tenants = sorted(set(gl) | set(pr) | set(tr))
        for ten in tenants:
            a, b, c = tr.get(ten), gl.get(ten), pr.get(ten)
            if a is None or b is None or c is None:
                good = False
            else:
                rel = max(abs(b - a), abs(c - a)) / max(abs(a), 1.0)
                worst = max(worst, rel)
                good = rel <= REL_TOL
            ok &= good
            fmt = lambda x: "missing" if x is None else f"{x:,.3f}"  # noqa: E731
            p(f"   {name:5} {ten:14} {fmt(a):>18} {fmt(b):>18} {fmt(c):>18}  {'ok' if good else 'MISMATCH'}")
        tot = [sum(d.values()) for d in (tr, gl, pr)]
        p(f"   {name:5} {'(all tenants)':14} {tot[0]:>18,.3f} {tot[1]:>18,.3f} {tot[2]:>18,.3f}")
    p(f"   => {'MATCH' if ok else 'MISMATCH'}: largest relative difference from the trace {worst:.1e} (tolerance {REL_TOL:g})")
    p("")
    p(f"   total run time {int(kv['finished']) - int(kv['started'])} s")
    print("\n".join(out))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
