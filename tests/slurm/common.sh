# common.sh - sourced by the SLURM test scripts (tests/slurm/test_*.sh) with their arguments:
# the skip/fail conventions (exit 77 = skipped), the argument check, and the preconditions shared
# by every test that starts a throw-away SLURM with jobscripts/local_slurm.sh. Defines prog,
# caviar_bin and workdir (absolute), repo, local_slurm and python.
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
