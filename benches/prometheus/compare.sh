#!/usr/bin/env bash
# gpuledger beside Prometheus, both fed the same trace of the built-in simulated fleet.
#
#  1. Storage: a 2 h trace (1 s per MIG instance, ~640,800 instance-seconds) is imported into a
#     fresh ledger (`gpuledger import`) and, converted to OpenMetrics (the 8 counters as gauges
#     with the labels a DCGM-exporter + Kubernetes setup carries), backfilled into a Prometheus
#     TSDB (`promtool tsdb create-blocks-from openmetrics`). Bytes per instance-second of each,
#     and of the CSV.
#  1b. Storage at length (-s): the same 8 counters over the last L hours of the trace, for each L
#     in HOURS_LIST. The ledger is a fresh `gpuledger import --db` of those rows, which applies
#     the ledger's default retentions (raw samples for 48 h before now, rollups for 400 days):
#     samples older than now - 48 h go to the rollups only, by design. Prometheus gets the same
#     rows' OpenMetrics, converted and backfilled 2 h window by 2 h window (promtool beside the
#     conversion, each window's text deleted after it) into one TSDB for the longest L; each L's
#     TSDB is a copy of the 2 h blocks of its last L hours. Measured right after promtool and
#     after a running Prometheus has compacted the blocks. Also a steady-state estimate per
#     instance-month at the default retentions, from the ledger's per-table bytes.
#  2. The month question: per-tenant allocated GPU-seconds over the last 2 h, 24 h and DAYS days
#     of a DAYS-day trace, from `GET /api/v1/showback?group_by=tenant` on a running aggregator and
#     from `sum by (tenant) (sum_over_time(gpu_allocated_gpu_equivalents[RANGE]))` on a running
#     Prometheus (one gauge: the instance's GPU-equivalents while a tenant holds it). Median
#     latency of RUNS runs after a warm-up, peak RSS, and a check that both answers equal the
#     totals computed straight from the CSV.
#
# The long traces are simulated one day at a time, ending where the 2 h one ends (the simulator
# is deterministic: a sub-range is byte-identical to the same seconds of a longer run, which the
# script checks on the last 2 h); each day's CSV feeds parts 1b and 2, then is deleted, so disk
# stays at a few GB.
#
# Usage: benches/prometheus/compare.sh [-d DAYS] [-r RUNS] [-s HOURS_LIST] [-n] [-k] [WORKDIR]
#   WORKDIR   where everything goes (default: a new mktemp dir, removed at exit unless -k);
#             a given WORKDIR is kept; its run/ is recreated, its venv/ reused
#   -d DAYS   long range in days (default $LONG_DAYS or 7)
#   -r RUNS   timed runs per query after one warm-up (default $RUNS or 5)
#   -s HOURS_LIST  trace lengths for part 1b, in hours, even, space-separated, e.g. "24 72"
#             (default $STORAGE_HOURS or "24"; "" skips part 1b)
#   -n        skip part 2 (the month question)
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
lengths="${STORAGE_HOURS-24}"
month=1
keep=0
work=""

usage() { sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; }

while [ $# -gt 0 ]; do
    case "$1" in
        -d | --days) days="$2"; shift 2 ;;
        -r | --runs) runs="$2"; shift 2 ;;
        -s | --storage-hours) lengths="$2"; shift 2 ;;
        -n | --no-month) month=0; shift ;;
        -k | --keep) keep=1; shift ;;
        -h | --help) usage; exit 0 ;;
        -*) echo "compare.sh: unknown option $1" >&2; exit 2 ;;
        *) work="$1"; shift ;;
    esac
done
[[ "$days" =~ ^[1-9][0-9]*$ ]] || { echo "compare.sh: DAYS must be a positive integer" >&2; exit 2; }
[[ "$runs" =~ ^[1-9][0-9]*$ ]] || { echo "compare.sh: RUNS must be a positive integer" >&2; exit 2; }
lens=()
for L in $lengths; do
    if ! [[ "$L" =~ ^[1-9][0-9]*$ ]] || [ $((L % 2)) != 0 ]; then
        echo "compare.sh: storage lengths must be positive even numbers of hours, not '$L'" >&2
        exit 2
    fi
    lens+=("$L")
done
if [ "${#lens[@]}" -gt 0 ]; then mapfile -t lens < <(printf '%s\n' "${lens[@]}" | sort -nu); fi

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
addf() { awk -v a="$1" -v b="$2" 'BEGIN { print a + b }'; }
used_ports=()
new_port() { # VAR: a free port not handed out before
    local np_
    np_="$(free_port)"
    while [[ " ${used_ports[*]} " == *" $np_ "* ]]; do np_="$(free_port)"; done
    used_ports+=("$np_")
    printf -v "$1" %s "$np_"
}
metric() { curl -sf "http://127.0.0.1:$1/metrics" | awk -v m="$2" '$1 == m { print $2 }'; }
start_prom() { # DIR PORT LOGNAME: a Prometheus on DIR with nothing to scrape; its pid in last_pid
    printf 'global:\n  scrape_interval: 1m\nscrape_configs: []\n' >"$run/prometheus.yml"
    "$prometheus" --config.file="$run/prometheus.yml" --storage.tsdb.path="$1" \
        --storage.tsdb.retention.time=100y --web.listen-address="127.0.0.1:$2" \
        --query.max-samples=2000000000 --query.timeout=30m >"$logs/$3.log" 2>&1 &
    last_pid=$!
    pids+=("$last_pid")
}
wait_ready() { # PID PORT NAME
    until curl -sf -o /dev/null "http://127.0.0.1:$2/-/ready"; do
        alive "$1" "$3"
        sleep 0.2
    done
}
# Prometheus compacts backfilled 2 h blocks in the background, starting a minute after it
# starts: wait until it has and is idle again (its steady state).
wait_compacted() { # PID PORT NAME
    local waited=0 n a b
    while :; do
        n="$(metric "$2" prometheus_tsdb_compactions_triggered_total)"
        if [ -n "$n" ] && [ "$n" != 0 ]; then break; fi
        alive "$1" "$3"
        sleep 2
        waited=$((waited + 2))
        [ "$waited" -lt 600 ] || { echo "compare.sh: $3 never started compacting" >&2; exit 1; }
    done
    while :; do
        a="$(cpu_ticks "$1")"
        sleep 5
        b="$(cpu_ticks "$1")"
        [ $((b - a)) -gt 20 ] || break
    done
}

put started "$(date +%s)"
put days "$days"
put month "$month"
put storage_lengths "${lens[*]}"
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

# ---------------------------------------------------------------- the long traces, a day at a time
# Pieces of 24 h ending at $end, as many as parts 1b and 2 need; the oldest is cut to what they
# need. Each piece feeds part 2 (if inside its DAYS days), then part 1b (if inside the longest L).
ledger="$run/ledger-long.duckdb"
promdata="$run/prom-long"
r2="$((end - 7200)):$end"
r24="$((end - 86400)):$end"
rl="$((end - long)):$end"
maxlen=0
for L in "${lens[@]}"; do
    if [ "$L" -gt "$maxlen" ]; then maxlen=$L; fi
done
span=$((maxlen * 3600))
if [ "$month" = 1 ] && [ "$long" -gt "$span" ]; then span=$long; fi
npieces=$(((span + 86399) / 86400))
sim_s=0 import_s=0 convert_s=0 promtool_s=0 len_sim_s=0 len_convert_s=0
declare -A len_import_s=() len_pid=() len_port=()
for L in "${lens[@]}"; do len_import_s[$L]=0; done
mkdir -p "$res/len"
for ((k = 0; k < npieces; k++)); do
    pstart=$((end - (npieces - k) * 86400))
    pend=$((pstart + 86400))
    first=$pstart
    if [ "$first" -lt $((end - span)) ]; then first=$((end - span)); fi
    in_month=0
    if [ "$month" = 1 ] && [ "$pstart" -ge $((end - long)) ]; then in_month=1; fi
    j=$(((pstart - end + long) / 86400)) # the day's index in part 2
    piece="$run/piece.csv"
    log "trace: piece $((k + 1))/$npieces: simulate $(((pend - first) / 3600)) h from $(date -u -d "@$first" +%FT%TZ)"
    t="$EPOCHREALTIME"
    "$gl" simulate --duration "$((pend - first))s" --start "$first" --out "$piece" 2>>"$logs/simulate.log"
    if [ "$in_month" = 1 ]; then
        sim_s="$(addf "$sim_s" "$(since "$t")")"
    else
        len_sim_s="$(addf "$len_sim_s" "$(since "$t")")"
    fi
    if [ "$k" = $((npieces - 1)) ]; then
        # The storage trace must be exactly the last 2 h of the long ones.
        n=$(($(wc -l <"$trace") - 1))
        if cmp -s <(tail -n "$n" "$piece") <(tail -n "$n" "$trace"); then put same_trace yes; else put same_trace NO; fi
        rm -f "$trace"
    fi
    if [ "$in_month" = 1 ]; then
        log "long: day $((j + 1))/$days: gpuledger import"
        t="$EPOCHREALTIME"
        "$gl" import --db "$ledger" "$piece" 2>>"$logs/import.log" >>"$logs/import.log"
        import_s="$(addf "$import_s" "$(since "$t")")"
        log "long: day $((j + 1))/$days: OpenMetrics + promtool"
        t="$EPOCHREALTIME"
        "$python" "$here/trace_to_openmetrics.py" alloc "$piece" "$run/om-long" \
            --tally "$r2" --tally "$r24" --tally "$rl" >"$res/long/day-$j.json"
        convert_s="$(addf "$convert_s" "$(since "$t")")"
        t="$EPOCHREALTIME"
        for f in "$run"/om-long/*.om; do
            "$promtool" tsdb create-blocks-from openmetrics -q "$f" "$promdata" >>"$logs/promtool.log" 2>&1
            rm -f "$f"
        done
        promtool_s="$(addf "$promtool_s" "$(since "$t")")"
    fi
    if [ "$maxlen" -gt 0 ] && [ "$pend" -gt $((end - maxlen * 3600)) ]; then
        for L in "${lens[@]}"; do
            from=$((end - L * 3600))
            [ "$from" -lt "$pend" ] || continue
            src="$piece"
            if [ "$from" -gt "$first" ]; then
                src="$run/piece-part.csv"
                awk -F, -v t="$from" -v c="$(date -u -d "@$from" +%FT%TZ)" \
                    'NR == 1 || ($1 ~ /^[0-9]+$/ ? $1 + 0 >= t : $1 >= c)' "$piece" >"$src"
            fi
            log "length $L h: gpuledger import of $(((pend - (from > first ? from : first)) / 3600)) h"
            t="$EPOCHREALTIME"
            "$gl" import --db "$run/len-$L.duckdb" "$src" >>"$logs/import.log" 2>&1
            len_import_s[$L]="$(addf "${len_import_s[$L]}" "$(since "$t")")"
            rm -f "$run/piece-part.csv"
        done
        lo=$((end - maxlen * 3600))
        if [ "$lo" -lt "$first" ]; then lo=$first; fi
        log "lengths: 8 counters -> OpenMetrics -> promtool, $(((pend - lo) / 3600)) h in 2 h windows (promtool beside the conversion)"
        t="$EPOCHREALTIME"
        "$python" "$here/trace_to_openmetrics.py" counters "$piece" "$run/om-len" --from "$lo" \
            --promtool "$promtool" --tsdb "$run/prom-len" >"$res/len/piece-$k.json" 2>>"$logs/promtool.log"
        len_convert_s="$(addf "$len_convert_s" "$(since "$t")")"
    fi
    rm -f "$piece"
done
rm -f "$trace"
rmdir "$run/om-long" "$run/om-len" 2>/dev/null || true

# ---------------------------------------------------------------- 1b. storage at length
if [ "${#lens[@]}" -gt 0 ]; then
    put len_simulate_s "$len_sim_s"
    put len_convert_s "$len_convert_s"
    for L in "${lens[@]}"; do
        f="$run/len-$L.duckdb"
        put "len_${L}_import_s" "${len_import_s[$L]}"
        put "len_${L}_ledger_bytes" "$(stat -c %s "$f")"
        if [ -e "$f.wal" ]; then put "len_${L}_ledger_wal_bytes" "$(stat -c %s "$f.wal")"; else put "len_${L}_ledger_wal_bytes" 0; fi
        if [ -n "$duck_py" ] && ! "$duck_py" "$here/ledger_breakdown.py" "$f" >"$res/len/ledger-$L.json" 2>>"$logs/breakdown.log"; then
            log "length $L h: breakdown failed (see $logs/breakdown.log)"
            rm -f "$res/len/ledger-$L.json"
        fi
        rm -f "$f" "$f.wal"
        # This length's TSDB: the backfilled 2 h blocks of its last L hours.
        d="$run/prom-len-$L"
        mkdir -p "$d"
        for b in "$run"/prom-len/*/; do
            mint="$(awk -F'[:,]' '/"minTime"/ { gsub(/[^0-9]/, "", $2); print $2; exit }' "$b/meta.json")"
            if [ "$mint" -ge $(((end - L * 3600) * 1000)) ]; then cp -a "${b%/}" "$d/"; fi
        done
        put "len_${L}_prom_bytes" "$(du -sb "$d" | cut -f1)"
        put "len_${L}_prom_blocks" "$(find "$d" -mindepth 1 -maxdepth 1 -type d | wc -l)"
        cat "$d"/*/meta.json >"$res/len/prom-meta-$L.json"
    done
    rm -rf "$run/prom-len"
    # A running Prometheus on each, compacting beside the rest (it starts a minute after start).
    for L in "${lens[@]}"; do
        lport=0
        new_port lport
        log "length $L h: starting Prometheus on 127.0.0.1:$lport to compact the backfilled blocks"
        start_prom "$run/prom-len-$L" "$lport" "prometheus-len-$L"
        len_pid[$L]=$last_pid
        len_port[$L]=$lport
    done
fi
len_prom_finish() {
    local L pid port d
    for L in "${lens[@]}"; do
        pid="${len_pid[$L]}" port="${len_port[$L]}" d="$run/prom-len-$L"
        wait_ready "$pid" "$port" "prometheus (length $L h)"
        log "length $L h: waiting for Prometheus to compact the backfilled blocks"
        wait_compacted "$pid" "$port" "prometheus (length $L h)"
        put "len_${L}_prom_compaction_s" "$(metric "$port" prometheus_tsdb_compaction_duration_seconds_sum)"
        put "len_${L}_prom_compactions" "$(metric "$port" prometheus_tsdb_compactions_total)"
        put "len_${L}_prom_blocks_compacted" "$(metric "$port" prometheus_tsdb_blocks_loaded)"
        kill -TERM "$pid"
        wait "$pid" || true
        put "len_${L}_prom_bytes_compacted" "$(du -sb --exclude=wal --exclude=chunks_head --exclude=queries.active --exclude=lock "$d" | cut -f1)"
        rm -rf "$d"
    done
}
if [ "$month" = 0 ]; then
    len_prom_finish
    put finished "$(date +%s)"
    "$python" "$here/report.py" "$res" | tee "$run/report.txt"
    exit "${PIPESTATUS[0]}"
fi

# ---------------------------------------------------------------- 2. the month question
put long_simulate_s "$sim_s"
put long_import_s "$import_s"
put long_convert_s "$convert_s"
put long_promtool_s "$promtool_s"
put long_ledger_bytes "$(stat -c %s "$ledger")"
put long_prom_bytes_backfilled "$(du -sb "$promdata" | cut -f1)"
put long_prom_blocks_backfilled "$(find "$promdata" -mindepth 1 -maxdepth 1 -type d | wc -l)"

token="$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')"
gport=0
new_port gport
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

pport=0
new_port pport
log "long: starting Prometheus on 127.0.0.1:$pport"
t="$EPOCHREALTIME"
start_prom "$promdata" "$pport" prometheus
pid_prom=$last_pid
wait_ready "$pid_prom" "$pport" prometheus
put prom_ready_s "$(since "$t")"
# Wait for the compaction, so that the queries meet the layout a Prometheus that had held these
# days would have. (Part 1b's Prometheus servers compact beside it; they stop before the queries.)
log "long: waiting for Prometheus to compact the backfilled blocks"
wait_compacted "$pid_prom" "$pport" prometheus
put prom_compaction_s "$(metric "$pport" prometheus_tsdb_compaction_duration_seconds_sum)"
put prom_compactions "$(metric "$pport" prometheus_tsdb_compactions_total)"
put long_prom_blocks "$(metric "$pport" prometheus_tsdb_blocks_loaded)"
put long_prom_bytes "$(du -sb --exclude=wal --exclude=chunks_head "$promdata" | cut -f1)"
len_prom_finish

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
