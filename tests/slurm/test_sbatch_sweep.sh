#!/usr/bin/env bash
# test_sbatch_sweep.sh - end-to-end test of jobscripts/sweep.sbatch (a 3-task job array on a
# throw-away single-node SLURM started by jobscripts/local_slurm.sh) and of `caviar gmm compare`
# on its three outputs.
#
# Usage: test_sbatch_sweep.sh CAVIAR_BIN WORKDIR
#
# Exit codes: 0 pass, 77 skipped (SLURM/munge/h5py/root not available; ctest maps this to SKIP via
# the SKIP_RETURN_CODE property), anything else fails.
#
# Steps:
#  1. without SLURM: rows the table does not have, and malformed rows, end sweep.sbatch with one
#     'sweep.sbatch: ERROR:' line and exit 1 before anything runs;
#  2. 1500 generated points (2-D, 3 components) split into 1200 for fitting and 300 held out; a
#     3-row table (K = 2 CAVI seed 1; K = 3 seed 2; K = 6 SVI adaptive seed 3 with its own
#     args); sbatch --array=1-3, wait for every task (TEST_JOB_TIMEOUT, default 240 s) and check
#     each COMPLETED 0:0 and wrote a model whose K, seed, algorithm and schedule are its row's;
#  3. caviar gmm compare on the three models (--plot): every table row and the JSON line against
#     the model files read with h5py (K = len(weights), elbo, heldout_score, seed, effective
#     components = weights >= 0.01/K), rows sorted by K, and the PNG is a PNG of two panels' size.
set -euo pipefail

# shellcheck source=common.sh
. "$(dirname -- "${BASH_SOURCE[0]}")/common.sh" "$@"
sweep_sbatch=$repo/jobscripts/sweep.sbatch
job_timeout=${TEST_JOB_TIMEOUT:-240}
[[ -f $sweep_sbatch ]] || fail "jobscripts not found under $repo/jobscripts"
slurm_dir=$workdir/slurm
# Start from a clean slate so stale outputs cannot make the test pass.
rm -rf "$workdir/out" "$workdir"/*.h5 "$workdir"/*.tsv "$workdir"/*.png "$workdir"/sweep-*.out
mkdir -p "$workdir/out"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

# --- data ----------------------------------------------------------------------
log "generating data"
mpirun -n 1 "$caviar_bin" -q generate gmm --n 1500 --dim 2 --components 3 --seed 1 \
  --out "$workdir/all.h5:/X" >/dev/null || fail "caviar generate gmm failed"
"$python" - "$workdir" <<'EOF' || fail "could not split the data"
import sys, h5py
w = sys.argv[1]
with h5py.File(w + "/all.h5", "r") as f:
    x = f["X"][()]
# Rows are shuffled by the generator, so the last 300 are a fair held-out sample.
with h5py.File(w + "/train.h5", "w") as f:
    f["X"] = x[:1200]
with h5py.File(w + "/test.h5", "w") as f:
    f["X"] = x[1200:]
EOF

table=$workdir/sweep.tsv
{
  printf 'K\tseed\talgorithm\tschedule\targs\n'
  printf '# K = 2 and 3 by CAVI, K = 6 by SVI\n'
  printf '2\t1\tcavi\t-\t\n'
  printf '3\t2\t\t\t\n'
  printf '6\t3\tsvi\tadaptive\t--batch-size 200\n'
} >"$table"

# --- 1. bad rows, without SLURM -------------------------------------------------
# Runs sweep.sbatch outside SLURM for row $1 of table $2; it must exit 1 with exactly one
# 'sweep.sbatch: ERROR:' line containing $3, and start no fit.
expect_row_error() {
  local row=$1 tab=$2 want=$3 err rc=0
  err=$(env -u SLURM_ARRAY_TASK_ID -u SLURM_JOB_ID TASK="$row" TABLE="$tab" \
    CAVIAR_BIN="$caviar_bin" DATA="$workdir/train.h5:/X" OUT_DIR="$workdir/out" \
    bash "$sweep_sbatch" 2>&1 >/dev/null) || rc=$?
  [[ $rc -eq 1 ]] || fail "row $row of $tab: exit $rc, want 1 (stderr: $err)"
  [[ $(grep -c '^sweep.sbatch: ERROR:' <<<"$err") -eq 1 && $(wc -l <<<"$err") -eq 1 ]] ||
    fail "row $row of $tab: want one 'sweep.sbatch: ERROR:' line, got: $err"
  [[ $err == *"$want"* ]] || fail "row $row of $tab: error lacks '$want': $err"
  log "ok: row $row of ${tab##*/}: $err"
}
expect_row_error 4 "$table" "array task 4 has no row"
expect_row_error 0 "$table" "array task 0 has no row"
bad=$workdir/bad.tsv
printf 'K\tseed\tcolour\n2\t1\tred\n' >"$bad"
expect_row_error 1 "$bad" "unknown column 'colour'"
printf 'K\tseed\nfour\t1\n3\t1\t9\n' >"$bad"
expect_row_error 1 "$bad" "K must be a positive integer, got 'four'"
expect_row_error 2 "$bad" "has 3 tab-separated fields, the header has 2"
[[ -z $(ls -A "$workdir/out") ]] || fail "a bad row left files in $workdir/out: $(ls "$workdir/out")"

# --- 2. the array, on SLURM ---------------------------------------------------------
start_local_slurm "$slurm_dir"
# Poll scontrol rather than sbatch --wait: --wait has no timeout.
job_id=$(sbatch --parsable --array=1-3 --chdir="$workdir" \
  --output="$workdir/sweep-%A_%a.out" \
  --export="ALL,CAVIAR_BIN=$caviar_bin,TABLE=$table,DATA=$workdir/train.h5:/X,OUT_DIR=$workdir/out,CAVIAR_FIT_ARGS=--max-iter 300 --heldout $workdir/test.h5:/X" \
  "$sweep_sbatch") || fail "sbatch failed"
job_id=${job_id%%;*}
log "submitted array job $job_id (3 tasks), waiting up to ${job_timeout}s"

show_output() {
  for f in "$workdir"/sweep-"$job_id"_*.out; do
    log "---- $f ----"
    cat "$f" >&2 2>/dev/null || true
  done
}

deadline=$((SECONDS + job_timeout))
while :; do
  # One line per array task (a pending remainder shows as one line with ArrayTaskId=a-b).
  info=$(scontrol -o show job "$job_id" 2>&1) || {
    show_output
    fail "scontrol show job $job_id failed: $info"
  }
  if ! grep -qE 'JobState=(PENDING|CONFIGURING|RUNNING|COMPLETING|SUSPENDED|REQUEUED)' <<<"$info"; then
    break
  fi
  if ((SECONDS >= deadline)); then
    scancel "$job_id" || true
    show_output
    fail "array job $job_id not finished after ${job_timeout}s; cancelled"
  fi
  sleep 1
done
for t in 1 2 3; do
  line=$(grep -E "ArrayTaskId=$t( |$)" <<<"$info") || {
    show_output
    fail "no record of array task $t: $info"
  }
  state=$(sed -n 's/.*JobState=\([A-Z_]*\).*/\1/p' <<<"$line")
  exit_code=$(sed -n 's/.* ExitCode=\([0-9:]*\).*/\1/p' <<<"$line")
  if [[ $state != COMPLETED || $exit_code != 0:0 ]]; then
    show_output
    fail "task $t ended with state=$state ExitCode=$exit_code (want COMPLETED 0:0)"
  fi
  [[ -f $workdir/out/sweep-$t.h5 ]] || {
    show_output
    fail "task $t wrote no $workdir/out/sweep-$t.h5"
  }
done
log "all 3 tasks COMPLETED 0:0"

# Each model must carry its row's settings (the row reached caviar, not another row's).
"$python" - "$workdir/out" <<'EOF' || { show_output; fail "a model does not match its table row"; }
import sys, h5py
rows = {1: (2, 1, "cavi", None), 2: (3, 2, "cavi", None), 3: (6, 3, "svi", "adaptive")}
bad = False
for t, (k, seed, alg, schedule) in rows.items():
    with h5py.File(f"{sys.argv[1]}/sweep-{t}.h5", "r") as f:
        got = (f["weights"].shape[0], int(f.attrs["seed"]), f.attrs["algorithm"],
               f.attrs.get("schedule"))
    want = (k, seed, alg, schedule)
    if got != want:
        print(f"sweep-{t}.h5: (K, seed, algorithm, schedule) = {got}, want {want}")
        bad = True
sys.exit(1 if bad else 0)
EOF
log "models carry their rows' K, seed, algorithm and schedule"

# --- 3. compare -----------------------------------------------------------------------
png=$workdir/compare.png
# Given out of K order (3, 1, 2 -> K = 6, 2, 3): the table must come back sorted by K.
compare_out=$workdir/compare.txt
mpirun -n 1 "$caviar_bin" gmm compare "$workdir/out/sweep-3.h5" "$workdir/out/sweep-1.h5" \
  "$workdir/out/sweep-2.h5" --plot "$png" >"$compare_out" ||
  fail "caviar gmm compare failed"
cat "$compare_out" >&2
"$python" - "$compare_out" "$png" "$workdir/out" <<'EOF' || fail "compare output check failed"
import json, struct, sys
import h5py
import numpy as np

out, png, models = sys.argv[1:4]
lines = open(out).read().splitlines()
summary = json.loads(lines[-1])
table = [l.split() for l in lines[:-1]]
fails = []
def check(cond, what):
    if not cond:
        fails.append(what)

# The model files, read independently of caviar.
want = []
for t in (1, 2, 3):
    f = f"{models}/sweep-{t}.h5"
    with h5py.File(f, "r") as h:
        w = h["weights"][()]
        k = len(w)
        want.append(dict(file=f, k=k, seed=int(h.attrs["seed"]), elbo=float(h.attrs["elbo"]),
                         heldout=float(h.attrs["heldout_score"]),
                         effective=int(np.sum(w >= 0.01 / k)),
                         algorithm=h.attrs["algorithm"], schedule=h.attrs.get("schedule")))
want.sort(key=lambda r: r["k"])

head, rows = table[0], table[1:]
check(head == ["file", "K", "algorithm", "seed", "elbo", "heldout_score", "effective_K",
               "iterations", "converged"], f"table header {head}")
check(len(rows) == 3, f"{len(rows)} table rows, want 3")
check(len(summary["fits"]) == 3, f"{len(summary['fits'])} JSON fits, want 3")
for i, (r, j, m) in enumerate(zip(rows, summary["fits"], want)):
    alg = m["algorithm"] + ("/" + m["schedule"] if m["schedule"] else "")
    # The table prints 10 significant digits; the JSON line round-trips the double.
    check(r[0] == m["file"] and j["file"] == m["file"], f"row {i}: file {r[0]}, want {m['file']}")
    check(int(r[1]) == m["k"] and j["k"] == m["k"], f"row {i}: K {r[1]}/{j['k']}, want {m['k']}")
    check(r[2] == alg and j["algorithm"] == alg, f"row {i}: algorithm {r[2]}, want {alg}")
    check(int(r[3]) == m["seed"] and j["seed"] == m["seed"], f"row {i}: seed {r[3]}, want {m['seed']}")
    check(abs(float(r[4]) - m["elbo"]) <= 1e-9 * abs(m["elbo"]) and j["objective"] == m["elbo"],
          f"row {i}: elbo {r[4]}/{j['objective']}, want {m['elbo']!r}")
    check(abs(float(r[5]) - m["heldout"]) <= 1e-9 * abs(m["heldout"]) and j["heldout"] == m["heldout"],
          f"row {i}: heldout {r[5]}/{j['heldout']}, want {m['heldout']!r}")
    check(int(r[6]) == m["effective"] and j["effective"] == m["effective"],
          f"row {i}: effective {r[6]}/{j['effective']}, want {m['effective']}")
    check(j["objective_name"] == "elbo" and j["heldout_name"] == "heldout_score",
          f"row {i}: names {j['objective_name']}, {j['heldout_name']}")
check(summary.get("plot") == png, f"JSON plot {summary.get('plot')!r}, want {png!r}")

# A PNG: the signature, then the IHDR chunk with the figure's size (10 x 4 in at 100 dpi).
with open(png, "rb") as f:
    head = f.read(24)
check(head[:8] == b"\x89PNG\r\n\x1a\n" and head[12:16] == b"IHDR", "not a PNG file")
width, height = struct.unpack(">II", head[16:24])
check((width, height) == (1000, 400), f"PNG is {width}x{height}, want 1000x400")
for f in fails:
    print("FAIL:", f)
print("compare: checked", len(rows), "rows,", "PNG %dx%d" % (width, height))
sys.exit(1 if fails else 0)
EOF
log "PASS"
