#!/usr/bin/env bash
# caviar bbvi fit vs PyTorch (Debian python3-torch) on the same full-rank reparameterisation ADVI
# (bench/bbvi_vs_torch.py), side by side and interleaved in one run: logistic regression,
# N = 10^6, D = 50, B = 1024, S = 8, Adam lr 0.01, double precision on both sides.
#
#   seconds per step  caviar: the median over 100-step intervals of its progress lines (each
#                     interval ends with a 1-draw ELBO estimate over 1,024 rows, about 1/8 of a
#                     step), of a run with nothing else; PyTorch: the median of its timed steps
#                     (ELBO estimates outside), both after the first 100 steps.
#   time to ELBO      separate runs of CONV_STEPS (1500) steps whose ELBO estimates, every 50
#                     steps, use every row and 4 draws (the same estimator on both sides, outside
#                     the optimisation: it does not change the path). At lr 0.01 the iterates
#                     reach a noisy plateau within a few hundred steps, so the target is caviar's
#                     final level, the median of its estimates over the run's last third, minus
#                     half their sd; the time is the first estimate's step at or above it times
#                     that side's seconds per step.
#   scaling           caviar at 1 and 2 ranks x 1 thread on N = 10^7 (4 GB of doubles; skipped
#                     with SCALING_N=0), seconds per step as above; efficiency t1 / (2 t2). Each
#                     rank is bound to a core (1 rank: core 0; 2 ranks: cores 0 and 1), so that
#                     every run has the same placement. On the VM of docs/experiments/bbvi.md
#                     each vCPU ran the fit at one of two speeds (about 0.40 or 0.60 ms a step at
#                     1 rank), switching from minute to minute: print the per-rank local times
#                     (the JSON's local_seconds_max and _min) before reading an efficiency.
#
# usage: bench/bbvi_vs_torch.sh [CAVIAR_BIN] [STEPS (timing runs, 1000)] [WORKDIR]
# Needs: scripts/install_bench_deps.sh (python3-torch), a built caviar.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
caviar="${1:-$here/../build/caviar}"
steps="${2:-1000}"
work="${3:-${TMPDIR:-/tmp}/caviar-bbvi-bench}"
scaling_n="${SCALING_N:-10000000}"
conv_steps="${CONV_STEPS:-1500}"
rounds="${ROUNDS:-2}"
py=/usr/bin/python3
mkdir -p "$work"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1

gen() {  # gen N FILE
  [[ -f "$2" ]] || "$caviar" generate glm --family logistic --n "$1" --dim 50 --seed 1 \
    --out "$2" >/dev/null
}
fit() {  # fit DATA LOG THREADS RANKS STEPS ELBO_EVERY ELBO_ROWS ELBO_SAMPLES: JSON on stdout
  # Open MPI binds each rank to one core by default (<= 2 ranks): both threads of a 1 x 2 run
  # would share one core. BIND=core binds the 1-thread ranks of the scaling runs.
  OMP_NUM_THREADS="$3" mpirun -n "$4" --bind-to "${BIND:-none}" -x OMP_NUM_THREADS "$caviar" bbvi fit \
    --model logistic \
    --family fullrank --estimator reparam --data "$1:/X" --response "$1:/y" --batch-size 1024 \
    --samples 8 --lr 0.01 --max-iter "$5" --tol 0 --elbo-every "$6" --elbo-rows "$7" \
    --elbo-samples "$8" --diagnostic-samples 0 --seed 1 --out "$work/post.h5" 2>"$2" | tail -1
}
data="$work/glm_1e6.h5"
gen 1000000 "$data"

load() { cut -d' ' -f1-3 /proc/loadavg; }
echo "# $(date -u +%FT%TZ) machine load before: $(load)" >&2
for r in $(seq "$rounds"); do
  $py "$here/bbvi_vs_torch.py" --data "$data" --steps "$conv_steps" --elbo-every 50 --threads 2 \
    >"$work/torch2_$r.json"
  fit "$data" "$work/ctime_$r.log" 2 1 "$steps" 100 1024 1 >"$work/ctime_$r.json"
  fit "$data" "$work/cconv_$r.log" 2 1 "$conv_steps" 50 1000000 4 >"$work/cconv_$r.json"
  $py "$here/bbvi_vs_torch.py" --data "$data" --steps "$steps" --elbo-every "$steps" --threads 1 \
    >"$work/torch1_$r.json"
  echo "# round $r done, load $(load)" >&2
done
if [[ "$scaling_n" != 0 ]]; then
  big="$work/glm_big.h5"
  gen "$scaling_n" "$big"
  for r in $(seq "$rounds"); do
    for ranks in 1 2; do
      BIND=core fit "$big" "$work/scale${ranks}_$r.log" 1 "$ranks" "$steps" 100 1024 1 \
        >"$work/scale${ranks}_$r.json"
    done
  done
fi
echo "# machine load after: $(load)" >&2

$py - "$work" "$rounds" "$scaling_n" <<'EOF'
import glob, json, re, sys
import numpy as np
work, rounds, big = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])

def progress(path):  # caviar's progress lines: (step, elbo, elapsed seconds)
    rows = [re.match(r"step\s+(\d+)\s+elbo\s+(\S+)\s+(\S+)s", l) for l in open(path)]
    return np.array([[float(m[1]), float(m[2]), float(m[3])] for m in rows if m])

def per_step(path):  # the median over 100-step intervals after the first one
    p = progress(path)
    return float(np.median(np.diff(p[:, 2]) / np.diff(p[:, 0])))

def first_at(trace, target):
    hit = [s for s, e in trace if e >= target]
    return hit[0] if hit else None

print(f"{'round':<6}{'run':<28}{'ms/step':>9}{'steps to target':>17}{'s to target':>13}"
      f"{'final ELBO':>14}")
for r in range(1, rounds + 1):
    t2, t1 = (json.load(open(f"{work}/torch{k}_{r}.json")) for k in (2, 1))
    conv = progress(f"{work}/cconv_{r}.log")
    tail = conv[len(conv) * 2 // 3:, 1]
    target = np.median(tail) - 0.5 * tail.std()
    c_step = per_step(f"{work}/ctime_{r}.log")
    runs = [("caviar 1 rank x 2 threads", c_step, conv[:, :2].tolist()),
            (f"torch {t2['version']} x2 threads", t2["seconds_per_step"], t2["trace"]),
            (f"torch {t1['version']} x1 thread", t1["seconds_per_step"], None)]
    for name, s, trace in runs:
        k = first_at(trace, target) if trace else None
        reach = f"{k:>17.0f}{k * s:>13.2f}" if k else f"{'-':>17}{'-':>13}"
        final = f"{trace[-1][1]:>14.1f}" if trace else f"{'-':>14}"
        print(f"{r:<6}{name:<28}{s * 1e3:>9.2f}{reach}{final}")
    print(f"{'':<6}target ELBO {target:.1f} (caviar's last third: median "
          f"{np.median(tail):.1f}, sd {tail.std():.1f}); "
          f"torch x2 / caviar per step: {t2['seconds_per_step'] / c_step:.2f}, "
          f"torch x1 / caviar: {t1['seconds_per_step'] / c_step:.2f}")
    j = json.load(open(f"{work}/ctime_{r}.json"))
    keys = ("local_seconds_max", "reduce_seconds_max", "seconds")
    ms = {k: j[k] / j["steps"] * 1e3 for k in keys}
    print(f"{'':<6}caviar timing run, ms/step: local (blocks) {ms['local_seconds_max']:.2f}, "
          f"reduce {ms['reduce_seconds_max']:.3f}, all {ms['seconds']:.2f}")
if big:
    for r in range(1, rounds + 1):
        s1, s2 = (per_step(f"{work}/scale{k}_{r}.log") for k in (1, 2))
        j1, j2 = (json.load(open(f"{work}/scale{k}_{r}.json")) for k in (1, 2))
        loc = lambda j, k: j[f"local_seconds_{k}"] / j["steps"] * 1e3
        print(f"N = {big}, round {r}: 1 rank {s1 * 1e3:.2f} ms/step "
              f"(local {loc(j1, 'max'):.2f}), 2 ranks {s2 * 1e3:.2f} ms/step "
              f"(local, slower rank {loc(j2, 'max'):.2f}, faster {loc(j2, 'min'):.2f}), "
              f"efficiency {s1 / (2 * s2):.2f}")
EOF
