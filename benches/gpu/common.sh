# shellcheck shell=bash
# $agg, $scraper: set here for the caller; $exp: set by the caller (its exporter).
# shellcheck disable=SC2034,SC2154
# Shared by the real-GPU checks (real_gpu_check.sh, shared_gpu_check.sh); sourced, not run.
# Each check runs an aggregator and an NVML exporter on loopback, scrapes the exporter's /metrics
# every second while known work runs on the GPU, then asks the aggregator what it stored.

# write_tokens WORK NODE NODE_TOKEN ADMIN_TOKEN: the aggregator's token file (WORK/tokens) and the
# exporter's (WORK/node.token).
write_tokens() {
  printf 'node:%s %s\nadmin %s\n' "$2" "$3" "$4" >"$1/tokens"
  printf '%s\n' "$3" >"$1/node.token"
}

# start_aggregator WORK PORT CMD...: `CMD aggregator` on 127.0.0.1:PORT, writing WORK/ledger.duckdb
# and logging to WORK/aggregator.log, in the background with its pid in $agg; returns once
# /readyz answers 200 (or after 20 s, saying so).
start_aggregator() {
  local work="$1" port="$2"
  shift 2
  "$@" aggregator --db "$work/ledger.duckdb" --listen "127.0.0.1:$port" \
    --token-file "$work/tokens" --analytics-interval 5s --default-price 3.5 \
    >"$work/aggregator.log" 2>&1 &
  agg=$!
  for _ in $(seq 1 100); do
    curl -sf "http://127.0.0.1:$port/readyz" >/dev/null && return 0
    sleep 0.2
  done
  echo "the aggregator was not ready after 20 s; see $work/aggregator.log" >&2
}

# scrape SECONDS PORT PATTERN OUT: the exporter's /metrics on 127.0.0.1:PORT once a second for
# SECONDS, each scrape headed '# scrape <unix time>' and keeping the lines `grep -E PATTERN`
# matches, into OUT; in the background with its pid in $scraper.
scrape() {
  local seconds="$1" port="$2" pattern="$3" out="$4"
  (
    for _ in $(seq 1 "$seconds"); do
      echo "# scrape $(date +%s.%N)"
      curl -s "http://127.0.0.1:$port/metrics" | grep -E "$pattern"
      sleep 1
    done
  ) >"$out" 2>&1 &
  scraper=$!
}

# showback PORT TOKEN: the showback by tenant over the last 10 minutes, headed.
showback() {
  local now
  now=$(date +%s)
  echo '# showback by tenant, the last 10 minutes'
  curl -s -H "Authorization: Bearer $2" \
    "http://127.0.0.1:$1/api/v1/showback?group_by=tenant&from=$((now - 600))&to=$now"
  echo
}

# stop_services: the exporter ($exp) first, so that it ships what it holds, then the aggregator.
stop_services() {
  kill -TERM "$exp"
  wait "$exp"
  kill -TERM "$agg"
  wait "$agg"
}
