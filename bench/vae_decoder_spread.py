#!/usr/bin/env -S /usr/bin/python3
"""What q(decoder weights) of a `caviar vae train --bayesian-decoder` model does to its outputs.

Reads the model file with h5py and runs the MLP decoder in numpy (float64), independently of
caviar's code: ReLU hidden layers, Bernoulli logits. For the first --rows rows of the test data:

  - spread: the per-pixel standard deviation, over --draws weight draws w ~ q(w) (each weight and
    bias N(mean, exp(log_sigma)^2)), of the decoded Bernoulli means at a fixed z. Reported at
    z = the encoder's mean for each test image (reconstructions) and at z ~ N(0, I) (samples),
    averaged over pixels and rows, with the largest per-image value. For scale, the same spread
    over z ~ q(z | x) at the mean weights (the latent posterior's own uncertainty).
  - the test ELBO with the weights drawn: (1/R) sum_r E_q(w) E_q(z|x)[log p(x | z, w)] - KL(q(z|x))
    by Monte Carlo (one z per weight draw), next to the same at the mean weights, then minus the
    weights' KL per training row (the file's decoder_kl / n_samples): the per-image bound of the
    whole model, which caviar's own test ELBO (taken at the mean weights) does not include.

usage: vae_decoder_spread.py MODEL.h5 DATA.h5:/path [--rows 1000] [--draws 20] [--seed 0]
Prints a table and, last, a JSON line.
"""
import argparse
import json

import h5py
import numpy as np


_arrays = {}  # each array read from the model file once: every draw reuses the means and sigmas


def dense(f, name, draw, rng):
    def get(key):
        if key not in _arrays:
            _arrays[key] = np.asarray(f[key])
        return _arrays[key]

    w, b = get(name + "/W"), get(name + "/b")
    if draw and name + "/W_log_sigma" in f:
        w = w + np.exp(get(name + "/W_log_sigma")) * rng.standard_normal(w.shape)
        b = b + np.exp(get(name + "/b_log_sigma")) * rng.standard_normal(b.shape)
    return w, b


def decoder(f, draw, rng):
    """The decoder's layers, mean weights or one draw from q(w): a list of (W, b)."""
    hidden = len(f["architecture/hidden"])
    names = [f"decoder/hidden{l}" for l in range(hidden)] + ["decoder/logits"]
    return [dense(f, n, draw, rng) for n in names]


def logits(layers, z):
    h = z
    for l, (w, b) in enumerate(layers):
        h = h @ w.T + b
        if l + 1 < len(layers):
            h = np.maximum(h, 0)
    return h


def bernoulli_loglik(lg, x):
    # log sigmoid(l) x + log sigmoid(-l) (1 - x), stably: x l - softplus(l).
    return (x * lg - np.logaddexp(0, lg)).sum(axis=1)


def sigmoid(lg):
    return 0.5 * (1 + np.tanh(0.5 * lg))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("data")
    ap.add_argument("--rows", type=int, default=1000)
    ap.add_argument("--draws", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    rng = np.random.default_rng(a.seed)
    f = h5py.File(a.model, "r")
    if not int(f.attrs.get("bayesian_decoder", 0)):
        raise SystemExit(f"{a.model}: not a --bayesian-decoder model")
    if f.attrs["likelihood"] != "bernoulli" or "encoder/lower" in f:
        raise SystemExit("this script handles the Bernoulli MLP with a diagonal encoder only")
    path, _, key = a.data.partition(":")
    x = np.asarray(h5py.File(path, "r")[key or "/X"][: a.rows], dtype=np.float64)

    # The encoder (deterministic): mu and log sigma^2 of q(z | x).
    h = x
    l = 0
    while f"encoder/hidden{l}" in f:
        w, b = dense(f, f"encoder/hidden{l}", False, rng)
        h = np.maximum(h @ w.T + b, 0)
        l += 1
    w, b = dense(f, "encoder/mu", False, rng)
    mu = h @ w.T + b
    w, b = dense(f, "encoder/logvar", False, rng)
    lv = h @ w.T + b
    kl = 0.5 * (np.exp(lv) + mu**2 - 1 - lv).sum(axis=1)
    z_prior = rng.standard_normal(mu.shape)

    mean_layers = decoder(f, False, rng)
    at_mu, at_prior, lik_draw, lik_mean, over_z = [], [], [], [], []
    for _ in range(a.draws):
        layers = decoder(f, True, rng)
        at_mu.append(sigmoid(logits(layers, mu)))
        at_prior.append(sigmoid(logits(layers, z_prior)))
        z = mu + np.exp(0.5 * lv) * rng.standard_normal(mu.shape)
        lik_draw.append(bernoulli_loglik(logits(layers, z), x))
        lg = logits(mean_layers, z)
        lik_mean.append(bernoulli_loglik(lg, x))
        over_z.append(sigmoid(lg))

    def spread(stack):
        s = np.std(np.stack(stack), axis=0, ddof=1)  # rows x pixels
        return float(s.mean()), float(s.mean(axis=1).max())

    n_train = int(f.attrs["n_samples"])
    weights_kl = float(f.attrs["decoder_kl"]) / n_train
    elbo_draw = float(np.mean(np.mean(lik_draw, axis=0) - kl))
    elbo_mean = float(np.mean(np.mean(lik_mean, axis=0) - kl))
    out = {
        "rows": int(x.shape[0]),
        "draws": a.draws,
        "spread_weights_at_encoder_mean": spread(at_mu),
        "spread_weights_at_prior_z": spread(at_prior),
        "spread_latent_at_mean_weights": spread(over_z),
        "elbo_weights_drawn": elbo_draw,
        "elbo_mean_weights": elbo_mean,
        "weights_kl_per_row": weights_kl,
        "elbo_weights_drawn_minus_kl": elbo_draw - weights_kl,
    }
    print(f"{x.shape[0]} test rows, {a.draws} weight draws from q(w) (pixel values in [0, 1]):")
    for k in ("spread_weights_at_encoder_mean", "spread_weights_at_prior_z",
              "spread_latent_at_mean_weights"):
        print(f"  {k:34s} mean per-pixel sd {out[k][0]:.5f}   largest image mean {out[k][1]:.5f}")
    print(f"  test ELBO, weights drawn from q     {elbo_draw:10.3f}")
    print(f"  test ELBO, mean weights             {elbo_mean:10.3f}")
    print(f"  weights' KL per training row        {weights_kl:10.3f}")
    print(f"  ELBO, weights drawn, minus their KL {elbo_draw - weights_kl:10.3f}")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
