#!/usr/bin/env bash
# test_two_hosts.sh - caviar on two "hosts" of one machine: two network namespaces joined by a
# veth pair, mpirun on the first, its daemon on the second started through a remote-shell agent
# (netns_rsh.sh, in place of ssh), and every message between ranks over Open MPI's TCP transport.
# The fits must give the bits of the same fits at 4 ranks on one host (shared memory), and a fit
# stopped on two hosts must resume on one host to the uninterrupted fit's bits.
# See jobscripts/README.md, "Two hosts on one machine".
#
# Usage: test_two_hosts.sh CAVIAR_BIN WORKDIR
#
# Exit codes: 0 pass; anything else fails, including missing privileges or tools (no skip: the
# test needs root, iproute2 and util-linux, all of which CI has).
#
# What it runs (2 ranks per host on two hosts, "2h", against 4 ranks on one host, "1h"):
#   1. placement: every rank prints its host name and network namespace; ranks 0-1 must be on
#      the first host, 2-3 on the second, and mpirun must have started exactly one remote daemon;
#   2. a GMM fit (CAVI, with --labels: a file written in parallel from both hosts), an LDA fit
#      (CAVI) and a VAE training (Gaussian likelihood): every dataset and attribute of each output
#      bitwise equal between 2h and 1h, timings and the command line excepted (the output paths
#      differ, so the files are not byte for byte the same), and the same JSON summary;
#   3. a longer GMM fit with --checkpoint on two hosts, stopped by SIGUSR1 to mpirun (Open MPI
#      forwards it to the ranks; caviar's ranks agree on the stop in one allreduce, so all of them
#      stop at the same boundary): mpirun must exit with the ranks' 75, with "stopped by SIGUSR1",
#      a checkpoint and no model; --resume at 4 ranks on one host must then give an uninterrupted
#      1h fit's bits;
#   4. an LDA fit (online VB) on two hosts with a checkpoint every 10 steps; its last checkpoint,
#      resumed at 1 rank, must give the two-host model's bits (LDA resumes at any rank count).
#
# The two-host runs use `--mca pml ob1 --mca btl tcp,self`: the only transport between two
# processes is TCP, here over the veth pair (the ranks of one host talk over TCP too). The hosts
# differ in network namespace, host name, SysV IPC, /tmp and /dev/shm (netns_rsh.sh), not in
# filesystem: every file is seen by both, so host-local file assumptions are not tested.
set -euo pipefail

prog=${0##*/}
fail() {
  printf '%s: FAIL: %s\n' "$prog" "$*" >&2
  exit 1
}
log() { printf '%s: %s\n' "$prog" "$*" >&2; }

[[ $# -eq 2 ]] || {
  echo "usage: $prog CAVIAR_BIN WORKDIR" >&2
  exit 2
}
here=$(cd "$(dirname -- "${BASH_SOURCE[0]}")" && pwd -P)
repo=$(cd "$here/../.." && pwd -P)
agent=$here/netns_rsh.sh
python=${PYTHON:-/usr/bin/python3}
t_start=$SECONDS

# --- preconditions: all failures, never skips -------------------------------------------------
[[ $(id -u) -eq 0 ]] || fail "needs root (network namespaces need CAP_SYS_ADMIN, the veth pair CAP_NET_ADMIN)"
for c in ip unshare mount hostname timeout mpirun; do
  command -v "$c" >/dev/null || fail "'$c' not found (scripts/install_deps.sh installs iproute2)"
done
[[ -x $agent ]] || fail "agent $agent not found or not executable"
"$python" -c 'import h5py, numpy' 2>/dev/null || fail "$python with h5py and numpy not available"
[[ -x $1 ]] || fail "caviar binary '$1' not found or not executable"
caviar=$(cd "$(dirname -- "$1")" && pwd -P)/$(basename -- "$1")
mkdir -p "$2"
work=$(cd "$2" && pwd -P)
# Each host gets a private /tmp, so files the hosts share must live elsewhere.
case $work/ in
  /tmp/*) fail "WORKDIR must not be under /tmp (each host has its own /tmp): $work" ;;
esac
rm -rf "${work:?}"/*

# --- the two hosts ------------------------------------------------------------------------------
# Names unique to this run (the pid), so that concurrent runs do not collide; the addresses can
# be the same in every run, since they only exist inside this run's namespaces. Interface names
# have at most 15 characters.
tag=cv2h$$
ns_a=${tag}a ns_b=${tag}b
veth_a=${tag}a veth_b=${tag}b
addr_a=10.231.0.1 addr_b=10.231.0.2 subnet=10.231.0.0/24
host_a=caviar-host-a host_b=caviar-host-b
made_ns=()

cleanup() {
  local rc=$? ns pids
  trap - EXIT INT TERM
  for ns in "${made_ns[@]}"; do
    # Processes left in our namespaces (a failed run's mpirun, orted or ranks) are ours.
    read -ra pids <<<"$(ip netns pids "$ns" 2>/dev/null | tr '\n' ' ')"
    ((${#pids[@]} == 0)) || kill -KILL "${pids[@]}" 2>/dev/null || true
  done
  ip link del "$veth_a" 2>/dev/null || true  # only if setup stopped before moving it
  for ns in "${made_ns[@]}"; do
    ip netns del "$ns" 2>/dev/null || { log "WARNING: could not delete namespace $ns"; rc=1; }
  done
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

try() {  # try WHAT COMMAND...: runs it; on failure, one line with WHAT and the command's error
  local out
  out=$("${@:2}" 2>&1) || fail "$1 failed: ${out//$'\n'/ }"
}
try "ip netns add $ns_a (needs CAP_SYS_ADMIN)" ip netns add "$ns_a"
made_ns+=("$ns_a")
try "ip netns add $ns_b" ip netns add "$ns_b"
made_ns+=("$ns_b")
try "ip link add (a veth pair; needs CAP_NET_ADMIN)" ip link add "$veth_a" type veth peer name "$veth_b"
try "moving the veth ends into the namespaces" ip link set "$veth_a" netns "$ns_a"
try "moving the veth ends into the namespaces" ip link set "$veth_b" netns "$ns_b"
try "address of $ns_a" ip -n "$ns_a" addr add "$addr_a/24" dev "$veth_a"
try "address of $ns_b" ip -n "$ns_b" addr add "$addr_b/24" dev "$veth_b"
for ns in "$ns_a" "$ns_b"; do
  try "bringing up lo in $ns" ip -n "$ns" link set lo up
done
try "bringing up $veth_a" ip -n "$ns_a" link set "$veth_a" up
try "bringing up $veth_b" ip -n "$ns_b" link set "$veth_b" up
log "hosts: $host_a = $addr_a (namespace $ns_a), $host_b = $addr_b (namespace $ns_b)"

export CAVIAR_NETNS_HOSTS="$addr_a=$ns_a=$host_a $addr_b=$ns_b=$host_b"
export CAVIAR_NETNS_LOG=$work/agent.log
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
printf '%s slots=2\n%s slots=2\n' "$addr_a" "$addr_b" >"$work/hostfile"

# mpirun on host A; ranks 0-1 there, 2-3 on host B (by slot). ob1 + tcp,self: no shared memory
# and no other fabric; the daemons (oob) and the ranks (btl) use the veth subnet only. The two
# hosts share this machine's 2 cores, which Open MPI cannot see from the hostfile: without
# yield_when_idle its 4 busy-polling ranks made every iteration 2x slower.
# shellcheck disable=SC2054 # tcp,self is one argument
mpirun_2h=(mpirun -n 4 --hostfile "$work/hostfile" --map-by slot
  --mca plm_rsh_agent "$agent" --mca pml ob1 --mca btl tcp,self
  --mca btl_tcp_if_include "$subnet" --mca oob_tcp_if_include "$subnet" -x OMP_NUM_THREADS
  --mca mpi_yield_when_idle 1)
# Every run is bounded: a launch that hangs fails with exit 124 well inside ctest's timeout,
# which would kill this script before its trap could delete the namespaces.
run_limit=120
on_two_hosts() { timeout -k 10 "$run_limit" "$agent" --argv "$addr_a" "${mpirun_2h[@]}" "$@"; }
# The reference: 4 ranks on this machine's own host, Open MPI's default (shared-memory) transport.
on_one_host() { timeout -k 10 "$run_limit" mpirun -n 4 --oversubscribe "$@"; }
on_one_rank() { timeout -k 10 "$run_limit" "$@"; }

veth_bytes() {  # bytes that crossed the veth pair so far (what B sent plus what it received)
  local rx tx
  rx=$(ip netns exec "$ns_b" cat "/sys/class/net/$veth_b/statistics/rx_bytes")
  tx=$(ip netns exec "$ns_b" cat "/sys/class/net/$veth_b/statistics/tx_bytes")
  echo $((rx + tx))
}

# --- 1. placement ------------------------------------------------------------------------------
netns_id() { ip netns exec "$1" readlink /proc/self/ns/net; }
id_a=$(netns_id "$ns_a") id_b=$(netns_id "$ns_b")
: >"$CAVIAR_NETNS_LOG"
# shellcheck disable=SC2016 # expanded by each rank's shell
placement=$(on_two_hosts sh -c 'echo "$OMPI_COMM_WORLD_RANK $(hostname) $(readlink /proc/self/ns/net)"' 2>&1) || {
  printf '%s\n' "$placement" >&2
  fail "mpirun across the two hosts failed (its output above)"
}
want=$(printf '0 %s %s\n1 %s %s\n2 %s %s\n3 %s %s' "$host_a" "$id_a" "$host_a" "$id_a" \
  "$host_b" "$id_b" "$host_b" "$id_b")
[[ $(sort <<<"$placement") == "$want" ]] ||
  fail "ranks not placed 2 + 2 on the two hosts; got: ${placement//$'\n'/ | }"
daemons=$(cat "$CAVIAR_NETNS_LOG")
[[ $daemons == "$addr_b $ns_b" ]] ||
  fail "want one remote daemon, on $addr_b; the agent was called for: ${daemons:-nothing}"
log "placement ok: ranks 0-1 on $host_a, 2-3 on $host_b, one remote daemon"

# --- comparisons ---------------------------------------------------------------------------------
# Every dataset and attribute bitwise (tests/cli/clitest.py: timings, command line, rank and
# thread counts excepted), and the JSON summaries without timings. Prints one line either way.
same_results() {  # same_results WHAT REF.h5 OTHER.h5 [REF.json OTHER.json]
  PYTHONPATH=$repo/tests/cli "$python" - "$@" <<'PYEOF'
import sys
from clitest import h5_contents, h5_differences, json_summary
what, ref, other = sys.argv[1:4]
diffs = h5_differences(ref, other)
if len(sys.argv) > 5:
    a, b = (json_summary(open(p).read()) for p in sys.argv[4:6])
    diffs += ["JSON %s: %s vs %s" % (k, a.get(k), b.get(k))
              for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]
if diffs:
    sys.exit("%s: %s differs from %s in %d entries: %s"
             % (what, other, ref, len(diffs), ", ".join(diffs[:8])))
print("%s: %d datasets and attributes bitwise identical" % (what, len(h5_contents(ref))))
PYEOF
}

run_logged() {  # run_logged NAME LAUNCHER ARGS...: stdout to NAME.json, stderr to NAME.err
  local name=$1
  shift
  local rc=0
  "$@" >"$work/$name.json" 2>"$work/$name.err" || rc=$?
  if ((rc != 0)); then
    tail -n 20 "$work/$name.err" >&2
    ((rc != 124)) || fail "$name: '$*' did not finish within $run_limit s"
    fail "$name: '$*' exited with $rc"
  fi
}

# --- 2. GMM, LDA and VAE: two hosts against one ------------------------------------------------
"$caviar" -q generate gmm --n 20000 --dim 4 --components 4 --seed 1 --out "$work/gmm.h5:/X" >/dev/null ||
  fail "caviar generate gmm failed"
"$caviar" -q generate lda --docs 600 --words 300 --topics 5 --seed 2 --out "$work/corpus.h5" >/dev/null ||
  fail "caviar generate lda failed"
"$caviar" -q generate gmm --n 3000 --dim 8 --components 3 --seed 3 --out "$work/vae.h5:/X" >/dev/null ||
  fail "caviar generate gmm (VAE data) failed"

fit() {  # fit MODEL TAG LAUNCHER: one of the three runs, outputs tagged TAG
  local model=$1 tag=$2 launcher=$3 args
  case $model in
    gmm) args=(gmm fit --data "$work/gmm.h5:/X" -k 4 --seed 3 --tol 0 --max-iter 30
      --out "$work/gmm_$tag.h5" --labels "$work/labels_$tag.h5") ;;
    lda) args=(lda fit --data "$work/corpus.h5" --topics 5 --algorithm cavi --max-iter 10 --seed 4
      --out "$work/lda_$tag.h5") ;;
    vae) args=(vae train --data "$work/vae.h5:/X" --likelihood gaussian --hidden 16 --latent 2
      --batch-size 500 --max-iter 3 --seed 5 --out "$work/vae_$tag.h5") ;;
  esac
  run_logged "${model}_$tag" "$launcher" "$caviar" -q "${args[@]}"
}
for model in gmm lda vae; do
  before=$(veth_bytes)
  fit "$model" 2h on_two_hosts
  bytes=$(($(veth_bytes) - before))
  fit "$model" 1h on_one_host
  report=$(same_results "$model" "$work/${model}_1h.h5" "$work/${model}_2h.h5" \
    "$work/${model}_1h.json" "$work/${model}_2h.json" 2>&1) || fail "$report"
  log "$report ($bytes bytes over the veth pair)"
done
report=$(same_results "gmm labels" "$work/labels_1h.h5" "$work/labels_2h.h5" 2>&1) || fail "$report"
log "$report"

# --- 3. checkpoint on two hosts, resume on one ---------------------------------------------------
# 400 iterations of 100000 2-D points; the signal comes after 20 progress lines. An iteration
# takes 6-9 ms at 4 ranks on a quiet machine here (more when loaded), so the 380 iterations left
# give the signal seconds to reach every rank before the fit would end on its own.
"$caviar" -q generate gmm --n 100000 --dim 2 --components 4 --seed 1 --out "$work/ck_data.h5:/X" >/dev/null ||
  fail "caviar generate gmm (checkpoint data) failed"
ck_fit=("$caviar" gmm fit --data "$work/ck_data.h5:/X" -k 4 --seed 5 --tol 0 --max-iter 400)
run_logged ck_ref on_one_host "${ck_fit[@]}" --out "$work/ck_ref.h5"

# Not through on_two_hosts: a function in the background is a subshell, and $! would be that
# shell (which dies of SIGUSR1), not mpirun. Started directly, the agent execs its way to mpirun.
"$agent" --argv "$addr_a" "${mpirun_2h[@]}" "${ck_fit[@]}" --out "$work/ck_2h.h5" \
  --checkpoint "$work/ck.h5" >"$work/ck_2h.json" 2>"$work/ck_2h.err" &
mpirun_pid=$!
deadline=$((SECONDS + 60))
iterations() {  # progress lines so far in $1 (0 before the file exists)
  local n
  n=$(grep -c '^iter ' "$1" 2>/dev/null) || true
  echo "${n:-0}"
}
until (($(iterations "$work/ck_2h.err") >= 20)); do
  kill -0 "$mpirun_pid" 2>/dev/null || {
    tail -n 20 "$work/ck_2h.err" >&2
    fail "the two-host fit ended before it could be stopped; make it longer"
  }
  ((SECONDS < deadline)) || fail "no progress from the two-host fit within 60 s"
  sleep 0.05
done
# SIGUSR1 to mpirun: it forwards the signal to its local ranks and, through the daemon, to host
# B's (the ranks' agreement makes any one of them enough for all to stop).
comm=$(cat "/proc/$mpirun_pid/comm" 2>/dev/null || true)
[[ $comm == mpirun ]] || fail "pid $mpirun_pid is '$comm', not mpirun"
kill -USR1 "$mpirun_pid"
deadline=$((SECONDS + run_limit))
while kill -0 "$mpirun_pid" 2>/dev/null; do
  ((SECONDS < deadline)) || fail "the two-host fit did not stop within $run_limit s of SIGUSR1"
  sleep 0.1
done
rc=0
wait "$mpirun_pid" || rc=$?
[[ $rc -eq 75 ]] || {
  tail -n 20 "$work/ck_2h.err" >&2
  fail "the stopped two-host fit exited with $rc, want 75 (stopped at a boundary, checkpoint written)"
}
[[ -f $work/ck.h5 && ! -e $work/ck_2h.h5 ]] ||
  fail "after the stop: want a checkpoint and no model (checkpoint: $([[ -f $work/ck.h5 ]] && echo yes || echo no))"
grep -q 'stopped by SIGUSR1' "$work/ck_2h.err" || fail "no 'stopped by SIGUSR1' line from the two-host fit"
stopped=$(iterations "$work/ck_2h.err")
run_logged ck_resumed on_one_host "${ck_fit[@]}" --out "$work/ck_resumed.h5" --resume "$work/ck.h5"
report=$(same_results "gmm stopped on two hosts after ~$stopped iterations, resumed on one" \
  "$work/ck_ref.h5" "$work/ck_resumed.h5" "$work/ck_ref.json" "$work/ck_resumed.json" 2>&1) ||
  fail "$report"
log "$report"

# --- 4. LDA: periodic checkpoints on two hosts, resume at 1 rank --------------------------------
# LDA promises the uninterrupted bytes on a resume at any rank count. Online VB over the 600
# documents in minibatches of 100: 6 steps a pass, 6 passes; with a checkpoint every 4 passes
# (--checkpoint-every counts SVI passes) the last one is taken after pass 4, and 1 rank on one
# host does the last 2 passes from it.
lda_svi=("$caviar" lda fit --data "$work/corpus.h5" --topics 5 --algorithm svi --batch-size 100
  --max-iter 6 --seed 4)
run_logged lda_ck_2h on_two_hosts "${lda_svi[@]}" --out "$work/lda_ck_2h.h5" \
  --checkpoint "$work/lda_ck.h5" --checkpoint-every 4
pass=$("$python" -c 'import h5py, sys; print(int(h5py.File(sys.argv[1], "r").attrs["iteration"]))' \
  "$work/lda_ck.h5") || fail "cannot read the pass of $work/lda_ck.h5"
[[ $pass == 4 ]] || fail "the last LDA checkpoint is after pass $pass, want 4"
run_logged lda_ck_1r on_one_rank "${lda_svi[@]}" --out "$work/lda_ck_1r.h5" --resume "$work/lda_ck.h5"
report=$(same_results "lda checkpointed on two hosts after pass 4, resumed at 1 rank" \
  "$work/lda_ck_2h.h5" "$work/lda_ck_1r.h5" "$work/lda_ck_2h.json" "$work/lda_ck_1r.json" 2>&1) ||
  fail "$report"
log "$report"
log "PASS ($((SECONDS - t_start)) s)"
