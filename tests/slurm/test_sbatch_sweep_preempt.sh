#!/usr/bin/env bash
# test_sbatch_sweep_preempt.sh - a preempted task of a jobscripts/sweep.sbatch job array must be
# requeued alone, resume from its checkpoint and end with the model of an uninterrupted run, byte
# for byte; the other task is not disturbed.
#
# Usage: test_sbatch_sweep_preempt.sh CAVIAR_BIN WORKDIR
#
# Exit codes: 0 pass, 77 skipped (SLURM/munge/h5py/root not available), anything else fails.
#
# Steps: start SLURM in WORKDIR/slurm (a trap always stops it), generate 2-D data, run row 2's fit
# uninterrupted with mpirun -n 1 (the reference), submit a 2-task array (row 1 short, row 2 long),
# wait for 20 progress lines of task 2, send its batch shell SIGUSR1
# (`scancel --signal=USR1 --batch JOB_2`, what `--signal=B:USR1@60` does before the time limit),
# and wait (TEST_JOB_TIMEOUT, default 240 s). Checks: task 2 was requeued (Restarts=1), resumed
# ("(resuming)" in its output) and COMPLETED 0:0 with a model equal to the reference (timings and
# the command line excepted); task 1 COMPLETED 0:0 without a restart.
set -euo pipefail

# shellcheck source=common.sh
. "$(dirname -- "${BASH_SOURCE[0]}")/common.sh" "$@"
script=$repo/jobscripts/sweep.sbatch
job_timeout=${TEST_JOB_TIMEOUT:-240}
[[ -f $script ]] || fail "jobscripts not found under $repo/jobscripts"
slurm_dir=$workdir/slurm
data=$workdir/d.h5
ref=$workdir/ref.h5
table=$workdir/sweep.tsv
rm -rf "$data" "$ref" "$table" "$workdir/out" "$workdir"/sweep-*.out
mkdir -p "$workdir/out"

start_local_slurm "$slurm_dir"

# --- data and the uninterrupted reference (1 rank x 1 thread, as each task) ------
"$caviar_bin" generate gmm --n 40000 --dim 2 --components 4 --seed 1 --out "$data:/X" >/dev/null ||
  fail "caviar generate gmm failed"
# Long enough (~10 s here) that task 2 is still fitting when the signal arrives.
long_args="--tol 0 --max-iter 6000"
root_flag=()
[[ $(id -u) -ne 0 ]] || root_flag=(--allow-run-as-root)
# shellcheck disable=SC2086
OMP_NUM_THREADS=1 mpirun -n 1 "${root_flag[@]}" "$caviar_bin" -q gmm fit --data "$data:/X" \
  --components 4 --seed 5 --out "$ref" $long_args >/dev/null || fail "reference fit failed"
{
  printf 'K\tseed\targs\n'
  printf '2\t1\t--max-iter 20\n'
  printf '4\t5\t%s\n' "$long_args"
} >"$table"

# --- submit, preempt task 2, wait ------------------------------------------------
job_id=$(sbatch --parsable --array=1-2 --chdir="$workdir" --output="$workdir/sweep-%A_%a.out" \
  --export="ALL,CAVIAR_BIN=$caviar_bin,TABLE=$table,DATA=$data:/X,OUT_DIR=$workdir/out,CHECKPOINT_EVERY=1000" \
  "$script") || fail "sbatch failed"
job_id=${job_id%%;*}
task2=${job_id}_2
job_out=$workdir/sweep-${job_id}_2.out
log "submitted array job $job_id"

show_output() {
  for f in "$workdir"/sweep-"$job_id"_*.out; do
    log "---- $f ----"
    cat "$f" >&2 2>/dev/null || true
  done
}
job_field() { sed -n "s/.*[ ]$1=\([^ ]*\).*/\1/p" <<<"$2"; }

deadline=$((SECONDS + job_timeout))
while :; do
  if [[ -f $job_out ]] && (($(grep -c '^iter ' "$job_out" || true) >= 20)); then
    break
  fi
  info=$(scontrol -o show job "$task2" 2>&1) || true
  state=$(job_field JobState "$info")
  case $state in
    PENDING | CONFIGURING | RUNNING | "") ;;
    *)
      show_output
      fail "task $task2 ended ($state) before it could be signalled; make the fit longer"
      ;;
  esac
  ((SECONDS < deadline)) || {
    show_output
    fail "no progress from task $task2 within ${job_timeout}s"
  }
  sleep 0.2
done
log "sending SIGUSR1 to the batch shell of task $task2"
scancel --signal=USR1 --batch "$task2" || fail "scancel --signal=USR1 --batch $task2 failed"

state="" exit_code="" restarts="" released=""
while :; do
  info=$(scontrol -o show job "$task2" 2>&1) || {
    show_output
    fail "scontrol show job $task2 failed: $info"
  }
  state=$(job_field JobState "$info")
  exit_code=$(job_field ExitCode "$info")
  restarts=$(job_field Restarts "$info")
  # As test_sbatch_preempt.sh: SLURM holds a requeued job until a BeginTime minutes ahead; release
  # it once the node is idle again, and a few seconds later ("Job credential revoked" otherwise).
  if [[ $state == PENDING && ${restarts:-0} -ge 1 && $(job_field Reason "$info") == BeginTime &&
    -z $released ]] && sinfo -h -N -o '%T' | grep -qx idle; then
    sleep 5
    log "task $task2 requeued (restart $restarts), held for BeginTime; scontrol update StartTime=now"
    scontrol update JobId="$task2" StartTime=now || fail "scontrol update StartTime=now failed"
    released=1
  fi
  case $state in
    COMPLETED | FAILED | CANCELLED | TIMEOUT | NODE_FAIL | OUT_OF_MEMORY | BOOT_FAIL | DEADLINE) break ;;
  esac
  if ((SECONDS >= deadline)); then
    scancel "$job_id" || true
    show_output
    fail "task $task2 still $state (restarts $restarts) after ${job_timeout}s; cancelled"
  fi
  sleep 1
done
log "task $task2 finished: state=$state exit=$exit_code restarts=$restarts"

# --- checks -------------------------------------------------------------------
if [[ $state != COMPLETED || $exit_code != 0:0 || $restarts != 1 ]]; then
  show_output
  fail "task $task2: state=$state ExitCode=$exit_code Restarts=$restarts (want COMPLETED 0:0, 1)"
fi
info1=$(scontrol -o show job "${job_id}_1" 2>&1) || fail "scontrol show job ${job_id}_1 failed: $info1"
if [[ $(job_field JobState "$info1") != COMPLETED || $(job_field ExitCode "$info1") != 0:0 ||
  $(job_field Restarts "$info1") != 0 ]]; then
  show_output
  fail "task 1 was disturbed: $(job_field JobState "$info1") $(job_field ExitCode "$info1") restarts $(job_field Restarts "$info1")"
fi
grep -q 'restart 1 .*(resuming)' "$job_out" || {
  show_output
  fail "the requeued task 2 did not resume from its checkpoint"
}
[[ -f $workdir/out/sweep-1.h5 && -f $workdir/out/sweep-2.h5 ]] || {
  show_output
  fail "a task wrote no model under $workdir/out"
}
if ! report=$(same_model_bits "$ref" "$workdir/out/sweep-2.h5" 2>&1); then
  show_output
  fail "$report"
fi
log "model ok: $report"
log "PASS"
