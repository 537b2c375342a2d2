#!/usr/bin/env bash
# gpuledger beside Prometheus, both fed the same trace of the built-in simulated fleet.
#
#  1. Storage: a 2 h trace (1 s per MIG instance, ~640,800 instance-seconds) is imported into a
#     fresh ledger (`gpuledger import`) and, converted to OpenMetrics (the 8 counters as gauges
#     with the labels a DCGM-exporter + Kubernetes setup carries), backfilled into a Prometheus
#     TSDB (`promtool tsdb create-blocks-from openmetrics`). Bytes per instance-second of each,
#     and of the CSV.
#  2. The month question: per-tenant allocated GPU-seconds over the last 2 h, 24 h and DAYS days
#     of a DAYS-day trace, from `GET /api/v1/showback?group_by=tenant` on a running aggregator and
#     from `sum by (tenant) (sum_over_time(gpu_allocated_gpu_equivalents[RANGE]))` on a running
#     Prometheus (one gauge: the instance's GPU-equivalents while a tenant holds it). Median
#     latency of RUNS runs after a warm-up, peak RSS, and a check that both answers equal the
#     totals computed straight from the CSV.
#
# The long trace is simulated one day at a time (the simulator is deterministic: a sub-range is
# byte-identical to the same seconds of a longer run, which the script checks on the last 2 h);
# each day's CSV feeds both sides, then is deleted, so disk stays at a few GB.
#
# Usage: benches/prometheus/compare.sh [-d DAYS] [-r RUNS] [-k] [WORKDIR]
#   WORKDIR   where everything goes (default: a new mktemp dir, removed at exit unless -k);
#             a given WORKDIR is kept; its run/ is recreated, its venv/ reused
#   -d DAYS   long range in days (default $LONG_DAYS or 7)
#   -r RUNS   timed runs per query after one warm-up (default $RUNS or 5)
#   -k        keep a mktemp work dir
# Environment: GPULEDGER_BIN (default $CARGO_TARGET_DIR or ~/.cache/gpuledger-target, release
# build; copied into the work dir first), PROMETHEUS, PROMTOOL, PYTHON (default python3),
# DUCKDB_PYTHON (a python with the `duckdb` package matching the ledger's DuckDB version, for the
# per-table breakdown; otherwise one is pip-installed into WORKDIR/venv, or the breakdown is
# skipped when that fails; NO_PIP=1 skips it).
# Needs curl, promtool and prometheus (tested with 2.42), python3 >= 3.9. The report goes to
# standard output (and WORKDIR/run/report.txt), progress to standard error.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
days="${LONG_DAYS:-7}"
runs="${RUNS:-5}"
keep=0
work=""

usage() { sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; }

while [ $# -gt 0 ]; do
    case "$1" in
        -d | --days) days="$2"; shift 2 ;;
        -r | --runs) runs="$2"; shift 2 ;;
        -k | --keep) keep=1; shift ;;
        -h | --help) usage; exit 0 ;;
        -*) echo "compare.sh: unknown option $1" >&2; exit 2 ;;
        *) work="$1"; shift ;;
    esac
done
[[ "$days" =~ ^[1-9][0-9]*$ ]] || { echo "compare.sh: DAYS must be a positive integer" >&2; exit 2; }
[[ "$runs" =~ ^[1-9][0-9]*$ ]] || { echo "compare.sh: RUNS must be a positive integer" >&2; exit 2; }

src_bin="${GPULEDGER_BIN:-${CARGO_TARGET_DIR:-$HOME/.cache/gpuledger-target}/release/gpuledger}"
prometheus="${PROMETHEUS:-prometheus}"
promtool="${PROMTOOL:-promtool}"
python="${PYTHON:-python3}"
for tool in curl "$prometheus" "$promtool" "$python"; do
    command -v "$tool" >/dev/null || { echo "compare.sh: $tool not found" >&2; exit 1; }
done
[ -x "$src_bin" ] || { echo "compare.sh: no gpuledger binary at $src_bin (set GPULEDGER_BIN)" >&2; exit 1; }

created=0
if [ -z "$work" ]; then
    work="$(mktemp -d "${TMPDIR:-/tmp}/gpuledger-vs-prometheus.XXXXXX")"
    created=1
fi
mkdir -p "$work"
work="$(cd "$work" && pwd)"
run="$work/run"
res="$run/results"
logs="$run/logs"

pids=()
cleanup() {
    local p
    for p in "${pids[@]}"; do
        kill "$p" 2>/dev/null || true
    done
    for p in "${pids[@]}"; do
        wait "$p" 2>/dev/null || true
    done
    if [ "$created" = 1 ] && [ "$keep" = 0 ]; then
        rm -rf "$work"
    fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

rm -rf "$run"
mkdir -p "$run/bin" "$res/long" "$res/q" "$logs"
cp "$src_bin" "$run/bin/gpuledger"
gl="$run/bin/gpuledger"

t0="$EPOCHREALTIME"
log() { printf '[%6.1fs] %s\n' "$(awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN { print b - a }')" "$*" >&2; }
put() { printf '%s %s\n' "$1" "$2" >>"$res/kv"; }
since() { awk -v a="$1" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.3f", b - a }'; }
free_port() { "$python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
hwm_kib() { awk '/^VmHWM:/ { print $2 }' "/proc/$1/status"; }
cpu_ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }
alive() { kill -0 "$1" 2>/dev/null || { echo "compare.sh: $2 exited; see $logs" >&2; exit 1; }; }

put started "$(date +%s)"
put days "$days"
put runs "$runs"
put nproc "$(nproc)"
put loadavg_start "$(cut -d' ' -f1-3 /proc/loadavg | tr ' ' /)"
put gpuledger_version "$("$gl" --version | tr ' ' _)"
put prometheus_version "$("$prometheus" --version 2>&1 | head -1 | awk '{ print $3 }')"

# The trace ends on a 2 h boundary at least 2 h ago, so the 2 h trace is one Prometheus block
# and inside the ledger's 48 h raw window.
end=$(($(date +%s) / 7200 * 7200 - 7200))
long=$((days * 86400))
put end "$end"

# ---------------------------------------------------------------- 1. storage (2 h trace)
log "storage: simulating 2 h ending $(date -u -d "@$end" +%FT%TZ)"
trace="$run/trace-2h.csv"
t="$EPOCHREALTIME"
"$gl" simulate --duration 2h --start "$((end - 7200))" --out "$trace" 2>>"$logs/simulate.log"
put storage_simulate_s "$(since "$t")"
put storage_csv_bytes "$(stat -c %s "$trace")"

log "storage: gpuledger import"
ledger2="$run/ledger-2h.duckdb"
t="$EPOCHREALTIME"
"$gl" import --db "$ledger2" "$trace" 2>>"$logs/import.log" >>"$logs/import.log"
put storage_import_s "$(since "$t")"
put storage_ledger_bytes "$(stat -c %s "$ledger2")"
if [ -e "$ledger2.wal" ]; then put storage_ledger_wal_bytes "$(stat -c %s "$ledger2.wal")"; else put storage_ledger_wal_bytes 0; fi

# Per-table breakdown with the DuckDB version that wrote the file (named in its header).
duck_version="$(dd if="$ledger2" bs=1 skip=52 count=16 2>/dev/null | tr -d '\0' | sed 's/^v//')"
put duckdb_version "$duck_version"
duck_py="${DUCKDB_PYTHON:-}"
if [ -z "$duck_py" ] && [ "${NO_PIP:-0}" != 1 ] && [ -n "$duck_version" ]; then
    if [ -x "$work/venv/bin/python" ] && "$work/venv/bin/python" -c "import duckdb, sys; sys.exit(duckdb.__version__ != '$duck_version')" 2>/dev/null; then
        duck_py="$work/venv/bin/python"
    else
        log "storage: installing duckdb==$duck_version into $work/venv for the breakdown"
        rm -rf "$work/venv"
        if "$python" -m venv "$work/venv" >>"$logs/pip.log" 2>&1 &&
            "$work/venv/bin/pip" install -q "duckdb==$duck_version" >>"$logs/pip.log" 2>&1; then
            duck_py="$work/venv/bin/python"
        else
            log "storage: could not install duckdb==$duck_version (see $logs/pip.log); no breakdown"
        fi
    fi
fi
if [ -n "$duck_py" ]; then
    if ! "$duck_py" "$here/ledger_breakdown.py" "$ledger2" >"$res/ledger_breakdown.json" 2>>"$logs/breakdown.log"; then
        log "storage: breakdown failed (see $logs/breakdown.log)"
        rm -f "$res/ledger_breakdown.json"
    fi
fi

log "storage: converting to OpenMetrics (8 counters)"
t="$EPOCHREALTIME"
"$python" "$here/trace_to_openmetrics.py" counters "$trace" "$run/om-2h" >"$res/storage_convert.json"
put storage_convert_s "$(since "$t")"
put storage_om_bytes "$(du -cb "$run"/om-2h/*.om | tail -1 | cut -f1)"
log "storage: promtool tsdb create-blocks-from openmetrics"
t="$EPOCHREALTIME"
for f in "$run"/om-2h/*.om; do
    "$promtool" tsdb create-blocks-from openmetrics -q "$f" "$run/prom-2h" >>"$logs/promtool.log" 2>&1
    rm -f "$f"
done
put storage_promtool_s "$(since "$t")"
put storage_prom_bytes "$(du -sb "$run/prom-2h" | cut -f1)"
put storage_prom_chunks_bytes "$(du -cb "$run"/prom-2h/*/chunks | tail -1 | cut -f1)"
put storage_prom_index_bytes "$(du -cb "$run"/prom-2h/*/index | tail -1 | cut -f1)"
cat "$run"/prom-2h/*/meta.json >"$res/storage_prom_meta.json"
rm -rf "$run/om-2h"

# ---------------------------------------------------------------- 2. the month question
ledger="$run/ledger-long.duckdb"
promdata="$run/prom-long"
r2="$((end - 7200)):$end"
r24="$((end - 86400)):$end"
rl="$((end - long)):$end"
sim_s=0 import_s=0 convert_s=0 promtool_s=0
for ((k = 0; k < days; k++)); do
    start=$((end - long + k * 86400))
    piece="$run/piece.csv"
    log "long: day $((k + 1))/$days from $(date -u -d "@$start" +%FT%TZ): simulate"
    t="$EPOCHREALTIME"
    "$gl" simulate --duration 24h --start "$start" --out "$piece" 2>>"$logs/simulate.log"
    sim_s="$(awk -v a="$sim_s" -v b="$(since "$t")" 'BEGIN { print a + b }')"
    if [ "$k" = $((days - 1)) ]; then
        # The storage trace must be exactly the last 2 h of the long one.
        n=$(($(wc -l <"$trace") - 1))
        if cmp -s <(tail -n "$n" "$piece") <(tail -n "$n" "$trace"); then put same_trace yes; else put same_trace NO; fi
        rm -f "$trace"
    fi
    log "long: day $((k + 1))/$days: gpuledger import"
    t="$EPOCHREALTIME"
    "$gl" import --db "$ledger" "$piece" 2>>"$logs/import.log" >>"$logs/import.log"
    import_s="$(awk -v a="$import_s" -v b="$(since "$t")" 'BEGIN { print a + b }')"
    log "long: day $((k + 1))/$days: OpenMetrics + promtool"
    t="$EPOCHREALTIME"
    "$python" "$here/trace_to_openmetrics.py" alloc "$piece" "$run/om-long" \
        --tally "$r2" --tally "$r24" --tally "$rl" >"$res/long/day-$k.json"
    convert_s="$(awk -v a="$convert_s" -v b="$(since "$t")" 'BEGIN { print a + b }')"
    t="$EPOCHREALTIME"
    for f in "$run"/om-long/*.om; do
        "$promtool" tsdb create-blocks-from openmetrics -q "$f" "$promdata" >>"$logs/promtool.log" 2>&1
        rm -f "$f"
    done
    promtool_s="$(awk -v a="$promtool_s" -v b="$(since "$t")" 'BEGIN { print a + b }')"
    rm -f "$piece"
done
put long_simulate_s "$sim_s"
put long_import_s "$import_s"
put long_convert_s "$convert_s"
put long_promtool_s "$promtool_s"
rmdir "$run/om-long" 2>/dev/null || true
put long_ledger_bytes "$(stat -c %s "$ledger")"
put long_prom_bytes_backfilled "$(du -sb "$promdata" | cut -f1)"
put long_prom_blocks_backfilled "$(find "$promdata" -mindepth 1 -maxdepth 1 -type d | wc -l)"

token="$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')"
gport="$(free_port)"
log "long: starting the aggregator on 127.0.0.1:$gport"
t="$EPOCHREALTIME"
GPULEDGER_ADMIN_TOKEN="$token" "$gl" aggregator --db "$ledger" --listen "127.0.0.1:$gport" \
    >"$logs/aggregator.log" 2>&1 &
pid_gl=$!
pids+=("$pid_gl")
auth=(-H "Authorization: Bearer $token")
until curl -sf -o /dev/null "http://127.0.0.1:$gport/readyz"; do
    alive "$pid_gl" aggregator
    sleep 0.2
done
put gl_ready_s "$(since "$t")"
# The first analytics pass (hoarding, fragmentation) over the backfilled hours: wait for it, so
# that the timed queries meet an idle, warm aggregator.
t="$EPOCHREALTIME"
for _ in $(seq 20); do
    out="$(curl -sf -X POST "${auth[@]}" "http://127.0.0.1:$gport/api/v1/analytics/evaluate")"
    case "$out" in *'"gpu_hours":0,'*) break ;; esac
done
put gl_evaluate_s "$(since "$t")"

pport="$(free_port)"
while [ "$pport" = "$gport" ]; do pport="$(free_port)"; done
printf 'global:\n  scrape_interval: 1m\nscrape_configs: []\n' >"$run/prometheus.yml"
log "long: starting Prometheus on 127.0.0.1:$pport"
t="$EPOCHREALTIME"
"$prometheus" --config.file="$run/prometheus.yml" --storage.tsdb.path="$promdata" \
    --storage.tsdb.retention.time=100y --web.listen-address="127.0.0.1:$pport" \
    --query.max-samples=2000000000 --query.timeout=30m >"$logs/prometheus.log" 2>&1 &
pid_prom=$!
pids+=("$pid_prom")
until curl -sf -o /dev/null "http://127.0.0.1:$pport/-/ready"; do
    alive "$pid_prom" prometheus
    sleep 0.2
done
put prom_ready_s "$(since "$t")"
# Prometheus compacts the backfilled 2 h blocks in the background, starting a minute after it
# starts: wait until it has and is idle (its steady state), so the queries meet the layout a
# Prometheus that had held these days would have.
log "long: waiting for Prometheus to compact the backfilled blocks"
metric() { curl -sf "http://127.0.0.1:$pport/metrics" | awk -v m="$1" '$1 == m { print $2 }'; }
waited=0
until [ "$(metric prometheus_tsdb_compactions_triggered_total)" != 0 ]; do
    alive "$pid_prom" prometheus
    sleep 2
    waited=$((waited + 2))
    [ "$waited" -lt 600 ] || { echo "compare.sh: Prometheus never started compacting" >&2; exit 1; }
done
while :; do
    a="$(cpu_ticks "$pid_prom")"
    sleep 5
    b="$(cpu_ticks "$pid_prom")"
    [ $((b - a)) -gt 20 ] || break
done
put prom_compaction_s "$(metric prometheus_tsdb_compaction_duration_seconds_sum)"
put prom_compactions "$(metric prometheus_tsdb_compactions_total)"
put long_prom_blocks "$(metric prometheus_tsdb_blocks_loaded)"
put long_prom_bytes "$(du -sb --exclude=wal --exclude=chunks_head "$promdata" | cut -f1)"

# Peak RSS so far (startup, first evaluation / compaction), then reset the mark so that the peak
# during the queries can be read on its own (clear_refs 5 resets VmHWM).
put gl_hwm_startup_kib "$(hwm_kib "$pid_gl")"
put prom_hwm_startup_kib "$(hwm_kib "$pid_prom")"
if echo 5 >"/proc/$pid_gl/clear_refs" 2>/dev/null && echo 5 >"/proc/$pid_prom/clear_refs" 2>/dev/null; then
    put hwm_reset yes
else
    put hwm_reset no
fi

query() { # side name from to i  -> appends "side name i seconds" to times
    local side="$1" name="$2" from="$3" to="$4" i="$5" out code_time
    out="$res/q/$side-$name.json"
    if [ "$side" = gpuledger ]; then
        code_time="$(curl -s -o "$out" -w '%{http_code} %{time_total}' "${auth[@]}" \
            "http://127.0.0.1:$gport/api/v1/showback?from=$from&to=$to&group_by=tenant")"
    else
        code_time="$(curl -s -o "$out" -w '%{http_code} %{time_total}' -G \
            --data-urlencode "query=sum by (tenant) (sum_over_time(gpu_allocated_gpu_equivalents[$((to - from))s]))" \
            --data-urlencode "time=$((to - 1)).5" "http://127.0.0.1:$pport/api/v1/query")"
    fi
    [ "${code_time%% *}" = 200 ] || { echo "compare.sh: $side $name: HTTP ${code_time%% *}: $(head -c 500 "$out")" >&2; exit 1; }
    printf '%s %s %s %s\n' "$side" "$name" "$i" "${code_time#* }" >>"$res/q/times"
}
put loadavg_queries "$(cut -d' ' -f1-3 /proc/loadavg | tr ' ' /)"
for spec in "2h:$r2" "24h:$r24" "${days}d:$rl"; do
    name="${spec%%:*}"
    range="${spec#*:}"
    from="${range%%:*}"
    to="${range#*:}"
    log "queries: $name ($((runs)) runs after a warm-up)"
    for ((i = 0; i <= runs; i++)); do
        query gpuledger "$name" "$from" "$to" "$i"
        query prometheus "$name" "$from" "$to" "$i"
    done
    put "range_$name" "$from:$to"
done
alive "$pid_gl" aggregator
alive "$pid_prom" prometheus
put gl_hwm_kib "$(hwm_kib "$pid_gl")"
put prom_hwm_kib "$(hwm_kib "$pid_prom")"
# SIGTERM makes the aggregator checkpoint: the ledger's size with the analytics it wrote.
kill -TERM "$pid_gl"
wait "$pid_gl" || true
wal=0
if [ -e "$ledger.wal" ]; then wal="$(stat -c %s "$ledger.wal")"; fi
put long_ledger_bytes_stopped "$(($(stat -c %s "$ledger") + wal))"
put finished "$(date +%s)"

"$python" "$here/report.py" "$res" | tee "$run/report.txt"
