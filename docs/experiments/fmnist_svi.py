#!/usr/bin/env -S /usr/bin/python3
"""A reduced version of issue 3 item 5 on Fashion-MNIST PCA-50: CAVI vs SVI (Robbins-Monro
delta=0.9 omega=1; adaptive tau0=500), K in {10, 30}, 3 initialisations (seeds 1-3), and an SVI
batch-size sweep (64, 256, 1024) at K=10. Writes results.json, a markdown table on stdout and
fmnist_elbo_time.png (full ELBO against fitting time, seed 1).

usage: fmnist_svi.py CAVIAR_BIN WORKDIR [--ranks 1]
"""
import argparse
import json
import os
import subprocess
import sys

import h5py
import numpy as np


def run(cmd):
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit("failed: %s\n%s" % (" ".join(cmd), r.stderr[-3000:]))
    return json.loads(r.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("caviar")
    ap.add_argument("workdir")
    ap.add_argument("--ranks", type=int, default=1)
    ap.add_argument("--seeds", type=int, default=3)
    a = ap.parse_args()
    os.makedirs(a.workdir, exist_ok=True)
    p = lambda f: os.path.join(a.workdir, f)
    mpi = ["mpirun", "-n", str(a.ranks), "--allow-run-as-root", "--oversubscribe"]
    data = p("fmnist.h5")
    if not os.path.exists(data):
        run([a.caviar, "prep", "fashion-mnist", "--out", data, "--pca", "50"])
    runs = []
    configs = []
    for k in (10, 30):
        configs.append(("cavi", k, 512, ["--algorithm", "cavi", "--tol", "1e-6"]))
        configs.append(("svi-rm", k, 512, ["--algorithm", "svi", "--schedule", "robbins-monro",
                                           "--delta", "0.9", "--omega", "1"]))
        configs.append(("svi-adaptive", k, 512, ["--algorithm", "svi", "--schedule", "adaptive",
                                                 "--tau0", "500"]))
    for b in (64, 1024):
        configs.append(("svi-rm", 10, b, ["--algorithm", "svi", "--schedule", "robbins-monro",
                                          "--delta", "0.9", "--omega", "1"]))
    for name, k, b, extra in configs:
        for seed in range(1, a.seeds + 1):
            out = p("%s_K%d_B%d_s%d.h5" % (name, k, b, seed))
            cmd = mpi + [a.caviar, "gmm", "fit", "--data", data + ":/train/pca", "--components",
                         str(k), "--seed", str(seed), "--init", "kmeans++", "--max-iter", "300",
                         "--heldout", data + ":/test/pca", "--out", out] + extra
            if name != "cavi":
                cmd[cmd.index("300")] = "30"  # epochs
                cmd += ["--batch-size", str(b), "--tol", "1e-5",
                        "--full-elbo-every", str(max(1, 60000 // b // 4))]
            js = run(cmd)
            runs.append(dict(method=name, K=k, B=b, seed=seed, elbo=js["elbo"],
                             heldout=js["heldout"], seconds=js["seconds"],
                             iterations=js["iterations"], stop=js["stop_reason"], file=out))
            print(runs[-1], flush=True)
    with open(p("results.json"), "w") as f:
        json.dump(runs, f, indent=1)
    print("\n| method | K | B | ELBO per point (mean ± s.e.) | held-out log pred. density (mean ± s.e.) | seconds (mean) | iterations/epochs |")
    print("|---|---|---|---|---|---|---|")
    for name, k, b, _ in configs:
        rs = [r for r in runs if r["method"] == name and r["K"] == k and r["B"] == b]
        e = np.array([r["elbo"] for r in rs]) / 60000
        h = np.array([r["heldout"] for r in rs])
        se = lambda v: v.std(ddof=1) / np.sqrt(len(v)) if len(v) > 1 else float("nan")
        print("| %s | %d | %s | %.4f ± %.4f | %.4f ± %.4f | %.1f | %s |" % (
            name, k, b if name != "cavi" else "-", e.mean(), se(e), h.mean(), se(h),
            np.mean([r["seconds"] for r in rs]), ",".join(str(r["iterations"]) for r in rs)))
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, k in zip(axes, (10, 30)):
        for name, b in (("cavi", 512), ("svi-rm", 512), ("svi-adaptive", 512)):
            with h5py.File(p("%s_K%d_B%d_s1.h5" % (name, k, b))) as f:
                if name == "cavi":
                    t, e = f["trace/seconds"][...], f["trace/elbo"][...]
                else:
                    t, e = f["trace/full_elbo_seconds"][...], f["trace/full_elbo"][...]
            ax.plot(t, e / 60000, label=name, marker="." if name != "cavi" else None)
        ax.set_xscale("log")
        ax.set_xlabel("fitting time (s, full-ELBO checks excluded)")
        ax.set_ylabel("full ELBO per point")
        ax.set_title("Fashion-MNIST PCA-50, K=%d, seed 1" % k)
        ax.legend()
    fig.tight_layout()
    fig.savefig(p("fmnist_elbo_time.png"), dpi=100)


if __name__ == "__main__":
    main()
