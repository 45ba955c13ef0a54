#!/usr/bin/env -S /usr/bin/python3
"""The PyTorch side of bench/bbvi_vs_torch.sh: the same full-rank reparameterisation ADVI as
`caviar bbvi fit --model logistic --family fullrank --estimator reparam` (Kucukelbir et al. 2017;
Titsias & Lazaro-Gredilla 2014), in double precision like caviar:

  theta = (w_1..w_D, b), prior N(0, s0^2 I); q = N(mu, L L^T), L lower triangular with its
  diagonal stored as log L_ii (Kucukelbir et al. 2017, section 2.5), starting at mu = 0, L = 0.1 I;
  each step B rows, one drawn uniformly in each of B equal strata of the N rows (row
  floor((j + u_j) N / B), as caviar's minibatches), and S draws theta_s = mu + L eps_s;
  ELBO_hat = mean_s [(N / B) sum_b log p(y_b | x_b, theta_s) + log p(theta_s)] + H(q);
  Adam (PyTorch's, the convention caviar's optimiser follows) on -ELBO_hat.

Every --elbo-every steps (outside the timed steps) the ELBO is estimated over ALL N rows with
--elbo-samples draws, with every constant, as caviar's --elbo-rows N estimate is, so the two
traces are on one scale.

Prints one JSON line: the median seconds per step (steps after the first --warmup), and the ELBO
trace as [step, elbo] pairs. Needs Debian's python3-torch (scripts/install_bench_deps.sh).
"""
import argparse
import json
import math
import sys
import time

import h5py
import numpy as np
import torch
import torch.nn.functional as F


def elbo_estimate(x, y, mu, L, logd, s0, draws, gen, chunk=250_000):
    """All-rows ELBO: mean over draws of log p(y, theta_s) + H(q), every constant kept."""
    p = mu.numel()
    eps = torch.randn(draws, p, generator=gen, dtype=x.dtype)
    theta = mu + eps @ L.T
    ll = torch.zeros(draws, dtype=x.dtype)
    for a in range(0, x.shape[0], chunk):
        eta = x[a:a + chunk] @ theta[:, :-1].T + theta[:, -1]
        ll += (y[a:a + chunk, None] * eta - F.softplus(eta)).sum(0)
    prior = -0.5 * p * math.log(2 * math.pi * s0 * s0) - 0.5 * (theta**2).sum(1) / s0**2
    entropy = 0.5 * p * (1 + math.log(2 * math.pi)) + logd.sum()
    return float((ll + prior).mean() + entropy)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True, help="FILE.h5 from `caviar generate glm` (/X, /y)")
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--batch-size", type=int, default=1024)
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--lr", type=float, default=0.01)
    ap.add_argument("--prior-scale", type=float, default=1.0)
    ap.add_argument("--elbo-every", type=int, default=250)
    ap.add_argument("--elbo-samples", type=int, default=4)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    gen = torch.Generator().manual_seed(a.seed + 1)  # the ELBO estimates' draws
    with h5py.File(a.data, "r") as f:
        x = torch.from_numpy(np.asarray(f["X"], dtype=np.float64))
        y = torch.from_numpy(np.asarray(f["y"], dtype=np.float64))
    n, d = x.shape
    p = d + 1
    mu = torch.zeros(p, dtype=torch.float64, requires_grad=True)
    off = torch.zeros(p * (p - 1) // 2, dtype=torch.float64, requires_grad=True)
    logd = torch.full((p,), math.log(0.1), dtype=torch.float64, requires_grad=True)
    rows, cols = torch.tril_indices(p, p, -1)
    opt = torch.optim.Adam([mu, off, logd], lr=a.lr)
    scale, s0 = n / a.batch_size, a.prior_scale

    def factor():
        return torch.zeros(p, p, dtype=torch.float64).index_put((rows, cols), off) + torch.diag(
            torch.exp(logd))

    times, trace = [], []
    for t in range(1, a.steps + 1):
        t0 = time.perf_counter()
        idx = ((torch.arange(a.batch_size, dtype=torch.float64)
                + torch.rand(a.batch_size, dtype=torch.float64)) * (n / a.batch_size)).long()
        idx = idx.clamp_(max=n - 1)
        xb, yb = x[idx], y[idx]
        theta = mu + torch.randn(a.samples, p, dtype=torch.float64) @ factor().T
        eta = xb @ theta[:, :d].T + theta[:, d]  # B x S
        f = scale * (yb[:, None] * eta - F.softplus(eta)).sum(0) - 0.5 * (theta**2).sum(1) / s0**2
        loss = -(f.mean() + logd.sum())  # the constants of the prior and entropy dropped
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        times.append(time.perf_counter() - t0)
        if t % a.elbo_every == 0 or t == a.steps:
            with torch.no_grad():
                trace.append([t, elbo_estimate(x, y, mu, factor(), logd, s0, a.elbo_samples, gen)])
            med = np.median(times[a.warmup:] or times)
            print(f"torch step {t:6d}  elbo {trace[-1][1]:.6e}  {med:.3e} s/step", file=sys.stderr,
                  flush=True)
    print(json.dumps({"peer": "torch", "version": torch.__version__, "threads": a.threads,
                      "seconds_per_step": float(np.median(times[a.warmup:])),
                      "seconds_steps": float(np.sum(times)), "steps": a.steps, "trace": trace}))


if __name__ == "__main__":
    main()
