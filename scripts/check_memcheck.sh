#!/usr/bin/env bash
# CI job: valgrind memcheck over one small fit of every model and algorithm.
#
# usage: scripts/check_memcheck.sh [BUILD_DIR]     (default: build-memcheck in the repository)
#
# valgrind 3.19 cannot execute AVX-512, so BUILD_DIR is a portable build of the caviar target only
# (-DCAVIAR_NATIVE=OFF -DCAVIAR_ARCH=x86-64-v3, -O1 -g1): AVX2 + FMA + BMI2, which valgrind 3.19
# executes (its virtual CPU reports them, so caviar's start-up CPU check passes under it). This
# job is also CI's portable-build test: before the cases it checks that
# the binary says it was built for -march=x86-64-v3, that it holds AVX2/FMA instructions (so the
# cases below run them), and runs tests/cli/test_isa.py on it (the start-up CPU check names a
# missing extension on every rank and passes on this CPU). How the portable build's outputs and
# speed compare with the native build's: docs/performance.md, "Portable builds".
# Each case runs at 2 ranks x 2 OpenMP threads, every rank under valgrind (mpirun -n 2 valgrind
# caviar ...): 2 ranks split the rows (shard boundaries, allreduce, SVI's allgatherv, collective
# HDF5 writes), 2 threads split the blocks.
#
# Cases (inputs made by `caviar generate` and h5py first, natively, not under valgrind):
#   gmm fit CAVI full (+ labels, checkpoint), CAVI diag, SVI, SVI --stream, EM (+ labels),
#   stick-breaking (+ held-out score); lda fit CAVI and SVI; plsa fit (+ per-document topics,
#   checkpoint); hmm fit Gaussian EM (+ posteriors) and categorical CAVI (+ checkpoint); vae train
#   (700 x 12 binary, 1 epoch).
#
# Policy: ANY memcheck error fails the job (invalid reads/writes, uninitialised values in
# conditions, addresses or syscalls, bad frees), after tests/sanitize/valgrind.supp removes
# library-internal noise only (see that file: no caviar frame appears in it). Leaks are not
# checked here (--leak-check=no): check_sanitizers.sh runs LeakSanitizer over the tests.
# The job fails if a rank exits non-zero (valgrind's --error-exitcode=3) or if any log has a
# non-zero ERROR SUMMARY; the logs stay in BUILD_DIR/memcheck.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=$(realpath -m "${1:-$root/build-memcheck}")
jobs=${CAVIAR_JOBS:-2}

arch=x86-64-v3
cmake -B "$build" -S "$root" -DCAVIAR_NATIVE=OFF -DCAVIAR_ARCH="$arch" -DCAVIAR_SANITIZE=OFF \
  -DCAVIAR_BUILD_TESTS=OFF -DCAVIAR_BUILD_BENCH=OFF -DCMAKE_BUILD_TYPE=Debug \
  -DCMAKE_CXX_FLAGS_DEBUG="-O1 -g1" -DCMAKE_C_FLAGS_DEBUG="-O1 -g1"
cmake --build "$build" -j"$jobs" --target caviar
caviar=$build/caviar
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

# The portable build: what it reports, what it holds, and its start-up CPU check.
version=$("$caviar" --version)
if [[ "$version" != *"built for -march=$arch: "* ]]; then
  echo "check_memcheck: FAILED: the portable build does not report -march=$arch: $version" >&2
  exit 1
fi
# A build whose -march was lost would still run every case below, on SSE2 code only.
nfma=$(objdump -d --no-show-raw-insn "$caviar" | grep -c 'vfmadd' || true)
nymm=$(objdump -d --no-show-raw-insn "$caviar" | grep -c '%ymm' || true)
echo "portable build: $version; $nfma FMA and $nymm ymm instructions"
if [ "$nfma" -eq 0 ] || [ "$nymm" -eq 0 ]; then
  echo "check_memcheck: FAILED: the -march=$arch binary holds no FMA or AVX instructions" >&2
  exit 1
fi
OMP_NUM_THREADS=1 /usr/bin/python3 "$root/tests/cli/test_isa.py" "$caviar" "$build/isa"

work=$build/memcheck
rm -rf "$work"
mkdir -p "$work"
cd "$work"
export OMP_NUM_THREADS=2

"$caviar" -q generate gmm --n 600 --dim 3 --components 3 --seed 1 --out gmm.h5:/X
"$caviar" -q generate lda --docs 200 --words 80 --topics 3 --seed 2 --out lda.h5
"$caviar" -q generate hmm --sequences 60 --length 5-30 --states 3 --emission gaussian --dim 2 \
  --seed 3 --out hmm_gauss.h5
"$caviar" -q generate hmm --sequences 60 --length 5-30 --states 3 --emission categorical \
  --symbols 6 --seed 4 --out hmm_cat.h5
/usr/bin/python3 -c '
import h5py, numpy as np
rng = np.random.default_rng(0)
with h5py.File("vae.h5", "w") as f:
    f["train"] = (rng.random((700, 12)) < 0.3).astype(np.float32)
'

valgrind=(valgrind --tool=memcheck --error-exitcode=3 --track-origins=yes --leak-check=no
  --num-callers=40 --gen-suppressions=all --suppressions="$root/tests/sanitize/valgrind.supp")
failed=()
run() {
  local name=$1
  shift
  local start=$SECONDS rc=0
  mpirun -n 2 --oversubscribe "${valgrind[@]}" --log-file="$work/$name.%p.vg.log" \
    "$caviar" "$@" >"$work/$name.out" 2>&1 || rc=$?
  local errors
  errors=$(grep -ho 'ERROR SUMMARY: [0-9]*' "$work/$name".*.vg.log | awk '{s += $3} END {print s + 0}')
  echo "memcheck $name: exit $rc, $errors errors, $((SECONDS - start)) s"
  if [ "$rc" -ne 0 ] || [ "$errors" -ne 0 ]; then
    failed+=("$name")
    cat "$work/$name.out" "$work/$name".*.vg.log >&2
  fi
}

gmm=(gmm fit --data gmm.h5:/X -k 3 --seed 1)
run gmm-cavi-full "${gmm[@]}" --max-iter 10 --out cavi.h5 --labels cavi_labels.h5 \
  --checkpoint cavi_ck.h5 --checkpoint-every 3
run gmm-cavi-diag "${gmm[@]}" --covariance diag --max-iter 10 --out diag.h5
run gmm-svi "${gmm[@]}" --algorithm svi --batch-size 128 --max-iter 3 --out svi.h5
run gmm-svi-stream "${gmm[@]}" --algorithm svi --stream --init random --batch-size 128 \
  --max-iter 2 --out svi_stream.h5
run gmm-em "${gmm[@]}" --algorithm em --max-iter 10 --out em.h5 --labels em_labels.h5
run gmm-stick-breaking "${gmm[@]}" --weights stick-breaking --max-iter 10 --out dp.h5 \
  --heldout gmm.h5:/X
run lda-cavi lda fit --data lda.h5 --topics 3 --algorithm cavi --max-iter 3 --out lda_cavi.h5
run lda-svi lda fit --data lda.h5 --topics 3 --algorithm svi --batch-size 64 --max-iter 2 \
  --out lda_svi.h5
run plsa plsa fit --data lda.h5 --topics 3 --max-iter 5 --out plsa.h5 --doc-topics plsa_docs.h5 \
  --checkpoint plsa_ck.h5 --checkpoint-every 2
run hmm-em-full hmm fit --data hmm_gauss.h5 --states 3 --emission gaussian --covariance full \
  --algorithm em --max-iter 5 --out hmm_em.h5 --posteriors hmm_em_post.h5
run hmm-cavi-categorical hmm fit --data hmm_cat.h5 --states 3 --emission categorical \
  --algorithm cavi --max-iter 5 --out hmm_cavi.h5 --checkpoint hmm_ck.h5 --checkpoint-every 2
run vae-train vae train --data vae.h5:/train --hidden 8 --latent 2 --batch-size 64 --max-iter 1 \
  --seed 5 --out vae_model.h5

if [ "${#failed[@]}" -ne 0 ]; then
  echo "check_memcheck: FAILED: ${failed[*]} (logs in $work)" >&2
  exit 1
fi
echo "check_memcheck: no memcheck errors in ${SECONDS} s"
