#!/usr/bin/env -S /usr/bin/python3
"""Plot the CSVs of jobscripts/strong_scaling.sbatch and weak_scaling.sbatch (columns ranks,
threads, n, dim, components, iterations, seconds, seconds_per_iter) as one PNG: seconds per
iteration and parallel efficiency against the number of ranks.

  strong efficiency E(P) = t(1) / (P t(P));  weak efficiency E(P) = t(1) / t(P)

usage: plot_scaling.py [--strong S.csv] [--weak W.csv] --out scaling.png
"""
import argparse
import csv
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def load(path):
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    need = {"ranks", "seconds_per_iter"}
    if not rows or not need <= set(rows[0]):
        sys.exit(f"plot_scaling: {path}: expected a CSV with columns {sorted(need)} and data rows")
    rows.sort(key=lambda r: int(r["ranks"]))
    p = [int(r["ranks"]) for r in rows]
    t = [float(r["seconds_per_iter"]) for r in rows]
    if p[0] != 1:
        sys.exit(f"plot_scaling: {path}: the first row must be the 1-rank baseline")
    return p, t, rows[0]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--strong")
    ap.add_argument("--weak")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    studies = [(kind, path) for kind, path in (("strong", a.strong), ("weak", a.weak)) if path]
    if not studies:
        sys.exit("plot_scaling: give --strong and/or --weak")
    fig, axes = plt.subplots(len(studies), 2, figsize=(10, 4 * len(studies)), squeeze=False)
    for (kind, path), (ax_t, ax_e) in zip(studies, axes):
        p, t, first = load(path)
        eff = [t[0] / (pi * ti) if kind == "strong" else t[0] / ti for pi, ti in zip(p, t)]
        shape = f"N={first.get('n', '?')}{' per rank' if kind == 'weak' else ''}, " \
                f"D={first.get('dim', '?')}, K={first.get('components', '?')}"
        ax_t.plot(p, t, "o-", label="measured")
        if kind == "strong":
            ax_t.plot(p, [t[0] / pi for pi in p], "k--", lw=0.8, label="ideal")
        else:
            ax_t.axhline(t[0], color="k", ls="--", lw=0.8, label="ideal")
        ax_t.set_xscale("log", base=2)
        ax_t.set_yscale("log")
        ax_t.set_xlabel("MPI ranks")
        ax_t.set_ylabel("seconds per iteration")
        ax_t.set_title(f"{kind} scaling ({shape})")
        ax_t.legend()
        ax_e.plot(p, eff, "o-")
        ax_e.axhline(1.0, color="k", ls="--", lw=0.8)
        ax_e.set_xscale("log", base=2)
        ax_e.set_ylim(0, max(1.2, 1.1 * max(eff)))
        ax_e.set_xlabel("MPI ranks")
        ax_e.set_ylabel("parallel efficiency")
        ax_e.set_title(f"{kind} scaling efficiency")
    fig.tight_layout()
    fig.savefig(a.out, dpi=110)
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
