#!/usr/bin/env bash
# Alternating A/B runs of the live-path bench (`benches/ingest_load.rs`) against two aggregator
# binaries: the same bench binary each time, with the `gpuledger` binary it starts swapped between
# runs, base first in every pair. This is how BENCHMARKS.md compares two builds on a shared,
# noisy machine: each pair ran minutes apart under the same load.
#
#   benches/ingest_pairs.sh BASE_BIN NEW_BIN OUT_DIR PAIRS [ingest_load arguments...]
#   e.g. benches/ingest_pairs.sh /tmp/gl.base /tmp/gl.new /tmp/pairs 3 --seconds 120 --paced-seconds 5
#
# Build the bench and the binary with `cargo bench --locked --no-run` at each commit, copying
# `target/release/gpuledger` aside each time. Each run's report goes to OUT_DIR/{base,new}.N.txt;
# the lines the comparisons quote are printed at the end, with the checkpoints `wal_watch.sh` saw
# (OUT_DIR/{base,new}.N.wal). `target/release/gpuledger` is left as NEW_BIN.
set -euo pipefail
[ $# -ge 4 ] || { sed -n '2,14p' "$0"; exit 2; }
base=$1 new=$2 out=$3 pairs=$4
shift 4
here=$(cd "$(dirname "$0")" && pwd)
target=${CARGO_TARGET_DIR:-$here/../target}
bench=
for f in "$target"/release/deps/ingest_load-*; do
  case $f in *.d) continue ;; esac
  [ -z "$bench" ] || [ "$f" -nt "$bench" ] && bench=$f
done
[ -n "$bench" ] || { echo "no ingest_load bench under $target/release/deps: run cargo bench --locked --no-run" >&2; exit 2; }
mkdir -p "$out"
for i in $(seq 1 "$pairs"); do
  for v in base new; do
    bin=$base
    [ "$v" = new ] && bin=$new
    cp "$bin" "$target/release/gpuledger"
    "$here/wal_watch.sh" "$out/$v.$i.wal" &
    watch=$!
    rc=0
    "$bench" --bench "$@" > "$out/$v.$i.txt" 2>&1 || rc=$?
    echo "$v $i: exit $rc"
    sleep 1
    kill "$watch" 2>/dev/null || true
  done
done
cp "$new" "$target/release/gpuledger"
for f in "$out"/*.txt; do
  echo "== $f"
  grep -E 'samples/s|CPU per sample|peak RSS [0-9]|evaluations ended' "$f" || true
  wal=${f%.txt}.wal
  echo "  checkpoints: $(grep -vc '^#' "$wal" || true); the largest WALs before one, MB:" \
    "$(grep -v '^#' "$wal" | awk '{print int($2 / 1e6)}' | sort -n | tail -4 | tr '\n' ' ')"
done
