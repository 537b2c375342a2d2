#!/usr/bin/env bash
# Watches a running `gpuledger aggregator`'s write-ahead log: every 50 ms it reads the WAL's size,
# and each time the size falls (a checkpoint folded the WAL into the database file) it writes
# the time and the size just before to OUT_FILE. It waits for the aggregator to start and stops
# when it exits. `benches/ingest_pairs.sh` runs it beside each bench run.
#
#   benches/wal_watch.sh OUT_FILE
#
# The 50 ms poll misses what is written between the last poll and the checkpoint, so sizes are
# lower bounds; checkpoints less than 50 ms apart count as one.
set -euo pipefail
[ $# -eq 1 ] || { sed -n '2,10p' "$0"; exit 2; }
out=$1
: > "$out"
db="" pid=""
while [ -z "$db" ]; do
  sleep 0.2
  pid=$(pgrep -f "gpuledger aggregator" | head -1) || continue
  db=$(tr '\0' '\n' < "/proc/$pid/cmdline" 2>/dev/null | grep -A1 -x -- '--db' | tail -1) || db=""
done
wal=$db.wal
echo "# aggregator $pid, $wal" >> "$out"
prev=0
while kill -0 "$pid" 2>/dev/null; do
  size=$(stat -c %s "$wal" 2>/dev/null || echo 0)
  if [ "$size" -lt "$prev" ]; then
    echo "$(date +%s.%N | cut -c1-14) $prev" >> "$out"
  fi
  prev=$size
  sleep 0.05
done
