#!/usr/bin/env bash
# The running exporter daemon on the simulated 8 × 7 MIG node (gpu-h100-01 of the built-in fleet,
# 56 instances at 1 Hz, a /metrics scrape every 5 s, no aggregator), two builds in alternating
# pairs: CPU as a share of one core (/proc/PID/stat over 30 s, after 2 s of start-up) and RSS
# after 2 s and at the end. Used to compare the lean `gpuledger-exporter` with the exporter inside
# the combined `gpuledger` binary (BENCHMARKS.md, "Exporter").
#
#   benches/exporter_daemon.sh PAIRS "BASELINE COMMAND" "NEW COMMAND"
#   e.g. benches/exporter_daemon.sh 3 "target/release/gpuledger exporter" target/release/gpuledger-exporter
set -euo pipefail
pairs=$1 base=$2 new=$3
hz=$(getconf CLK_TCK)

run() {
  local port pid t0 t1 r0 r1 start end
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  # shellcheck disable=SC2086 # the command is words by design
  $1 --source sim --node gpu-h100-01 --listen "127.0.0.1:$port" 2>/dev/null &
  pid=$!
  sleep 2
  read -r t0 r0 < <(awk '{print $14 + $15, $24 * 4}' "/proc/$pid/stat")
  start=$(date +%s.%N)
  for _ in 1 2 3 4 5 6; do
    sleep 5
    curl -s -o /dev/null "http://127.0.0.1:$port/metrics"
  done
  read -r t1 r1 < <(awk '{print $14 + $15, $24 * 4}' "/proc/$pid/stat")
  end=$(date +%s.%N)
  kill "$pid"
  wait "$pid" 2>/dev/null || true
  # CPU % of one core, RSS KiB at 2 s, RSS KiB at the end.
  python3 -c "print(f'{($t1 - $t0) / $hz / ($end - $start) * 100:.3f} $r0 $r1')"
}

printf 'pair\tbuild\tcpu_pct\trss_2s_kib\trss_end_kib\n'
for i in $(seq 1 "$pairs"); do
  printf '%s\tbaseline\t%s\n' "$i" "$(run "$base" | tr ' ' '\t')"
  printf '%s\tnew\t%s\n' "$i" "$(run "$new" | tr ' ' '\t')"
done
