#!/usr/bin/env bash
# The shared-GPU check: two Slurm jobs on one real GPU, time-sliced and then under MPS, and what
# the exporter's per-process view (exporter/src/attribution/shares.rs) makes of them.
#
# What is real: the GPU and its driver (NVML, the MPS daemon), deploy/slurm's own prolog writing
# the job map, and cgroup v2 directories named as Slurm's cgroup plugin names them (`job_<id>`),
# which the two load processes are moved into. What stands in: no slurmd runs; the prolog is
# called with the SLURM_* variables slurmd would give it, and the cgroups are made by this script.
#
# Phases (both jobs start together; job 102's prolog runs last, so the GPU's device file is
# job 102's and job 101's processes are named through its job-101 record):
#   sliced   12 s  both jobs run FMA chains, time-sliced by the driver  -> about half each
#   alone    10 s  job 101 runs FMAs, job 102 holds its context idle    -> job 101 all, 102 zero
#   mps-one   8 s  the MPS daemon started; job 101 alone runs FMAs as its client -> job 101 all
#   mps      12 s  job 101 FMAs, job 102 a DRAM copy, both clients         -> not attributable
# nvidia-smi pmon samples each process's SM % meanwhile, as the driver's own reference.
# It only reads the GPU's settings: MIG mode and compute mode are left as they are, and the MPS
# daemon it starts is told to quit before it ends.
#
# Usage: GPULEDGER_BIN=path/to/gpuledger GPULOAD_BIN=path/to/gpuload benches/gpu/shared_gpu_check.sh OUTDIR
# OUTDIR receives: env.txt, run.log, scrapes.txt, pmon.txt, api.json, logs.txt.
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
out="${1:?usage: shared_gpu_check.sh OUTDIR}"
bin="${GPULEDGER_BIN:?set GPULEDGER_BIN to the gpuledger binary}"
load="${GPULOAD_BIN:?set GPULOAD_BIN to the gpuload binary}"
mkdir -p "$out"
# shellcheck source=benches/gpu/common.sh
. "$here/common.sh"
began=$(date +%s)
work="$(mktemp -d)"
agg_port=19846
exp_port=19845
token_node="gpu-share-node-token-0123456789"
token_admin="gpu-share-admin-token-0123456789"
uuid="$(nvidia-smi --query-gpu=uuid --format=csv,noheader | head -1 | tr -d ' ')"

{
  echo "# nvidia-smi --query-gpu"
  nvidia-smi --query-gpu=index,name,uuid,mig.mode.current,compute_mode --format=csv
  echo "# gpuledger --version"; "$bin" --version
  echo "# cgroup"; stat -fc %T /sys/fs/cgroup; cat /proc/self/cgroup
  echo "# mps"; command -v nvidia-cuda-mps-control || echo "no nvidia-cuda-mps-control"
} >"$out/env.txt" 2>&1

# The job map, written by the real prolog as slurmd would call it.
jobs="$work/slurm-jobs"
for job in 101:acct-a 102:acct-b; do
  GPULEDGER_JOBMAP_DIR="$jobs" SLURM_JOB_ID="${job%%:*}" SLURM_JOB_ACCOUNT="${job#*:}" \
    SLURM_JOB_USER=check SLURM_JOB_PARTITION=gpu SLURM_JOB_QOS=normal \
    CUDA_VISIBLE_DEVICES="$uuid" bash "$repo/deploy/slurm/gpuledger-prolog.sh"
done
ls -l "$jobs" >>"$out/env.txt" 2>&1

# Slurm-shaped cgroups: .../job_<id>, as the task/cgroup plugin names them.
cg=/sys/fs/cgroup/gpuledger-check
mkdir -p "$cg/job_101" "$cg/job_102" 2>>"$out/env.txt" || echo "cannot make cgroups" >>"$out/env.txt"
# in_job ID CMD...: runs CMD inside job ID's cgroup.
in_job() {
  local id="$1"
  shift
  sh -c 'echo $$ >"$0/cgroup.procs" 2>/dev/null || echo "not moved into $0" >&2; exec "$@"' \
    "$cg/job_$id" "$@"
}

write_tokens "$work" gpu-share "$token_node" "$token_admin"
start_aggregator "$work" "$agg_port" "$bin"
"$bin" exporter --source nvml --listen "127.0.0.1:$exp_port" \
  --aggregator "http://127.0.0.1:$agg_port" --token-file "$work/node.token" --node gpu-share \
  --spool-dir "$work/spool" --slurm-job-dir "$jobs" >"$work/exporter.log" 2>&1 &
exp=$!

seconds=64
nvidia-smi pmon -s um -d 1 -c "$seconds" >"$out/pmon.txt" 2>&1 &
scrape "$seconds" "$exp_port" '^gpuledger_(share_|instance_sm_active|exporter_collector_duration)' \
  "$out/scrapes.txt"

sleep 4
{
  echo "# sliced + alone $(date +%s.%N)"
  in_job 101 "$load" fma 12 fma 10 >"$work/job101.log" 2>&1 &
  a=$!
  in_job 102 "$load" fma 12 idle 10 >"$work/job102.log" 2>&1 &
  b=$!
  wait "$a" "$b"
  cat "$work/job101.log" "$work/job102.log"
  sleep 3
  echo "# mps $(date +%s.%N)"
  export CUDA_MPS_PIPE_DIRECTORY="$work/mps-pipe" CUDA_MPS_LOG_DIRECTORY="$work/mps-log"
  mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
  if nvidia-cuda-mps-control -d; then
    in_job 101 "$load" fma 8 >"$work/job101.log" 2>&1
    cat "$work/job101.log"
    sleep 2
    echo "# mps, both jobs $(date +%s.%N)"
    in_job 101 "$load" fma 12 >"$work/job101.log" 2>&1 &
    a=$!
    in_job 102 "$load" copy 12 >"$work/job102.log" 2>&1 &
    b=$!
    wait "$a" "$b"
    cat "$work/job101.log" "$work/job102.log"
    echo quit | nvidia-cuda-mps-control
    echo "# mps quit $(date +%s.%N)"
  else
    echo "the MPS daemon did not start"
  fi
} >"$out/run.log" 2>&1

wait "$scraper"
sleep 12 # the last 5 s batch sealed and shipped
now=$(date +%s)
# Shares are kept per UTC hour: every hour the check touched.
from=$((began - began % 3600))
to=$((now - now % 3600 + 3600))
{
  for by in workload tenant; do
    echo "# shares by $by, the hours of the check"
    curl -s -H "Authorization: Bearer $token_admin" \
      "http://127.0.0.1:$agg_port/api/v1/shares?group_by=$by&from=$from&to=$to"
    echo
  done
  showback "$agg_port" "$token_admin"
} >"$out/api.json" 2>&1

stop_services
rmdir "$cg/job_101" "$cg/job_102" "$cg" 2>/dev/null
{
  echo "# exporter.log"; cat "$work/exporter.log"
  echo "# aggregator.log"; cat "$work/aggregator.log"
  echo "# mps log"; cat "$work/mps-log/"*.log 2>/dev/null
} >"$out/logs.txt"
echo "shared_gpu_check: done; $(grep -c '^# scrape' "$out/scrapes.txt") scrapes"
