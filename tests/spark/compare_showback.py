#!/usr/bin/env python3
"""Compares month.py's JSON lines with each cluster's own showback, to the cent.

    python3 tests/spark/compare_showback.py MONTH_JSONL CLUSTER=SHOWBACK_JSON [CLUSTER=BILL_JSON ...]

SHOWBACK_JSON: GET /api/v1/showback?group_by=tenant&from=..&to=.. of that cluster's aggregator
(rows[].allocated_gpu_seconds, used_gpu_seconds, cost unrounded), or GET /api/v1/bill (lines[],
hours and cents already rounded and apportioned). Hours must agree within 1e-9 relative, cost in
cents exactly. Exit 1 on any difference, listing each.
"""
import decimal
import json
import sys


def cents(x):
    return decimal.Decimal(repr(x)).quantize(decimal.Decimal("0.01"), rounding=decimal.ROUND_HALF_UP)


def main():
    got = {}
    for line in open(sys.argv[1]):
        if line.strip():
            r = json.loads(line)
            got[(r["cluster"], r["tenant"])] = r
    want = {}
    for arg in sys.argv[2:]:
        cluster, path = arg.split("=", 1)
        doc = json.load(open(path))
        for r in doc.get("rows") or doc.get("lines"):
            if "allocated_gpu_seconds" in r:  # showback
                want[(cluster, r["tenant"])] = (r["allocated_gpu_seconds"] / 3600, r["used_gpu_seconds"] / 3600, cents(r["cost"]), "showback")
            else:  # bill
                want[(cluster, r["tenant"])] = (r["allocated_gpu_hours"], r["used_gpu_hours"], cents(r["cost"]), "bill")
    bad = 0
    for key in sorted(set(got) | set(want)):
        g, w = got.get(key), want.get(key)
        if g is None or w is None:
            print(f"{key}: only in {'showback' if g is None else 'month.py'}")
            bad += 1
            continue
        close = lambda a, b: abs(a - b) <= 1e-9 * max(1.0, abs(b))
        ok = close(g["allocated_gpu_hours"], w[0]) and close(g["used_gpu_hours"], w[1]) and cents(g["cost_exact"]) == w[2]
        print(f"{'ok  ' if ok else 'DIFF'} {key[0]}/{key[1]}: hours {g['allocated_gpu_hours']:.9f} vs {w[0]:.9f}, "
              f"used {g['used_gpu_hours']:.9f} vs {w[1]:.9f}, cost {cents(g['cost_exact'])} vs {w[2]} ({w[3]})")
        bad += not ok
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
