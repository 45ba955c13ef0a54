#!/usr/bin/env bash
# test_sbatch_fit.sh - end-to-end test of jobscripts/fit.sbatch on a throw-away
# single-node SLURM cluster started by jobscripts/local_slurm.sh.
#
# Usage: test_sbatch_fit.sh CAVIAR_BIN WORKDIR
#
# Exit codes: 0 pass, 77 skipped (SLURM/munge/h5py/root not available; ctest
# maps this to SKIP via the SKIP_RETURN_CODE property), anything else fails.
#
# Steps: start SLURM in WORKDIR/slurm (a trap always stops it again), generate
# 2000 points in 2-D from 3 components, sbatch fit.sbatch with 2 tasks, wait
# for the job (timeout TEST_JOB_TIMEOUT, default 180 s), then check the job
# exit code, the model file (weights sum to 1, means are 3x2) and that the job
# output holds caviar's final JSON line with "ranks": 2.
set -euo pipefail

# shellcheck source=common.sh
. "$(dirname -- "${BASH_SOURCE[0]}")/common.sh" "$@"
fit_sbatch=$repo/jobscripts/fit.sbatch
job_timeout=${TEST_JOB_TIMEOUT:-180}
[[ -f $fit_sbatch ]] || fail "jobscripts not found under $repo/jobscripts"
slurm_dir=$workdir/slurm
data=$workdir/d.h5
model=$workdir/model.h5
# Start from a clean slate so stale outputs cannot make the test pass.
rm -f "$data" "$model" "$workdir"/fit-*.out

# --- cluster up (and ALWAYS down again) --------------------------------------
start_local_slurm "$slurm_dir"

# --- data ----------------------------------------------------------------------
log "generating $data"
"$caviar_bin" generate gmm --n 2000 --dim 2 --components 3 --seed 1 --out "$data:/X" ||
  fail "caviar generate gmm failed"
[[ -f $data ]] || fail "caviar generate gmm did not create $data"

# --- submit and wait -----------------------------------------------------------
# Poll scontrol rather than sbatch --wait: --wait has no timeout and backs off
# to long polling intervals.
job_id=$(sbatch --parsable --chdir="$workdir" --output="$workdir/fit-%j.out" \
  --export="ALL,CAVIAR_BIN=$caviar_bin,DATA=$data:/X,K=3,OUT=$model" \
  "$fit_sbatch") || fail "sbatch failed"
job_id=${job_id%%;*}
job_out=$workdir/fit-$job_id.out
log "submitted job $job_id, waiting up to ${job_timeout}s"

show_output() {
  log "---- job $job_id output ($job_out) ----"
  cat "$job_out" >&2 2>/dev/null || log "(no output file)"
  log "---- end of job output ----"
}

state="" exit_code=""
deadline=$((SECONDS + job_timeout))
while :; do
  info=$(scontrol -o show job "$job_id" 2>&1) || {
    show_output
    fail "scontrol show job $job_id failed: $info"
  }
  state=$(sed -n 's/.*JobState=\([A-Z_]*\).*/\1/p' <<<"$info")
  exit_code=$(sed -n 's/.* ExitCode=\([0-9:]*\).*/\1/p' <<<"$info")
  case $state in
    PENDING | CONFIGURING | RUNNING | COMPLETING | SUSPENDED | "") ;;
    *) break ;;
  esac
  if ((SECONDS >= deadline)); then
    scancel "$job_id" || true
    show_output
    fail "job $job_id still $state after ${job_timeout}s; cancelled"
  fi
  sleep 1
done
log "job $job_id finished: state=$state exit=$exit_code"

# --- checks -------------------------------------------------------------------
if [[ $state != COMPLETED || $exit_code != 0:0 ]]; then
  show_output
  fail "job $job_id ended with state=$state ExitCode=$exit_code (want COMPLETED 0:0)"
fi
[[ -f $model ]] || {
  show_output
  fail "model file $model was not written"
}

# weights/means may sit at the root or in a group; find them by name.
if ! model_report=$("$python" - "$model" 2>&1 <<'EOF'
import sys
import h5py
import numpy as np

found = {}
with h5py.File(sys.argv[1], "r") as f:
    def visit(name, obj):
        base = name.rsplit("/", 1)[-1]
        if isinstance(obj, h5py.Dataset) and base in ("weights", "means"):
            found.setdefault(base, []).append(name)
    f.visititems(visit)
    for key in ("weights", "means"):
        if len(found.get(key, [])) != 1:
            sys.exit("expected exactly one dataset named %r, found %r" % (key, found.get(key, [])))
    w = np.asarray(f[found["weights"][0]][()], dtype=float)
    m = np.asarray(f[found["means"][0]][()], dtype=float)
if w.shape != (3,):
    sys.exit("weights %s has shape %s, want (3,)" % (found["weights"][0], w.shape))
if not np.all(np.isfinite(w)) or np.any(w < 0) or abs(w.sum() - 1.0) > 1e-6:
    sys.exit("weights %s do not form a distribution: %s (sum %r)" % (found["weights"][0], w, w.sum()))
if m.shape != (3, 2):
    sys.exit("means %s has shape %s, want (3, 2)" % (found["means"][0], m.shape))
if not np.all(np.isfinite(m)):
    sys.exit("means contain non-finite values: %s" % m)
print("weights=%s sum=%.12f means shape=%s" % (np.round(w, 4), w.sum(), m.shape))
EOF
); then
  show_output
  fail "model check: $model_report"
fi
log "model ok: $model_report"

# The last line that parses as a JSON object must report 2 ranks.
if ! json_report=$("$python" - "$job_out" 2>&1 <<'EOF'
import json
import sys

rec = None
with open(sys.argv[1], errors="replace") as f:
    for line in f:
        # mpirun forwards stdout and stderr separately, so in the job's one output file the JSON
        # line can land inside a progress line: parse from every '{' on the line.
        line = line.strip()
        for i in [j for j, c in enumerate(line) if c == "{"]:
            try:
                obj = json.loads(line[i:])
            except ValueError:
                continue
            if isinstance(obj, dict):
                rec = obj
                break
if rec is None:
    sys.exit("no JSON result line in job output")
if rec.get("ranks") != 2:
    sys.exit('final JSON line has "ranks": %r, want 2: %s' % (rec.get("ranks"), json.dumps(rec)))
for key in ("elbo", "iterations", "seconds"):
    if key not in rec:
        sys.exit("final JSON line lacks %r: %s" % (key, json.dumps(rec)))
print(json.dumps(rec))
EOF
); then
  show_output
  fail "job output check: $json_report"
fi
log "job output ok: $json_report"
log "PASS"
