#!/usr/bin/env bash
# local_slurm.sh - bring up / tear down a throw-away single-node SLURM cluster
# (munged + slurmctld + slurmd) so the sbatch scripts in this directory can be
# tested on one machine without a site installation.
#
# Usage:
#   local_slurm.sh start DIR   # config, state, logs and pid records go in DIR
#   local_slurm.sh stop DIR    # stop only the daemons recorded in DIR
#   local_slurm.sh status DIR  # print what DIR knows about its daemons
#
# `start` prints exactly one line on stdout, `export SLURM_CONF=DIR/slurm.conf`,
# and writes the same line to DIR/env, so either of these works:
#   eval "$(jobscripts/local_slurm.sh start /tmp/slurm)"
#   jobscripts/local_slurm.sh start /tmp/slurm && . /tmp/slurm/env
# All progress and error messages go to stderr so the eval form stays clean.
#
# Tunables (environment):
#   LOCAL_SLURM_TIMEOUT     seconds to wait for the node to become idle [60]
#   LOCAL_SLURM_CTLD_PORT   slurmctld port [6817]
#   LOCAL_SLURM_SLURMD_PORT slurmd port [6818]
#   LOCAL_SLURM_CPUS        CPUs advertised for the node [from `slurmd -C`]
#   LOCAL_SLURM_MEMORY      RealMemory in MB [95% of what `slurmd -C` reports]
#
# Safety rules this script keeps (it may run next to other people's daemons):
#   * it only ever signals pids it recorded itself under DIR/pids, and only
#     after checking that the pid still belongs to the expected program;
#   * a munged that is already running (and answering) is reused and never
#     stopped; a munged that is running but NOT answering is an error, because
#     starting a second one or killing it would both be wrong.
#
# Needs root: slurmd must be able to start jobs as the submitting user and
# munged has to be started as the `munge` user. Only tested as root.
set -euo pipefail

prog=${0##*/}

log() { printf '%s: %s\n' "$prog" "$*" >&2; }
die() {
  printf '%s: ERROR: %s\n' "$prog" "$*" >&2
  exit 1
}

usage() {
  sed -n '2,/^set -euo/p' "$0" | sed -e '/^set -euo/d' -e 's/^# \{0,1\}//' >&2
  exit 2
}

# --- pid bookkeeping ---------------------------------------------------------

# pid_alive PID NAME: true if PID exists, is not a zombie and runs program NAME.
# The name check protects against pid reuse; the zombie check matters because
# daemons that double-forked are reparented to pid 1, which inside containers
# is not always a reaping init, so a dead daemon may linger as a zombie.
pid_alive() {
  local pid=$1 name=$2 comm state
  [[ $pid =~ ^[0-9]+$ ]] || return 1
  [[ -r /proc/$pid/comm ]] || return 1
  comm=$(cat "/proc/$pid/comm" 2>/dev/null) || return 1
  [[ $comm == "$name" ]] || return 1
  # Field 3 of /proc/PID/stat is the state; strip "pid (comm) " first because
  # comm may contain spaces.
  state=$(sed -e 's/^.*) //' "/proc/$pid/stat" 2>/dev/null | cut -d' ' -f1) || return 1
  [[ $state != Z && $state != X ]]
}

# recorded_pid DIR NAME: pid we recorded for NAME, or empty.
recorded_pid() {
  local f=$1/pids/$2.pid
  if [[ -s $f ]]; then
    tr -dc '0-9' <"$f"
  fi
}

# wait_for_pidfile FILE NAME TIMEOUT: wait until a daemon wrote FILE with a
# live pid of program NAME; print the pid.
wait_for_pidfile() {
  local file=$1 name=$2 timeout=$3 pid i
  for ((i = 0; i < timeout * 10; i++)); do
    if [[ -s $file ]]; then
      pid=$(tr -dc '0-9' <"$file")
      if pid_alive "$pid" "$name"; then
        printf '%s\n' "$pid"
        return 0
      fi
    fi
    sleep 0.1
  done
  return 1
}

# wait_gone PID NAME TRIES: polls every 0.1 s until the process is gone; fails if it is not.
wait_gone() {
  local pid=$1 name=$2 tries=$3 i
  for ((i = 0; i < tries; i++)); do
    pid_alive "$pid" "$name" || return 0
    sleep 0.1
  done
  ! pid_alive "$pid" "$name"
}


# stop_pid DIR NAME: SIGTERM the recorded pid of NAME, wait up to 20 s, then
# SIGKILL. Daemons are not our children, so `wait` cannot be used; poll.
stop_pid() {
  local dir=$1 name=$2 pid i
  pid=$(recorded_pid "$dir" "$name")
  if [[ -z $pid ]]; then
    return 0
  fi
  if ! pid_alive "$pid" "$name"; then
    log "$name (pid $pid) already gone"
    rm -f "$dir/pids/$name.pid"
    return 0
  fi
  log "stopping $name (pid $pid)"
  kill -TERM "$pid" 2>/dev/null || true
  if ! wait_gone "$pid" "$name" 200; then
    log "$name (pid $pid) ignored SIGTERM for 20 s, sending SIGKILL"
    kill -KILL "$pid" 2>/dev/null || true
    wait_gone "$pid" "$name" 50 || die "could not stop $name (pid $pid)"
  fi
  rm -f "$dir/pids/$name.pid"
}

show_logs() {
  local dir=$1 f
  for f in "$dir"/log/*.log "$dir"/log/*.stdio; do
    [[ -s $f ]] || continue
    printf '%s: ---- last lines of %s ----\n' "$prog" "$f" >&2
    tail -n 25 "$f" >&2 || true
  done
}

# --- munge -------------------------------------------------------------------

munge_works() {
  command -v munge >/dev/null && command -v unmunge >/dev/null || return 1
  munge -n 2>/dev/null | unmunge >/dev/null 2>&1
}

start_munge() {
  local dir=$1 pid
  pid=$(recorded_pid "$dir" munged)
  if [[ -n $pid ]] && pid_alive "$pid" munged && munge_works; then
    log "munged already started by this harness (pid $pid)"
    return 0
  fi
  if munge_works; then
    # Someone else's munged: use it, never stop it (no pid recorded).
    log "munged already running and answering; reusing it (will not stop it)"
    rm -f "$dir/pids/munged.pid"
    return 0
  fi
  if [[ -S /run/munge/munge.socket.2 ]] && [[ -s /run/munge/munged.pid ]] &&
    pid_alive "$(tr -dc '0-9' </run/munge/munged.pid)" munged; then
    die "a munged is running (pid $(cat /run/munge/munged.pid)) but 'munge -n | unmunge' fails; fix or stop it yourself"
  fi
  [[ $(id -u) -eq 0 ]] || die "munged is not running and only root can start it as user munge"
  id munge >/dev/null 2>&1 || die "user 'munge' does not exist (install the munge package)"

  # munged refuses to start unless these are owned by munge with safe modes.
  mkdir -p /run/munge /var/log/munge /var/lib/munge /etc/munge
  chown munge:munge /run/munge /var/log/munge /var/lib/munge /etc/munge
  chmod 0755 /run/munge
  chmod 0700 /var/log/munge /etc/munge
  if [[ ! -s /etc/munge/munge.key ]]; then
    log "creating /etc/munge/munge.key"
    if command -v mungekey >/dev/null; then
      runuser -u munge -- mungekey --create --keyfile=/etc/munge/munge.key
    else
      dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
    fi
  fi
  chown munge:munge /etc/munge/munge.key
  chmod 0400 /etc/munge/munge.key

  log "starting munged"
  # A stale pid file from a dead munged would make us record the wrong pid.
  rm -f /run/munge/munged.pid
  # --force: start even if a stale socket from a dead munged is left over.
  runuser -u munge -- munged --force ||
    die "munged failed to start; see /var/log/munge/munged.log"
  pid=$(wait_for_pidfile /run/munge/munged.pid munged 10) ||
    die "munged did not write /run/munge/munged.pid within 10 s"
  printf '%s\n' "$pid" >"$dir/pids/munged.pid"
  local i
  for ((i = 0; i < 50; i++)); do
    munge_works && break
    sleep 0.1
  done
  munge_works || die "munged (pid $pid) started but 'munge -n | unmunge' fails"
  log "munged up (pid $pid)"
}

# --- slurm -------------------------------------------------------------------

write_conf() {
  local dir=$1 host=$2 cpus mem nodeline topo
  # Describe the node the way slurmd itself sees it, otherwise slurmctld drains
  # it for a config mismatch (e.g. "Low RealMemory"). Memory is advertised at
  # 95% so small fluctuations in reported memory cannot drain the node.
  nodeline=$(slurmd -C 2>/dev/null | head -n 1) || nodeline=""
  cpus=${LOCAL_SLURM_CPUS:-}
  mem=${LOCAL_SLURM_MEMORY:-}
  if [[ -n $cpus ]]; then
    topo="CPUs=$cpus"
  else
    # Full topology (CPUs Boards SocketsPerBoard CoresPerSocket ThreadsPerCore)
    # so CR_Core counts real cores; fall back to a bare CPU count.
    topo=$(grep -o 'CPUs=.*ThreadsPerCore=[0-9]*' <<<"$nodeline" || true)
    [[ -n $topo ]] || topo="CPUs=$(nproc)"
  fi
  if [[ -z $mem ]]; then
    mem=$(sed -n 's/.*RealMemory=\([0-9]*\).*/\1/p' <<<"$nodeline")
    [[ -n $mem ]] || mem=$(awk '/^MemTotal:/ {print int($2 / 1024)}' /proc/meminfo)
    mem=$((mem * 95 / 100))
  fi

  cat >"$dir/slurm.conf" <<EOF
# Generated by $prog for a throw-away single-node cluster; do not edit, it is
# rewritten on every start.
ClusterName=caviar-local
SlurmctldHost=$host(127.0.0.1)
SlurmUser=$(id -un)
SlurmdUser=$(id -un)
SlurmctldPort=${LOCAL_SLURM_CTLD_PORT:-6817}
SlurmdPort=${LOCAL_SLURM_SLURMD_PORT:-6818}
AuthType=auth/munge
CredType=cred/munge

StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/run/slurmctld.pid
SlurmdPidFile=$dir/run/slurmd.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info

# No cgroups: containers and CI machines often lack a usable cgroup hierarchy.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SwitchType=switch/none

SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
# A node that was DOWN (e.g. from a previous run in the same DIR) returns to
# service as soon as it registers with a valid configuration.
ReturnToService=2
SlurmdTimeout=300
InactiveLimit=0
KillWait=10
# Keep finished jobs visible to scontrol for 5 min so callers can read ExitCode.
MinJobAge=300

NodeName=$host NodeAddr=127.0.0.1 $topo RealMemory=$mem State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES OverSubscribe=YES MaxTime=INFINITE State=UP
EOF
}

node_state() {
  SLURM_CONF=$1/slurm.conf sinfo -h -N -n "$2" -o '%T' 2>/dev/null | head -n 1 || true
}

start_slurm_daemon() {
  local dir=$1 name=$2 pid
  pid=$(recorded_pid "$dir" "$name")
  if [[ -n $pid ]] && pid_alive "$pid" "$name"; then
    log "$name already started by this harness (pid $pid)"
    return 0
  fi
  rm -f "$dir/run/$name.pid"
  log "starting $name"
  # Daemon mode; the daemons write their pid files into DIR/run. Logs go to
  # DIR/log, stdio is detached so callers (ctest) do not wait on our fds.
  if ! SLURM_CONF=$dir/slurm.conf "$name" </dev/null >>"$dir/log/$name.stdio" 2>&1; then
    show_logs "$dir"
    die "$name failed to start (see $dir/log)"
  fi
  if ! pid=$(wait_for_pidfile "$dir/run/$name.pid" "$name" 15); then
    show_logs "$dir"
    die "$name did not come up within 15 s (is port ${LOCAL_SLURM_CTLD_PORT:-6817}/${LOCAL_SLURM_SLURMD_PORT:-6818} already used by another SLURM?)"
  fi
  printf '%s\n' "$pid" >"$dir/pids/$name.pid"
  log "$name up (pid $pid)"
}

cmd_start() {
  local dir=$1 host timeout state i
  for c in munged slurmctld slurmd sinfo scontrol; do
    command -v "$c" >/dev/null || die "'$c' not found; install slurm-wlm and munge (CAVIAR_WITH_SLURM=1 scripts/install_deps.sh)"
  done
  mkdir -p "$dir"
  dir=$(cd "$dir" && pwd -P)
  mkdir -p "$dir"/{pids,run,log,state,spool}
  # slurmd uses the short hostname to find its NodeName line.
  host=$(hostname -s)
  timeout=${LOCAL_SLURM_TIMEOUT:-60}

  start_munge "$dir"
  # Rewrite the config only when slurmctld is not already running from it.
  local ctld_pid
  ctld_pid=$(recorded_pid "$dir" slurmctld)
  if [[ -z $ctld_pid ]] || ! pid_alive "$ctld_pid" slurmctld; then
    write_conf "$dir" "$host"
  fi
  start_slurm_daemon "$dir" slurmctld
  start_slurm_daemon "$dir" slurmd

  log "waiting up to ${timeout}s for node $host to become idle"
  state=""
  for ((i = 0; i < timeout * 2; i++)); do
    state=$(node_state "$dir" "$host")
    case $state in
      idle | mixed | allocated) break ;;
      # Config mismatch: slurmctld will not change its mind, fail now.
      inval* | drain*) break ;;
    esac
    # If a daemon died there is no point in waiting for the timeout.
    pid_alive "$(recorded_pid "$dir" slurmctld)" slurmctld || break
    pid_alive "$(recorded_pid "$dir" slurmd)" slurmd || break
    sleep 0.5
  done
  case $state in
    idle | mixed | allocated) ;;
    *)
      log "node state is '${state:-<no answer from slurmctld>}'"
      SLURM_CONF=$dir/slurm.conf sinfo -R >&2 2>/dev/null || true
      show_logs "$dir"
      die "node $host is not idle (state '${state:-?}', waited up to ${timeout}s; daemons left running; run '$prog stop $dir')"
      ;;
  esac
  printf 'export SLURM_CONF=%s/slurm.conf\n' "$dir" >"$dir/env"
  log "cluster up: node $host is $state; config $dir/slurm.conf"
  cat "$dir/env"
}

cmd_stop() {
  local dir=$1
  [[ -d $dir ]] || die "no such directory: $dir"
  dir=$(cd "$dir" && pwd -P)
  # Cancel our cluster's jobs first, so no slurmstepd outlives slurmd.
  if [[ -f $dir/slurm.conf ]] && pid_alive "$(recorded_pid "$dir" slurmctld)" slurmctld; then
    local i
    SLURM_CONF=$dir/slurm.conf scancel --full --partition=debug >/dev/null 2>&1 || true
    for ((i = 0; i < 40; i++)); do
      [[ -z $(SLURM_CONF=$dir/slurm.conf squeue -h -o %i 2>/dev/null) ]] && break
      sleep 0.5
    done
  fi
  # Reverse start order: slurmd first so it can tell slurmctld it is leaving.
  stop_pid "$dir" slurmd
  stop_pid "$dir" slurmctld
  stop_pid "$dir" munged
  rm -f "$dir/env"
  log "stopped everything recorded in $dir/pids"
}

cmd_status() {
  local dir=$1 name pid
  for name in munged slurmctld slurmd; do
    pid=$(recorded_pid "$dir" "$name")
    if [[ -z $pid ]]; then
      echo "$name: not started by this harness"
    elif pid_alive "$pid" "$name"; then
      echo "$name: running (pid $pid)"
    else
      echo "$name: recorded pid $pid is gone"
    fi
  done
  if [[ -f $dir/slurm.conf ]]; then
    SLURM_CONF=$dir/slurm.conf sinfo 2>&1 || true
  fi
}

[[ $# -eq 2 ]] || usage
case $1 in
  start) cmd_start "$2" ;;
  stop) cmd_stop "$2" ;;
  status) cmd_status "$2" ;;
  *) usage ;;
esac
