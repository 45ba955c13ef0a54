#!/usr/bin/env -S /usr/bin/python3
"""Plot a caviar HMM fit: a few sequences coloured by their decoded states, and the objective trace.

usage: plot_hmm.py --model MODEL.h5 --data SEQS.h5 --paths PATHS.h5[:/states] --out FIT.png
                   [--sequences 4] [--max-steps 300] [--title T]

Writes one PNG (drawn with Debian's matplotlib; run with /usr/bin/python3):
  left   the first --sequences sequences of SEQS.h5 (/X, /offsets), one panel each, at most
         --max-steps steps of each: every step is drawn at its observation (the symbol for
         categorical emissions; x[0] for Gaussian ones, x[1] in grey when D > 1) and coloured by
         its state in PATHS.h5 (the Viterbi path written by `caviar hmm decode`), over a faint
         strip of the same colours;
  right  the model's trace/objective per iteration: the ELBO (cavi; svi: one estimate per pass)
         or the log-likelihood (em). Decreases are marked in red.

`caviar hmm decode --png FIT.png` runs this script on the file it has just written.
"""

import argparse
import os
import sys

import numpy as np

from plot_io import UserError, open_h5, split_spec

PROG = "plot_hmm.py"


def fail(msg):
    print("%s: error: %s" % (PROG, msg), file=sys.stderr)
    sys.exit(2)


def dataset(f, path, fname):
    import h5py
    if path not in f or not isinstance(f[path], h5py.Dataset):
        raise UserError("%s has no dataset %s" % (fname, path))
    return f[path]


def attr_str(v):
    if isinstance(v, bytes):
        return v.decode()
    if isinstance(v, np.ndarray):
        return attr_str(v.reshape(-1)[0]) if v.size else ""
    return "" if v is None else str(v)


def load(args):
    with open_h5(args.model, "model") as f:
        attrs = {k: f.attrs[k] for k in f.attrs.keys()}
        if attr_str(attrs.get("model")) != "hmm":
            raise UserError("%s is not a caviar hmm model file (its 'model' attribute is %r)"
                            % (args.model, attr_str(attrs.get("model"))))
        trace = (np.asarray(f["trace/objective"][...], dtype=np.float64).ravel()
                 if "trace/objective" in f else np.zeros(0))
        k = int(np.asarray(attrs.get("n_states", 0)).reshape(-1)[0])
    emission = attr_str(attrs.get("emission"))
    with open_h5(args.data, "data") as f:
        x_ds, off_ds = dataset(f, "/X", args.data), dataset(f, "/offsets", args.data)
        off = np.asarray(off_ds[...]).astype(np.int64).ravel()
        if off.size < 2 or off[0] != 0 or np.any(np.diff(off) <= 0) or off[-1] != x_ds.shape[0]:
            raise UserError("%s:/offsets must rise strictly from 0 to the %d steps of /X"
                            % (args.data, x_ds.shape[0]))
        want = emission == "categorical" and x_ds.ndim == 1 or emission == "gaussian" and x_ds.ndim == 2
        if not want:
            raise UserError("%s:/X has %d dimension(s), but the model's emissions are %s"
                            % (args.data, x_ds.ndim, emission))
        n = min(args.sequences, off.size - 1)
        # Only the steps drawn are read: the data file may be far larger than memory.
        spans = [(int(off[s]), int(min(off[s + 1], off[s] + args.max_steps))) for s in range(n)]
        xs = [np.asarray(x_ds[a:b], dtype=np.float64) for a, b in spans]
        total = int(off[-1])
    pfile, ppath = split_spec(args.paths, "/states")
    with open_h5(pfile, "paths") as f:
        p_ds = dataset(f, ppath, pfile)
        if p_ds.ndim != 1 or p_ds.shape[0] != total:
            raise UserError("%s:%s has shape %s, but %s has %d steps (give the --out of "
                            "`caviar hmm decode` on this data)" % (pfile, ppath, p_ds.shape,
                                                                  args.data, total))
        zs = [np.asarray(p_ds[a:b]).astype(np.int64) for a, b in spans]
    for s, z in enumerate(zs):
        if z.size and (z.min() < 0 or z.max() >= k):
            raise UserError("%s:%s holds states outside [0, %d) in sequence %d: not a path of "
                            "this %d-state model" % (pfile, ppath, k, s, k))
    return dict(attrs=attrs, trace=trace, k=k, emission=emission, xs=xs, zs=zs,
                lengths=np.diff(off[:n + 1]), n_total=off.size - 1)


def colours(k):
    import matplotlib
    name = "tab10" if k <= 10 else "tab20" if k <= 20 else None
    if name:
        cmap = matplotlib.colormaps[name]
        return [cmap(i) for i in range(k)]
    cmap = matplotlib.colormaps["turbo"]
    return [cmap(v) for v in np.linspace(0.05, 0.95, k)]


def plot(args, m):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import ListedColormap
    from matplotlib.patches import Patch

    k, xs, zs = m["k"], m["xs"], m["zs"]
    cols = colours(k)
    cmap = ListedColormap(cols)
    n = len(xs)
    fig = plt.figure(figsize=(14, 2.0 * n + 1.5))
    gs = fig.add_gridspec(n, 2, width_ratios=[2.2, 1])
    for s in range(n):
        ax = fig.add_subplot(gs[s, 0])
        x, z = xs[s], zs[s]
        t = np.arange(z.size)
        y = x if x.ndim == 1 else x[:, 0]
        lo, hi = float(np.min(y)), float(np.max(y))
        if x.ndim == 2 and x.shape[1] > 1:
            ax.plot(t, x[:, 1], "-", color="0.6", lw=0.8, label="x[1]")
            lo, hi = min(lo, float(np.min(x[:, 1]))), max(hi, float(np.max(x[:, 1])))
        pad = 0.08 * (hi - lo) + 0.5
        ax.imshow(z[None, :], aspect="auto", cmap=cmap, vmin=-0.5, vmax=k - 0.5, alpha=0.22,
                  extent=[-0.5, z.size - 0.5, lo - pad, hi + pad], interpolation="nearest")
        if x.ndim == 2:
            ax.plot(t, y, "-", color="0.25", lw=0.6)
        ax.scatter(t, y, c=[cols[v] for v in z], s=10 if z.size <= 400 else 4, linewidths=0,
                   zorder=3)
        ax.set_xlim(-0.5, z.size - 0.5)
        ax.set_ylim(lo - pad, hi + pad)
        shown = "" if z.size == m["lengths"][s] else " (first %d of %d steps)" % (z.size,
                                                                                  m["lengths"][s])
        ax.set_ylabel("symbol" if x.ndim == 1 else "x[0]")
        ax.set_title("sequence %d%s" % (s, shown), fontsize=9, loc="left")
        if s == n - 1:
            ax.set_xlabel("step")
    used = sorted(set(np.concatenate(zs).tolist())) if zs else []
    if used and len(used) <= 20:
        fig.legend(handles=[Patch(color=cols[v], label="state %d" % v) for v in used],
                   loc="lower center", ncol=min(len(used), 10), fontsize=8, frameon=False)

    ax2 = fig.add_subplot(gs[:, 1])
    tr = m["trace"]
    inference = attr_str(m["attrs"].get("inference")) or attr_str(m["attrs"].get("algorithm"))
    what = "log-likelihood" if inference == "em" else "ELBO"
    if tr.size == 0:
        ax2.text(0.5, 0.5, "no trace/objective in the model file", ha="center", va="center",
                 transform=ax2.transAxes)
        ax2.set_axis_off()
    else:
        it = np.arange(tr.size)
        ax2.plot(it, tr, "-", color="tab:blue", marker="o" if tr.size <= 60 else None, ms=3)
        dec = np.where(np.diff(tr) < 0)[0]
        if dec.size:
            ax2.plot(it[dec + 1], tr[dec + 1], "v", color="red", ms=6,
                     label="%d decrease(s)" % dec.size)
            ax2.legend(loc="lower right", fontsize=8)
        ax2.set_xlabel("pass" if inference == "svi" else "iteration")
        ax2.set_ylabel(what)
        ax2.set_title("%s trace (final %.10g)" % (what, tr[-1]), fontsize=9)
        ax2.grid(alpha=0.3)
        ax2.ticklabel_format(axis="y", useOffset=False, style="plain")
    title = args.title or ("caviar hmm: K=%d, %s emissions, %s; %d of %d sequences, coloured by "
                           "Viterbi state" % (k, m["emission"], inference or "?", n, m["n_total"]))
    fig.suptitle(title, fontsize=11)
    fig.tight_layout(rect=(0, 0.05 if used else 0, 1, 1))
    # Nothing half-written: draw into a temporary file beside the target, then rename it.
    tmp = args.out + ".tmp-plot_hmm.png"
    try:
        fig.savefig(tmp, dpi=100, format="png")
        os.replace(tmp, args.out)
    finally:
        plt.close(fig)
        if os.path.exists(tmp):
            os.remove(tmp)


def main(argv=None):
    ap = argparse.ArgumentParser(description="Plot a caviar HMM fit (decoded sequences, trace).")
    ap.add_argument("--model", required=True, help="model file written by caviar hmm fit --out")
    ap.add_argument("--data", required=True, help="sequences file (/X, /offsets)")
    ap.add_argument("--paths", required=True,
                    help="Viterbi paths: the --out of caviar hmm decode (FILE.h5[:/states])")
    ap.add_argument("--out", required=True, help="PNG to write")
    ap.add_argument("--sequences", type=int, default=4, help="how many sequences to draw")
    ap.add_argument("--max-steps", type=int, default=300, help="steps drawn per sequence")
    ap.add_argument("--title", default=None)
    args = ap.parse_args(argv)
    if args.sequences < 1 or args.max_steps < 1:
        fail("--sequences and --max-steps must be >= 1")
    out_dir = os.path.dirname(os.path.abspath(args.out))
    if not os.path.isdir(out_dir):
        fail("output directory does not exist: %s" % out_dir)
    try:
        plot(args, load(args))
    except UserError as e:
        fail(str(e))
    print("wrote %s" % args.out, file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
