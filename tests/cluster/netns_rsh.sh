#!/usr/bin/env bash
# netns_rsh.sh - Open MPI's remote-shell agent for the two-host test (test_two_hosts.sh), used as
# `mpirun --mca plm_rsh_agent netns_rsh.sh`. mpirun calls it as `netns_rsh.sh HOST COMMAND...`,
# exactly as it would call ssh, to start its daemon (orted) on HOST; here a "host" is a network
# namespace of this machine.
#
# CAVIAR_NETNS_HOSTS lists the hosts as space-separated ADDRESS=NAMESPACE=HOSTNAME entries. The
# command runs in NAMESPACE, in new UTS, IPC and mount namespaces:
#  - HOSTNAME as the host name. Open MPI itself tells the hosts apart by the hostfile's addresses
#    (the test also passed with the machine's one name for both), but anything that goes by
#    gethostname(), a rank's log line or MPI_Get_processor_name, would see one host;
#  - its own System V IPC, and empty tmpfs mounts on /tmp and /dev/shm: a host's Open MPI session
#    directory and shared-memory files are its own, as on real machines, so no shared-memory
#    segment can be mapped by processes of both hosts. Everything else, the test's files
#    included, is still the one shared filesystem.
#
# `netns_rsh.sh --argv HOST PROGRAM ARGS...` enters the host the same way but runs PROGRAM with
# its arguments as given, not through a shell (the test starts mpirun on the first host with it).
# Every remote-shell call (not --argv) appends "ADDRESS NAMESPACE" to $CAVIAR_NETNS_LOG if set,
# so the test can count the daemons mpirun started.
set -euo pipefail
prog=${0##*/}
as_argv=0
if [[ ${1:-} == --argv ]]; then
  as_argv=1
  shift
fi
[[ $# -ge 2 ]] || { echo "$prog: usage: $prog [--argv] HOST COMMAND..." >&2; exit 255; }
host=$1
shift
ns="" name=""
for entry in ${CAVIAR_NETNS_HOSTS:-}; do
  IFS='=' read -r addr e_ns e_name <<<"$entry"
  if [[ $addr == "$host" ]]; then
    ns=$e_ns name=$e_name
  fi
done
# 255 is what ssh returns when it cannot reach the host; mpirun reports the launch as failed.
[[ -n $ns ]] || { echo "$prog: host '$host' is not in CAVIAR_NETNS_HOSTS='${CAVIAR_NETNS_HOSTS:-}'" >&2; exit 255; }
# shellcheck disable=SC2016 # expanded by the inner shell
enter='hostname "$1" && mount -t tmpfs -o mode=1777 tmpfs /tmp &&
  mount -t tmpfs -o mode=1777 tmpfs /dev/shm && shift && exec "$@"'
if ((as_argv)); then
  exec ip netns exec "$ns" unshare --uts --ipc --mount --propagation private -- \
    sh -c "$enter" netns_rsh "$name" "$@"
fi
[[ -z ${CAVIAR_NETNS_LOG:-} ]] || echo "$host $ns" >>"$CAVIAR_NETNS_LOG"
# Like ssh, pass the command as one string to a shell: mpirun quotes its arguments for that.
exec ip netns exec "$ns" unshare --uts --ipc --mount --propagation private -- \
  sh -c "$enter" netns_rsh "$name" sh -c "$*"
