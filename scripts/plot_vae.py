#!/usr/bin/env -S /usr/bin/python3
"""PNG figures for caviar's VAE, drawn with Debian's matplotlib (run with /usr/bin/python3).

  plot_vae.py grid IMAGES.h5 --png OUT.png        # /images (n x D) from vae sample|reconstruct|manifold
  plot_vae.py curves MODEL.h5 [MODEL.h5 ...] --png OUT.png   # per-epoch train/test ELBO traces

`caviar vae sample|reconstruct|manifold --png` calls the first form itself.
"""
import argparse
import math
import sys

import h5py
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402


def tile(images, rows, cols, pad=1):
    """Square images (n x side^2) into one rows x cols mosaic with `pad` pixels between them."""
    n, d = images.shape
    side = int(round(math.sqrt(d)))
    if side * side != d:
        raise SystemExit(f"plot_vae.py: images have {d} pixels, not a square; cannot tile them")
    canvas = np.ones((rows * (side + pad) + pad, cols * (side + pad) + pad))
    for k in range(min(n, rows * cols)):
        r, c = divmod(k, cols)
        y, x = pad + r * (side + pad), pad + c * (side + pad)
        canvas[y:y + side, x:x + side] = images[k].reshape(side, side)
    return canvas


def grid(args):
    with h5py.File(args.images, "r") as f:
        images = np.asarray(f["images"], dtype=float)
        rows = int(f.attrs.get("grid_rows", 0))
        cols = int(f.attrs.get("grid_cols", 0))
        kind = f.attrs.get("kind", "")
        kind = kind.decode() if isinstance(kind, bytes) else str(kind)
    if rows <= 0 or cols <= 0:
        cols = int(math.ceil(math.sqrt(len(images))))
        rows = int(math.ceil(len(images) / cols))
    canvas = tile(np.clip(images, 0.0, 1.0), rows, cols)
    scale = args.pixel_scale
    fig = plt.figure(figsize=(canvas.shape[1] * scale / 100, canvas.shape[0] * scale / 100), dpi=100)
    ax = fig.add_axes([0, 0, 1, 1])
    ax.imshow(canvas, cmap="gray_r" if args.invert else "gray", vmin=0, vmax=1,
              interpolation="nearest")
    ax.axis("off")
    fig.savefig(args.png, dpi=100)
    print(f"wrote {args.png} ({kind}, {rows} x {cols})", file=sys.stderr)


def curves(args):
    fig, ax = plt.subplots(figsize=(6, 4))
    for path in args.models:
        with h5py.File(path, "r") as f:
            train = np.asarray(f["trace/train_elbo"])
            test = np.asarray(f["trace/test_elbo"])
            label = f"Z={int(f.attrs['latent'])}"
        epochs = np.arange(1, len(train) + 1)
        ax.plot(epochs, train, "-o", label=f"{label} train")
        if np.isfinite(test).any():
            ax.plot(epochs, test, "--s", label=f"{label} test")
    ax.set_xlabel("epoch")
    ax.set_ylabel("ELBO (nats per image)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(args.png, dpi=120)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("grid")
    g.add_argument("images")
    g.add_argument("--png", required=True)
    g.add_argument("--pixel-scale", type=float, default=3.0, help="screen pixels per image pixel")
    g.add_argument("--invert", action="store_true", help="dark ink on white")
    g.set_defaults(func=grid)
    c = sub.add_parser("curves")
    c.add_argument("models", nargs="+")
    c.add_argument("--png", required=True)
    c.set_defaults(func=curves)
    args = p.parse_args()
    args.func(args)


if __name__ == "__main__":
    main()
