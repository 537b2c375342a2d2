#!/usr/bin/env python3
"""The fleet's month per (cluster, tenant) from `gpuledger export` Parquet, read by Spark.

    python3 tests/spark/month.py ROOT --month 2026-10 [--prices FILE] [--timeout 300]

ROOT is the shared export directory (ROOT/<table>/date=YYYY-MM-DD/<cluster>.parquet,
docs/multi-cluster.md). Prints one JSON object per (cluster, tenant) holding allocated samples,
sorted by cluster then tenant:

    {"cluster": "east", "tenant": "ads", "allocated_gpu_hours": 8.583214286,
     "used_gpu_hours": 3.980629687, "cost": 21.37, "cost_exact": 21.372203571}

What the ledger's showback (GET /api/v1/showback?group_by=tenant) would answer for the same UTC
month, read from rollup_1h (it carries gpu_model and mig_profile, which the price book needs):
  allocated GPU-seconds = sum(samples * gpu_equivalents), used = sum(sm_active_sum * gpu_equivalents),
  cost = allocated GPU-seconds * the price of a GPU-second in force at the hour (schema/ANALYTICS.md).
Prices come from --prices, the aggregator's TOML config (default_price, [prices],
[[price_book]]); without it every cost is 0. Hours are the smallest unit here, so a price change
that is not on a whole UTC hour is refused. Shared-instance transfers (the bill's
shared_gpu_transfer) are not in the export and are not applied.

Nothing is counted twice: an export writes one file per (table, day, cluster) and replaces it
when run again. The script also refuses (exit 3) files whose rows name another cluster than the
file, and the same GPU-hour in two clusters (one ledger exported under two names).

Local-mode Spark only: master local[2], no UI, bound to 127.0.0.1, session time zone UTC.
Exit codes: 0 ok, 2 pyspark/java missing or bad arguments, 3 data refused, 124 timed out.
"""

import argparse
import datetime as dt
import decimal
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

# schema/src/mig.rs MODELS: configuration key -> NVML name (the price book takes either).
MODELS = {
    "A100-40GB": "NVIDIA A100-SXM4-40GB",
    "A100-80GB": "NVIDIA A100-SXM4-80GB",
    "H100-80GB": "NVIDIA H100 80GB HBM3",
    "H200-141GB": "NVIDIA H200",
}
SLICES_PER_GPU = 7


def fail(code, message):
    print(f"month.py: {message}", file=sys.stderr)
    sys.exit(code)


def check_runtime():
    """pyspark importable and a Java 17+ runtime present, or a clear message and exit 2."""
    try:
        import pyspark  # noqa: F401
    except ImportError:
        fail(2, "pyspark is not installed (python3 -m pip install pyspark; it needs Java 17+)")
    java_home = os.environ.get("JAVA_HOME")
    java = os.path.join(java_home, "bin", "java") if java_home else shutil.which("java")
    if not java or not os.path.exists(java):
        fail(2, "java was not found (set JAVA_HOME or put a Java 17+ `java` on PATH); Spark needs it")
    try:
        out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        fail(2, f"java ({java}) does not run: {e}")
    text = out.stderr + out.stdout
    version = text.split('"')[1] if '"' in text else ""
    major = version.split(".")[0]
    if major == "1":  # 1.8.0_x
        major = version.split(".")[1]
    import pyspark

    need = 17 if int(pyspark.__version__.split(".")[0]) >= 4 else 8
    if not major.isdigit() or int(major) < need:
        fail(2, f"java at {java} is {version or 'unknown'}; pyspark {pyspark.__version__} needs Java {need}+")


def parse_instant(value):
    """A price book `from`: YYYY-MM-DD (UTC midnight), RFC 3339, or a TOML date/datetime."""
    if isinstance(value, dt.datetime):
        d = value if value.tzinfo else value.replace(tzinfo=dt.timezone.utc)
        return int(d.timestamp())
    if isinstance(value, dt.date):
        return int(dt.datetime(value.year, value.month, value.day, tzinfo=dt.timezone.utc).timestamp())
    s = str(value)
    if len(s) == 10:
        d = dt.datetime.strptime(s, "%Y-%m-%d").replace(tzinfo=dt.timezone.utc)
    else:
        d = dt.datetime.fromisoformat(s.replace("Z", "+00:00"))
    return int(d.timestamp())


def load_prices(path, default_override):
    """(default price per GPU-hour, entries) from an aggregator config file."""
    if path is None:
        return (default_override or 0.0), []
    import tomllib

    with open(path, "rb") as f:
        cfg = tomllib.load(f)
    default = float(cfg.get("default_price", 0.0)) if default_override is None else default_override
    entries = [
        {"model": m, "profile": None, "per_hour": float(p), "from": None}
        for m, p in cfg.get("prices", {}).items()
    ]
    for e in cfg.get("price_book", []):
        profile = e.get("mig_profile")
        per_hour = e.get("per_instance_hour") if profile else e.get("per_gpu_hour")
        if per_hour is None:
            fail(2, f"{path}: price_book entry {e} has no {'per_instance_hour' if profile else 'per_gpu_hour'}")
        entries.append({
            "model": e["gpu_model"], "profile": profile, "per_hour": float(per_hour),
            "from": parse_instant(e["from"]) if "from" in e else None,
        })
    return default, entries


def names_model(entry, model):
    return entry == model or any(model in (k, n) and entry in (k, n) for k, n in MODELS.items())


def gpu_equivalents_of(profile):
    try:
        n = int(profile.split("g.", 1)[0])
    except (ValueError, AttributeError):
        return 1.0
    return n / SLICES_PER_GPU if 1 <= n <= SLICES_PER_GPU else 1.0


def per_gpu_second(default, entries, model, profile, at):
    """ledger/src/analytics/prices.rs PriceBook::per_gpu_second."""
    def latest(want):
        cands = [e for e in entries if e["profile"] == want and names_model(e["model"], model)
                 and (e["from"] is None or e["from"] <= at)]
        return max(cands, key=lambda e: -2**63 if e["from"] is None else e["from"]) if cands else None

    e = (latest(profile) if profile else None) or latest(None)
    if e is None:
        return default / 3600.0
    if e["profile"] is not None:
        return e["per_hour"] / 3600.0 / gpu_equivalents_of(e["profile"])
    return e["per_hour"] / 3600.0


def month_range(month):
    try:
        start = dt.datetime.strptime(month, "%Y-%m").replace(tzinfo=dt.timezone.utc)
    except ValueError:
        fail(2, f"--month {month!r} is not YYYY-MM")
    end = start.replace(year=start.year + (start.month == 12), month=start.month % 12 + 1)
    return int(start.timestamp()), int(end.timestamp())


def run(args, spark, out):
    from pyspark.sql import functions as F

    root = os.path.abspath(args.root)
    frm, to = month_range(args.month)
    day = lambda t: dt.datetime.fromtimestamp(t, dt.timezone.utc).strftime("%Y-%m-%d")
    default, entries = load_prices(args.prices, args.default_price)
    changes = sorted({e["from"] for e in entries if e["from"] is not None and frm < e["from"] < to})
    if any(c % 3600 for c in changes):
        fail(2, f"a price changes inside {args.month} off a whole UTC hour ({changes}); rollup_1h cannot split it")

    def table(name):
        path = os.path.join(root, name)
        if not os.path.isdir(path):
            fail(2, f"{path} does not exist (is {root} a gpuledger export directory?)")
        df = spark.read.option("basePath", path).parquet(path)
        # Partition pruning on the directory's date, then the exact range on the hour itself
        # (bucket_start is a UTC instant: Spark reads it as a TIMESTAMP in any session zone).
        return (df.where((F.col("date") >= F.lit(day(frm)).cast("date"))
                         & (F.col("date") < F.lit(day(to)).cast("date")))
                  .withColumn("t", F.unix_seconds(F.col("bucket_start").cast("timestamp")))
                  .where((F.col("t") >= frm) & (F.col("t") < to))
                  .withColumn("file_cluster", F.regexp_extract(F.col("_metadata.file_name"), r"^(.*)\.parquet$", 1)))

    hours = table("rollup_1h")
    gpus = table("rollup_gpu_1h")

    # Refusals: a file holding another cluster's rows, and one GPU-hour in two clusters.
    for name, df in (("rollup_1h", hours), ("rollup_gpu_1h", gpus)):
        bad = df.where(F.col("cluster") != F.col("file_cluster")).select("cluster", "file_cluster").distinct().limit(5).collect()
        if bad:
            fail(3, f"{name}: rows whose cluster is not their file's name: {[tuple(r) for r in bad]}")
    twice = (gpus.groupBy("gpu_uuid", "t").agg(F.countDistinct("cluster").alias("n"), F.collect_set("cluster").alias("clusters"))
                 .where("n > 1").limit(5).collect())
    if twice:
        fail(3, "the same GPU-hour is in several clusters (one ledger exported under two --cluster names?): "
                + "; ".join(f"{r.gpu_uuid} at {dt.datetime.fromtimestamp(r.t, dt.timezone.utc):%Y-%m-%dT%H:%MZ}: "
                           f"{sorted(r.clusters)}" for r in twice))

    # One price per (model, profile, price period): the price book evaluated in Python, joined on.
    pairs = hours.where("tenant IS NOT NULL").select("gpu_model", "mig_profile").distinct().collect()
    edges = [frm] + changes + [to]
    prices = [(r.gpu_model, r.mig_profile, a, b, per_gpu_second(default, entries, r.gpu_model, r.mig_profile, a))
              for r in pairs for a, b in zip(edges, edges[1:])]
    price_df = spark.createDataFrame(
        prices, "p_model string, p_profile string, p_from long, p_to long, per_gpu_second double")
    hours.where("tenant IS NOT NULL").createOrReplaceTempView("hours")
    price_df.createOrReplaceTempView("prices")
    # docs/multi-cluster.md quotes this query; tests/e2e/spark.rs keeps the two the same.
    rows = spark.sql("""
SELECT h.cluster, h.tenant,
       sum(h.samples * h.gpu_equivalents) / 3600 AS allocated_gpu_hours,
       sum(h.sm_active_sum * h.gpu_equivalents) / 3600 AS used_gpu_hours,
       sum(h.samples * h.gpu_equivalents * p.per_gpu_second) AS cost_exact
FROM hours h
JOIN prices p
  ON p.p_model = h.gpu_model AND p.p_profile <=> h.mig_profile
 AND h.t >= p.p_from AND h.t < p.p_to
GROUP BY h.cluster, h.tenant
ORDER BY h.cluster, h.tenant
""").collect()
    for r in rows:
        out.append({
            "cluster": r.cluster, "tenant": r.tenant,
            # Rounded so that the output does not depend on the order Spark summed in (local[1]
            # and local[2] differ in the last bits); 1e-9 GPU-hours is 3.6 GPU-microseconds.
            "allocated_gpu_hours": round(r.allocated_gpu_hours, 9), "used_gpu_hours": round(r.used_gpu_hours, 9),
            # round half up, on the exact sum (showback's cost rounded to the cent; the bill
            # apportions the fleet's rounded cost by largest remainder and may differ by 1 cent)
            "cost": float(decimal.Decimal(repr(r.cost_exact)).quantize(
                decimal.Decimal("0.01"), rounding=decimal.ROUND_HALF_UP)),
            "cost_exact": round(r.cost_exact, 9),
        })


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("root", help="the export directory (ROOT/<table>/date=YYYY-MM-DD/<cluster>.parquet)")
    p.add_argument("--month", required=True, help="UTC month, YYYY-MM")
    p.add_argument("--prices", help="aggregator config TOML with [prices] / [[price_book]] / default_price")
    p.add_argument("--default-price", type=float, help="price of a GPU-hour of models without an entry")
    p.add_argument("--timeout", type=float, default=600, help="give up after this many seconds (default 600)")
    p.add_argument("--master", default="local[2]")
    p.add_argument("--driver-memory", default="1g")
    args = p.parse_args()
    check_runtime()
    month_range(args.month)
    if not os.path.isdir(args.root):
        fail(2, f"{args.root} is not a directory")

    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    scratch = tempfile.mkdtemp(prefix="gpuledger-spark-")
    state = {"spark": None, "error": None}
    out = []

    def work():
        try:
            started = time.monotonic()
            from pyspark.sql import SparkSession

            spark = (SparkSession.builder.master(args.master).appName("gpuledger-month")
                     .config("spark.ui.enabled", "false")
                     .config("spark.ui.showConsoleProgress", "false")
                     .config("spark.driver.host", "127.0.0.1")
                     .config("spark.driver.bindAddress", "127.0.0.1")
                     .config("spark.driver.memory", args.driver_memory)
                     .config("spark.sql.session.timeZone", "UTC")
                     .config("spark.sql.shuffle.partitions", "4")
                     .config("spark.local.dir", scratch)
                     .config("spark.sql.warehouse.dir", os.path.join(scratch, "warehouse"))
                     .getOrCreate())
            state["spark"] = spark
            spark.sparkContext.setLogLevel("ERROR")
            up = time.monotonic()
            run(args, spark, out)
            print(f"month.py: Spark {spark.version} ({args.master}) started in {up - started:.1f} s, "
                  f"query {time.monotonic() - up:.1f} s", file=sys.stderr)
        except SystemExit as e:
            state["error"] = e.code
        except Exception as e:  # noqa: BLE001
            print(f"month.py: Spark failed: {e}", file=sys.stderr)
            state["error"] = 1

    t = threading.Thread(target=work, daemon=True)
    t.start()
    t.join(args.timeout)
    if t.is_alive():
        print(f"month.py: timed out after {args.timeout:.0f} s (Spark local mode)", file=sys.stderr)
        try:
            if state["spark"] is not None:
                state["spark"].sparkContext.cancelAllJobs()
        finally:
            os._exit(124)
    if state["spark"] is not None:
        state["spark"].stop()
    shutil.rmtree(scratch, ignore_errors=True)
    if state["error"]:
        sys.exit(state["error"])
    for row in sorted(out, key=lambda r: (r["cluster"], r["tenant"])):
        print(json.dumps(row, sort_keys=False))


if __name__ == "__main__":
    main()
