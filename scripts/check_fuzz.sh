#!/usr/bin/env bash
# Fuzzes caviar's own parsers with libFuzzer (ASan + UBSan), time-boxed: the checkpoint readers
# (gmm, lda, vae; their fingerprint check), the CSR corpus reader, the FILE.h5:/path argument and
# --checkpoint-every. See tests/fuzz/README.md.
#
#   scripts/check_fuzz.sh [SECONDS_PER_TARGET]      (default 45)
#
# Installs clang-14, libFuzzer and libomp if missing (Debian; root or sudo), configures a separate
# clang build tree (build-fuzz, or $CAVIAR_FUZZ_BUILD), builds the fuzz targets, replays every
# committed regression input (tests/fuzz/regressions/<target>/), then fuzzes each target for the
# time box from its seeds (tests/fuzz/corpus/<target>/ and seeds the target writes from files
# caviar itself produces). Crash inputs, logs and the grown corpora stay in the build tree
# (<build>/fuzz/). Exits non-zero if any target crashed (sanitizer report, abort, uncaught
# exception, timeout > 10 s, RSS > 2 GB) or a regression input crashes again.
# CAVIAR_FUZZ_JOBS targets run at once (default 2: the two cores).
set -euo pipefail

secs=${1:-45}
[[ "$secs" =~ ^[0-9]+$ && "$secs" -ge 1 ]] || { echo "usage: $0 [SECONDS_PER_TARGET]" >&2; exit 2; }
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${CAVIAR_FUZZ_BUILD:-$root/build-fuzz}
jobs=${CAVIAR_FUZZ_JOBS:-2}
targets=(gmm_checkpoint lda_checkpoint vae_checkpoint csr data_ref checkpoint_every)
t_start=$(date +%s)

# 1. Tools: caviar's dependencies, then clang-14 with libFuzzer (libclang-rt-14-dev) and its
# OpenMP runtime (libomp-14-dev; clang-14 does not pull it in without recommends).
bash "$root/scripts/install_deps.sh"
missing=()
for p in clang-14 libclang-rt-14-dev libomp-14-dev; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [[ ${#missing[@]} -gt 0 ]]; then
  SUDO=""
  [[ $(id -u) -ne 0 ]] && SUDO=sudo
  echo "check_fuzz: installing ${missing[*]}"
  $SUDO apt-get update -q
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

# 2. A clang build tree of its own (the main build uses GCC). -O1 -g1 (line tables: enough for a
# crash's stack) without NDEBUG: Eigen's and caviar's assertions stay on (-Wno-pass-failed: at
# -O1 clang does not vectorise the `omp simd` loops, and says so for each).
t_build=$(date +%s)
mkdir -p "$build"
CC=clang-14 CXX=clang++-14 cmake -S "$root" -B "$build" -DCAVIAR_FUZZ=ON \
  -DCAVIAR_BUILD_TESTS=OFF -DCAVIAR_BUILD_BENCH=OFF -DCMAKE_BUILD_TYPE=Debug \
  -DCMAKE_CXX_FLAGS_DEBUG="-O1 -g1 -Wno-pass-failed" -DCMAKE_C_FLAGS_DEBUG="-O1 -g1" >"$build/configure.log" 2>&1 ||
  { cat "$build/configure.log"; exit 1; }
cmake --build "$build" --target caviar_fuzz -j2
build_secs=$(($(date +%s) - t_build))

out=$build/fuzz
mkdir -p "$out"/{logs,artifacts,corpus,seeds}
# Open MPI leaks at exit by design: no leak detection. UBSan aborts on the first report (also
# compiled with -fno-sanitize-recover).
export ASAN_OPTIONS=detect_leaks=0:abort_on_error=0
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
export OMP_NUM_THREADS=1
bin() { echo "$build/tests/fuzz/fuzz_$1"; }
cd "$out"  # whatever libFuzzer writes lands in the build tree
rm -f "$out/artifacts/"*

# 3. Regressions: every input that once crashed a target is run through it again, once.
failed=0
for t in "${targets[@]}"; do
  reg=$root/tests/fuzz/regressions/$t
  compgen -G "$reg/*" >/dev/null || continue
  if "$(bin "$t")" -timeout=10 -rss_limit_mb=2048 -artifact_prefix="$out/artifacts/$t-regression-" \
    "$reg"/* >"$out/logs/$t.regressions.log" 2>&1; then
    echo "check_fuzz: $t: $(ls "$reg" | wc -l) regression input(s) pass"
  else
    echo "check_fuzz: $t: a regression input crashes again:" >&2
    tail -n 40 "$out/logs/$t.regressions.log" >&2
    failed=1
  fi
done

# 4. Fuzz each target for the time box, $jobs at a time. Seeds: the target writes them from files
# caviar produces (HDF5 targets), plus the committed ones.
run_target() {
  local t=$1 b rc=0
  b=$(bin "$t")
  rm -rf "$out/seeds/$t" "$out/logs/$t.status"
  mkdir -p "$out/corpus/$t" "$out/seeds/$t"
  # -runs=0: a target without seeds of its own (the string parsers) runs no input and exits.
  if ! CAVIAR_FUZZ_WRITE_SEEDS=$out/seeds/$t "$b" -runs=0 >"$out/logs/$t.seeds.log" 2>&1; then
    echo "seeds" >"$out/logs/$t.status"
    return
  fi
  local dirs=("$out/corpus/$t" "$out/seeds/$t")
  if [[ -d $root/tests/fuzz/corpus/$t ]]; then dirs+=("$root/tests/fuzz/corpus/$t"); fi
  "$b" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
    -artifact_prefix="$out/artifacts/$t-" "${dirs[@]}" >"$out/logs/$t.log" 2>&1 || rc=$?
  echo "$rc" >"$out/logs/$t.status"
}
for t in "${targets[@]}"; do
  while [[ $(jobs -rp | wc -l) -ge $jobs ]]; do wait -n || true; done
  run_target "$t" &
done
wait

# 5. Report: executions, speed, coverage (libFuzzer's "cov": instrumented edges reached), crashes.
printf '\n%-18s %10s %8s %8s %8s  %s\n' target execs exec/s cov ft result
crashed=()
for t in "${targets[@]}"; do
  log=$out/logs/$t.log
  rc=$(cat "$out/logs/$t.status" 2>/dev/null || echo "none")
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  speed=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
  cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1 | cut -d' ' -f2)
  ft=$(grep -o 'ft: [0-9]*' "$log" | tail -1 | cut -d' ' -f2)
  if [[ $rc == 0 ]]; then
    result=ok
  elif [[ $rc == seeds ]]; then
    result="FAILED writing its seeds: $out/logs/$t.seeds.log"
    failed=1
  else
    result="CRASH (exit $rc): $(ls "$out/artifacts/$t-"* 2>/dev/null | head -1)"
    crashed+=("$t")
    failed=1
  fi
  printf '%-18s %10s %8s %8s %8s  %s\n' "$t" "${execs:-?}" "${speed:-?}" "${cov:-?}" "${ft:-?}" \
    "$result"
done
for t in "${crashed[@]}"; do
  echo >&2
  echo "check_fuzz: $t crashed; end of $out/logs/$t.log:" >&2
  grep -v -E '^#[0-9]+ +(NEW|REDUCE|pulse)|NEW_FUNC' "$out/logs/$t.log" | tail -n 40 >&2
done
echo
echo "check_fuzz: build ${build_secs} s, total $(($(date +%s) - t_start)) s," \
  "${secs} s per target, ${jobs} at once; logs and artifacts in $out"
if [[ $failed -ne 0 ]]; then
  echo "check_fuzz: FAILED (replay one input: $(bin TARGET) FILE)" >&2
  exit 1
fi
echo "check_fuzz: no crash"
