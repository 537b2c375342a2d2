#!/bin/bash
# gpuledger Slurm prolog: records which job holds which GPU or MIG device on this node, so the
# gpuledger exporter (--slurm-job-dir) can charge the device to the job's account even while no
# process runs on it. Install as (or call from) slurm.conf's Prolog=.
#
# Writes one file per device into $GPULEDGER_JOBMAP_DIR (default /run/gpuledger/slurm-jobs),
# named after the device as Slurm gives it: a GPU UUID (GPU-…), a MIG UUID (MIG-…) or a GPU index,
# taken from SLURM_JOB_GPUS and CUDA_VISIBLE_DEVICES — and, for every job, one more named
# job-<id>, which names the job's processes on a GPU shared with other jobs (shards,
# oversubscription) even after another job's prolog took the device's file. Each file holds
# key=value lines: job_id, user, account, partition, qos. Files are written under a temporary name and renamed, so the exporter never
# reads half a file.
#
# A failing prolog would drain the node, so this script reports problems on stderr and always
# exits 0: a job is never held back by accounting.
set -u

dir="${GPULEDGER_JOBMAP_DIR:-/run/gpuledger/slurm-jobs}"
job="${SLURM_JOB_ID:-}"
if [ -z "$job" ]; then
  echo "gpuledger-prolog: SLURM_JOB_ID is not set; run this as Slurm's Prolog" >&2
  exit 0
fi

devices="${SLURM_JOB_GPUS:-},${CUDA_VISIBLE_DEVICES:-}"

# slurmd does not pass the job's QOS to the prolog (22.05 never sets SLURM_JOB_QOS there): ask
# slurmctld once, unless GPULEDGER_PROLOG_QUERY_QOS=0 (one controller request per job start). The
# field alone (squeue's %q), never a search of `scontrol show job`'s line: a job's name is free
# text and could carry "QOS=…" itself.
qos="${SLURM_JOB_QOS:-}"
if [ -z "$qos" ] && [ "${GPULEDGER_PROLOG_QUERY_QOS:-1}" != 0 ] && command -v squeue >/dev/null; then
  qos="$(timeout 5 squeue -h -j "$job" --states=all -o %q 2>/dev/null | head -n 1)"
  qos="${qos//[[:space:]]/}"
  case "$qos" in "(null)" | *[!A-Za-z0-9_.-]*) qos="" ;; esac
fi

if ! mkdir -p "$dir"; then
  echo "gpuledger-prolog: cannot create $dir" >&2
  exit 0
fi

# publish NAME: writes the job's record as $dir/NAME.
publish() {
  local tmp
  tmp="$(mktemp "$dir/.$1.XXXXXX")" || {
    echo "gpuledger-prolog: job $job: cannot write to $dir" >&2
    return
  }
  printf 'job_id=%s\nuser=%s\naccount=%s\npartition=%s\nqos=%s\n' \
    "$job" "${SLURM_JOB_USER:-}" "${SLURM_JOB_ACCOUNT:-}" "${SLURM_JOB_PARTITION:-}" "$qos" >"$tmp"
  chmod 0644 "$tmp"
  mv -f "$tmp" "$dir/$1" || echo "gpuledger-prolog: job $job: cannot publish $dir/$1" >&2
}

IFS=',' read -r -a ids <<<"$devices"
declare -A seen
for id in "${ids[@]}"; do
  id="${id//[[:space:]]/}"
  case "$id" in
  "" | NoDevFiles) continue ;;
  GPU-* | MIG-*) ;;
  *[!0-9]*)
    echo "gpuledger-prolog: job $job: ignoring device id '$id' (not a GPU/MIG UUID or an index)" >&2
    continue
    ;;
  esac
  case "$id" in
  */*)
    echo "gpuledger-prolog: job $job: ignoring the old MIG id form '$id'" >&2
    continue
    ;;
  esac
  # CUDA_VISIBLE_DEVICES repeats SLURM_JOB_GPUS: each device once.
  [ -n "${seen[$id]:-}" ] && continue
  seen[$id]=1
  publish "$id"
done
# Every job gets its record, GPUs named or not: a job on GPU shards may see neither variable set
# in the prolog, and its processes are still to be named.
case "$job" in
*[!0-9]*) echo "gpuledger-prolog: job id '$job' is not numeric; no job-<id> record" >&2 ;;
*) publish "job-$job" ;;
esac
exit 0
