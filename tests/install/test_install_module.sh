#!/usr/bin/env bash
# What a cluster user gets from `cmake --install`: installs this build into a temporary prefix,
# loads the modulefile with Debian's Lmod in a clean shell, and there fits a mixture under 2 MPI
# ranks and draws PNGs, from a directory outside the source and build trees. The scripts the
# binary runs must come from the prefix: a Python wrapper logs the script each PNG was drawn with.
# Then a copy of the prefix at another path must use its own scripts, and fail with one line, not
# fall back to the source tree, once its plot_vae.py is removed.
#
# usage: test_install_module.sh CMAKE BUILD_DIR SOURCE_DIR VERSION
set -euo pipefail
cmake=$1 build=$(cd "$2" && pwd -P) src=$(cd "$3" && pwd -P) version=$4

fail() { echo "FAIL: $*" >&2; exit 1; }

# CI installs lmod (scripts/install_deps.sh); without it this test has nothing to check, and says so.
lmod_init=/usr/share/lmod/lmod/init/bash
[[ -r $lmod_init ]] || fail "Lmod is not installed ($lmod_init is missing): apt-get install lmod"

work=$(mktemp -d "${TMPDIR:-/tmp}/caviar-install.XXXXXX")
work=$(cd "$work" && pwd -P)
trap 'rm -rf "$work"' EXIT
for tree in "$src" "$build"; do
  [[ $work/ != "$tree"/* ]] || fail "the work directory $work lies inside $tree"
done
prefix=$work/prefix run=$work/run
mkdir -p "$run"

echo "--- cmake --install $build --prefix $prefix"
"$cmake" --install "$build" --prefix "$prefix" >"$work/install.log" || {
  cat "$work/install.log"
  fail "cmake --install failed"
}
for f in bin/caviar share/modulefiles/caviar/$version share/caviar/scripts/plot_gmm.py \
  share/caviar/scripts/plot_vae.py share/caviar/scripts/plot_hmm.py share/caviar/jobscripts/fit.sbatch \
  share/caviar/jobscripts/README.md share/caviar/python/caviar/__init__.py \
  share/doc/caviar/README.md share/doc/caviar/reproducibility.md; do
  [[ -e $prefix/$f ]] || fail "not installed: $prefix/$f"
done

# A python3 that logs which script it was asked to run: the binary runs plot_vae.py through it.
cat >"$work/python-logged" <<'PY'
#!/bin/sh
echo "$1" >>"$CAVIAR_SCRIPT_LOG"
exec /usr/bin/python3 "$@"
PY
chmod +x "$work/python-logged"

is_png() { [[ -s $1 && $(head -c 8 "$1" | od -An -tx1 | tr -d ' \n') == 89504e470d0a1a0a ]]; }

# The clean shell: nothing from the caller's environment but HOME, a system PATH and what mpirun
# needs to run as root (CI does).
clean() {
  env -i HOME="$HOME" PATH=/usr/bin:/bin OMP_NUM_THREADS=1 \
    OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
    LMOD_INIT="$lmod_init" PREFIX="$prefix" RUN="$run" VERSION="$version" \
    PYTHON_LOGGED="$work/python-logged" CAVIAR_SCRIPT_LOG="$work/scripts.log" \
    bash --noprofile --norc -c "$1"
}

echo "--- module load caviar; fit and plot in $run"
clean '
set -euo pipefail
fail() { echo "FAIL: $*" >&2; exit 1; }
source "$LMOD_INIT"
module use "$PREFIX/share/modulefiles"
module load caviar
module list 2>&1 | grep -q "caviar/$VERSION" || fail "module list does not show caviar/$VERSION"
[[ $(command -v caviar) == "$PREFIX/bin/caviar" ]] || fail "caviar resolves to $(command -v caviar)"
[[ ${CAVIAR_HOME:-} == "$PREFIX" ]] || fail "CAVIAR_HOME is \"${CAVIAR_HOME:-}\", not $PREFIX"
cd "$RUN"
caviar --version
caviar generate gmm --n 3000 --dim 4 --components 3 --seed 1 --out data.h5:/X
mpirun -n 2 caviar gmm fit --data data.h5:/X --components 4 --seed 1 --out model.h5 --labels labels.h5
# The plotting command of the README, from the installed copy.
/usr/bin/python3 "$CAVIAR_HOME/share/caviar/scripts/plot_gmm.py" --data data.h5:/X \
  --model model.h5 --labels labels.h5 --out fit.png
# A PNG the binary draws itself, through the logging python3 (D = 4: images of 2 x 2 pixels).
mpirun -n 2 caviar vae train --data data.h5:/X --likelihood gaussian --hidden 4 --latent 2 \
  --epochs 1 --batch-size 100 --seed 1 --out vae.h5
CAVIAR_PYTHON=$PYTHON_LOGGED caviar vae sample --model vae.h5 --n 4 --png samples.png
# The Python package, from the prefix and running the module'"'"'s binary.
/usr/bin/python3 -c "
import caviar, os
assert caviar.__file__.startswith(os.environ[\"PREFIX\"] + \"/\"), caviar.__file__
assert caviar.find_binary() == os.environ[\"PREFIX\"] + \"/bin/caviar\", caviar.find_binary()
print(\"python package:\", caviar.__file__)"
'
is_png "$run/fit.png" || fail "plot_gmm.py did not write a PNG"
is_png "$run/samples.png" || fail "caviar vae sample --png did not write a PNG"
[[ $(cat "$work/scripts.log") == "$prefix/share/caviar/scripts/plot_vae.py" ]] ||
  fail "the binary ran '$(cat "$work/scripts.log")', not the installed plot_vae.py"

echo "--- the prefix copied to another path"
moved=$work/moved
cp -a "$prefix" "$moved"
: >"$work/scripts.log"
clean "cd \"\$RUN\" && CAVIAR_PYTHON=\$PYTHON_LOGGED '$moved/bin/caviar' vae sample \
  --model vae.h5 --n 4 --png moved.png"
is_png "$run/moved.png" || fail "the moved binary did not write a PNG"
[[ $(cat "$work/scripts.log") == "$moved/share/caviar/scripts/plot_vae.py" ]] ||
  fail "the moved binary ran '$(cat "$work/scripts.log")', not its own plot_vae.py"

echo "--- the moved prefix without its plot_vae.py"
rm "$moved/share/caviar/scripts/plot_vae.py"
: >"$work/scripts.log"
if clean "cd \"\$RUN\" && CAVIAR_PYTHON=\$PYTHON_LOGGED '$moved/bin/caviar' vae sample \
  --model vae.h5 --n 4 --png missing.png" 2>"$work/missing.err"; then
  fail "the binary succeeded without its plot_vae.py (it found another one: $(cat "$work/scripts.log"))"
fi
cat "$work/missing.err"
grep -q "plot_vae.py not found" "$work/missing.err" || fail "no 'plot_vae.py not found' error"
[[ ! -e $run/missing.png && ! -s $work/scripts.log ]] || fail "output or a script run without plot_vae.py"

echo "PASS: installed, loaded with Lmod, fitted and plotted from $prefix; relocatable"
