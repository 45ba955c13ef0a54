#!/usr/bin/env -S /usr/bin/python3
"""Plot a Gibbs chain summarised by `caviar gmm summarize --plot OUT.png`.

usage: plot_gibbs_summary.py TABLE.json --png OUT.png

TABLE.json is what caviar writes for this script: {"sampler", "k", "d", "burn_in", "log_joint"
(per sweep), "counts" (sweeps x K, the chain's own labels), and for D = 2 "draws" {"means",
"covariances"} (relabelled to the reference's order; covariances empty for a collapsed chain) and
"reference" {"weights", "means", "covariances"}}. Panels:
  the log joint density per sweep, burn-in shaded;
  the points per component per sweep (the chain's labels: a label switch shows as crossing lines);
  for D = 2, every draw's 2-sigma ellipse of Sigma_k (faint; the collapsed chain: its means) over
  the reference's ellipses and means, one colour per reference component.
The PNG is written to a temporary name and renamed, so a failed run leaves no partial file.
"""

import os
import sys

import matplotlib

matplotlib.use("Agg")  # no display on compute nodes
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.collections import LineCollection  # noqa: E402
from plot_io import save_png, table_args  # noqa: E402

PROG = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "plot_gibbs_summary.py"


def outlines(means, covs, sd=2.0, points=64):
    """The sd-contours of N(means[i], covs[i]) as (n, points, 2) polylines: x = m + V sqrt(L) u
    over the unit circle u, with covs = V L V^T (all at once: one patch per draw is slow)."""
    vals, vecs = np.linalg.eigh(np.asarray(covs).reshape(-1, 2, 2))
    t = np.linspace(0, 2 * np.pi, points)
    circle = np.stack([np.cos(t), np.sin(t)])  # 2 x points
    scaled = vecs * np.sqrt(np.maximum(vals, 0))[:, None, :]
    return np.asarray(means).reshape(-1, 1, 2) + sd * np.einsum("nij,jp->npi", scaled, circle)


def traces(ax_lj, ax_counts, t):
    sweeps = np.arange(1, len(t["log_joint"]) + 1)
    for ax in (ax_lj, ax_counts):
        if t["burn_in"] > 0:
            ax.axvspan(0.5, t["burn_in"] + 0.5, color="0.9", label="burn-in")
        ax.set_xlabel("sweep")
        ax.grid(True, alpha=0.3)
    ax_lj.plot(sweeps, t["log_joint"], "-", lw=1)
    ax_lj.set_ylabel("log joint density")
    ax_lj.set_title("log joint per sweep")
    counts = np.asarray(t["counts"]).reshape(len(sweeps), t["k"])
    for k in range(t["k"]):
        ax_counts.plot(sweeps, counts[:, k], "-", lw=1, label=f"label {k + 1}")
    ax_counts.set_ylabel("points")
    ax_counts.set_title("points per component (chain's labels)")
    if t["k"] <= 10:
        ax_counts.legend(loc="best", fontsize="small")


def ellipses(ax, t):
    k = t["k"]
    ref = t["reference"]
    rm = np.asarray(ref["means"]).reshape(k, 2)
    rc = np.asarray(ref["covariances"]).reshape(k, 2, 2)
    dm = np.asarray(t["draws"]["means"]).reshape(-1, k, 2)
    dc = np.asarray(t["draws"]["covariances"])
    n = dm.shape[0]
    alpha = max(0.02, min(0.3, 10.0 / n))
    for j in range(k):
        color = f"C{j % 10}"
        if dc.size:
            lines = outlines(dm[:, j], dc.reshape(n, k, 2, 2)[:, j])
            ax.add_collection(LineCollection(lines, colors=color, linewidths=0.5, alpha=alpha))
        ax.plot(dm[:, j, 0], dm[:, j, 1], ".", ms=2, color=color, alpha=min(1.0, 3 * alpha))
    ax.add_collection(LineCollection(outlines(rm, rc), colors="k", linewidths=1.5,
                                     linestyles="--"))
    ax.plot(rm[:, 0], rm[:, 1], "x", color="k", ms=8)
    ax.autoscale_view()
    ax.set_aspect("equal", adjustable="datalim")
    ax.set_title(f"{n} draws over the reference (black), 2 sd")
    ax.grid(True, alpha=0.3)


def main():
    t, a = table_args(__doc__)
    if not t.get("log_joint"):
        sys.exit(f"{PROG}: no sweeps in {a.table}")
    two_d = "draws" in t
    fig, axes = plt.subplots(1, 3 if two_d else 2, figsize=(15 if two_d else 10, 4.5))
    traces(axes[0], axes[1], t)
    if two_d:
        ellipses(axes[2], t)
    fig.suptitle(f"gmm {t['sampler']} Gibbs chain: K = {t['k']}, D = {t['d']}")
    fig.tight_layout()
    save_png(fig, a.png)


if __name__ == "__main__":
    main()
