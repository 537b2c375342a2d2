#!/usr/bin/env bash
# Peak memory of the aggregator under hostile ingest (BENCHMARKS.md, "Memory").
#
# Starts `gpuledger aggregator` on a fresh ledger, reads its peak RSS (VmHWM) once it is idle (the
# baseline), then after each attack, in rounds of N concurrent requests from one valid node token:
#   bomb     a 255 KiB gzip body inflating to 256 MiB of `"t":[0,0,…]` (issue 11, defect 1);
#   values   681,000 ratios in one column: just under the value bound, every one parsed before
#            a rule refuses the batch (the worst a body may cost once it passes the bounds);
#   tenant   the bomb sent with a read-only tenant token (refused before the body is read).
# Prints one line per round: attack, concurrency, peak RSS in MiB, ratio to the idle baseline.
#
# Usage: benches/ingest_memory.sh [path/to/gpuledger]   (default: the debug build in
# $CARGO_TARGET_DIR, else ~/.cache/gpuledger-target). Needs curl and python3.
set -euo pipefail
bin="${1:-${CARGO_TARGET_DIR:-$HOME/.cache/gpuledger-target}/debug/gpuledger}"
work="$(mktemp -d)"
trap 'kill "$pid" 2>/dev/null || true; rm -rf "$work"' EXIT

node_token="bench-node-token-0123456789"
tenant_token="bench-tenant-token-0123456789"
printf 'node:n1 %s\ntenant:a %s\n' "$node_token" "$tenant_token" >"$work/tokens"
chmod 600 "$work/tokens"

python3 - "$work" <<'EOF'
import gzip, sys
work = sys.argv[1]
head = b'{"v":1,"batch_id":"01a2057d-f974-7779-95df-9092985a68aa","node":"n1","series":[{"t":['
with gzip.open(f"{work}/bomb.gz", "wb", compresslevel=9) as f:
    f.write(head)
    chunk = b"0," * (1 << 20)
    for _ in range(128):
        f.write(chunk)
    f.write(b"0]}]}")
# Just under the defaults' value bound (4,096 series x 32 + 50,000 x 11 + 64 = 681,136 values),
# all parsed into the widest column type (a ratio: 16 bytes each) before the column-length rule
# refuses the batch: the most a body that passes the bounds can cost.
values = 681_000
with gzip.open(f"{work}/values.gz", "wb", compresslevel=6) as f:
    f.write(head + b'1],"sm_active":[')
    f.write(b"0.5," * (values - 1))
    f.write(b"0.5]}]}")
EOF

port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
RUST_LOG=error "$bin" aggregator --db "$work/ledger.duckdb" --listen "127.0.0.1:$port" \
  --token-file "$work/tokens" >/dev/null 2>&1 &
pid=$!
for _ in $(seq 100); do
  curl -sf "http://127.0.0.1:$port/healthz" >/dev/null && break
  sleep 0.2
done
sleep 2
hwm() { awk '/VmHWM/ {printf "%.1f", $2 / 1024}' "/proc/$pid/status"; }
base=$(hwm)
echo "idle                      peak RSS ${base} MiB  (baseline, 1.00x)"

attack() { # name file token concurrency
  local name=$1 file=$2 token=$3 n=$4 codes
  codes=$(seq "$n" | xargs -P "$n" -I{} curl -s -o /dev/null -w '%{http_code}\n' \
    -H "Authorization: Bearer $token" -H 'Content-Encoding: gzip' -H 'Content-Type: application/json' \
    --data-binary "@$work/$file" "http://127.0.0.1:$port/api/v1/ingest" | sort | uniq -c | tr -s ' ' | tr '\n' ' ')
  local peak
  peak=$(hwm)
  printf '%-8s x%-3s answers [%s] peak RSS %s MiB  (%.2fx)\n' "$name" "$n" "$codes" "$peak" \
    "$(echo "$peak / $base" | bc -l)"
}
attack tenant bomb.gz "$tenant_token" 64
attack bomb bomb.gz "$node_token" 1
attack bomb bomb.gz "$node_token" 16
attack values values.gz "$node_token" 1
attack values values.gz "$node_token" 16
attack values values.gz "$node_token" 64
