#!/usr/bin/env -S /usr/bin/python3
"""Plot a caviar Gaussian-mixture fit.

usage: plot_gmm.py --data F.h5:/X --model model.h5 [--labels labels.h5]
                   --out fit.png [--title T] [--max-points 50000]

Writes one PNG with two panels:
  left   the data coloured by label with a 2-sigma ellipse (from /covariances,
         i.e. W_k^-1/nu_k) for every component whose weight exceeds 1e-3,
         annotated with its index. D > 2: everything is projected onto the
         first two coordinates (the title says so). D = 1: points are drawn
         with a vertical jitter and the ellipses become +-2 sigma bars.
         Without --labels the points are coloured by the argmax of the
         Gaussian mixture (/weights, /means, /covariances) of the model.
  right  the ELBO trace /trace/elbo against the iteration number (starting
         at 0 when the trace has n_iter+1 entries, i.e. includes the ELBO of
         the initial posterior).
Data sets larger than --max-points are randomly subsampled (fixed seed) for
plotting; the model-derived labels are computed only for the plotted points.
"""

import argparse
import os
import sys

import numpy as np

from plot_io import UserError, open_h5, split_spec

PROG = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "plot_gmm.py"


def fail(msg):
    print("%s: error: %s" % (PROG, msg), file=sys.stderr)
    sys.exit(2)


def get_dataset(f, path, fname, what):
    import h5py
    if path not in f:
        raise UserError("%s file %s has no dataset %s" % (what, fname, path))
    d = f[path]
    if not isinstance(d, h5py.Dataset):
        raise UserError("%s:%s is a group, not a dataset" % (fname, path))
    return d


def read_rows(dset, idx, chunk=1 << 20):
    """Rows idx (sorted) of a 2-D or 1-D dataset, reading contiguous blocks so
    that huge files are streamed rather than loaded at once."""
    n = dset.shape[0]
    if idx is None:
        return np.asarray(dset[...])
    parts = []
    for start in range(0, n, chunk):
        stop = min(n, start + chunk)
        lo, hi = np.searchsorted(idx, [start, stop])
        if hi > lo:
            block = np.asarray(dset[start:stop])
            parts.append(block[idx[lo:hi] - start])
    return np.concatenate(parts, axis=0)


def load_inputs(args):
    dfile, dpath = split_spec(args.data)
    with open_h5(dfile, "data") as f:
        d = get_dataset(f, dpath, dfile, "data")
        if d.ndim != 2:
            raise UserError("data %s:%s has shape %s, expected 2-D (N, D)" % (dfile, dpath, d.shape))
        N, D = d.shape
        if N == 0 or D == 0:
            raise UserError("data %s:%s is empty (shape %s)" % (dfile, dpath, d.shape))
        idx = None
        if N > args.max_points:
            rng = np.random.default_rng(args.seed)
            idx = np.sort(rng.choice(N, size=args.max_points, replace=False))
        X = read_rows(d, idx).astype(np.float64)

    with open_h5(args.model, "model") as f:
        model = {}
        for name in ("weights", "means", "covariances"):
            model[name] = np.asarray(get_dataset(f, "/" + name, args.model, "model")[...], dtype=np.float64)
        model["trace"] = (np.asarray(f["trace/elbo"][...], dtype=np.float64).ravel()
                          if "trace/elbo" in f else None)
        model["attrs"] = {k: f.attrs[k] for k in f.attrs.keys()}
    w, mu, cov = model["weights"], model["means"], model["covariances"]
    if mu.ndim != 2 or w.shape != (mu.shape[0],):
        raise UserError("model %s: /means %s and /weights %s are inconsistent"
                        % (args.model, mu.shape, w.shape))
    K, Dm = mu.shape
    if Dm != D:
        raise UserError("model %s has D=%d but data %s:%s has D=%d" % (args.model, Dm, dfile, dpath, D))
    ct = attr_str(model["attrs"].get("covariance_type"))
    if ct is None:
        ct = "full" if cov.ndim == 3 else "diag"
    if ct == "full" and cov.shape != (K, D, D) or ct == "diag" and cov.shape != (K, D) \
            or ct not in ("full", "diag"):
        raise UserError("model %s: /covariances has shape %s, not valid for covariance_type %r"
                        % (args.model, cov.shape, ct))
    if ct == "diag":
        cov = np.stack([np.diag(c) for c in cov])
    model["cov_full"] = cov
    model["cov_type"] = ct

    labels = None
    if args.labels:
        lfile, lpath = split_spec(args.labels, default_path="/labels", what="--labels")
        with open_h5(lfile, "labels") as f:
            ld = get_dataset(f, lpath, lfile, "labels")
            if ld.ndim != 1 or ld.shape[0] != N:
                raise UserError("labels %s:%s has shape %s, expected (%d,)" % (lfile, lpath, ld.shape, N))
            labels = read_rows(ld, idx).astype(np.int64)
        if labels.size and (labels.min() < 0 or labels.max() >= K):
            raise UserError("labels %s:%s has values outside [0, %d)" % (lfile, lpath, K))
    return X, N, idx, labels, model


def attr_str(v):
    if v is None:
        return None
    if isinstance(v, bytes):
        return v.decode()
    if isinstance(v, np.ndarray):
        v = v.reshape(-1)[0] if v.size else ""
        return attr_str(v)
    return str(v)


def attr_num(v):
    try:
        return float(np.asarray(v).reshape(-1)[0])
    except (TypeError, ValueError, IndexError):
        return None


def gaussian_argmax(X, model):
    """argmax_k ln w_k + ln N(x | mean_k, cov_k), full dimension."""
    w, mu, cov = model["weights"], model["means"], model["cov_full"]
    K, D = mu.shape
    out = np.full((X.shape[0], K), -np.inf)
    for k in range(K):
        if not w[k] > 0:
            continue
        try:
            L = np.linalg.cholesky(cov[k])
        except np.linalg.LinAlgError:
            continue
        y = np.linalg.solve(L, (X - mu[k]).T)
        out[:, k] = (np.log(w[k]) - np.sum(np.log(np.diag(L)))
                     - 0.5 * np.einsum("ij,ij->j", y, y))
    return np.argmax(out, axis=1)


def colours(K):
    import matplotlib
    if K <= 10:
        cmap = matplotlib.colormaps["tab10"]
        return [cmap(i) for i in range(K)]
    if K <= 20:
        cmap = matplotlib.colormaps["tab20"]
        return [cmap(i) for i in range(K)]
    cmap = matplotlib.colormaps["turbo"]
    return [cmap(x) for x in np.linspace(0.05, 0.95, K)]


def plot(args, X, N, idx, labels, model):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Ellipse
    import matplotlib.patheffects as pe

    w, mu, cov = model["weights"], model["means"], model["cov_full"]
    K, D = mu.shape
    cols = colours(K)
    label_src = "labels file"
    if labels is None:
        labels = gaussian_argmax(X, model)
        label_src = "argmax of model"
    n = X.shape[0]

    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(14, 6), gridspec_kw=dict(width_ratios=[1.15, 1]))
    size = float(np.clip(60000.0 / max(n, 1), 1.0, 18.0))
    alpha = float(np.clip(3000.0 / max(n, 1), 0.25, 0.8))
    if D == 1:
        yj = np.random.default_rng(args.seed + 1).uniform(-1, 1, size=n)
        ax.scatter(X[:, 0], yj, s=size, c=[cols[l] for l in labels], alpha=alpha,
                   linewidths=0, rasterized=True)
    else:
        ax.scatter(X[:, 0], X[:, 1], s=size, c=[cols[l] for l in labels], alpha=alpha,
                   linewidths=0, rasterized=True)
    shown = 0
    stroke = [pe.withStroke(linewidth=4, foreground="black")]
    for k in range(K):
        if not w[k] > 1e-3:
            continue
        shown += 1
        if D == 1:
            s = 2.0 * np.sqrt(max(cov[k, 0, 0], 0.0))
            y = 1.15 + 0.12 * (shown % 3)
            ax.plot([mu[k, 0] - s, mu[k, 0] + s], [y, y], color=cols[k], lw=2.5,
                    path_effects=stroke)
            ax.text(mu[k, 0], y + 0.05, str(k), ha="center", va="bottom", fontsize=10,
                    fontweight="bold", bbox=dict(boxstyle="round,pad=0.15", fc="white", ec=cols[k]))
            continue
        C = cov[k][:2, :2]
        C = 0.5 * (C + C.T)
        evals, evecs = np.linalg.eigh(C)
        evals = np.clip(evals, 0.0, None)
        angle = np.degrees(np.arctan2(evecs[1, 1], evecs[0, 1]))
        ell = Ellipse(xy=mu[k, :2], width=4.0 * np.sqrt(evals[1]), height=4.0 * np.sqrt(evals[0]),
                      angle=angle, fill=False, lw=2.2, ec=cols[k], path_effects=stroke, zorder=3)
        ax.add_patch(ell)
        ax.plot(mu[k, 0], mu[k, 1], "x", color="black", ms=7, mew=2, zorder=4)
        ax.annotate(str(k), xy=(mu[k, 0], mu[k, 1]), xytext=(6, 6), textcoords="offset points",
                    fontsize=10, fontweight="bold", zorder=5,
                    bbox=dict(boxstyle="round,pad=0.15", fc="white", ec=cols[k], alpha=0.9))
    ax.set_xlabel("x[0]")
    ax.set_ylabel("x[1]" if D > 1 else "jitter")
    if D == 1:
        ax.set_yticks([])
    sub = "%d points" % N if idx is None else "%d of %d points (random subsample)" % (n, N)
    proj = ", projected onto x[0], x[1] (D=%d)" % D if D > 2 else ""
    ax.set_title("data (%s, colour: %s)%s\n2-sigma %s of %d/%d components with weight > 1e-3"
                 % (sub, label_src, proj, "bars" if D == 1 else "ellipses", shown, K), fontsize=9)
    ax.autoscale_view()

    tr = model["trace"]
    if tr is None or tr.size == 0:
        ax2.text(0.5, 0.5, "no /trace/elbo in model file", ha="center", va="center",
                 transform=ax2.transAxes)
        ax2.set_axis_off()
    else:
        # caviar stores T = n_iter + 1 values (iteration 0 = the ELBO of the
        # initial posterior); otherwise number the entries 1..T
        ni = attr_num(model["attrs"].get("n_iter"))
        first = 0 if ni is not None and tr.size == int(ni) + 1 else 1
        it = np.arange(first, first + tr.size)
        ax2.plot(it, tr, "-", color="tab:blue", marker="o" if tr.size <= 60 else None, ms=3)
        dec = np.where(np.diff(tr) < 0)[0]
        if dec.size:
            ax2.plot(it[dec + 1], tr[dec + 1], "v", color="red", ms=6,
                     label="%d decrease(s)" % dec.size)
            ax2.legend(loc="lower right", fontsize=8)
        ax2.set_xlabel("iteration")
        ax2.set_ylabel("ELBO")
        ax2.set_title("ELBO trace (final %.10g)" % tr[-1], fontsize=9)
        ax2.grid(alpha=0.3)
        ax2.ticklabel_format(axis="y", useOffset=False, style="plain")

    attrs = model["attrs"]
    title = args.title
    if title is None:
        parts = ["caviar gmm: K=%d, D=%d, %s covariance" % (K, D, model["cov_type"])]
        e = attr_num(attrs.get("elbo"))
        if e is not None:
            parts.append("ELBO=%.8g" % e)
        ni = attr_num(attrs.get("n_iter"))
        if ni is not None:
            conv = attr_num(attrs.get("converged"))
            parts.append("%d iterations%s" % (ni, "" if conv is None else
                                               (", converged" if conv else ", not converged")))
        r, t = attr_num(attrs.get("ranks")), attr_num(attrs.get("threads"))
        if r is not None and t is not None:
            parts.append("%d ranks x %d threads" % (r, t))
        title = "; ".join(parts)
    if D > 2:
        title += "  [projection onto first two coordinates]"
    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    plt.close(fig)


def main(argv=None):
    ap = argparse.ArgumentParser(description="Plot a caviar GMM fit (data + ellipses, ELBO trace).")
    ap.add_argument("--data", required=True, help="FILE.h5:/dataset with the (N, D) data")
    ap.add_argument("--model", required=True, help="model.h5 written by caviar gmm fit --out")
    ap.add_argument("--labels", default=None, help="labels.h5 (dataset /labels, or FILE.h5:/path)")
    ap.add_argument("--out", required=True, help="output PNG")
    ap.add_argument("--title", default=None)
    ap.add_argument("--max-points", type=int, default=50000, help="subsample to this many points")
    ap.add_argument("--seed", type=int, default=0, help="subsampling seed")
    args = ap.parse_args(argv)
    if args.max_points < 1:
        fail("--max-points must be positive")
    out_dir = os.path.dirname(os.path.abspath(args.out))
    if not os.path.isdir(out_dir):
        fail("output directory does not exist: %s" % out_dir)
    try:
        X, N, idx, labels, model = load_inputs(args)
        plot(args, X, N, idx, labels, model)
    except UserError as e:
        fail(str(e))
    print("wrote %s" % args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
