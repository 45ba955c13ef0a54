#!/usr/bin/env bash
# test_sbatch_preempt.sh - a preempted and requeued jobscripts/preemptible.sbatch job must end
# with the same model, byte for byte, as an uninterrupted run (README.md, "Checkpoint, resume,
# preemption").
#
# Usage: test_sbatch_preempt.sh CAVIAR_BIN WORKDIR
#
# Exit codes: 0 pass, 77 skipped (SLURM/munge/h5py/root not available), anything else fails.
#
# Steps: start SLURM in WORKDIR/slurm (a trap always stops it), generate 2-D data, run the fit
# uninterrupted with mpirun -n 2 (the reference), submit preemptible.sbatch with 2 tasks, wait
# for a few progress lines in the job output, send the batch shell SIGUSR1
# (`scancel --signal=USR1 --batch`, what `#SBATCH --signal=B:USR1@60` does before the time
# limit), and wait (TEST_JOB_TIMEOUT, default 240 s). Checks: the job was requeued (Restarts=1)
# and COMPLETED with 0:0, its output shows "stopped by SIGUSR1" and a resumed second run, and
# the model's datasets and attributes (except timings and the command line) equal the
# reference's bytes.
set -euo pipefail

# shellcheck source=common.sh
. "$(dirname -- "${BASH_SOURCE[0]}")/common.sh" "$@"
script=$repo/jobscripts/preemptible.sbatch
job_timeout=${TEST_JOB_TIMEOUT:-240}
[[ -f $script ]] || fail "jobscripts not found under $repo/jobscripts"
slurm_dir=$workdir/slurm
data=$workdir/d.h5
model=$workdir/model.h5
ref=$workdir/ref.h5
ckpt=$workdir/model.ckpt.h5
rm -f "$data" "$model" "$ref" "$ckpt" "$workdir"/pre-*.out

start_local_slurm "$slurm_dir"

# --- data and the uninterrupted reference (2 ranks x 1 thread, as the job) -----
"$caviar_bin" generate gmm --n 40000 --dim 2 --components 4 --seed 1 --out "$data:/X" >/dev/null ||
  fail "caviar generate gmm failed"
# Long enough (~10 s here) that the job is still fitting when the signal arrives.
fit_args="--tol 0 --max-iter 15000 --seed 5"
root_flag=()
[[ $(id -u) -ne 0 ]] || root_flag=(--allow-run-as-root)
# shellcheck disable=SC2086
OMP_NUM_THREADS=1 mpirun -n 2 --oversubscribe "${root_flag[@]}" "$caviar_bin" -q gmm fit \
  --data "$data:/X" --components 4 --out "$ref" $fit_args >/dev/null || fail "reference fit failed"

# --- submit, preempt, wait ------------------------------------------------------
job_id=$(sbatch --parsable --chdir="$workdir" --output="$workdir/pre-%j.out" \
  --export="ALL,CAVIAR_BIN=$caviar_bin,DATA=$data:/X,K=4,OUT=$model,CHECKPOINT=$ckpt,CHECKPOINT_EVERY=1000,CAVIAR_FIT_ARGS=$fit_args" \
  "$script") || fail "sbatch failed"
job_id=${job_id%%;*}
job_out=$workdir/pre-$job_id.out
log "submitted job $job_id"

show_output() {
  log "---- job $job_id output ($job_out) ----"
  cat "$job_out" >&2 2>/dev/null || log "(no output file)"
  log "---- end of job output ----"
}
job_field() { sed -n "s/.*[ ]$1=\([^ ]*\).*/\1/p" <<<"$2"; }

deadline=$((SECONDS + job_timeout))
# Wait until the fit has printed 20 iterations, then signal the batch shell.
while :; do
  if [[ -f $job_out ]] && (($(grep -c '^iter ' "$job_out" || true) >= 20)); then
    break
  fi
  info=$(scontrol -o show job "$job_id" 2>&1) || true
  state=$(job_field JobState "$info")
  case $state in
    PENDING | CONFIGURING | RUNNING | "") ;;
    *)
      show_output
      fail "job $job_id ended ($state) before it could be signalled; make the fit longer"
      ;;
  esac
  ((SECONDS < deadline)) || {
    show_output
    fail "no progress from job $job_id within ${job_timeout}s"
  }
  sleep 0.2
done
log "sending SIGUSR1 to the batch shell of job $job_id"
scancel --signal=USR1 --batch "$job_id" || fail "scancel --signal=USR1 --batch failed"

state="" exit_code="" restarts=""
while :; do
  info=$(scontrol -o show job "$job_id" 2>&1) || {
    show_output
    fail "scontrol show job $job_id failed: $info"
  }
  state=$(job_field JobState "$info")
  exit_code=$(job_field ExitCode "$info")
  restarts=$(job_field Restarts "$info")
  # SLURM holds a requeued job until a BeginTime some minutes ahead (about 170 s here); make it
  # eligible sooner so that the test stays short. The requeue itself is the job script's. Only
  # once the node is idle again, and a few seconds later: a job started while slurmd is still
  # cleaning up its previous run fails ("Job credential revoked").
  if [[ $state == PENDING && ${restarts:-0} -ge 1 && $(job_field Reason "$info") == BeginTime &&
    -z ${released:-} ]] && sinfo -h -N -o '%T' | grep -qx idle; then
    sleep 5
    log "job $job_id requeued (restart $restarts), held for BeginTime; scontrol update StartTime=now"
    scontrol update JobId="$job_id" StartTime=now || fail "scontrol update StartTime=now failed"
    released=1
  fi
  case $state in
    COMPLETED | FAILED | CANCELLED | TIMEOUT | NODE_FAIL | OUT_OF_MEMORY | BOOT_FAIL | DEADLINE) break ;;
  esac
  if ((SECONDS >= deadline)); then
    scancel "$job_id" || true
    show_output
    fail "job $job_id still $state (restarts $restarts) after ${job_timeout}s; cancelled"
  fi
  sleep 1
done
log "job $job_id finished: state=$state exit=$exit_code restarts=$restarts"

# --- checks -------------------------------------------------------------------
if [[ $state != COMPLETED || $exit_code != 0:0 ]]; then
  show_output
  fail "job $job_id ended with state=$state ExitCode=$exit_code (want COMPLETED 0:0)"
fi
[[ $restarts == 1 ]] || {
  show_output
  fail "job $job_id was restarted $restarts times, want 1"
}
grep -q 'stopped by SIGUSR1' "$job_out" || {
  show_output
  fail "the job output lacks caviar's 'stopped by SIGUSR1' line"
}
grep -q 'restart 1 .*(resuming)' "$job_out" || {
  show_output
  fail "the requeued run did not resume from the checkpoint"
}
[[ -f $model ]] || {
  show_output
  fail "model file $model was not written"
}
if ! report=$(same_model_bits "$ref" "$model" 2>&1); then
  show_output
  fail "$report"
fi
log "model ok: $report"
log "PASS"
