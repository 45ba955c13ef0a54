#!/usr/bin/env -S /usr/bin/python3
"""caviar's convolutional VAE (`caviar vae train --arch conv`) against the same network in
PyTorch (Debian python3-torch), side by side in one run on Fashion-MNIST.

The network (Radford, Metz & Chintala 2016's stride-2 pattern, Bruno 2022, section 4.4), for
--channels c1,c2,... and --latent Z on 1 x s x s images:
  encoder  for each c: Conv2d(c_prev, c, 4, stride 2, padding 1) -> ReLU -> BatchNorm2d(c)
           (28 -> 14 -> 7 -> 3), flatten (NCHW), Linear(c_last h w, 2Z) = (mu, log sigma^2)
  sample   z = mu + exp(logvar / 2) eps, one per image
  decoder  Linear(Z, c_last h w) -> ReLU -> BatchNorm2d(c_last), then the encoder's convolutions
           mirrored as ConvTranspose2d(4, stride 2, padding 1, output_padding giving back the
           conv's input size) -> ReLU -> BatchNorm2d, the last one (to 1 channel, no ReLU or
           batch norm) giving Bernoulli logits
  loss     BCE with logits summed over pixels + analytic KL to N(0, I), mean over the batch;
           Adam, float32. Batch norm: eps 1e-5, momentum 0.1, batch statistics in training and
           the running ones in evaluation (PyTorch's defaults, which caviar copies)
  init     Xavier uniform (fan in and out times k^2 for a convolution), zero biases, batch norm
           gamma 1 and beta 0; the (mu, logvar) head as caviar draws it: each half like its own
           Linear(c_last h w, Z)

Runs PyTorch at each of --torch-threads (a subprocess each: this script with --torch-only) and
caviar at each of --caviar-runs (RxT: R MPI ranks x T OpenMP threads), then prints seconds per
epoch (training passes only; the per-epoch test evaluation is excluded on both sides), the test
ELBO after the last epoch (evaluation mode, one sample, mean over the test images), caviar's time
over PyTorch's, a small table, and a JSON summary as the last line of stdout. Progress and the
machine's load average go to stderr. --rows N trains on the first N training rows only (for
caviar through a subset HDF5 file written with h5py); the test set is always the whole one.

--torch-only --threads T: the PyTorch side alone, one JSON line (as bench/vae_vs_torch.py).
Needs Debian's python3-torch (scripts/install_bench_deps.sh) and a built caviar.
"""
import argparse
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np

HERE = Path(__file__).resolve().parent


# ---- the PyTorch side ------------------------------------------------------------------------

def build_model(d, channels, latent):
    import torch
    from torch import nn

    s = math.isqrt(d)
    if s * s != d:
        raise SystemExit(f"cvae_vs_torch: {d} columns are not a square image")

    class ConvVae(nn.Module):
        def __init__(self):
            super().__init__()
            enc, sizes, c, h = [], [], 1, s
            for co in channels:
                ho = (h + 2 - 4) // 2 + 1
                if ho < 1:
                    raise SystemExit(f"cvae_vs_torch: too many --channels for {s} x {s} images")
                enc += [nn.Conv2d(c, co, 4, 2, 1), nn.ReLU(), nn.BatchNorm2d(co)]
                sizes.append((c, h, co, ho))
                c, h = co, ho
            self.enc = nn.Sequential(*enc)
            self.shape = (c, h, h)
            features = c * h * h
            self.latent = latent
            self.head = nn.Linear(features, 2 * latent)
            self.project = nn.Linear(latent, features)
            self.bn_project = nn.BatchNorm2d(c)
            dec = []
            for i, (ci, hi, co, ho) in enumerate(reversed(sizes)):
                last = i == len(sizes) - 1
                # The adjoint of Conv2d(ci, co, 4, 2, 1) on hi x hi: back to hi x hi.
                pad_out = hi - ((ho - 1) * 2 - 2 + 4)
                dec.append(nn.ConvTranspose2d(co, 1 if last else ci, 4, 2, 1,
                                              output_padding=pad_out))
                if not last:
                    dec += [nn.ReLU(), nn.BatchNorm2d(ci)]
            self.dec = nn.Sequential(*dec)
            for m in self.modules():
                if isinstance(m, (nn.Linear, nn.Conv2d, nn.ConvTranspose2d)):
                    nn.init.xavier_uniform_(m.weight)
                    nn.init.zeros_(m.bias)
            # caviar draws the head's mu and logvar rows each as its own Linear(features, Z).
            bound = math.sqrt(6.0 / (features + latent))
            with torch.no_grad():
                self.head.weight.uniform_(-bound, bound)

        def elbo_sum(self, x):
            n = x.shape[0]
            hd = self.head(self.enc(x.view(n, 1, s, s)).flatten(1))
            mu, lv = hd[:, :self.latent], hd[:, self.latent:]
            z = mu + torch.exp(0.5 * lv) * torch.randn_like(mu)
            hmap = torch.relu(self.project(z)).view(n, *self.shape)
            logits = self.dec(self.bn_project(hmap)).flatten(1)
            loglik = -torch.nn.functional.binary_cross_entropy_with_logits(logits, x,
                                                                          reduction="sum")
            kl = 0.5 * torch.sum(mu * mu + lv.exp() - 1.0 - lv)
            return loglik - kl

    return ConvVae()


def torch_main(a):
    import torch

    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    with h5py.File(a.data, "r") as f:
        train = f["train/images"]
        rows = train.shape[0] if a.rows is None else min(a.rows, train.shape[0])
        x_train = torch.from_numpy(np.asarray(train[:rows], dtype=np.float32))
        x_test = torch.from_numpy(np.asarray(f["test/images"], dtype=np.float32))
    n = x_train.shape[0]
    model = build_model(x_train.shape[1], a.channels, a.latent)
    sys.path.insert(0, str(HERE))
    from vae_vs_torch import train_epochs  # the training loop both benchmarks share
    train_seconds, trace = train_epochs(model, x_train, x_test, a, f"torch x{a.threads}")
    params = {k: list(v.shape) for k, v in model.state_dict().items()
              if not k.endswith("num_batches_tracked")}
    print(json.dumps({"peer": "torch", "version": torch.__version__, "threads": a.threads,
                      "seconds_per_epoch": train_seconds / a.epochs, "test_elbo": trace[-1],
                      "epochs": a.epochs, "n": n,
                      "n_params": sum(p.numel() for p in model.parameters()),
                      "state_shapes": sorted(params.values())}))


# ---- the side-by-side run --------------------------------------------------------------------

def last_json(out, what):
    for line in reversed(out.splitlines()):
        line = line.strip()
        if line.startswith("{"):
            return json.loads(line)
    raise SystemExit(f"cvae_vs_torch: no JSON line from {what}")


def run_torch(a, threads):
    cmd = [sys.executable, str(Path(__file__).resolve()), "--torch-only", "--threads",
           str(threads), "--data", str(a.data), "--channels", a.channels_str, "--latent",
           str(a.latent), "--epochs", str(a.epochs), "--batch-size", str(a.batch_size),
           "--lr", str(a.lr), "--seed", str(a.seed)]
    if a.rows is not None:
        cmd += ["--rows", str(a.rows)]
    out = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True).stdout
    return last_json(out, f"torch x{threads}")


def caviar_param_shapes(path):
    """Shapes of the trained tensors in caviar's model file (its PyTorch-shaped W, b, gamma,
    beta and running statistics), for the check that both sides built the same network."""
    shapes = []
    with h5py.File(path, "r") as f:
        def visit(name, obj):
            leaf = name.rsplit("/", 1)[-1]
            if isinstance(obj, h5py.Dataset) and leaf in (
                    "W", "b", "gamma", "beta", "running_mean", "running_var"):
                shapes.append((name, list(obj.shape)))
        f.visititems(visit)
    return shapes


def run_caviar(a, train_ref, ranks, threads):
    out_file = Path(a.work) / f"cvae_{ranks}x{threads}.h5"
    args = [str(a.caviar), "vae", "train", "--arch", "conv", "--channels", a.channels_str,
            "--latent", str(a.latent), "--data", train_ref, "--test", f"{a.data}:/test/images",
            "--max-iter", str(a.epochs), "--batch-size", str(a.batch_size), "--lr", str(a.lr),
            "--seed", str(a.seed), "--out", str(out_file)]
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), OMPI_ALLOW_RUN_AS_ROOT="1",
               OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMPI_MCA_rmaps_base_oversubscribe="1")
    if ranks > 1:
        # Open MPI binds each rank to one core by default: fine for R x 1, not for R x T.
        args = ["mpirun", "-n", str(ranks)] + (["--bind-to", "none"] if threads > 1 else []) + args
    out = subprocess.run(args, check=True, stdout=subprocess.PIPE, text=True, env=env).stdout
    r = last_json(out, f"caviar {ranks}x{threads}")
    r["param_shapes"] = caviar_param_shapes(out_file)
    return r


def parse_runs(s):
    runs = []
    for item in s.split(","):
        r, _, t = item.strip().lower().partition("x")
        if not (r.isdigit() and t.isdigit() and int(r) > 0 and int(t) > 0):
            raise SystemExit(f"cvae_vs_torch: --caviar-runs wants RxT,... (got '{item}')")
        runs.append((int(r), int(t)))
    return runs


def load():
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def main_side_by_side(a):
    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    if not Path(a.caviar).exists():
        raise SystemExit(f"cvae_vs_torch: no caviar binary at {a.caviar}")
    a.data = Path(a.data) if a.data else work / "fmnist.h5"
    if not a.data.exists():
        subprocess.run([str(a.caviar), "prep", "fashion-mnist", "--out", str(a.data)],
                       check=True, stdout=subprocess.DEVNULL)
    torch_threads = [int(t) for t in a.torch_threads.split(",") if t.strip()]
    caviar_runs = parse_runs(a.caviar_runs)

    # caviar reads whole datasets: --rows N goes through a file holding the first N rows.
    train_ref = f"{a.data}:/train/images"
    subset = None
    with h5py.File(a.data, "r") as f:
        n_all = f["train/images"].shape[0]
        if a.rows is not None and a.rows < n_all:
            subset = work / f"fmnist_train_{a.rows}.h5"
            with h5py.File(subset, "w") as g:
                g.create_dataset("train/images", data=f["train/images"][:a.rows])
            train_ref = f"{subset}:/train/images"

    load_before = load()
    print(f"# machine load before: {load_before}", file=sys.stderr)
    try:
        torch_res = [run_torch(a, t) for t in torch_threads]
        caviar_res = [run_caviar(a, train_ref, r, t) for r, t in caviar_runs]
    finally:
        if subset is not None:
            subset.unlink()
    load_after = load()
    print(f"# machine load after: {load_after}", file=sys.stderr)

    # The same network on both sides: caviar's saved tensors (the head split into mu and logvar)
    # against PyTorch's: the same convolution kernels and the same number of parameters.
    same_net = None
    if torch_res and caviar_res:
        c_shapes = [s for _, s in caviar_res[0]["param_shapes"]]
        kernels = (sorted(s for s in torch_res[0]["state_shapes"] if len(s) == 4),
                   sorted(s for s in c_shapes if len(s) == 4))
        n_caviar = sum(math.prod(s) for n, s in caviar_res[0]["param_shapes"]
                       if not n.endswith(("running_mean", "running_var")))
        same_net = kernels[0] == kernels[1] and n_caviar == torch_res[0]["n_params"]
        if not same_net:
            print(f"# WARNING: not the same network: kernels torch {kernels[0]}, caviar "
                  f"{kernels[1]}; parameters torch {torch_res[0]['n_params']}, caviar {n_caviar}",
                  file=sys.stderr)

    # caviar's time over PyTorch's on the same two cores (the 2-thread run if there is one).
    base = next((t for t in torch_res if t["threads"] == 2), torch_res[0] if torch_res else None)
    t1 = next((t for t in torch_res if t["threads"] == 1), None)
    print(f"conv VAE, channels {a.channels_str}, latent {a.latent}, batch {a.batch_size}, "
          f"{torch_res[0]['n'] if torch_res else a.rows or n_all} training rows, "
          f"{a.epochs} epoch(s)")
    print(f"{'run':<28}{'s/epoch':>10}{'test ELBO':>12}{'ratio':>8}")
    rows = []
    for t in torch_res:
        s = t["seconds_per_epoch"]
        ratio = s / base["seconds_per_epoch"]
        label = f"torch {t['version']} x{t['threads']} thread" + ("s" if t["threads"] > 1 else "")
        print(f"{label:<28}{s:>10.2f}{t['test_elbo']:>12.2f}{ratio:>8.2f}")
        rows.append({"run": f"torch x{t['threads']}", "threads": t["threads"],
                     "seconds_per_epoch": s, "test_elbo": t["test_elbo"], "ratio": ratio})
    for (r, th), c in zip(caviar_runs, caviar_res):
        s = c["seconds_per_epoch"]
        label = f"caviar {r} rank{'s' if r > 1 else ''} x {th} thread{'s' if th > 1 else ''}"
        ratio = s / base["seconds_per_epoch"] if base else None
        line = f"{label:<28}{s:>10.2f}{c.get('test_elbo', float('nan')):>12.2f}"
        line += f"{ratio:>8.2f}" if ratio is not None else f"{'-':>8}"
        if t1 is not None and t1 is not base:
            line += f"   ({s / t1['seconds_per_epoch']:.2f} of torch x1)"
        print(line)
        rows.append({"run": f"caviar {r}x{th}", "ranks": r, "threads": th,
                     "seconds_per_epoch": s, "test_elbo": c.get("test_elbo"), "ratio": ratio,
                     "seconds_eval": c.get("seconds_eval")})
    if base is not None:
        print(f"ratio: seconds per epoch over torch x{base['threads']}'s "
              f"(training passes only, evaluation excluded)")
    print(json.dumps({"bench": "cvae_vs_torch", "channels": a.channels, "latent": a.latent,
                      "batch_size": a.batch_size, "lr": a.lr, "epochs": a.epochs,
                      "rows": torch_res[0]["n"] if torch_res else a.rows, "seed": a.seed,
                      "torch_version": torch_res[0]["version"] if torch_res else None,
                      "ratio_base": f"torch x{base['threads']}" if base else None,
                      "n_params_torch": torch_res[0]["n_params"] if torch_res else None,
                      "same_network": same_net, "load_before": load_before,
                      "load_after": load_after, "runs": rows}))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--caviar", default=str(HERE.parent / "build" / "caviar"),
                   help="caviar binary (default build/caviar)")
    p.add_argument("--data", help="FILE.h5 from `caviar prep fashion-mnist` "
                   "(default WORK/fmnist.h5, prepared if missing)")
    p.add_argument("--work", default=os.path.join(os.environ.get("TMPDIR", "/tmp"),
                                                  "caviar-cvae-bench"),
                   help="directory for the data, model files and the --rows subset")
    p.add_argument("--channels", default="32,64", help="conv output channels, comma-separated")
    p.add_argument("--latent", type=int, default=20)
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--rows", type=int, default=None, help="train on the first N rows only")
    p.add_argument("--batch-size", type=int, default=100)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--torch-threads", default="2,1",
                   help="PyTorch thread counts, comma-separated (default 2,1)")
    p.add_argument("--caviar-runs", default="1x2,2x1",
                   help="caviar RANKSxTHREADS runs, comma-separated (default 1x2,2x1)")
    p.add_argument("--torch-only", action="store_true",
                   help="the PyTorch side alone, at --threads, one JSON line")
    p.add_argument("--threads", type=int, default=2, help="with --torch-only")
    a = p.parse_args()
    a.channels_str = a.channels
    try:
        a.channels = [int(c) for c in a.channels.split(",")]
    except ValueError:
        raise SystemExit(f"cvae_vs_torch: --channels wants counts like 32,64 (got '{a.channels}')")
    if a.epochs < 1 or (a.rows is not None and a.rows < a.batch_size):
        raise SystemExit("cvae_vs_torch: needs --epochs >= 1 and --rows >= --batch-size")
    if a.torch_only:
        if not a.data:
            raise SystemExit("cvae_vs_torch: --torch-only needs --data")
        torch_main(a)
    else:
        main_side_by_side(a)


if __name__ == "__main__":
    main()
