#!/usr/bin/env -S /usr/bin/python3
"""Plot the fits compared by `caviar <model> compare --plot OUT.png`.

usage: plot_compare.py TABLE.json --png OUT.png

TABLE.json is what caviar writes for this script: {"fits": [{"k", "objective", "objective_name",
"heldout", "heldout_name", "file", ...}, ...]}. Writes one PNG with two panels against K:
  left   the final objective (ELBO, or EM's log-likelihood) of every fit;
  right  the held-out score of every fit that recorded one (otherwise the panel says so).
Every fit is a point (several seeds at one K are several points); the line joins the best fit at
each K (the highest objective; the highest held-out score, or the lowest for perplexity), which is
the fit a user would keep. The PNG is written to a temporary name and renamed, so a failed run
leaves no partial file.
"""

import os
import sys

import matplotlib

matplotlib.use("Agg")  # no display on compute nodes
import matplotlib.pyplot as plt  # noqa: E402
from plot_io import save_png, table_args  # noqa: E402

PROG = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "plot_compare.py"

# Held-out metrics where smaller is better.
LOWER_IS_BETTER = {"perplexity"}
# What the attribute names caviar records mean, for the axis labels.
LABELS = {"elbo": "ELBO", "log_likelihood": "log-likelihood (EM)", "objective": "objective",
          "heldout_score": "held-out log predictive density per point",
          "perplexity": "held-out perplexity", "heldout": "held-out score"}


def panel(ax, fits, value, name, lower_is_better):
    pts = [(f["k"], f[value]) for f in fits if f.get(value) is not None]
    if not pts:
        ax.text(0.5, 0.5, "no held-out score recorded\nin these model files", ha="center",
                va="center", transform=ax.transAxes)
        ax.set_xlabel("K")
        return
    ks, vs = zip(*pts)
    ax.plot(ks, vs, "o", alpha=0.6, label="fits")
    best = {}
    for k, v in pts:
        if k not in best or (v < best[k] if lower_is_better else v > best[k]):
            best[k] = v
    kk = sorted(best)
    ax.plot(kk, [best[k] for k in kk], "-", color="C1", label="best per K")
    ax.set_xlabel("K")
    ax.set_ylabel(LABELS.get(name, name))
    ax.set_xticks(sorted(set(ks)))
    ax.grid(True, alpha=0.3)
    ax.legend(loc="best", fontsize="small")


def main():
    table, a = table_args(__doc__)
    fits = table["fits"]
    if not fits:
        sys.exit(f"{PROG}: no fits in {a.table}")
    obj_name = fits[0]["objective_name"]
    held = [f for f in fits if f.get("heldout") is not None]
    held_name = held[0]["heldout_name"] if held else "held-out score"
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    panel(left, fits, "objective", obj_name, False)
    left.set_title(f"final {LABELS.get(obj_name, obj_name)} against K")
    panel(right, fits, "heldout", held_name, held_name in LOWER_IS_BETTER)
    right.set_title(f"{LABELS.get(held_name, held_name)} against K")
    fig.suptitle(f"{fits[0]['model']}: {len(fits)} fits")
    fig.tight_layout()
    save_png(fig, a.png)


if __name__ == "__main__":
    main()
