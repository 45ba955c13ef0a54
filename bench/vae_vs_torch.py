#!/usr/bin/env -S /usr/bin/python3
"""The PyTorch side of bench/vae_vs_torch.sh: the same VAE as `caviar vae train` (Kingma &
Welling 2014 with the ReLU MLPs of Bruno 2022, section 4.3): x -> ReLU(H) -> (mu, log sigma^2) in
R^Z, z -> ReLU(H) -> Bernoulli logits, one reparameterised sample, analytic KL, Xavier-uniform
weights and zero biases, Adam(1e-3), float32.

Prints one JSON line: seconds per epoch (training passes only) and the final test ELBO.
Needs Debian's python3-torch (scripts/install_bench_deps.sh).
"""
import argparse
import json
import sys
import time

import h5py
import numpy as np
import torch
import torch.nn.functional as F
from torch import nn


class Vae(nn.Module):
    def __init__(self, d, h, z):
        super().__init__()
        self.enc = nn.Linear(d, h)
        self.mu = nn.Linear(h, z)
        self.logvar = nn.Linear(h, z)
        self.dec = nn.Linear(z, h)
        self.out = nn.Linear(h, d)
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.xavier_uniform_(m.weight)
                nn.init.zeros_(m.bias)

    def elbo_sum(self, x):
        h = F.relu(self.enc(x))
        mu, lv = self.mu(h), self.logvar(h)
        z = mu + torch.exp(0.5 * lv) * torch.randn_like(mu)
        logits = self.out(F.relu(self.dec(z)))
        loglik = -F.binary_cross_entropy_with_logits(logits, x, reduction="sum")
        kl = 0.5 * torch.sum(mu * mu + lv.exp() - 1.0 - lv)
        return loglik - kl


def train_epochs(model, x_train, x_test, a, label):
    """Adam(a.lr) on the mean negative ELBO over minibatches of a.batch_size rows in a fresh
    permutation each epoch, for a.epochs epochs; the test ELBO (evaluation mode) after each.
    Returns the training passes' seconds and the test ELBO per epoch. Shared with
    bench/cvae_vs_torch.py."""
    n = x_train.shape[0]
    opt = torch.optim.Adam(model.parameters(), lr=a.lr)
    train_seconds, trace = 0.0, []
    for epoch in range(1, a.epochs + 1):
        t0 = time.perf_counter()
        perm = torch.randperm(n)
        total = 0.0
        model.train()
        for b in range(0, n, a.batch_size):
            xb = x_train[perm[b:b + a.batch_size]]
            opt.zero_grad(set_to_none=True)
            elbo = model.elbo_sum(xb)
            (-elbo / xb.shape[0]).backward()
            opt.step()
            total += float(elbo)
        dt = time.perf_counter() - t0
        train_seconds += dt
        model.eval()
        with torch.no_grad():
            test = sum(float(model.elbo_sum(x_test[b:b + 1000]))
                       for b in range(0, len(x_test), 1000)) / len(x_test)
        trace.append(test)
        print(f"{label} epoch {epoch:3d}/{a.epochs}  train elbo {total / n:10.3f}  "
              f"test elbo {test:10.3f}  {dt:7.2f}s", file=sys.stderr, flush=True)
    return train_seconds, trace


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--data", required=True, help="FILE.h5 from `caviar prep fashion-mnist`")
    p.add_argument("--hidden", type=int, default=400)
    p.add_argument("--latent", type=int, default=20)
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--batch-size", type=int, default=100)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    with h5py.File(a.data, "r") as f:
        x_train = torch.from_numpy(np.asarray(f["train/images"], dtype=np.float32))
        x_test = torch.from_numpy(np.asarray(f["test/images"], dtype=np.float32))
    model = Vae(x_train.shape[1], a.hidden, a.latent)
    train_seconds, trace = train_epochs(model, x_train, x_test, a, f"torch x{a.threads}")
    print(json.dumps({"peer": "torch", "version": torch.__version__, "threads": a.threads,
                      "seconds_per_epoch": train_seconds / a.epochs, "test_elbo": trace[-1],
                      "epochs": a.epochs}))


if __name__ == "__main__":
    main()
