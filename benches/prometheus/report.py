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


HOUR, MONTH, RAW_HELD = 3600, 30 * 86400, 48 * 3600


def split_tables(bd):
    """A breakdown's bytes: samples_raw, rollup_1m, the hourly/daily rollups, the rest."""
    tables = bd["tables"]
    get = lambda t: tables.get(t, {"rows": 0, "bytes": 0})  # noqa: E731
    hd = {t: v for t, v in tables.items() if t.startswith("rollup_") and t != "rollup_1m"}
    rest = sum(v["bytes"] for t, v in tables.items() if t not in hd and t not in ("samples_raw", "rollup_1m"))
    return get("samples_raw"), get("rollup_1m"), hd, rest + bd["other_bytes"]


def storage_at_length(res, kv, p):
    lens = [int(x) for x in kv.get("storage_lengths", "").split()]
    if not lens:
        return
    end = int(kv["end"])
    pieces = [json.load(open(path)) for path in glob.glob(os.path.join(res, "len", "piece-*.json"))]
    lag_h = (int(kv["started"]) - end) / HOUR
    p(f"1b. STORAGE AT LENGTH: the same 8 counters over the last L hours of the trace (ending {iso(end)}, "
      f"{lag_h:.1f} h before the run started)")
    p("   gpuledger: a fresh ledger, `gpuledger import --db` of the L hours (one import per day of trace, each "
      "checkpoints), at the ledger's")
    p("   DEFAULT retentions: raw samples for 48 h before now (the import's clock), rollups for 400 days. Samples "
      "older than now - 48 h")
    p("   are written to the rollups only: that is the design measured here (the ledger keeps the last 48 h raw, "
      "then minute, hourly")
    p("   and daily rollups), while Prometheus keeps every sample. Prometheus: the same rows' OpenMetrics, "
      "backfilled 2 h window by 2 h")
    p("   window (promtool) into one TSDB for the longest L; each L's TSDB is the copy of its last L hours' "
      "2 h blocks; measured right")
    p("   after promtool (du -sb) and after a running Prometheus 2.42 (retention 100y) compacted them and went "
      "idle (blocks only).")
    p(f"   {'L':>4} {'instance-s':>12} {'ledger B':>13} {'B/inst-s':>8} {'Prom backfill B':>15} {'B/inst-s':>8} "
      f"{'Prom compacted B':>16} {'B/inst-s':>8} {'ledger/Prom':>12}")
    per = {}
    for L in lens:
        lo = end - L * HOUR
        rows = sum(n for d in pieces for w, n in d["window_rows"].items() if int(w) >= lo)
        led = int(kv[f"len_{L}_ledger_bytes"]) + int(kv[f"len_{L}_ledger_wal_bytes"])
        pb = int(kv[f"len_{L}_prom_bytes"])
        pc = int(kv[f"len_{L}_prom_bytes_compacted"]) if f"len_{L}_prom_bytes_compacted" in kv else None
        metas = load_json_stream(os.path.join(res, "len", f"prom-meta-{L}.json"))
        per[L] = dict(rows=rows, led=led, pb=pb, pc=pc, metas=metas)
        pcs = f"{pc:>16,} {pc / rows:>8.2f}" if pc else f"{'-':>16} {'-':>8}"
        ratio = f"{led / pb:.2f}" + (f" / {led / pc:.2f}" if pc else "")
        p(f"   {str(L) + ' h':>4} {rows:>12,} {led:>13,} {led / rows:>8.2f} {pb:>15,} {pb / rows:>8.2f} {pcs} {ratio:>12}")
    p("   (ledger/Prom: against the backfilled / the compacted TSDB; ledger = DuckDB file after import, WAL counted "
      "if any)")
    cpu = sum(d.get("promtool_cpu_s") or 0 for d in pieces)
    p(f"   ingest (information): simulation beyond part 2's days {float(kv.get('len_simulate_s', 0)):.0f} s; "
      f"8 counters -> OpenMetrics with promtool beside it {float(kv.get('len_convert_s', 0)):.0f} s "
      f"(promtool CPU {cpu:.0f} s)")
    for L in lens:
        d = per[L]
        metas = d["metas"]
        samples = sum(m["stats"]["numSamples"] for m in metas)
        wal = int(kv[f"len_{L}_ledger_wal_bytes"])
        extra = ""
        if d["pc"]:
            extra = (f"; compacted: {kv.get(f'len_{L}_prom_blocks_compacted', '?')} block(s) after "
                     f"{kv.get(f'len_{L}_prom_compactions', '?')} compactions "
                     f"({float(kv.get(f'len_{L}_prom_compaction_s', 0)):.1f} s), {d['pc'] / samples:.2f} B/sample")
        p(f"   {L} h: Prometheus {len(metas)} block(s), {samples:,} samples, {d['pb'] / samples:.2f} B/sample "
          f"backfilled{extra}")
        p(f"   {L} h: ledger WAL {'absent' if wal == 0 else f'{wal:,} B'}; import {float(kv[f'len_{L}_import_s']):.0f} s")
        path = os.path.join(res, "len", f"ledger-{L}.json")
        if not os.path.exists(path):
            p("     (no per-table breakdown: no duckdb Python package of the file's version)")
            continue
        bd = json.load(open(path))
        d["bd"] = bd
        raw, m1, hd, rest = split_tables(bd)
        rows = d["rows"]
        inst = rows / (L * HOUR)
        hd_b = sum(v["bytes"] for v in hd.values())
        raw_row = f"{raw['bytes'] / raw['rows']:.2f} B/row" if raw["rows"] else "-"
        free = bd["free_blocks"] * bd["block_size"]
        line = lambda name, b, r, what: p(f"     {name:21} {b:>12,} B {b / r:>6.3f} B/inst-s  {what}")  # noqa: E731
        line("samples_raw", raw["bytes"], rows, f"{raw['rows']:,} rows = {raw['rows'] / rows:.0%} of the instance-seconds "
             f"(the last {raw['rows'] / inst / HOUR:.1f} h), {raw_row}")
        line("rollup_1m", m1["bytes"], rows, f"{m1['rows']:,} rows (minute masks included), "
             f"{m1['bytes'] / rows * 60:.1f} B per instance-minute")
        line("hourly/daily rollups", hd_b, rows, ", ".join(f"{t} {v['rows']:,}" for t, v in sorted(hd.items())) + " rows")
        line("rest", rest, rows, f"other tables (dimensions, bookkeeping), metadata, {bd['free_blocks']} free blocks "
             f"({free:,} B)")
    # Steady state, from the longest length with a breakdown.
    best = [L for L in lens if "bd" in per[L]]
    if not best:
        p("")
        return
    L = best[-1]
    d = per[L]
    raw, m1, hd, rest = split_tables(d["bd"])
    rows = d["rows"]
    if not raw["rows"]:
        p("")
        return
    r_raw = raw["bytes"] / raw["rows"]
    r_1m = m1["bytes"] / rows
    r_hd = sum(v["bytes"] for v in hd.values()) / rows
    prom_b = d["pc"] or d["pb"]
    r_prom = prom_b / rows
    held = r_raw * RAW_HELD
    month_l = (r_1m + r_hd) * MONTH
    month_p = r_prom * MONTH
    mb = lambda b: f"{b / 1e6:.2f} MB"  # noqa: E731
    p(f"   STEADY STATE per instance, default retentions (estimate from the {L} h ledger's per-table bytes, "
      f"not measured over months):")
    p("     ledger(M months of history) = r_raw x 172,800 s (48 h raw, held at any time) + M x (r_1m + r_hd) x 2,592,000 s")
    p("     Prometheus(M months)        = M x r_prom x 2,592,000 s (the same 8 counters at 1 s, retention >= M months)")
    p(f"     r_raw = samples_raw B / raw rows = {r_raw:.2f}; r_1m = rollup_1m B / instance-s = {r_1m:.2f}; "
      f"r_hd = hourly+daily rollups B / instance-s = {r_hd:.3f}")
    bs = d["bd"]["block_size"]
    small = [t for t, v in hd.items() if v["bytes"] <= bs]
    note = (f"r_hd is an upper bound: at {L} h {len(small)} of those {len(hd)} tables fill(s) at most one "
            f"{bs // 1024} KiB block, counted whole; " if small else "")
    other = f"; backfilled {d['pb'] / rows:.2f}" if d["pc"] else ""
    p(f"       ({note}r_prom = {r_prom:.2f} B/instance-s, the {'compacted' if d['pc'] else 'backfilled'} {L} h TSDB{other})")
    p(f"     ledger: {mb(held)} raw held + {mb(month_l)} per month of history; Prometheus: {mb(month_p)} per month")
    for m in (1, 12):
        led = held + m * month_l
        p(f"     M = {m:>2}: ledger {mb(led):>9}  Prometheus {mb(m * month_p):>9}  ledger/Prometheus {led / (m * month_p):.2f}")
    p(f"     (not counted: the rest, {rest / inst_count(rows, L):,.0f} B per instance in the {L} h ledger: dimension "
      f"tables, metadata, free blocks)")
    p("")


def inst_count(rows, L):
    return rows / (L * HOUR)


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
      f"during queries {kv.get('loadavg_queries', '-')}")
    p(f"  trace: built-in fleet, 1 s per MIG instance / whole GPU; ends {iso(kv['end'])} (on a 2 h boundary); "
      f"the 2 h trace is byte-identical to the last 2 h of the longer ones: {kv.get('same_trace', '?')}")
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

    storage_at_length(res, kv, p)
    if kv.get("month") == "0":
        p("2. (the month question skipped: -n)")
        p(f"   total run time {int(kv['finished']) - int(kv['started'])} s")
        print("\n".join(out))
        return 0

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
