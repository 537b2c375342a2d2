#!/bin/bash
# A throwaway single-node Slurm cluster on loopback, for gpuledger's tests against real Slurm
# daemons (munged, slurmctld, slurmd of Debian's slurm-wlm and munge packages). Run as root.
#
#   cluster.sh start DIR   writes DIR/slurm.conf, DIR/gres.conf, a munge key and fake GPU
#                          character devices (DIR/dev/nvidiaN, major 195; plain files without
#                          CAP_MKNOD), starts the three daemons and waits until the node is
#                          idle. Prints nothing unless something fails; then it says which
#                          daemon did not come up, shows the end of its output and stops what it
#                          started.
#   cluster.sh stop DIR    cancels the cluster's jobs, stops the daemons started in DIR (by their
#                          pid files) and kills any job process left. Safe to run twice, or after a
#                          failed start.
#
# Clients (sbatch, squeue, scontrol, scancel, sinfo) need SLURM_CONF=DIR/slurm.conf. Node gpunode1,
# partition gpu (the default), no accounting: any --account is accepted, QoS is always empty.
# DIR must be an absolute or relative path without whitespace.
#
# The node's Prolog and Epilog are wrappers (DIR/prolog.sh, DIR/epilog.sh) that save the
# environment slurmd gave them as DIR/env/{prolog,epilog}.<job id>.<restart count>
# (NUL-separated, as in /proc/PID/environ), export GPULEDGER_JOBMAP_DIR, and run the configured
# script with bash. slurmd gives a prolog a fresh environment (no PATH, nothing of slurmd's own),
# so a wrapper is the only way to point the project's prolog at another job map directory.
#
# Timing (2-core VM): start about 0.8s; the first job after start is allocated about 2.6s after
# its sbatch, later ones in about 0.2s; a requeued job runs again about 11s later
# (cred_expire=10); stop about 1s. squeue says RUNNING while the prolog still runs: wait for the
# prolog's files, not for the job state.
#
# Environment:
#   GPULEDGER_SLURM_PROLOG   script run as the prolog (default: deploy/slurm/gpuledger-prolog.sh
#                            of this checkout; empty: none, the environment is still saved)
#   GPULEDGER_SLURM_EPILOG   likewise for the epilog (default: deploy/slurm/gpuledger-epilog.sh)
#   GPULEDGER_JOBMAP_DIR     job map directory handed to both scripts (default DIR/jobs)
#   GPULEDGER_SLURM_GPUS     GPUs on the node, 1..64 (default 2)
#   GPULEDGER_SLURM_PORT     slurmctld's port; slurmd takes the next one (default 46817). Both
#                            listen on all addresses; the munge key is DIR's own.
#   GPULEDGER_SLURM_TIMEOUT  seconds to wait for each daemon (default 60)
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
node=gpunode1

die() {
  echo "cluster.sh: $*" >&2
  exit 1
}

usage() {
  die "usage: cluster.sh start|stop DIR"
}

# alive PID: whether process PID runs (a zombie does not: the daemons are reparented when start
# exits, and whoever reaps them may take its time).
alive() {
  local stat
  stat="$(cat "/proc/$1/stat" 2>/dev/null)" || return 1
  stat="${stat##*) }"
  [[ "$stat" != [ZX]* ]]
}

# pid_of NAME: the pid recorded for daemon NAME, if it still runs.
pid_of() {
  local f="$dir/run/$1.pid" pid
  [ -f "$f" ] || return 1
  pid="$(<"$f")"
  [[ "$pid" =~ ^[0-9]+$ ]] || return 1
  # The process must still be that daemon, not another one that reused the pid.
  [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$1" ] || return 1
  alive "$pid" || return 1
  echo "$pid"
}

# log_tail NAME: the last lines of daemon NAME's output, indented, on stderr.
log_tail() {
  local f="$dir/log/$1.out"
  if [ -s "$f" ]; then
    echo "  last lines of $f:" >&2
    tail -n 15 "$f" | sed 's/^/    /' >&2
  fi
}

# fail NAME MESSAGE: reports that daemon NAME did not come up, stops the cluster, exits 1.
fail() {
  echo "cluster.sh: $1 did not come up: $2" >&2
  log_tail "$1"
  stop_cluster
  exit 1
}

# wait_for NAME CHECK...: runs CHECK until it succeeds, failing if NAME's process exits or the
# timeout passes.
wait_for() {
  local name="$1" deadline=$((SECONDS + timeout))
  shift
  until "$@" >/dev/null 2>&1; do
    pid_of "$name" >/dev/null || fail "$name" "the process exited"
    [ "$SECONDS" -lt "$deadline" ] || fail "$name" "not ready within ${timeout}s ($*)"
    sleep 0.2
  done
}

# launch NAME COMMAND...: starts a daemon in the foreground mode of its own, in the background,
# with its output in DIR/log/NAME.out and its pid in DIR/run/NAME.pid.
launch() {
  local name="$1" i
  shift
  if pid_of "$name" >/dev/null; then
    die "$name already runs in $dir (pid $(pid_of "$name")); stop it first"
  fi
  (cd "$dir" && exec setsid "$@" </dev/null >"$dir/log/$name.out" 2>&1) &
  echo "$!" >"$dir/run/$name.pid"
  # Until the subshell has become the daemon, pid_of does not recognise it.
  for ((i = 0; i < 50; i++)); do
    pid_of "$name" >/dev/null && return 0
    alive "$!" || break
    sleep 0.1
  done
  pid_of "$name" >/dev/null || fail "$name" "it did not start ($1 exited or never became $name)"
}

munge_works() {
  munge -n -S "$dir/munge/munge.socket.2" | unmunge -S "$dir/munge/munge.socket.2"
}

controller_up() {
  scontrol ping | grep -q 'is UP'
}

node_idle() {
  [ "$(sinfo -h -n "$node" -o %T)" = idle ]
}

# wrapper KIND SCRIPT: writes DIR/KIND.sh, which saves its environment and runs SCRIPT.
wrapper() {
  local kind="$1" script="$2"
  {
    echo '#!/bin/bash'
    # shellcheck disable=SC2016 # expanded by the wrapper, not here
    printf '/bin/cat /proc/$$/environ >%q/env/%s."${SLURM_JOB_ID:-none}.${SLURM_JOB_RESTART_COUNT:-0}"\n' \
      "$dir" "$kind"
    printf 'export GPULEDGER_JOBMAP_DIR=%q\n' "$jobmap"
    if [ -n "$script" ]; then
      printf 'exec /bin/bash %q\n' "$script"
    fi
  } >"$dir/$kind.sh"
  chmod 0755 "$dir/$kind.sh"
}

write_config() {
  local host cpus i files
  host="$(hostname -s)"
  cpus="$(nproc)"
  [ "$cpus" -ge "$gpus" ] || cpus="$gpus"
  files="$dir/dev/nvidia0"
  [ "$gpus" -eq 1 ] || files="$dir/dev/nvidia[0-$((gpus - 1))]"
  cat >"$dir/slurm.conf" <<EOF
# Generated by tests/slurm/cluster.sh.
ClusterName=gpuledger-test
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$port
SlurmdPort=$((port + 1))
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$dir/munge/munge.socket.2,cred_expire=10
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/run/slurmctld.daemon.pid
SlurmdPidFile=$dir/run/slurmd.daemon.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SwitchType=switch/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
GresTypes=gpu
PrologFlags=Alloc
Prolog=$dir/prolog.sh
Epilog=$dir/epilog.sh
ReturnToService=2
MailProg=/bin/true
SchedulerParameters=batch_sched_delay=0,sched_interval=1
MinJobAge=300
NodeName=$node NodeAddr=127.0.0.1 CPUs=$cpus Gres=gpu:$gpus State=UNKNOWN
PartitionName=gpu Nodes=$node Default=YES MaxTime=INFINITE State=UP
EOF
  echo "NodeName=$node Name=gpu File=$files" >"$dir/gres.conf"
  # slurmd only stats the files: plain files do too, with an error line in slurmd.log
  # ("not a valid character or block device") and no other effect.
  for ((i = 0; i < gpus; i++)); do
    [ -e "$dir/dev/nvidia$i" ] && continue
    if ! mknod -m 0666 "$dir/dev/nvidia$i" c 195 "$i" 2>/dev/null; then
      echo "cluster.sh: mknod failed (no CAP_MKNOD?); $dir/dev/nvidia$i is a plain file" >&2
      : >"$dir/dev/nvidia$i" || die "cannot create $dir/dev/nvidia$i"
    fi
  done
}

start_cluster() {
  local tool
  [ "$(id -u)" -eq 0 ] || die "start must run as root (slurmd runs jobs as their users)"
  for tool in munged munge unmunge mungekey slurmctld slurmd sinfo scontrol setsid; do
    command -v "$tool" >/dev/null || die "$tool is not installed (apt-get install slurm-wlm munge)"
  done
  if ! [[ "$gpus" =~ ^[0-9]+$ ]] || [ "$gpus" -lt 1 ] || [ "$gpus" -gt 64 ]; then
    die "GPULEDGER_SLURM_GPUS must be 1..64, not '$gpus'"
  fi
  if ! [[ "$port" =~ ^[0-9]+$ ]] || [ "$port" -lt 1024 ] || [ "$port" -gt 65534 ]; then
    die "GPULEDGER_SLURM_PORT must be 1024..65534, not '$port'"
  fi
  [[ "$timeout" =~ ^[0-9]+$ ]] || die "GPULEDGER_SLURM_TIMEOUT must be whole seconds"
  for tool in "$prolog" "$epilog"; do
    [ -z "$tool" ] || [ -f "$tool" ] || die "no such prolog/epilog: $tool"
  done

  mkdir -p "$dir"/{dev,env,log,munge,run,spool,state} "$jobmap"
  chmod 0755 "$dir/munge"
  [ -s "$dir/munge/munge.key" ] || mungekey --create --keyfile="$dir/munge/munge.key" ||
    die "cannot create a munge key"
  chmod 0600 "$dir/munge/munge.key"
  write_config
  wrapper prolog "$prolog"
  wrapper epilog "$epilog"

  launch munged munged --foreground --force \
    --socket="$dir/munge/munge.socket.2" --key-file="$dir/munge/munge.key" \
    --pid-file="$dir/munge/munged.pid" --seed-file="$dir/munge/munged.seed"
  wait_for munged munge_works

  launch slurmctld slurmctld -D -i -f "$dir/slurm.conf"
  wait_for slurmctld controller_up

  launch slurmd slurmd -D -N "$node" -f "$dir/slurm.conf"
  wait_for slurmd node_idle
}

# stop_daemons NAME...: SIGTERM to each, then SIGKILL to those still there after 10 seconds.
stop_daemons() {
  local name pid i pids=()
  for name in "$@"; do
    if pid="$(pid_of "$name")"; then
      kill -TERM "$pid" 2>/dev/null || true
      pids+=("$name:$pid")
    fi
    rm -f "$dir/run/$name.pid"
  done
  for ((i = 0; i < 50; i++)); do
    for pid in "${pids[@]}"; do
      alive "${pid#*:}" && continue 2
    done
    return 0
  done
  for pid in "${pids[@]}"; do
    if alive "${pid#*:}"; then
      echo "cluster.sh: ${pid%%:*} (pid ${pid#*:}) ignored SIGTERM; killing it" >&2
      kill -KILL "${pid#*:}" 2>/dev/null || true
    fi
  done
}

# Kills what is left of this cluster's jobs: the slurmstepd processes that log to its slurmd.log
# (slurmstepd outlives slurmd by design) and everything below them.
kill_strays() {
  local p stat pid ppid victims=() found=1
  for p in /proc/[0-9]*; do
    [ "$(cat "$p/comm" 2>/dev/null)" = slurmstepd ] || continue
    alive "${p#/proc/}" || continue
    if find "$p/fd" -lname "$dir/log/slurmd.log" 2>/dev/null | grep -q .; then
      victims+=("${p#/proc/}")
    fi
  done
  [ "${#victims[@]}" -gt 0 ] || return 0
  while [ "$found" -eq 1 ]; do
    found=0
    for p in /proc/[0-9]*/stat; do
      stat="$(cat "$p" 2>/dev/null)" || continue
      pid="${stat%% *}"
      stat="${stat##*) }" # after the command name, which may hold spaces: state, ppid, ...
      ppid="${stat#* }"
      ppid="${ppid%% *}"
      [[ " ${victims[*]} " == *" $ppid "* && " ${victims[*]} " != *" $pid "* ]] || continue
      victims+=("$pid")
      found=1
    done
  done
  echo "cluster.sh: killing leftover job processes: ${victims[*]}" >&2
  kill -KILL "${victims[@]}" 2>/dev/null || true
}

# Cancels every job while the daemons still run, so no job or slurmstepd outlives the cluster.
cancel_jobs() {
  local i
  pid_of slurmctld >/dev/null || return 0
  pid_of slurmd >/dev/null || return 0
  [ -n "$(squeue -h -o %i 2>/dev/null)" ] || return 0
  scancel --partition=gpu 2>/dev/null || true
  for ((i = 0; i < 50; i++)); do
    [ -n "$(squeue -h -t running,completing -o %i 2>/dev/null)" ] || return 0
    sleep 0.2
  done
  echo "cluster.sh: jobs still running after scancel; stopping the daemons anyway" >&2
}

stop_cluster() {
  cancel_jobs
  stop_daemons slurmd slurmctld munged
  kill_strays
}

[ $# -eq 2 ] || usage
case "$2" in
/*) dir="$2" ;;
*) dir="$PWD/$2" ;;
esac
[[ "$dir" != *[[:space:]]* ]] || die "DIR must not hold whitespace: '$dir'"
gpus="${GPULEDGER_SLURM_GPUS:-2}"
port="${GPULEDGER_SLURM_PORT:-46817}"
timeout="${GPULEDGER_SLURM_TIMEOUT:-60}"
prolog="${GPULEDGER_SLURM_PROLOG-$repo/deploy/slurm/gpuledger-prolog.sh}"
epilog="${GPULEDGER_SLURM_EPILOG-$repo/deploy/slurm/gpuledger-epilog.sh}"
jobmap="${GPULEDGER_JOBMAP_DIR:-$dir/jobs}"
export SLURM_CONF="$dir/slurm.conf"

case "$1" in
start) start_cluster ;;
stop) if [ -d "$dir" ]; then stop_cluster; fi ;;
*) usage ;;
esac
