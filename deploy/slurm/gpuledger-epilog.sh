#!/bin/bash
# gpuledger Slurm epilog: removes the job's device files written by gpuledger-prolog.sh, so the
# devices count as unallocated from the next second on. Only files still naming this job are
# removed: a device already handed to another job keeps that job's file.
#
# A failing epilog would drain the node, so this script reports problems on stderr and always
# exits 0.
set -u

dir="${GPULEDGER_JOBMAP_DIR:-/run/gpuledger/slurm-jobs}"
job="${SLURM_JOB_ID:-}"
if [ -z "$job" ]; then
  echo "gpuledger-epilog: SLURM_JOB_ID is not set; run this as Slurm's Epilog" >&2
  exit 0
fi
[ -d "$dir" ] || exit 0

for f in "$dir"/*; do
  [ -f "$f" ] || continue
  if grep -qx "job_id=$job" "$f"; then
    rm -f "$f" || echo "gpuledger-epilog: job $job: cannot remove $f" >&2
  fi
done
exit 0
