#!/usr/bin/env -S /usr/bin/python3
"""CAVI vs SVI (Robbins-Monro delta=0.9 omega=1; adaptive tau0=500) on
Fashion-MNIST PCA-50 (train 60000, held-out test 10000) and on an STL-shaped synthetic set
(D=192, K=30, 90000 train / 10000 held out), in the spirit of Bruno 2022's Figure 2.4 and
Tables 2.2-2.3 (section 2.2.2).

Three modes.

Run (appends one record per fit to WORKDIR/results.json as soon as it finishes, and skips fits
already recorded there, so a crash or a kill loses at most the running fit):

    fmnist_svi.py [run] CAVIAR WORKDIR [--parts ksweep,batch,stl] [--seeds 1-5] [--stl-seeds 1]
                      [--methods cavi,svi-rm,svi-adaptive] [--ks 10,20]
                      [--stop-at HH:MM]

Collect (merges the work directories' results into fmnist_results.json and stl_results.json
next to this file):

    fmnist_svi.py collect WORKDIR [WORKDIR ...]

Report (reads the JSON, prints the markdown tables, writes them between the markers of
fmnist_svi.md, and draws the PNGs next to this file):

    fmnist_svi.py report RESULTS_JSON [RESULTS_JSON ...] [--old OLD_JSON]

Every fit is single-rank (OMP_NUM_THREADS=1). The 1-minute load average is recorded before and
after every fit, because the machine is shared and the times depend on it.
"""
import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
KS = (10, 20, 30, 40, 50)
BS = (64, 128, 256, 512, 1024)
METHODS = ("cavi", "svi-rm", "svi-adaptive")
# Caps (chosen to fit the compute budget; see fmnist_svi.md). SVI stops earlier by Bruno 2022's rule
# (epoch-average ELBO relative change < tol, or three decreasing epochs).
CAVI_TOL, CAVI_MAX = 1e-5, 100
SVI_TOL, SVI_EPOCHS = 1e-5, 8
STL_CAVI_MAX, STL_SVI_EPOCHS = 15, 3
# Runs "to convergence" (the parts stl-conv, stl-diag and fmnist-conv): the same stopping rules
# with caps meant to be out of reach (if one is hit, the stop reason says so). Fashion-MNIST
# CAVI uses tol 1e-6, as the earlier version's uncapped runs (Table F).
CONV = dict(stl=dict(cavi_tol=1e-5, cavi_max=300, svi_tol=1e-5, svi_epochs=40),
            fmnist=dict(cavi_tol=1e-6, cavi_max=2000, svi_tol=1e-5, svi_epochs=100))
# tau0 per batch size (part tau0): the adaptive schedule at K = 30 with the batch sweep's budget.
TAU0_BS, TAU0S, TAU0_DEFAULT = (64, 1024), (64, 500, 4096), 500.0
# STL-shaped set: caviar generate gmm (means ~ N(0, 16 I), covariances 0.5 I + A A^T / 2D) is far
# too well separated in D = 192 (the true-parameter classifier is 100% right, and still 98.8%
# with all means equal, from the covariances alone). We keep each point's component z and
# deviation e = x - mu_z, and build x' = S mu_z + sqrt(LAM) e + sqrt(1 - LAM) g, g ~ N(0, mean of
# the true covariances): again a Gaussian mixture, with means S mu_k and covariances
# LAM Sigma_k + (1 - LAM) Sigma_bar, so the clusters overlap.
STL_N, STL_TRAIN, STL_DIM, STL_K, STL_GEN_SEED = 100000, 90000, 192, 30, 7
STL_S, STL_LAM = 0.06, 0.3


THREADS = 1  # OpenMP threads per fit (--threads)


def mpi_env():
    env = dict(os.environ)
    env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_rmaps_base_oversubscribe="1", OMP_NUM_THREADS=str(THREADS))
    return env


def call(cmd):
    r = subprocess.run(cmd, capture_output=True, text=True, env=mpi_env())
    if r.returncode != 0:
        sys.exit("failed: %s\n%s" % (" ".join(cmd), r.stderr[-3000:]))
    return json.loads(r.stdout.strip().splitlines()[-1])


def prep_fmnist(caviar, wd):
    data = os.path.join(wd, "fmnist.h5")
    if not os.path.exists(data):
        call([caviar, "prep", "fashion-mnist", "--out", data, "--pca", "50"])
    return data + ":/train/pca", data + ":/test/pca", 60000


def prep_stl(caviar, wd):
    import h5py
    raw, data = os.path.join(wd, "stl_raw.h5"), os.path.join(wd, "stl.h5")
    info = os.path.join(wd, "stl_info.json")
    if not os.path.exists(data):
        if not os.path.exists(raw):
            call([caviar, "generate", "gmm", "--n", str(STL_N), "--dim", str(STL_DIM),
                  "--components", str(STL_K), "--seed", str(STL_GEN_SEED), "--out", raw])
        with h5py.File(raw, "r") as f:
            x, z = f["X"][...], f["labels"][...]
            mu, cov, w = f["true/means"][...], f["true/covariances"][...], f["true/weights"][...]
        sbar = cov.mean(0)
        g = np.random.default_rng(0).standard_normal(x.shape) @ np.linalg.cholesky(sbar).T
        y = STL_S * mu[z] + np.sqrt(STL_LAM) * (x - mu[z]) + np.sqrt(1 - STL_LAM) * g
        mu2, cov2 = STL_S * mu, STL_LAM * cov + (1 - STL_LAM) * sbar
        # How much the clusters overlap: accuracy of the true-parameter classifier, and the
        # true-parameter held-out log density (an upper reference for the fitted models).
        yt, zt = y[STL_TRAIN:], z[STL_TRAIN:]
        ll = np.empty((len(yt), STL_K))
        for k in range(STL_K):
            lk = np.linalg.cholesky(cov2[k])
            r = np.linalg.solve(lk, (yt - mu2[k]).T)
            ll[:, k] = (np.log(w[k]) - np.log(np.diag(lk)).sum() - 0.5 * (r * r).sum(0)
                        - 0.5 * STL_DIM * np.log(2 * np.pi))
        m = ll.max(1, keepdims=True)
        lse = (m[:, 0] + np.log(np.exp(ll - m).sum(1)))
        resp = np.exp(ll - lse[:, None])
        with open(info, "w") as f:
            json.dump(dict(S=STL_S, LAM=STL_LAM, gen_seed=STL_GEN_SEED,
                           bayes_accuracy=float((ll.argmax(1) == zt).mean()),
                           mean_max_responsibility=float(resp.max(1).mean()),
                           true_heldout=float(lse.mean())), f)
        with h5py.File(data + ".tmp", "w") as f:
            f["train/X"] = y[:STL_TRAIN]
            f["test/X"] = y[STL_TRAIN:]
        os.replace(data + ".tmp", data)
    return data + ":/train/X", data + ":/test/X", STL_TRAIN


def key(r):
    """A fit's identity. The capped sweep's records (no run tag, tau0 500) keep their old keys."""
    k = "%s|%s|K%d|B%d|s%d" % (r["data"], r["method"], r["K"], r["B"], r["seed"])
    if r.get("run", "capped") != "capped":
        k += "|" + r["run"]
    if r.get("tau0", TAU0_DEFAULT) != TAU0_DEFAULT or r.get("run") == "tau0":
        k += "|tau%g" % r.get("tau0", TAU0_DEFAULT)
    return k


def posterior_summary(path, n):
    """From a model file alone: the components' counts N_k (alpha_k - alpha0, largest first), how
    many hold at least 1% of the rows, and the ELBO split into its data term
    sum_n ln sum_k rho_nk (per row) and KL(q(theta) || p(theta)) (per row). The KL comes from the
    independent NumPy reference (tests/python/gmm_reference.py, Bishop 10.73-10.77), so the split
    also cross-checks that caviar's ELBO is the bound of the posterior it wrote."""
    sys.path.insert(0, os.path.join(HERE, "..", "..", "tests", "python"))
    import gmm_reference as g
    m = g.load_model(path)
    t = g._theta_terms(m)
    kl = -(t["e_ln_p_pi"] + t["e_ln_p_mulam"] - t["e_ln_q_pi"] - t["e_ln_q_mulam"])
    nk = np.sort(m["posterior"]["alpha"] - m["prior"]["alpha0"])[::-1]
    elbo = float(m["attrs"]["elbo"])
    return dict(nk=[round(float(v), 1) for v in nk], active=int((nk >= 0.01 * n).sum()),
                kl_per_point=kl / n, data_per_point=(elbo + kl) / n)


def fit(caviar, wd, data, train, test, n, method, k, b, seed, trace, cavi_max, svi_epochs,
        run="capped", cavi_tol=CAVI_TOL, svi_tol=SVI_TOL, tau0=TAU0_DEFAULT, checks=None,
        save_resp=False, init="kmeans++"):
    """One fit; returns its record. checks: full-ELBO checks per SVI epoch when trace is set
    (default 2 on Fashion-MNIST, 1 on the STL-shaped set; may be fractional). save_resp writes the
    final responsibilities next to the model (for the stl-diag restarts)."""
    import h5py
    tag = "" if run == "capped" else "_" + run
    tag += "" if tau0 == TAU0_DEFAULT else "_tau%g" % tau0
    out = os.path.join(wd, "%s_%s_K%d_B%d_s%d%s.h5" % (data, method, k, b, seed, tag))
    cmd = [caviar, "gmm", "fit", "--data", train, "--components", str(k), "--seed", str(seed),
           "--init", init, "--heldout", test, "--out", out]
    if save_resp:
        cmd += ["--labels", out[:-3] + "_resp.h5", "--save-responsibilities"]
    if method.startswith("cavi"):
        cmd += ["--algorithm", "cavi", "--tol", str(cavi_tol), "--max-iter", str(cavi_max)]
    else:
        cmd += ["--algorithm", "svi", "--batch-size", str(b), "--tol", str(svi_tol),
                "--max-iter", str(svi_epochs)]
        if method == "svi-rm":
            cmd += ["--schedule", "robbins-monro", "--kappa", "0.9", "--tau0", "1"]
        else:
            cmd += ["--schedule", "adaptive", "--tau0", "%g" % tau0]
        if checks is None:
            checks = 1 if data == "stl" else 2
        if trace:  # full ELBO `checks` times per epoch (STL: a check costs a CAVI iteration);
            # the clock is paused during the checks, so they are not in the times
            cmd += ["--full-elbo-every", str(max(1, int(round(n / b / checks))))]
    load0, w0 = os.getloadavg()[0], time.time()
    js = call(cmd)
    rec = dict(data=data, method=method, K=k, B=b if not method.startswith("cavi") else 0,
               seed=seed, elbo=js["elbo"], elbo_per_point=js["elbo"] / n, heldout=js["heldout"],
               seconds=js["seconds"], wall=time.time() - w0, iterations=js["iterations"],
               steps=js.get("steps"), stop=js["stop_reason"], converged=js["converged"],
               load1_start=load0, load1_end=os.getloadavg()[0], n=n,
               cap=cavi_max if method.startswith("cavi") else svi_epochs)
    if run != "capped":
        rec.update(run=run, threads=THREADS, init=init if init in ("kmeans++", "random") else
                   "file", tol=cavi_tol if method.startswith("cavi") else svi_tol)
    if tau0 != TAU0_DEFAULT or run == "tau0":
        rec["tau0"] = tau0
    with h5py.File(out, "r") as f:
        if method.startswith("cavi"):
            e, t = f["trace/elbo"][...], f["trace/seconds"][...]
            rec["last_rel_change"] = float(abs(e[-1] - e[-2]) / abs(e[-1])) if len(e) > 1 else None
        else:
            ep = f["trace/epoch_elbo"][...]
            rec["last_rel_change"] = (float(abs(ep[-1] - ep[-2]) / abs(ep[-1]))
                                      if len(ep) > 1 else None)
            if "trace/full_elbo" in f:
                e, t = f["trace/full_elbo"][...], f["trace/full_elbo_seconds"][...]
                st = f["trace/full_elbo_step"][...]
                # Full-ELBO gain per point per epoch at the end (the last two checks), to show
                # how far from converged a capped run is.
                rec["last_epoch_gain_per_point"] = (
                    float((e[-1] - e[-2]) / (st[-1] - st[-2]) * (n / b) / n)
                    if len(e) > 1 else None)
            else:
                e = t = None
            if run == "panels":
                # Figure 7: the epoch-average stochastic ELBO (Bruno 2022, eq. 2.52) at each epoch's
                # end, and the step size rho_t, at most ~400 steps spaced evenly in log time.
                ts, rho = f["trace/seconds"][...], f["trace/rho"][...]
                spe = -(-n // b)  # steps per epoch
                rec["epoch_seconds"] = [round(float(ts[min(len(ts), (i + 1) * spe) - 1]), 3)
                                        for i in range(len(ep))]
                rec["epoch_elbo_per_point"] = [round(float(v) / n, 5) for v in ep]
                idx = np.unique(np.geomspace(1, len(ts), 400).astype(int) - 1)
                rec["rho_seconds"] = [round(float(ts[i]), 4) for i in idx]
                rec["rho"] = [float("%.5g" % rho[i]) for i in idx]
        if trace and e is not None:
            rec["trace_seconds"] = [round(float(v), 3) for v in t]
            rec["trace_elbo_per_point"] = [round(float(v) / n, 5) for v in e]
    if run != "capped":
        rec.update(posterior_summary(out, n))
    return rec


def plan(parts, seeds, stl_seeds, tau0_seeds):
    """Fits (dicts of fit()'s arguments) in run order: seed-major inside each part, so a part cut
    short by the deadline still has every configuration at the first seeds."""
    todo = []

    def add(data, m, k, b, s, trace, **kw):
        todo.append(dict(data=data, method=m, K=k, B=b, seed=s, trace=trace, **kw))
    if "ksweep" in parts:
        for s in seeds:
            for k in KS:
                for m in METHODS:
                    add("fmnist", m, k, 512, s, k == 30)
    if "batch" in parts:
        for s in seeds:
            for b in BS:
                if b != 512:  # B = 512 at K = 30 is part of the K sweep
                    for m in METHODS[1:]:
                        add("fmnist", m, 30, b, s, False)
    if "stl" in parts:
        for s in stl_seeds:
            for m in METHODS:
                add("stl", m, 30, 512, s, True)
    if "stl-conv" in parts:  # RM keeps its final responsibilities for stl-diag's restart
        for s in stl_seeds:
            for m in METHODS:
                add("stl", m, 30, 512, s, True, run="conv", save_resp=m == "svi-rm")
    if "stl-diag" in parts:
        # Why RM's ELBO beats CAVI's: CAVI restarted from RM's final responsibilities (does
        # CAVI keep RM's solution?), and a single Gaussian (K = 1) for scale.
        add("stl", "cavi", 1, 512, 1, True, run="diag")
        for s in stl_seeds:
            add("stl", "cavi-from-svi-rm", 30, 512, s, True, run="diag",
                init_from="stl_svi-rm_K30_B512_s%d_conv_resp.h5" % s)
    if "fmnist-conv" in parts:
        for s in seeds:
            for m in METHODS:
                add("fmnist", m, 30, 512, s, True, run="conv", checks=1)
    # The K and batch sweeps run to convergence (Tables M, N), with fmnist-conv's rules; its
    # K = 30, B = 512 fits are that configuration, so it is not fitted again here.
    if "ksweep-conv" in parts:
        for s in seeds:
            for k in KS:
                if k != 30:
                    for m in METHODS:
                        add("fmnist", m, k, 512, s, False, run="sweep")
    if "batch-conv" in parts:
        for s in seeds:
            for b in BS:
                if b != 512:
                    for m in METHODS[1:]:
                        add("fmnist", m, 30, b, s, False, run="sweep")
    if "panels" in parts:  # Bruno 2022's Figures 2.4b and 2.5, one initialisation as there
        for m in METHODS:
            add("fmnist", m, 30, 512, 1, True, run="panels", checks=1)
    if "tau0" in parts:  # tau0 = 500 again too: the batch sweep's fits ran an older build
        for s in tau0_seeds:
            for b in TAU0_BS:
                for tau in TAU0S:
                    add("fmnist", "svi-adaptive", 30, b, s, False, tau0=float(tau), run="tau0")
    return todo


def load_runs(res_path):
    return json.load(open(res_path)) if os.path.exists(res_path) else []


def save_runs(res_path, add=None, update=None):
    """Appends a record (add) or merges fields into the record of the same key (update), under a
    lock and re-reading the file first, so that several processes may share a work directory."""
    import fcntl
    with open(res_path + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        runs = load_runs(res_path)
        if add is not None:
            runs.append(add)
        if update is not None:
            for r in runs:
                if key(r) == key(update):
                    r.update(update)
        with open(res_path + ".tmp", "w") as f:
            json.dump(runs, f, indent=0)
        os.replace(res_path + ".tmp", res_path)


def claim(wd, kk):
    """Claims fit kk for this process, so that several processes given the same plan and work
    directory share it out instead of fitting the same configuration twice. A claim is a file
    holding the claimer's pid; a claim whose process is gone (killed, or failed) is taken over."""
    d = os.path.join(wd, "claims")
    os.makedirs(d, exist_ok=True)
    path = os.path.join(d, kk.replace("|", "_"))
    for _ in range(2):
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            try:
                pid = int(open(path).read() or 0)
                os.kill(pid, 0)  # raises if no such process
                return False
            except (ProcessLookupError, ValueError):
                os.remove(path)  # stale: retry once
                continue
        os.write(fd, str(os.getpid()).encode())
        os.close(fd)
        return True
    return False


def parse_seeds(text):
    a, _, b = text.partition("-")
    return list(range(int(a), int(b or a) + 1))


def run(a):
    global THREADS
    THREADS = a.threads
    os.makedirs(a.workdir, exist_ok=True)
    res_path = os.path.join(a.workdir, "results.json")
    datasets = {}
    for p in plan(a.parts.split(","), parse_seeds(a.seeds), parse_seeds(a.stl_seeds),
                  parse_seeds(a.tau0_seeds)):
        d, m, k, b, s = p["data"], p["method"], p["K"], p["B"], p["seed"]
        if m not in a.methods.split(",") or (a.ks and str(k) not in a.ks.split(",")):
            continue
        kk = key(dict(p, B=b if not m.startswith("cavi") else 0))
        if kk in {key(r) for r in load_runs(res_path)}:  # re-read: another process may share it
            continue
        if a.stop_at and time.strftime("%H:%M", time.gmtime()) >= a.stop_at:
            print("stop-at %s reached; not starting %s" % (a.stop_at, kk), flush=True)
            break
        if d not in datasets:
            datasets[d] = (prep_fmnist if d == "fmnist" else prep_stl)(a.caviar, a.workdir)
        train, test, n = datasets[d]
        run_tag = p.get("run", "capped")
        kw = dict(run=run_tag, tau0=p.get("tau0", TAU0_DEFAULT), checks=p.get("checks"),
                  save_resp=p.get("save_resp", False))
        if run_tag in ("capped", "tau0"):  # tau0: the batch sweep's budget
            caps = (STL_CAVI_MAX, STL_SVI_EPOCHS) if d == "stl" else (CAVI_MAX, SVI_EPOCHS)
        else:  # conv, diag and sweep: run to convergence
            c = CONV[d]
            caps = (c["cavi_max"], c["svi_epochs"])
            kw.update(cavi_tol=c["cavi_tol"], svi_tol=c["svi_tol"])
        if "init_from" in p:
            src = os.path.join(a.workdir, p["init_from"])
            if not os.path.exists(src):
                print("skip %s: %s not there (run stl-conv's svi-rm first)" % (kk, src),
                      flush=True)
                continue
            kw["init"] = src + ":/responsibilities"
        if not claim(a.workdir, kk):
            continue
        rec = fit(a.caviar, a.workdir, d, train, test, n, m, k, b, s, p["trace"], *caps, **kw)
        save_runs(res_path, add=rec)
        print("%s elbo/pt %.4f heldout %.4f %.1fs it %d %s load %.1f%s" % (
            kk, rec["elbo_per_point"], rec["heldout"], rec["seconds"], rec["iterations"],
            rec["stop"], rec["load1_start"],
            " active %d kl/pt %.3f" % (rec["active"], rec["kl_per_point"]) if "active" in rec
            else ""), flush=True)


# ----------------------------------------------------------------------------------- report


def mse(v):
    v = np.asarray(v, float)
    se = v.std(ddof=1) / np.sqrt(len(v)) if len(v) > 1 else float("nan")
    return v.mean(), se


def pm(v, sep=" ± "):
    """Mean ± standard error of v for the tables; one value has no standard error, so it says
    '(1 seed)' instead of printing nan. sep="paren" gives Bruno 2022's 'mean (s.e.)' style."""
    mu, se = mse(v)
    if len(v) < 2:
        return "%.3f (1 seed)" % mu
    return ("%.3f (%.3f)" % (mu, se)) if sep == "paren" else ("%.3f%s%.3f" % (mu, sep, se))


def seed_style(fm):
    """The compact held-out tables in Bruno 2022's style (its Tables 2.3 and 2.2): methods by K at
    B = 512, and the SVI schedules by B at K = 30, as mean (s.e.) over the seeds."""
    def cell(rs):
        return pm([r["heldout"] for r in rs], "paren") if rs else "not run"
    out = ["| | " + " | ".join("K = %d" % k for k in KS) + " |", "|---|" + "---|" * len(KS)]
    for m in METHODS:
        out.append("| %s | %s |" % (NAMES[m], " | ".join(
            cell(sel(fm, method=m, K=k, B=0 if m == "cavi" else 512)) for k in KS)))
    out += ["\n| | " + " | ".join("B = %d" % b for b in BS) + " |", "|---|" + "---|" * len(BS)]
    for m in METHODS[1:]:
        out.append("| %s | %s |" % (NAMES[m], " | ".join(
            cell(sel(fm, method=m, K=30, B=b)) for b in BS)))
    return out


def sel(runs, **kw):
    return sorted([r for r in runs if all(r[k] == v for k, v in kw.items())],
                  key=lambda r: r["seed"])


NAMES = {"cavi": "CAVI", "svi-rm": "SVI Robbins–Monro", "svi-adaptive": "SVI adaptive",
         "cavi-from-svi-rm": "CAVI from RM's responsibilities"}


def stops(rs):
    c = {}
    for r in rs:
        c[r["stop"]] = c.get(r["stop"], 0) + 1
    return ", ".join("%s %d" % kv for kv in sorted(c.items()))


def row(rs, label, k, b):
    return "| %s | %d | %s | %d | %s | %s | %.1f | %.1f | %s | %.1f–%.1f |" % (
        label, k, b or "–", len(rs), pm([r["elbo_per_point"] for r in rs]),
        pm([r["heldout"] for r in rs]), np.mean([r["seconds"] for r in rs]),
        np.mean([r["iterations"] for r in rs]), stops(rs),
        min(r["load1_start"] for r in rs), max(r["load1_end"] for r in rs))


HEAD = ("| method | K | B | seeds | ELBO per point | held-out log pred. density | fit s (mean) "
        "| iterations / epochs (mean) | stop reasons | load (1 min) |\n"
        "|---|---|---|---|---|---|---|---|---|---|")


def method_table(runs):
    """HEAD and one mean ± s.e. row per method present in `runs` (K = 30, B = 512 for SVI)."""
    out = [HEAD]
    for m in METHODS:
        rs = sel(runs, method=m)
        if rs:
            out.append(row(rs, NAMES[m], 30, 0 if m == "cavi" else 512))
    return out


def tables(runs, old):
    out = []
    fm = [r for r in runs if r["data"] == "fmnist"]
    out.append("### Table A. Fashion-MNIST PCA-50: K sweep (B = 512 for SVI)\n")
    out.append("Mean ± standard error over the initialisations (seeds).\n")
    out.append(HEAD)
    for k in KS:
        for m in METHODS:
            rs = sel(fm, method=m, K=k, B=0 if m == "cavi" else 512)
            if rs:
                out.append(row(rs, NAMES[m], k, 0 if m == "cavi" else 512))
    out.append("\n### Table B. Fashion-MNIST PCA-50: batch-size sweep (K = 30)\n")
    out.append(HEAD)
    for m in METHODS[1:]:
        for b in BS:
            rs = sel(fm, method=m, K=30, B=b)
            if rs:
                out.append(row(rs, NAMES[m], 30, b))
    st = [r for r in runs if r["data"] == "stl"]
    if st:
        out.append("\n### Table C. STL-shaped synthetic set (D = 192, K = 30, 90000 / 10000)\n")
        out.extend(method_table(st))
    # Compact tables (held-out only), like Bruno 2022's Tables 2.2 and 2.3.
    out.append("\n### Table D. Held-out log predictive density, in Bruno 2022's style "
               "(mean (s.e.))\n")
    out.extend(seed_style(fm))
    # How far from converged the capped runs were.
    out.append("\n### Table E. Convergence at the cap\n")
    out.append("Runs that stopped at their cap (`max-iter`), and for the SVI runs with a full-ELBO "
               "trace (K = 30, B = 512; STL) the full-ELBO gain per point over their last epoch. "
               "For SVI, *last relative change* is that of the epoch average as these runs "
               "computed it, a plain mean of the steps, which the later fix replaced (Table O); "
               "the capped runs' fits themselves are unchanged by it, as no stopping rule "
               "ended them.\n")
    out.append("| data | method | K | B | cap | stopped at cap | last-epoch full-ELBO gain per "
               "point (mean) | last relative change (mean) |")
    out.append("|---|---|---|---|---|---|---|---|")
    groups = sorted({(r["data"], r["method"], r["K"], r["B"]) for r in runs},
                    key=lambda g: (g[0], METHODS.index(g[1]), g[2], g[3]))
    for d, m, k, b in groups:
        rs = sel(runs, data=d, method=m, K=k, B=b)
        gains = [r["last_epoch_gain_per_point"] for r in rs
                 if r.get("last_epoch_gain_per_point") is not None]
        rel = [r["last_rel_change"] for r in rs if r.get("last_rel_change") is not None]
        out.append("| %s | %s | %d | %s | %d | %d of %d | %s | %s |" % (
            d, NAMES[m], k, b or "–", rs[0]["cap"], sum(r["stop"] == "max-iter" for r in rs),
            len(rs), "%.4f" % np.mean(gains) if gains else "–",
            "%.1e" % np.mean(rel) if rel else "–"))
    if old:
        out.append("\n### Table F. The earlier 30-epoch SVI runs (previous version, 3 seeds, "
                   "`fmnist_results_v1.json`)\n")
        out.append("Same data and methods, CAVI at tol 1e-6 without a cap, SVI capped at 30 "
                   "epochs; no load was recorded then (it was 3–7).\n")
        out.append("| method | K | B | seeds | ELBO per point | held-out | fit s (mean) "
                   "| iterations / epochs (mean) | stop reasons |")
        out.append("|---|---|---|---|---|---|---|---|---|")
        for k in (10, 30):
            for m in METHODS:
                rs = sorted([r for r in old if r["method"] == m and r["K"] == k
                             and r["B"] == 512], key=lambda r: r["seed"])
                if rs:
                    out.append("| %s | %d | %s | %d | %s | %s | %.1f | %.1f "
                               "| %s |" % (NAMES[m], k, "–" if m == "cavi" else 512, len(rs),
                                           pm([r["elbo"] / 60000 for r in rs]),
                                           pm([r["heldout"] for r in rs]),
                                           np.mean([r["seconds"] for r in rs]),
                                           np.mean([r["iterations"] for r in rs]), stops(rs)))
    # Time-matched view of Figure 1: when did CAVI pass each SVI run's final full ELBO?
    tr = [r for r in runs if "trace_seconds" in r]
    if tr:
        out.append("\n### Table G. Time-matched, from the traces (same data, K = 30, same seed)\n")
        out.append("For each SVI run: its final fitting time and full ELBO per point, CAVI's "
                   "ELBO at that time (same seed), and the time at which CAVI first passed the "
                   "SVI run's final ELBO. Each run had its own load, so the times are noisy.\n")
        out.append("| data | seed | SVI schedule | SVI end s | SVI final ELBO | CAVI ELBO at that "
                   "time | CAVI passes it at s |")
        out.append("|---|---|---|---|---|---|---|")
        for v in sorted([r for r in tr if r["method"] != "cavi"],
                        key=lambda r: (r["data"], r["seed"], r["method"])):
            cs = [c for c in tr if c["method"] == "cavi" and c["data"] == v["data"]
                  and c["seed"] == v["seed"] and c["K"] == v["K"]]
            if not cs:
                continue
            c, t, e = cs[0], v["trace_seconds"][-1], v["trace_elbo_per_point"][-1]
            at = (float(np.interp(t, c["trace_seconds"], c["trace_elbo_per_point"]))
                  if t >= c["trace_seconds"][0] else float("nan"))
            cross = [ts for ts, ce in zip(c["trace_seconds"], c["trace_elbo_per_point"]) if ce > e]
            out.append("| %s | %d | %s | %.1f | %.3f | %.3f | %s |" % (
                v["data"], v["seed"], NAMES[v["method"]], t, e, at,
                "%.1f" % cross[0] if cross else "never (within its cap)"))
    loads = [r["load1_start"] for r in runs] + [r["load1_end"] for r in runs]
    out.append("\nAll %d fits: 1-minute load average %.1f–%.1f (median %.1f) on 2 cores." % (
        len(runs), min(loads), max(loads), float(np.median(loads))))
    return "\n".join(out)


def is_capped(r):
    """The capped sweep (Tables A-G): no run tag and the default tau0."""
    return r.get("run", "capped") == "capped"


def seed_rows(rs):
    """One line per fit, with the ELBO split (data term and KL per row) and the components."""
    out = ["| method | K | seed | ELBO per point | data term | KL(q‖p) | components ≥ 1% "
           "| held-out | fit s | iter. / epochs | stop | threads | load (1 min) |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rs:
        out.append("| %s | %d | %d | %.3f | %.3f | %.3f | %d | %.3f | %.1f | %d | %s | %d | "
                   "%.1f–%.1f |" % (
                       NAMES[r["method"]], r["K"], r["seed"], r["elbo_per_point"],
                       r["data_per_point"], r["kl_per_point"], r["active"], r["heldout"],
                       r["seconds"], r["iterations"], r["stop"], r.get("threads", 1),
                       r["load1_start"], r["load1_end"]))
    return out


def reach_time(r, target):
    """First fitting time at which a run's full-ELBO trace is >= target (per point), or None."""
    for t, e in zip(r["trace_seconds"], r["trace_elbo_per_point"]):
        if e >= target:
            return t
    return None


def conv_tables(runs):
    out = []
    order = {m: i for i, m in enumerate(METHODS + ("cavi-from-svi-rm",))}

    def by(rs):
        return sorted(rs, key=lambda r: (order[r["method"]], r["K"], r["seed"]))
    st = [r for r in runs if r["data"] == "stl" and r.get("run") == "conv"]
    if st:
        c = CONV["stl"]
        out.append("### Table H. STL-shaped set, run to convergence (K = 30, B = 512)\n")
        out.append("CAVI tol %g (cap %d iterations); SVI tol %g on the epoch-average ELBO or three "
                   "decreasing epochs (cap %d epochs). Per seed; *data term* is "
                   "Σₙ ln Σₖ ρₙₖ per row, *KL(q‖p)* the KL divergence of q(π, μ, Λ) from the "
                   "prior per row (ELBO = data term − KL), *components ≥ 1%%* how many "
                   "components hold at least 1%% of the rows (N_k = α_k − α₀).\n" % (
                       c["cavi_tol"], c["cavi_max"], c["svi_tol"], c["svi_epochs"]))
        out.extend(seed_rows(by(st)))
        out.append("\nMean ± s.e. over the seeds:\n")
        out.extend(method_table(st))
    dg = [r for r in runs if r["data"] == "stl" and r.get("run") == "diag"]
    if dg:
        out.append("\n### Table I. STL-shaped set: where Robbins–Monro's ELBO comes from\n")
        out.append("CAVI (tol %g, cap %d) restarted from the final responsibilities of the "
                   "converged Robbins–Monro run of the same seed (`--init "
                   "FILE.h5:/responsibilities`), and CAVI with a single component (K = 1).\n"
                   % (CONV["stl"]["cavi_tol"], CONV["stl"]["cavi_max"]))
        out.extend(seed_rows(by(dg)))
        rm = {r["seed"]: r for r in st if r["method"] == "svi-rm"}
        pairs = [(r, rm[r["seed"]]) for r in by(dg)
                 if r["method"] == "cavi-from-svi-rm" and r["seed"] in rm]
        if pairs:
            out.append("\n| seed | RM final ELBO | CAVI from RM's responsibilities | change |")
            out.append("|---|---|---|---|")
            for r, v in pairs:
                out.append("| %d | %.3f | %.3f | %+.3f |" % (
                    r["seed"], v["elbo_per_point"], r["elbo_per_point"],
                    r["elbo_per_point"] - v["elbo_per_point"]))
    chk = [r for r in by(st + dg) if "reference_elbo_per_point" in r]
    if chk:
        out.append("\nThe same ELBOs recomputed by the independent NumPy reference "
                   "(`tests/python/gmm_reference.py`, its own E-step over all %d training rows) "
                   "from the model files (`fmnist_svi.py check`):\n" % chk[0]["n"])
        out.append("| method | seed | caviar's ELBO per point | reference | difference |")
        out.append("|---|---|---|---|---|")
        for r in chk:
            out.append("| %s | %d | %.6f | %.6f | %.1e |" % (
                NAMES[r["method"]], r["seed"], r["elbo_per_point"],
                r["reference_elbo_per_point"],
                r["elbo_per_point"] - r["reference_elbo_per_point"]))
    fm = [r for r in runs if r["data"] == "fmnist" and r.get("run") == "conv"]
    if fm:
        c = CONV["fmnist"]
        out.append("\n### Table J. Fashion-MNIST PCA-50, run to convergence (K = 30, B = 512)\n")
        out.append("CAVI tol %g (cap %d iterations); SVI tol %g or three decreasing epochs (cap "
                   "%d epochs), one full-ELBO check per epoch (not in the times).\n" % (
                       c["cavi_tol"], c["cavi_max"], c["svi_tol"], c["svi_epochs"]))
        out.extend(method_table(fm))
        out.append("\nPer seed:\n")
        out.extend(seed_rows(by(fm)))
        cv = {r["seed"]: r for r in fm if r["method"] == "cavi"}
        if cv:
            out.append("\n### Table K. Time to reach within 0.1% of converged CAVI's ELBO "
                       "(Fashion-MNIST, K = 30, same seed)\n")
            out.append("Target: CAVI's final ELBO per point minus 0.1% of its magnitude. Times "
                       "are fitting seconds from the full-ELBO traces (SVI: one check per "
                       "epoch, so its time is rounded up to an epoch end); *never* means not "
                       "within the run.\n")
            out.append("The last two columns give the SVI run's end (fitting seconds) and when "
                       "CAVI first passed that run's final ELBO.\n")
            out.append("| seed | CAVI final ELBO | target | CAVI reaches it at s | RM reaches it "
                       "at s | adaptive reaches it at s | RM final | adaptive final "
                       "| RM / adaptive end s | CAVI passes RM / adaptive final at s |")
            out.append("|---|---|---|---|---|---|---|---|---|---|")
            for s_ in sorted(cv):
                c_ = cv[s_]
                tgt = c_["elbo_per_point"] - 1e-3 * abs(c_["elbo_per_point"])
                cells, finals, ends, passes = [], [], [], []
                for m in ("svi-rm", "svi-adaptive"):
                    v = [r for r in fm if r["method"] == m and r["seed"] == s_]
                    if v and "trace_seconds" in v[0]:
                        t = reach_time(v[0], tgt)
                        cells.append("never" if t is None else "%.1f" % t)
                        finals.append("%.3f" % v[0]["elbo_per_point"])
                        ends.append("%.1f" % v[0]["seconds"])
                        tp = reach_time(c_, v[0]["trace_elbo_per_point"][-1])
                        passes.append("never" if tp is None else "%.1f" % tp)
                    else:
                        cells.append("not run")
                        finals.append("–")
                        ends.append("–")
                        passes.append("–")
                tc = reach_time(c_, tgt)
                out.append("| %d | %.3f | %.3f | %s | %s | %s | %s | %s | %s | %s |" % (
                    s_, c_["elbo_per_point"], tgt, "%.1f" % tc if tc is not None else "never",
                    cells[0], cells[1], finals[0], finals[1], " / ".join(ends),
                    " / ".join(passes)))
    tu = [r for r in runs if r["data"] == "fmnist" and r.get("run") == "tau0"]
    tseeds = sorted({r["seed"] for r in tu})
    if tseeds:
        out.append("\n### Table L. Adaptive schedule: tau0 per batch size (Fashion-MNIST, K = 30)"
                   "\n")
        out.append("The batch sweep's budget (%d epochs, stopping rule as there), seeds %s, all "
                   "with the same build (tau0 = 500 rerun; the batch sweep's own fits, Table B, "
                   "ran an older and slower build under more load).\n" % (
                       SVI_EPOCHS, ", ".join(str(v) for v in tseeds)))
        out.append("| B | tau0 | seeds | ELBO per point | held-out | fit s (mean) | stop reasons "
                   "| load (1 min) |")
        out.append("|---|---|---|---|---|---|---|---|")
        for b in TAU0_BS:
            for tau in TAU0S:
                rs = [r for r in tu if r["B"] == b and r["tau0"] == tau]
                if rs:
                    out.append("| %d | %g | %d | %s | %s | %.1f | %s | %.1f–%.1f |"
                               % (b, tau, len(rs), pm([r["elbo_per_point"] for r in rs]),
                                  pm([r["heldout"] for r in rs]),
                                  np.mean([r["seconds"] for r in rs]), stops(rs),
                                  min(r["load1_start"] for r in rs),
                                  max(r["load1_end"] for r in rs)))
        out.append("\nPer seed (ELBO per point / held-out):\n")
        out.append("| B | tau0 | " + " | ".join("seed %d" % v for v in tseeds) + " |")
        out.append("|---|---|" + "---|" * len(tseeds))
        for b in TAU0_BS:
            for tau in TAU0S:
                cells = []
                for v in tseeds:
                    rs = [r for r in tu if r["B"] == b and r["tau0"] == tau and r["seed"] == v]
                    cells.append("%.3f / %.3f" % (rs[0]["elbo_per_point"], rs[0]["heldout"])
                                 if rs else "not run")
                out.append("| %d | %g | %s |" % (b, tau, " | ".join(cells)))
    out.extend(sweep_tables(runs))
    new = [r for r in runs if not is_capped(r) and r.get("run") != "panels"]
    if new:
        loads = [r["load1_start"] for r in new] + [r["load1_end"] for r in new]
        out.append("\nThe %d fits of Tables H–N: 1-minute load average %.1f–%.1f (median %.1f) "
                   "on 2 cores; OpenMP threads per fit: %s." % (
                       len(new), min(loads), max(loads), float(np.median(loads)),
                       ", ".join(str(v) for v in sorted({r.get("threads", 1) for r in new}))))
    return "\n".join(out)


def sweep_runs(runs):
    """Fashion-MNIST fits to convergence at every K and B: the sweeps' own fits (run "sweep") and
    fmnist-conv's K = 30, B = 512 fits (run "conv"), which have the same settings."""
    return [r for r in runs if r["data"] == "fmnist" and r.get("run") in ("conv", "sweep")]


def sweep_tables(runs):
    """Tables M and N: the K sweep and the batch sweep run to convergence (mean ± s.e. over the
    seeds), and the held-out table in Bruno 2022's style."""
    fm = sweep_runs(runs)
    if not any(r["run"] == "sweep" for r in fm):
        return []
    c = CONV["fmnist"]
    out = ["\n### Table M. Fashion-MNIST PCA-50: K sweep run to convergence (B = 512 for SVI)\n",
           "CAVI tol %g (cap %d iterations); SVI tol %g or three decreasing epochs (cap %d "
           "epochs). K = 30 is Table J's fits. Mean ± standard error over the seeds.\n" % (
               c["cavi_tol"], c["cavi_max"], c["svi_tol"], c["svi_epochs"]), HEAD]
    for k in KS:
        for m in METHODS:
            rs = sel(fm, method=m, K=k, B=0 if m == "cavi" else 512)
            if rs:
                out.append(row(rs, NAMES[m], k, 0 if m == "cavi" else 512))
    out += ["\n### Table N. Fashion-MNIST PCA-50: batch-size sweep run to convergence (K = 30)\n",
            "As Table M; B = 512 is Table J's fits.\n", HEAD]
    for m in METHODS[1:]:
        for b in BS:
            rs = sel(fm, method=m, K=30, B=b)
            if rs:
                out.append(row(rs, NAMES[m], 30, b))
    out.append("\nHeld-out log predictive density to convergence, in Bruno 2022's style "
               "(mean (s.e.)):\n")
    out.extend(seed_style(fm))
    return out


def sweep_summary(runs):
    """Summary lines for Tables M and N: per K, SVI minus CAVI of the same seed."""
    fm = sweep_runs(runs)
    if not any(r["run"] == "sweep" for r in fm):
        return []
    out = []
    for m in METHODS[1:]:
        cells, n_pairs, n_below = [], 0, 0
        for k in KS:
            cv = {r["seed"]: r for r in sel(fm, method="cavi", K=k)}
            pr = [(r, cv[r["seed"]]) for r in sel(fm, method=m, K=k, B=512) if r["seed"] in cv]
            if pr:
                d = [r["heldout"] - c_["heldout"] for r, c_ in pr]
                n_pairs += len(d)
                n_below += sum(v < 0 for v in d)
                cells.append("K = %d: %+.3f to %+.3f (%d)" % (k, min(d), max(d), len(d)))
        if cells:
            out.append("- Fashion-MNIST to convergence, %s minus CAVI held-out, same seed and K "
                       "(pairs): %s; below CAVI in %d of %d pairs." % (
                           NAMES[m], "; ".join(cells), n_below, n_pairs))
    for m in METHODS[1:]:
        cells = ["B = %d: %s" % (b, pm([r["heldout"] for r in sel(fm, method=m, K=30, B=b)]))
                 for b in BS if sel(fm, method=m, K=30, B=b)]
        if cells:
            out.append("- Fashion-MNIST to convergence, %s held-out by B (mean ± s.e.): %s." % (
                NAMES[m], ", ".join(cells)))
    st = [r for r in fm if r["run"] == "sweep"]
    out.append("- The sweeps' own fits (%d): stops %s." % (len(st), stops(st)))
    return out


COLORS = {"cavi": "C0", "svi-rm": "C1", "svi-adaptive": "C2"}


def conv_summary(runs):
    """The numbers the text of fmnist_svi.md quotes for Tables H-K, computed here (so that none
    is typed by hand)."""
    out = []
    st = [r for r in runs if r["data"] == "stl" and r.get("run") == "conv"]
    dg = [r for r in runs if r["data"] == "stl" and r.get("run") == "diag"]

    def rng(v, f="%.3f"):
        lo, hi = f % min(v), f % max(v)
        return lo if lo == hi else "%s to %s" % (lo, hi)
    for m in METHODS:
        rs = sel(st, method=m)
        if rs:
            out.append("- STL-shaped, %s (%d seeds): ELBO %s per point (data term %s, KL %s); "
                       "components holding ≥ 1%% of the rows: %s; held-out %s; stops: %s." % (
                           NAMES[m], len(rs), rng([r["elbo_per_point"] for r in rs]),
                           rng([r["data_per_point"] for r in rs]),
                           rng([r["kl_per_point"] for r in rs]),
                           rng([r["active"] for r in rs], "%d"),
                           rng([r["heldout"] for r in rs]), stops(rs)))
    rs = [r for r in sel(st, method="cavi") if "trace_elbo_per_point" in r]
    if rs:
        e = [r["trace_elbo_per_point"] for r in rs]
        out.append("- STL-shaped, CAVI (seeds %s): %s iterations (stops: %s; last relative "
                   "change %s); full ELBO per point at the first iteration %s, at the last %s; the last "
                   "iteration still gained %s per point; the largest component holds %s of the "
                   "rows and the other %d components hold %.0f–%.0f rows each." % (
                       ", ".join(str(r["seed"]) for r in rs),
                       rng([r["iterations"] for r in rs], "%d"), stops(rs),
                       rng([r["last_rel_change"] for r in rs], "%.1e"),
                       rng([v[0] for v in e]), rng([v[-1] for v in e]),
                       rng([v[-1] - v[-2] for v in e], "%.4f"),
                       rng([100 * r["nk"][0] / r["n"] for r in rs], "%.1f%%"),
                       len(rs[0]["nk"]) - 1, min(min(r["nk"][1:]) for r in rs),
                       max(max(r["nk"][1:]) for r in rs)))
    for m in METHODS[1:]:
        rs = [r for r in sel(st, method=m) if r["stop"] == "max-iter"
              and r.get("last_epoch_gain_per_point") is not None]
        if rs:
            out.append("- STL-shaped, %s runs that hit the %d-epoch cap (%d): the full ELBO still "
                       "gained %s per point over the last epoch (relative change of the epoch "
                       "average %s)." % (
                           NAMES[m], rs[0]["cap"], len(rs),
                           rng([r["last_epoch_gain_per_point"] for r in rs], "%.4f"),
                           rng([r["last_rel_change"] for r in rs], "%.1e")))
    cv = {r["seed"]: r for r in st if r["method"] == "cavi"}
    for m in METHODS[1:]:
        pr = [(r, cv[r["seed"]]) for r in sel(st, method=m) if r["seed"] in cv]
        if pr:
            out.append("- STL-shaped, %s minus CAVI, same seed (%d pairs): ELBO %s, data term "
                       "%s, KL %s, held-out %s per point." % (
                           NAMES[m], len(pr),
                           rng([r["elbo_per_point"] - c["elbo_per_point"] for r, c in pr], "%+.3f"),
                           rng([r["data_per_point"] - c["data_per_point"] for r, c in pr], "%+.3f"),
                           rng([r["kl_per_point"] - c["kl_per_point"] for r, c in pr], "%+.3f"),
                           rng([r["heldout"] - c["heldout"] for r, c in pr], "%+.3f")))
    for r in dg:
        if r["K"] == 1:
            out.append("- STL-shaped, a single Gaussian (CAVI, K = 1): ELBO %.3f per point (data "
                       "term %.3f, KL %.3f), held-out %.3f, %d iterations (%s)." % (
                           r["elbo_per_point"], r["data_per_point"], r["kl_per_point"],
                           r["heldout"], r["iterations"], r["stop"]))
    rm = {r["seed"]: r for r in st if r["method"] == "svi-rm"}
    rs = [r for r in dg if r["method"] == "cavi-from-svi-rm" and r["seed"] in rm]
    if rs:
        out.append("- CAVI restarted from RM's responsibilities (%d seeds): ELBO change %s per "
                   "point, ending with %s components ≥ 1%%, %s iterations (%s)." % (
                       len(rs), rng([r["elbo_per_point"] - rm[r["seed"]]["elbo_per_point"]
                                     for r in rs], "%+.3f"),
                       rng([r["active"] for r in rs], "%d"),
                       rng([r["iterations"] for r in rs], "%d"), stops(rs)))
    chk = [r for r in st + dg if "reference_elbo_per_point" in r]
    if chk:
        out.append("- The NumPy reference reproduces caviar's reported ELBO of %d STL models "
                   "(CAVI and SVI) to within %.1e per point." % (
                       len(chk), max(abs(r["elbo_per_point"] - r["reference_elbo_per_point"])
                                     for r in chk)))
    fm = [r for r in runs if r["data"] == "fmnist" and r.get("run") == "conv"]
    cf = {r["seed"]: r for r in fm if r["method"] == "cavi"}
    for m in METHODS[1:]:
        pr = [(r, cf[r["seed"]]) for r in sel(fm, method=m) if r["seed"] in cf]
        if pr:
            tg = [reach_time(r, c["elbo_per_point"] - 1e-3 * abs(c["elbo_per_point"]))
                  for r, c in pr]
            out.append("- Fashion-MNIST, converged %s minus converged CAVI, same seed (%d pairs): "
                       "ELBO %s, held-out %s per point; SVI fit time / CAVI fit time %s; SVI "
                       "reached CAVI's ELBO within 0.1%% in %d of %d; SVI stops: %s." % (
                           NAMES[m], len(pr),
                           rng([r["elbo_per_point"] - c["elbo_per_point"] for r, c in pr], "%+.3f"),
                           rng([r["heldout"] - c["heldout"] for r, c in pr], "%+.3f"),
                           rng([r["seconds"] / c["seconds"] for r, c in pr], "%.2f"),
                           sum(t is not None for t in tg), len(pr),
                           stops([r for r, _ in pr])))
    pr = [(r, v) for r in sel(fm, method="svi-rm") for v in sel(fm, method="svi-adaptive")
          if r["seed"] == v["seed"]]
    if pr:
        out.append("- Fashion-MNIST, SVI epochs at the stop (RM / adaptive, by seed): %s; the two "
                   "schedules stopped at the same epoch in %d of %d seeds." % (
                       ", ".join("%d / %d" % (r["iterations"], v["iterations"]) for r, v in pr),
                       sum(r["iterations"] == v["iterations"] for r, v in pr), len(pr)))
    rs = sel(fm, method="cavi")
    if rs:
        out.append("- Fashion-MNIST, converged CAVI (%d seeds): %s iterations, %s s; stops: %s."
                   % (len(rs), rng([r["iterations"] for r in rs], "%d"),
                      rng([r["seconds"] for r in rs], "%.1f"), stops(rs)))
    out.extend(sweep_summary(runs))
    pn = [(r, c_) for r in runs if r.get("run") == "panels" for c_ in fm
          if c_["method"] == r["method"] and c_["seed"] == r["seed"] and c_["K"] == r["K"]
          and c_["B"] == r["B"]]
    if pn:
        out.append("- Figure 7's fits against Table J's fits of the same configuration (%d pairs, "
                   "a rerun): largest difference %.1e in the ELBO and %.1e in the held-out "
                   "density per point; fit time ratio %s; load %.1f–%.1f." % (
                       len(pn), max(abs(r["elbo_per_point"] - c_["elbo_per_point"])
                                    for r, c_ in pn),
                       max(abs(r["heldout"] - c_["heldout"]) for r, c_ in pn),
                       rng([r["seconds"] / c_["seconds"] for r, c_ in pn], "%.2f"),
                       min(r["load1_start"] for r, _ in pn), max(r["load1_end"] for r, _ in pn)))
    pr = {r["method"]: r for r in runs if r.get("run") == "panels" and "rho" in r}
    if "svi-rm" in pr and "svi-adaptive" in pr:
        a, m = pr["svi-adaptive"], pr["svi-rm"]
        ra = np.asarray(a["rho"])
        at_time = ra / np.interp(a["rho_seconds"], m["rho_seconds"], m["rho"])
        out.append("- Figure 7's step sizes: first step %.3g (adaptive) and %.3g (RM); adaptive / "
                   "RM at the same fitting time: %.2f to %.2f (median %.2f over the second half of "
                   "the adaptive run)." % (
                       ra[0], m["rho"][0], at_time.min(), at_time.max(),
                       float(np.median(at_time[len(at_time) // 2:]))))
    return "\n".join(out)


COLORS["cavi-from-svi-rm"] = "C3"


def fix_table(runs, before):
    """Table O and its summary: every SVI fit that a stopping rule ended, run before the epoch
    average was taken over rows (a plain mean of the steps, `svi_stepmean_results.json`) and
    again after (commit ab92089), paired by configuration and seed. The CAVI restarts from RM's
    responsibilities are paired too, as they start where RM ended."""
    now = {key(r): r for r in runs}
    pairs = [(b, now[key(b)]) for b in before if key(b) in now]
    if not pairs:
        return []
    out = ["\n### Table O. SVI before and after the epoch-average fix (same configuration, seed "
           "and stopping rule)\n",
           "*Before*: the epoch average of the stochastic ELBO (Bruno 2022, eq. 2.52) was the plain "
           "mean of the epoch's steps, which gave the short last step (N mod B rows, scaled by "
           "N/(N mod B)) a whole step's weight. *After*: each step weighs |b|/N. Only the "
           "stopping rules read this average, so a fit that ends at the same epoch ends with the "
           "same λ. Mean ± standard error over the paired seeds; Δ = after − before, per seed.\n",
           "| data | run | method | K | B | pairs | epochs before → after (mean) | stops before "
           "| stops after | held-out before | held-out after | Δ held-out (range) | Δ ELBO per "
           "point (range) |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    order = {m: i for i, m in enumerate(METHODS + ("cavi-from-svi-rm",))}
    groups = sorted({(b["data"], b["run"], b["method"], b["K"], b["B"]) for b, _ in pairs},
                    key=lambda g: (g[0], g[1], order[g[2]], g[3], g[4]))
    for d, run, m, k, bb in groups:
        ps = sorted([(b, a) for b, a in pairs if (b["data"], b["run"], b["method"], b["K"],
                                                  b["B"]) == (d, run, m, k, bb)],
                    key=lambda p: p[0]["seed"])
        bs, as_ = [b for b, _ in ps], [a for _, a in ps]
        dh = [a["heldout"] - b["heldout"] for b, a in ps]
        de = [a["elbo_per_point"] - b["elbo_per_point"] for b, a in ps]
        out.append("| %s | %s | %s | %d | %s | %d | %.1f → %.1f | %s | %s | %s | %s | %+.3f to "
                   "%+.3f | %+.3f to %+.3f |" % (
                       d, run, NAMES[m], k, bb or "–", len(ps),
                       np.mean([r["iterations"] for r in bs]),
                       np.mean([r["iterations"] for r in as_]), stops(bs), stops(as_),
                       pm([r["heldout"] for r in bs]), pm([r["heldout"] for r in as_]),
                       min(dh), max(dh), min(de), max(de)))
    out.append("\n**Summary of Table O** (computed by the script):\n")
    svi = [(b, a) for b, a in pairs if b["method"].startswith("svi")]
    fm = [(b, a) for b, a in svi if b["data"] == "fmnist"]
    if fm:
        longer = sum(a["iterations"] > b["iterations"] for b, a in fm)
        same = sum(a["iterations"] == b["iterations"] for b, a in fm)
        dh = [a["heldout"] - b["heldout"] for b, a in fm]
        out.append("- Fashion-MNIST SVI fits (%d pairs): after the fix %d ran longer, %d stopped "
                   "at the same epoch and %d sooner; held-out change %+.3f to %+.3f per point "
                   "(mean %+.3f), higher in %d of %d; stops before: %s; after: %s." % (
                       len(fm), longer, same, len(fm) - longer - same, min(dh), max(dh),
                       float(np.mean(dh)), sum(v > 0 for v in dh), len(dh),
                       stops([b for b, _ in fm]), stops([a for _, a in fm])))
        # The short last step is the same rows for every B with the same N mod B, and for both
        # schedules: before the fix, fits of one seed tended to stop at the same epoch.
        for label, idx in (("before", 0), ("after", 1)):
            per_seed = {}
            for p in fm:
                r = p[idx]
                if r["K"] == 30 and r["stop"] != "max-iter":
                    per_seed.setdefault(r["seed"], []).append(r["iterations"])
            if per_seed:
                n_fits = sum(len(v) for v in per_seed.values())
                n_distinct = sum(len(set(v)) for v in per_seed.values())
                out.append("- K = 30, every B and both schedules, fits stopped by a rule "
                           "(%s the fix): %d fits in %d seeds ended at %d distinct (seed, epoch) "
                           "values." % (label, n_fits, len(per_seed), n_distinct))
    cv = {(r["K"], r["seed"]): r for r in runs if r["data"] == "fmnist" and r["method"] == "cavi"
          and r.get("run") in ("conv", "sweep")}
    for label, idx in (("before", 0), ("after", 1)):
        gaps = [(p[idx]["elbo_per_point"] - cv[(p[idx]["K"], p[idx]["seed"])]["elbo_per_point"],
                 abs(cv[(p[idx]["K"], p[idx]["seed"])]["elbo"]))
                for p in fm if (p[idx]["K"], p[idx]["seed"]) in cv]
        if gaps:
            n = fm[0][0]["n"]
            within = sum(g * n >= -1e-3 * c for g, c in gaps)
            above = sum(g > 0 for g, _ in gaps)
            out.append("- Fashion-MNIST SVI fits %s the fix against converged CAVI of the same K and "
                       "seed (%d fits): final ELBO within 0.1%% of CAVI's in %d, above it in %d; "
                       "ELBO gap %.3f to %.3f per point." % (
                           label, len(gaps), within, above, min(g for g, _ in gaps),
                           max(g for g, _ in gaps)))
    # How far from converged the after-fix K = 30 fits are (they have a full-ELBO check per
    # epoch): the full-ELBO gain over the last epoch, and the epochs that gain would need to
    # close the gap to converged CAVI of the same seed if it did not shrink.
    for m in METHODS[1:]:
        rs = [a for b, a in fm if a["run"] == "conv" and a["method"] == m
              and a.get("last_epoch_gain_per_point") and (30, a["seed"]) in cv]
        if rs:
            gap = [cv[(30, r["seed"])]["elbo_per_point"] - r["elbo_per_point"] for r in rs]
            gain = [r["last_epoch_gain_per_point"] for r in rs]
            out.append("- Fashion-MNIST K = 30, %s after the fix (%d seeds; stops %s): the last "
                       "epoch gained %.5f to %.5f per point; the gap to converged CAVI is "
                       "%.3f to %.3f per point, %.0f to %.0f epochs at that gain." % (
                           NAMES[m], len(rs), stops(rs), min(gain), max(gain), min(gap),
                           max(gap), min(g / v for g, v in zip(gap, gain)),
                           max(g / v for g, v in zip(gap, gain))))
    st = [(b, a) for b, a in pairs if b["data"] == "stl"]
    for m in ("svi-rm", "cavi-from-svi-rm"):
        ps = [(b, a) for b, a in st if b["method"] == m]
        if ps:
            out.append("- STL-shaped, %s (%d pairs): epochs / iterations %s → %s; ELBO per point "
                       "change %s; components ≥ 1%% after: %s; held-out change %s." % (
                           NAMES[m], len(ps),
                           ", ".join(str(b["iterations"]) for b, _ in ps),
                           ", ".join(str(a["iterations"]) for _, a in ps),
                           ", ".join("%+.4f" % (a["elbo_per_point"] - b["elbo_per_point"])
                                     for b, a in ps),
                           ", ".join(str(a.get("active", "?")) for _, a in ps),
                           ", ".join("%+.4f" % (a["heldout"] - b["heldout"]) for b, a in ps)))
    return out


def elbo_time_figure(plt, panels, name):
    """Full ELBO per point against fitting time, one panel per (title, runs with traces)."""
    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 4), squeeze=False)
    for ax, (title, rs) in zip(axes[0], panels):
        for m in METHODS + ("cavi-from-svi-rm",):
            first = True
            for r in sel(rs, method=m):
                ax.plot(r["trace_seconds"], r["trace_elbo_per_point"], color=COLORS[m], lw=1,
                        marker="." if m.startswith("svi") else None, ms=3, alpha=0.8,
                        label=NAMES[m] if first else None)
                first = False
        ax.set_xscale("log")
        ax.set_xlabel("fitting time, s (log; full-ELBO checks excluded)")
        ax.set_ylabel("full ELBO per point")
        ax.set_title(title, fontsize=10)
        lo = min(min(r["trace_elbo_per_point"][len(r["trace_elbo_per_point"]) // 3:])
                 for r in rs)
        hi = max(max(r["trace_elbo_per_point"]) for r in rs)
        ax.set_ylim(lo - 0.1 * (hi - lo), hi + 0.05 * (hi - lo))
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(HERE, name), dpi=90)
    plt.close(fig)


def svi_panels_figure(plt, rs, name):
    """Figure 7 (Bruno 2022's Figures 2.4b and 2.5): the epoch-average stochastic ELBO against time
    (CAVI: its ELBO per iteration, which is the same thing for a batch method), and the step-size
    paths of the two schedules."""
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for r in sorted(rs, key=lambda r: METHODS.index(r["method"])):
        m = r["method"]
        if m == "cavi":
            axes[0].plot(r["trace_seconds"], r["trace_elbo_per_point"], color=COLORS[m], lw=1,
                         label=NAMES[m])
        else:
            axes[0].plot(r["epoch_seconds"], r["epoch_elbo_per_point"], color=COLORS[m], lw=1,
                         marker=".", ms=3, label=NAMES[m] + " (epoch average)")
            axes[1].plot(r["rho_seconds"], r["rho"], color=COLORS[m], lw=1, label=NAMES[m])
    lo = min(min(r.get("epoch_elbo_per_point", r.get("trace_elbo_per_point"))[2:]) for r in rs)
    hi = max(max(r.get("epoch_elbo_per_point", r.get("trace_elbo_per_point"))) for r in rs)
    axes[0].set_ylim(lo - 0.1 * (hi - lo), hi + 0.05 * (hi - lo))
    axes[0].set_ylabel("ELBO per point (SVI: epoch-average stochastic ELBO)")
    axes[1].set_yscale("log")
    axes[1].set_ylabel("step size rho_t")
    for ax, title in zip(axes, ("average ELBO per epoch (Bruno 2022, Figure 2.4b)",
                                "step size (Bruno 2022, Figure 2.5)")):
        ax.set_xscale("log")
        ax.set_xlabel("fitting time, s (log)")
        ax.set_title(title, fontsize=10)
        ax.legend(fontsize=8)
    fig.suptitle("Fashion-MNIST PCA-50, K = 30, B = 512, seed 1", fontsize=10)
    fig.tight_layout()
    fig.savefig(os.path.join(HERE, name), dpi=90)
    plt.close(fig)


def conv_plots(runs):
    """Figure 4: ELBO against time for the runs to convergence (Tables H-J)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    panels = []
    fm = [r for r in runs if r["data"] == "fmnist" and r.get("run") == "conv"
          and "trace_seconds" in r]
    if fm:
        panels.append(("Fashion-MNIST PCA-50, K = 30, B = 512, to convergence", fm))
    st = [r for r in runs if r["data"] == "stl" and r.get("run") == "conv"
          and "trace_seconds" in r]
    if st:
        panels.append(("STL-shaped, K = 30, B = 512, to convergence", st))
    if panels:
        elbo_time_figure(plt, panels, "fmnist_elbo_time_conv.png")
    pn = [r for r in runs if r.get("run") == "panels"]
    if pn:
        svi_panels_figure(plt, pn, "fmnist_svi_panels.png")
    sw = sweep_runs(runs)
    if any(r["run"] == "sweep" for r in sw):
        heldout_k_figure(plt, sw, "Fashion-MNIST PCA-50, to convergence (mean ± s.e.)",
                         "fmnist_heldout_k_conv.png")
        heldout_batch_figure(plt, sw, "Fashion-MNIST PCA-50, K = 30, to convergence",
                             "fmnist_heldout_batch_conv.png")


def plots(runs, stl_info):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fm = [r for r in runs if r["data"] == "fmnist"]
    # 1. ELBO vs time (Bruno 2022, Figure 2.4), every seed, K = 30 B = 512; and the STL-shaped set.
    st = [r for r in runs if r["data"] == "stl" and "trace_seconds" in r]
    panels = [("Fashion-MNIST PCA-50, K = 30, B = 512", [r for r in fm if r["K"] == 30 and
                                                          "trace_seconds" in r])]
    if st:
        panels.append(("STL-shaped synthetic, K = 30, B = 512", st))
    elbo_time_figure(plt, panels, "fmnist_elbo_time.png")
    heldout_k_figure(plt, fm, "Fashion-MNIST PCA-50 (mean ± s.e. over seeds)",
                     "fmnist_heldout_k.png")
    heldout_batch_figure(plt, fm, "Fashion-MNIST PCA-50, K = 30, %s epochs cap" % SVI_EPOCHS,
                         "fmnist_heldout_batch.png")


def heldout_k_figure(plt, fm, title, name):
    """Held-out density against K (Bruno 2022, Table 2.3), error bars = s.e. over seeds."""
    fig, ax = plt.subplots(figsize=(5.5, 4))
    for i, m in enumerate(METHODS):
        xs, ys, es = [], [], []
        for k in KS:
            rs = sel(fm, method=m, K=k, B=0 if m == "cavi" else 512)
            if rs:
                mu, se = mse([r["heldout"] for r in rs])
                xs.append(k + (i - 1) * 0.6), ys.append(mu), es.append(se)
        ax.errorbar(xs, ys, yerr=np.nan_to_num(es), color=COLORS[m], marker="o", capsize=3,
                    label=NAMES[m])
    ax.set_xlabel("K")
    ax.set_ylabel("held-out log predictive density per point")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(HERE, name), dpi=90)
    plt.close(fig)


def heldout_batch_figure(plt, fm, title, name):
    """Held-out density against the batch size at K = 30 (Bruno 2022, Table 2.2), CAVI as a band."""
    fig, ax = plt.subplots(figsize=(5.5, 4))
    for i, m in enumerate(METHODS[1:]):
        xs, ys, es = [], [], []
        for b in BS:
            rs = sel(fm, method=m, K=30, B=b)
            if rs:
                mu, se = mse([r["heldout"] for r in rs])
                xs.append(b * (1 + 0.04 * (2 * i - 1))), ys.append(mu), es.append(se)
        ax.errorbar(xs, ys, yerr=np.nan_to_num(es), color=COLORS[m], marker="o", capsize=3,
                    label=NAMES[m])
    cv = sel(fm, method="cavi", K=30)
    if cv:
        mu, se = mse([r["heldout"] for r in cv])
        ax.axhspan(mu - se, mu + se, color=COLORS["cavi"], alpha=0.2)
        ax.axhline(mu, color=COLORS["cavi"], label="CAVI (mean ± s.e.)")
    ax.set_xscale("log", base=2)
    ax.set_xticks(BS, [str(b) for b in BS])
    ax.set_xlabel("batch size B")
    ax.set_ylabel("held-out log predictive density per point")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(HERE, name), dpi=90)
    plt.close(fig)


def report(a):
    runs = [r for path in a.results for r in json.load(open(path))]
    old = json.load(open(a.old)) if a.old and os.path.exists(a.old) else None
    stl_info = json.load(open(a.stl_info)) if a.stl_info and os.path.exists(a.stl_info) else None
    capped = [r for r in runs if is_capped(r)]
    text = tables(capped, old)
    if stl_info:
        text += ("\n\nSTL-shaped set: S = %g, LAM = %g; the true-parameter classifier labels "
                 "%.1f%% of the held-out rows right (mean largest responsibility %.3f); the true "
                 "mixture's held-out log density is %.3f per point." % (
                     stl_info["S"], stl_info["LAM"], 100 * stl_info["bayes_accuracy"],
                     stl_info["mean_max_responsibility"], stl_info["true_heldout"]))
    extra = conv_tables(runs)
    if extra:
        text += "\n\n" + extra
        summary = conv_summary(runs)
        if summary:
            text += "\n\n**Summary of Tables H–N** (computed by the script):\n\n" + summary
    if a.stepmean and os.path.exists(a.stepmean):
        text += "\n" + "\n".join(fix_table(runs, json.load(open(a.stepmean))))
    print(text)
    md = os.path.join(HERE, "fmnist_svi.md")
    if os.path.exists(md):
        s = open(md).read()
        b, e = "<!-- tables:begin (written by fmnist_svi.py report) -->", "<!-- tables:end -->"
        if b in s and e in s:
            s = s[:s.index(b) + len(b)] + "\n" + text + "\n" + s[s.index(e):]
            open(md, "w").write(s)
    plots(capped, stl_info)
    conv_plots(runs)


def collect(a):
    """Merge the work directories' results.json into fmnist_results.json and stl_results.json
    next to this file (adding to the fits already there unless --replace), and copy the
    STL-shaped set's stl_info.json."""
    import shutil
    runs, seen = [], set()
    for name in ("fmnist_results.json", "stl_results.json"):  # keep what is already recorded
        path = os.path.join(HERE, name)
        if os.path.exists(path) and not a.replace:
            for r in json.load(open(path)):
                seen.add(key(r))
                runs.append(r)
    for wd in a.workdirs:
        for r in json.load(open(os.path.join(wd, "results.json"))):
            if key(r) not in seen:  # a fit run by two processes counts once (the first)
                seen.add(key(r))
                runs.append(r)
    for data, name in (("fmnist", "fmnist_results.json"), ("stl", "stl_results.json")):
        rs = sorted([r for r in runs if r["data"] == data],
                    key=lambda r: (r.get("run", "capped") != "capped", r.get("run", ""),
                                   (METHODS + ("cavi-from-svi-rm",)).index(r["method"]),
                                   r["K"], r["B"], r.get("tau0", TAU0_DEFAULT), r["seed"]))
        if rs:
            with open(os.path.join(HERE, name), "w") as f:
                json.dump(rs, f, indent=0)
    for wd in a.workdirs:
        if os.path.exists(os.path.join(wd, "stl_info.json")):
            shutil.copy(os.path.join(wd, "stl_info.json"), os.path.join(HERE, "stl_info.json"))


def check(a):
    """Recomputes the full ELBO of finished STL fits with the independent NumPy reference
    (tests/python/gmm_reference.py: data term from its own E-step, every constant kept) and stores
    it in their records, to test that SVI's and CAVI's reported ELBOs are the same quantity."""
    sys.path.insert(0, os.path.join(HERE, "..", "..", "tests", "python"))
    import gmm_reference as g
    import h5py
    res_path = os.path.join(a.workdir, "results.json")
    runs = json.load(open(res_path))
    x = None
    for r in runs:
        if (r["data"] != "stl" or r.get("run") not in ("conv", "diag") or r["K"] != 30
                or r["seed"] not in parse_seeds(a.seeds) or "reference_elbo_per_point" in r):
            continue
        if x is None:
            with h5py.File(os.path.join(a.workdir, "stl.h5"), "r") as f:
                x = np.asarray(f["train/X"][...], dtype=np.float64)
        tag = "_" + r["run"]
        path = os.path.join(a.workdir, "stl_%s_K%d_B%d_s%d%s.h5" % (
            r["method"], r["K"], r["B"] or 512, r["seed"], tag))
        t = g.elbo_terms(x, g.load_model(path))
        r["reference_elbo_per_point"] = t["elbo"] / r["n"]
        r["reference_data_per_point"] = t["data"] / r["n"]
        print("%s: caviar %.6f, reference %.6f per point" % (
            key(r), r["elbo_per_point"], r["reference_elbo_per_point"]), flush=True)
        save_runs(res_path, update=r)


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="mode", required=True)
    r = sub.add_parser("run")
    r.add_argument("caviar")
    r.add_argument("workdir")
    r.add_argument("--parts", default="ksweep,batch,stl",
                   help="of ksweep,batch,stl (the capped sweep), stl-conv, stl-diag, "
                   "fmnist-conv, tau0, ksweep-conv, batch-conv (the sweeps to convergence), "
                   "panels (Figure 7); processes given the same parts and work directory share "
                   "the fits")
    r.add_argument("--seeds", default="1-5")
    r.add_argument("--stl-seeds", default="1-5")
    r.add_argument("--tau0-seeds", default="1-3")
    r.add_argument("--threads", type=int, default=1, help="OMP_NUM_THREADS of each fit")
    r.add_argument("--methods", default=",".join(METHODS + ("cavi-from-svi-rm",)))
    r.add_argument("--ks", default="", help="only these K (comma-separated; default all)")
    r.add_argument("--stop-at", default="", help="UTC HH:MM after which no new fit starts")
    p = sub.add_parser("report")
    p.add_argument("results", nargs="+", help="one or more results.json (merged)")
    p.add_argument("--old", default=os.path.join(HERE, "fmnist_results_v1.json"))
    p.add_argument("--stl-info", default=os.path.join(HERE, "stl_info.json"))
    p.add_argument("--stepmean", default=os.path.join(HERE, "svi_stepmean_results.json"),
                   help="the fits superseded by the epoch-average fix (Table O)")
    k = sub.add_parser("check")
    k.add_argument("workdir")
    k.add_argument("--seeds", default="1")
    c = sub.add_parser("collect")
    c.add_argument("workdirs", nargs="+")
    c.add_argument("--replace", action="store_true",
                   help="start from the work directories only (default: add their new fits to "
                   "the JSONs already here)")
    argv = sys.argv[1:]
    if argv and argv[0] not in ("run", "report", "collect", "check", "-h", "--help"):
        argv = ["run"] + argv  # fmnist_svi.py CAVIAR WORKDIR ... means "run"
    a = ap.parse_args(argv)
    {"run": run, "report": report, "collect": collect, "check": check}[a.mode](a)


if __name__ == "__main__":
    main()
