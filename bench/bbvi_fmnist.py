#!/usr/bin/env -S /usr/bin/python3
"""Bayesian softmax regression on Fashion-MNIST: `caviar bbvi fit --model softmax` (mean-field and
low-rank Gaussian q, reparameterisation gradient, Adam) against scikit-learn's LogisticRegression,
the MAP of the same posterior. Prints a markdown table of test accuracy, test mean log predictive
density and fit seconds.

The model (src/models/bbvi/glm.hpp): x = pixels / 255 (784 columns, as `caviar prep fashion-mnist`
writes them), y in 0..9, eta_c = w_c . x + b_c for every one of the C = 10 classes (no reference
class), theta = (W, b) with the prior N(0, s^2 I) on EVERY parameter, the intercepts included:
P = 10 x 785 = 7,850 parameters.

The MAP maximises sum_n log p(y_n | x_n, theta) - |theta|^2 / (2 s^2), i.e. minimises
s^2 sum_n (-log p) + |theta|^2 / 2, which is scikit-learn's objective C sum_n loss + |w|^2 / 2 at
C = s^2. scikit-learn never penalises its own intercept, so it gets a constant column of ones and
fit_intercept=False: its last weight per class is then caviar's b_c, under the same prior.

Test metrics, from the 10,000 test images:
  accuracy: the argmax of the predictive class probabilities;
  LPD: mean_n log p(y_n | x_n, data). For caviar that is log of the Monte-Carlo predictive
  p(y | x) = mean_s softmax(eta(theta_s))_y over --pred-samples draws of q (`bbvi predict`'s
  /mean; checked against its own /log_density); for the MAP, log softmax(eta(theta_MAP))_y.
Fit seconds: caviar's summary `seconds` (the optimisation and ELBO estimates, no data loading);
scikit-learn's wall time of `fit`. Everything at one thread (the script sets OMP_NUM_THREADS and
OPENBLAS_NUM_THREADS to 1; caviar runs without mpirun, one rank).

usage: bbvi_fmnist.py CAVIAR_BIN WORKDIR [--prior-scale 1.0] [--max-iter 6000] [--lr 0.003] [--optimizer adam|rm]
                      [--batch-size 1024] [--samples 8] [--rank 10] [--pred-samples 1000]
                      [--elbo-every 250] [--elbo-samples 20] [--map-iter 2000]
                      [--methods meanfield,lowrank,map] [--seed 1]

At the defaults each caviar fit takes 6-7 minutes at one thread (55-75 ms per step) and the MAP
about 5.5 (1,888 L-BFGS iterations to tol 1e-8); results: docs/experiments/bbvi.md.

WORKDIR receives fmnist.h5 (made by `caviar prep fashion-mnist` unless already there; needs the
Debian package dataset-fashion-mnist), the posteriors and the predictions.
"""
import argparse
import json
import os
import subprocess
import sys
import time

# One thread everywhere: numpy's BLAS reads these when it loads, so before the import.
os.environ["OMP_NUM_THREADS"] = os.environ["OPENBLAS_NUM_THREADS"] = "1"

import h5py  # noqa: E402
import numpy as np  # noqa: E402


def run(argv, env):
    t0 = time.perf_counter()
    r = subprocess.run(argv, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - t0
    if r.returncode != 0:
        sys.exit(f"FAILED: {' '.join(argv)}\n{r.stderr}")
    return r, wall


def summary(r):
    return json.loads(r.stdout.strip().splitlines()[-1])


def load_split(path, split):
    with h5py.File(path, "r") as f:
        return f[f"{split}/images"][...].astype(np.float64), f[f"{split}/labels"][...].astype(int)


def trace_report(post):
    """The ELBO trace's last estimates and the relative change of its mean between the third and
    the last quarter of the run: how flat it is."""
    with h5py.File(post, "r") as f:
        e = f["elbo_trace"][...]
        sd = f["sd"][...]
        steps = int(f.attrs["steps"])
    q = max(1, len(e) // 4)
    late, prev = e[-q:].mean(), e[-2 * q:-q].mean() if len(e) >= 2 * q else float("nan")
    print(f"  {post}: {steps} steps, {len(e)} ELBO estimates; last 5: "
          + ", ".join(f"{v:.5g}" for v in e[-5:]))
    print(f"  mean of the last quarter {late:.6g}, of the quarter before {prev:.6g} "
          f"(relative change {(late - prev) / abs(prev):+.2e}); sd of the last quarter "
          f"{e[-q:].std():.4g}")
    print(f"  q's marginal sds: min {sd.min():.3g}, median {np.median(sd):.3g}, max {sd.max():.3g}")
    return steps


def caviar_method(args, env, data, family, y_test):
    post = os.path.join(args.workdir, f"post_{family}.h5")
    pred = os.path.join(args.workdir, f"pred_{family}.h5")
    for p in (post, pred):
        if os.path.exists(p):
            os.remove(p)
    argv = [args.caviar, "bbvi", "fit", "--model", "softmax", "--classes", "10",
            "--data", f"{data}:/train/images", "--response", f"{data}:/train/labels",
            "--prior-scale", str(args.prior_scale), "--family", family,
            "--estimator", "reparam", "--samples", str(args.samples),
            "--batch-size", str(args.batch_size), "--optimizer", args.optimizer, "--lr", str(args.lr),
            "--max-iter", str(args.max_iter), "--tol", "0",
            "--elbo-every", str(args.elbo_every), "--elbo-rows", "20000",
            "--elbo-samples", str(args.elbo_samples), "--diagnostic-samples", "0",
            "--seed", str(args.seed), "--out", post]
    if family == "lowrank":
        argv[argv.index("--family") + 2:argv.index("--family") + 2] = ["--rank", str(args.rank)]
    print("$ " + " ".join(argv), flush=True)
    r, wall = run(argv, env)
    fit = summary(r)
    print(f"  fit: {fit['seconds']:.1f} s (wall {wall:.1f} s)")
    steps = trace_report(post)
    argv = [args.caviar, "bbvi", "predict", "--model", post, "--data", f"{data}:/test/images",
            "--response", f"{data}:/test/labels", "--samples", str(args.pred_samples),
            "--seed", str(args.seed), "--out", pred]
    print("$ " + " ".join(argv), flush=True)
    r, pwall = run(argv, env)
    ps = summary(r)
    with h5py.File(pred, "r") as f:
        prob = f["mean"][...]
        logd = f["log_density"][...]
    acc = float(np.mean(prob.argmax(1) == y_test))
    lpd = float(np.mean(np.log(prob[np.arange(len(y_test)), y_test])))
    # /log_density is log mean_s p(y | theta_s) in log-sum-exp form: the same number.
    gap = abs(lpd - float(np.mean(logd)))
    print(f"  predict: {pwall:.1f} s wall; accuracy {acc:.4f}, LPD {lpd:.5f} (caviar's summary: "
          f"{ps['accuracy']:.4f}, {ps['log_predictive_density']:.5f}; |from /mean - "
          f"/log_density| = {gap:.1e})")
    label = "caviar BBVI mean-field" if family == "meanfield" else \
        f"caviar BBVI low rank (r = {args.rank})"
    return {"method": label, "accuracy": acc, "lpd": lpd, "seconds": fit["seconds"],
            "steps": steps}


def map_method(args, x_train, y_train, x_test, y_test):
    from sklearn.linear_model import LogisticRegression
    ones = np.ones((x_train.shape[0], 1))
    xt = np.hstack([x_train, ones])
    xs = np.hstack([x_test, np.ones((x_test.shape[0], 1))])
    clf = LogisticRegression(penalty="l2", C=args.prior_scale ** 2, fit_intercept=False,
                             solver="lbfgs", multi_class="multinomial", max_iter=args.map_iter,
                             tol=1e-8)
    print(f"$ sklearn {clf!r} on the train images with a column of ones", flush=True)
    t0 = time.perf_counter()
    clf.fit(xt, y_train)
    secs = time.perf_counter() - t0
    prob = clf.predict_proba(xs)
    acc = float(np.mean(clf.classes_[prob.argmax(1)] == y_test))
    lpd = float(np.mean(np.log(prob[np.arange(len(y_test)), y_test])))
    # The MAP's objective, as caviar's log joint without the prior's constant.
    pt = clf.predict_proba(xt)
    ll = float(np.sum(np.log(pt[np.arange(len(y_train)), y_train])))
    pen = float(np.sum(clf.coef_ ** 2)) / (2 * args.prior_scale ** 2)
    print(f"  fit: {secs:.1f} s, {int(clf.n_iter_[0])} lbfgs iterations; train log-lik {ll:.6g}, "
          f"penalty {pen:.6g}; accuracy {acc:.4f}, LPD {lpd:.5f}")
    return {"method": f"scikit-learn LogisticRegression (MAP, C = {args.prior_scale ** 2:g})",
            "accuracy": acc, "lpd": lpd, "seconds": secs, "steps": int(clf.n_iter_[0])}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("caviar")
    ap.add_argument("workdir")
    ap.add_argument("--prior-scale", type=float, default=1.0)
    ap.add_argument("--max-iter", type=int, default=6000)
    ap.add_argument("--lr", default="0.003")
    ap.add_argument("--optimizer", default="adam", choices=["adam", "rm"])
    ap.add_argument("--batch-size", type=int, default=1024)
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--rank", type=int, default=10)
    ap.add_argument("--elbo-every", type=int, default=250)
    ap.add_argument("--elbo-samples", type=int, default=20)
    ap.add_argument("--pred-samples", type=int, default=1000)
    ap.add_argument("--map-iter", type=int, default=2000)
    ap.add_argument("--methods", default="meanfield,lowrank,map")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    methods = args.methods.split(",")
    for m in methods:
        if m not in ("meanfield", "lowrank", "map"):
            sys.exit(f"--methods: unknown method '{m}'")
    os.makedirs(args.workdir, exist_ok=True)
    env = dict(os.environ)  # OMP_NUM_THREADS=1, OPENBLAS_NUM_THREADS=1 (set above)
    print(f"load average at start: {os.getloadavg()}")

    data = os.path.join(args.workdir, "fmnist.h5")
    if not os.path.exists(data):
        run([args.caviar, "prep", "fashion-mnist", "--out", data], env)
    x_test, y_test = load_split(data, "test")
    print(f"data: {data}; test {x_test.shape}, pixels in [{x_test.min()}, {x_test.max()}]")

    rows = []
    for m in methods:
        if m == "map":
            x_train, y_train = load_split(data, "train")
            rows.append(map_method(args, x_train, y_train, x_test, y_test))
        else:
            rows.append(caviar_method(args, env, data, m, y_test))

    print(f"\nload average at end: {os.getloadavg()}")
    print(f"\nprior N(0, {args.prior_scale:g}^2) on every weight and intercept; caviar: reparam, "
          f"S = {args.samples}, batch {args.batch_size}, {args.optimizer} lr {args.lr}, "
          f"{args.max_iter} steps, "
          f"{args.pred_samples} predictive draws; 1 thread\n")
    print("| method | test accuracy | test mean log predictive density | fit seconds |")
    print("|---|---|---|---|")
    for r in rows:
        print(f"| {r['method']} | {r['accuracy']:.4f} | {r['lpd']:.4f} | {r['seconds']:.1f} |")


if __name__ == "__main__":
    main()
