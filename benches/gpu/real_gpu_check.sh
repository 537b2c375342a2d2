#!/usr/bin/env bash
# The real-GPU check: the exporter's NVML source on a machine with a GPU, end to end.
#
# Starts an aggregator and `gpuledger exporter --source nvml` shipping to it on loopback, with the
# GPU mapped to a tenant by a static map. While NVIDIA's own Python binding samples the same GPM
# metrics as an independent reference (gpm_reference.py), it runs known work on the GPU
# (gpuload.c: idle, FP32 FMAs, a DRAM copy, tensor-core MMAs; then a PyTorch bf16 matrix product)
# and scrapes the exporter's /metrics every second. At the end it asks the aggregator for the
# tenant's showback and keeps the ledger file, so that what was stored can be read back.
# It only reads the GPU: MIG mode and every GPU setting are left as they are.
#
# Usage: GPULEDGER_BIN=path/to/gpuledger GPULOAD_BIN=path/to/gpuload benches/gpu/real_gpu_check.sh OUTDIR
# OUTDIR receives: env.txt, run.log, logs.txt, scrapes.txt, reference.csv, api.json, ledger.duckdb.
# The figures read from one run are in BENCHMARKS.md, "Real GPUs: H100 and H200 against NVIDIA's
# binding".
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
out="${1:?usage: real_gpu_check.sh OUTDIR}"
bin="${GPULEDGER_BIN:?set GPULEDGER_BIN to the gpuledger binary}"
load="${GPULOAD_BIN:-}"
# GPULEDGER_RUN may name a wrapper (a carried dynamic loader, for an older glibc).
run=("$bin")
if [ -n "${GPULEDGER_RUN:-}" ]; then run=("$GPULEDGER_RUN" "$bin"); fi
mkdir -p "$out"
# shellcheck source=benches/gpu/common.sh
. "$here/common.sh"
work="$(mktemp -d)"
agg_port=19836
exp_port=19835
token_node="gpu-check-node-token-0123456789"
token_admin="gpu-check-admin-token-0123456789"

{
  echo "# uname"; uname -a
  echo "# nvidia-smi"; nvidia-smi
  echo "# nvidia-smi --query-gpu"
  nvidia-smi --query-gpu=index,name,uuid,driver_version,mig.mode.current,memory.total,power.limit --format=csv
  echo "# gpuledger --version"; "${run[@]}" --version
  echo "# ldd"; ldd "$bin"
} >"$out/env.txt" 2>&1

uuid="$(nvidia-smi --query-gpu=uuid --format=csv,noheader | head -1 | tr -d ' ')"
write_tokens "$work" gpu-check "$token_node" "$token_admin"
cat >"$work/map.toml" <<EOF
[[device]]
uuid = "$uuid"
tenant = "gpu-check"
workload = "gpu-check/gpuload"
slo_class = "batch"
EOF

start_aggregator "$work" "$agg_port" "${run[@]}"

"${run[@]}" exporter --source nvml --listen "127.0.0.1:$exp_port" \
  --aggregator "http://127.0.0.1:$agg_port" --token-file "$work/node.token" --node gpu-check \
  --spool-dir "$work/spool" --attribution-map "$work/map.toml" >"$work/exporter.log" 2>&1 &
exp=$!

phases=(idle 10 fma 15 copy 15 mma 15 idle 5)
seconds=110
python3 "$here/gpm_reference.py" "$seconds" "$out/reference.csv" >>"$out/run.log" 2>&1 &
nvidia-smi dmon -s pu -d 1 -c "$seconds" >"$work/dmon.txt" 2>&1 &

scrape "$seconds" "$exp_port" '^[^#]' "$out/scrapes.txt"

sleep 3
{
  echo "# gpuload ${phases[*]}"
  if [ -n "$load" ]; then "$load" "${phases[@]}" 2>&1 || echo "gpuload failed: $?"; fi
  echo "# torch bf16 8192^3 matmul, 15 s"
  python3 - <<'EOF' 2>&1
import time, torch
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
start = time.time(); n = 0
while time.time() - start < 15:
    for _ in range(10):
        a @ a
    torch.cuda.synchronize(); n += 10
print(f"phase torch_matmul {start:.3f} {time.time():.3f} launches {n}", flush=True)
EOF
  echo "# idle to the end"
} >>"$out/run.log"

wait "$scraper"
sleep 12 # the last 5 s batch sealed and shipped
{
  showback "$agg_port" "$token_admin"
  echo '# aggregator /metrics (ingest)'
  curl -s "http://127.0.0.1:$agg_port/metrics" -H "Authorization: Bearer $token_admin" | grep -E '^gpuledger_(ingest|aggregator)_' | head -40
} >"$out/api.json" 2>&1

stop_services
cp "$work/ledger.duckdb" "$out/ledger.duckdb"
{
  echo "# exporter.log"; cat "$work/exporter.log"
  echo "# aggregator.log"; cat "$work/aggregator.log"
  echo "# nvidia-smi dmon"; cat "$work/dmon.txt"
} >"$out/logs.txt"
echo "real_gpu_check: done; $(wc -l <"$out/reference.csv") reference rows, $(grep -c '^# scrape' "$out/scrapes.txt") scrapes"
