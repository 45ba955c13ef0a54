# common.sh - sourced by the SLURM test scripts (tests/slurm/test_*.sh) with their arguments:
# the skip/fail conventions (exit 77 = skipped), the argument check, and the preconditions shared
# by every test that starts a throw-away SLURM with jobscripts/local_slurm.sh. Defines prog,
# caviar_bin and workdir (absolute), repo, local_slurm and python, and start_local_slurm.
prog=${0##*/}
SKIP=77

fail() {
  printf '%s: FAIL: %s\n' "$prog" "$*" >&2
  exit 1
}
skip() {
  printf '%s: SKIP: %s\n' "$prog" "$*" >&2
  exit "$SKIP"
}
log() { printf '%s: %s\n' "$prog" "$*" >&2; }

[[ $# -eq 2 ]] || {
  echo "usage: $prog CAVIAR_BIN WORKDIR" >&2
  exit 2
}
caviar_bin=$1
workdir=$2

# Resolve the repository from this file, not from the caller's cwd, so ctest
# can run it from the build tree.
here=$(cd "$(dirname -- "${BASH_SOURCE[0]}")" && pwd -P)  # this directory
repo=$(cd "$here/../.." && pwd -P)
local_slurm=$repo/jobscripts/local_slurm.sh
python=${PYTHON:-/usr/bin/python3}

# --- skip conditions: missing tools are not caviar bugs ----------------------
for c in sbatch squeue scontrol scancel sinfo slurmctld slurmd munged munge unmunge mpirun; do
  command -v "$c" >/dev/null || skip "'$c' not installed (CAVIAR_WITH_SLURM=1 scripts/install_deps.sh)"
done
# slurmd has to run jobs as the submitting user and munged as user munge.
[[ $(id -u) -eq 0 ]] || skip "needs root to run slurmd/munged locally"
if ! { [[ -x $python ]] && "$python" -c 'import h5py, numpy' 2>/dev/null; }; then
  skip "$python with h5py and numpy not available (apt-get install python3-h5py)"
fi

# --- real preconditions: these are failures ----------------------------------
[[ -x $caviar_bin ]] || fail "caviar binary '$caviar_bin' not found or not executable"
caviar_bin=$(cd "$(dirname -- "$caviar_bin")" && pwd -P)/$(basename -- "$caviar_bin")

mkdir -p "$workdir"
workdir=$(cd "$workdir" && pwd -P)

# Starts a throw-away SLURM in directory $1 (jobscripts/local_slurm.sh) and makes sure it is
# stopped again, with the job in $job_id cancelled, however the test exits.
job_id=""
start_local_slurm() {
  slurm_dir=$1
  trap stop_local_slurm EXIT
  # INT/TERM: exit, which runs the EXIT trap exactly once.
  trap 'exit 130' INT
  trap 'exit 143' TERM
  log "starting local SLURM in $slurm_dir"
  "$local_slurm" start "$slurm_dir" >/dev/null || fail "could not start local SLURM (see messages above)"
  # shellcheck source=/dev/null
  . "$slurm_dir/env"
  export SLURM_CONF
}

stop_local_slurm() {
  local rc=$?
  if [[ -n $job_id && -n ${SLURM_CONF:-} ]]; then
    scancel "$job_id" >/dev/null 2>&1 || true
  fi
  "$local_slurm" stop "$slurm_dir" || {
    log "WARNING: local_slurm.sh stop failed"
    [[ $rc -ne 0 ]] || rc=1
  }
  exit "$rc"
}

# same_model_bits REF MODEL: every dataset and attribute of two model files is the same bits,
# timings and the command line excepted (a resumed fit against an uninterrupted one). Prints how
# many entries matched; on a difference, names the entries and returns non-zero.
same_model_bits() {
  "$python" - "$1" "$2" <<'PYEOF'
import sys
import h5py
import numpy as np

def items(path):
    out = {}
    with h5py.File(path, "r") as f:
        def visit(name, obj):
            if isinstance(obj, h5py.Dataset):
                out["D:" + name] = (str(obj.dtype), obj.shape, np.asarray(obj[()]).tobytes())
        f.visititems(visit)
        for a, v in f.attrs.items():
            out["A:" + a] = repr(v)
    return out

a, b = items(sys.argv[1]), items(sys.argv[2])
skip = lambda k: "seconds" in k or k == "A:command"
diff = [k for k in sorted(set(a) | set(b)) if not skip(k) and a.get(k) != b.get(k)]
if diff:
    sys.exit("%s differs from the uninterrupted run in: %s" % (sys.argv[2], diff))
print("%d datasets and attributes identical" % len([k for k in a if not skip(k)]))
PYEOF
}
