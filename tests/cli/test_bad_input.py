#!/usr/bin/env -S /usr/bin/python3
"""Hostile input to caviar must end with exactly one clear error line, a non-zero exit on every
rank, no hang (a timeout fails the case), and no output file, new or changed.

docs/errors.md lists every case with the message it gives; this test fails if a case is missing
there. Regenerate it with:  test_bad_input.py CAVIAR_BIN WORKDIR --write-doc docs/errors.md

usage: test_bad_input.py CAVIAR_BIN WORKDIR [--write-doc FILE]
"""
import concurrent.futures
import json
import os
import re
import shutil
import subprocess
import sys

import h5py
import numpy as np

from clitest import fresh_workdir, mpirun

TIMEOUT = 60
WORKERS = 3  # cases at once: an mpirun start-up mostly waits (measured: 0.43 s wall, 0.2 s CPU)


def run_case(i, case, work, out):
    """Runs one case with its own output path in place of `out` (cases run WORKERS at a time);
    returns (problems, doc row)."""
    name, ranks, argv, expect = case
    mine = os.path.join(work, f"case{i}_{os.path.basename(out)}")
    argv = [mine if a == out else a for a in argv]
    shown = " ".join(a.replace(mine, "model.h5").replace(work + "/", "") for a in argv[1:])
    try:
        r = subprocess.run(mpirun(ranks) + argv, capture_output=True, text=True, timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        return [f"hung (no exit within {TIMEOUT} s)"], (name, ranks, shown, "(hung)")
    err_lines = [l for l in r.stderr.splitlines() if l.startswith("caviar:")]
    problems = []
    if r.returncode == 0:
        problems.append("exit code 0")
    if len(err_lines) != 1:
        problems.append(f"{len(err_lines)} 'caviar:' lines on stderr")
    elif not err_lines[0].startswith("caviar: error: ") or expect not in err_lines[0]:
        problems.append(f"error line lacks {expect!r}")
    if "MPI_ABORT" in r.stderr or "internal error" in r.stderr:
        problems.append("aborted instead of a clean exit")
    if os.path.exists(mine):
        problems.append("output file was written")
        os.remove(mine)
    leftovers = [f for f in os.listdir(work) if f.startswith(os.path.basename(mine) + ".tmp-caviar")]
    if leftovers:
        problems.append(f"temporary files left: {leftovers}")
    line = err_lines[0] if err_lines else r.stderr.strip()[-300:]
    if problems:
        problems.append(f"exit={r.returncode} stderr: {line}")
    return problems, (name, ranks, shown, line.replace(mine, "model.h5").replace(work + "/", ""))


def check_cases(cases, work, out):
    """Runs every case, WORKERS at a time, and prints one line each; returns (failures, doc rows).
    Files that existed before must be unchanged and no temporary file may be left after all the
    cases (checked once at the end, naming the files: while cases are in flight, another case's
    temporary file may legitimately exist)."""
    p = lambda f: os.path.join(work, f)
    before = {f: os.stat(p(f)).st_mtime_ns for f in os.listdir(work) if os.path.isfile(p(f))}
    with concurrent.futures.ThreadPoolExecutor(max_workers=WORKERS) as pool:
        results = list(pool.map(lambda ic: run_case(ic[0], ic[1], work, out), enumerate(cases)))
    failures, doc_rows = 0, []
    for (name, *_), (problems, row) in zip(cases, results):
        doc_rows.append(row)
        if problems:
            failures += 1
            print(f"FAIL {name}: {'; '.join(problems[:-1])}\n     {problems[-1]}")
        else:
            print(f"ok   {name}: {row[3]}")
    changed = [f for f in before if not os.path.exists(p(f)) or os.stat(p(f)).st_mtime_ns != before[f]]
    if changed:
        print(f"FAIL: existing files changed or removed by the cases: {changed}")
        failures += 1
    leftovers = [f for f in os.listdir(work) if ".tmp-caviar" in f]
    if leftovers:
        print(f"FAIL: temporary files left by the cases: {leftovers}")
        failures += 1
    return failures, doc_rows




def main():
    caviar, work = sys.argv[1], sys.argv[2]
    p = fresh_workdir(work)

    rng = np.random.default_rng(0)
    good = rng.normal(size=(600, 2))
    with h5py.File(p("good.h5"), "w") as f:
        f["X"] = good
        f["grp/X"] = good
        f["zero_resp"] = np.zeros((600, 3))
    with h5py.File(p("nan.h5"), "w") as f:
        x = good.copy()
        x[433, 1] = np.nan
        f["X"] = x
    with h5py.File(p("inf.h5"), "w") as f:
        x = good.copy()
        x[17, 0] = -np.inf
        f["X"] = x
    with h5py.File(p("posinf.h5"), "w") as f:
        x = good.copy()
        x[599, 1] = np.inf
        f["X"] = x
    with h5py.File(p("shapes.h5"), "w") as f:
        f["one_d"] = good[:, 0]
        f["three_d"] = good.reshape(600, 2, 1)
        f["empty"] = np.zeros((0, 2))
        f["strings"] = np.array([b"a", b"b"] * 300).reshape(300, 2)
        f["compound"] = np.zeros((300, 2), dtype=[("a", "<f8"), ("b", "<i4")])
        f.create_group("a_group")
    with h5py.File(p("tiny.h5"), "w") as f:
        f["X"] = good[:1]
    with open(p("not_hdf5.h5"), "w") as f:
        f.write("this is not an HDF5 file\n")
    with open(p("good.h5"), "rb") as f:
        blob = f.read()
    with open(p("truncated.h5"), "wb") as f:
        f.write(blob[: len(blob) // 3])
    os.makedirs(p("readonly_dir"))
    existing = p("existing_model.h5")
    with open(existing, "wb") as f:
        f.write(b"previous contents")

    fit = lambda data, *rest: [caviar, "gmm", "fit", "--data", data] + list(rest)
    out = p("model.h5")
    with h5py.File(p("good3d.h5"), "w") as f:
        f["X"] = rng.normal(size=(300, 3))
    r = subprocess.run(mpirun(1) + [caviar, "-q", "gmm", "fit", "--data", p("good3d.h5"), "-k", "2",
                                    "--out", p("model3d.h5")], capture_output=True, text=True, timeout=TIMEOUT)
    if r.returncode != 0:
        print(f"FAIL: could not fit the 3-D model the mismatch case needs:\n{r.stderr}")
        return 1
    with h5py.File(p("params_singular.h5"), "w") as f:
        f["weights"], f["means"] = [0.5, 0.5], np.zeros((2, 3))
        f["covariances"] = np.stack([np.eye(3), np.diag([1.0, 1.0, 0.0])])
    with h5py.File(p("params_spherical_neg.h5"), "w") as f:  # spherical: one variance each
        f["weights"], f["means"], f["covariances"] = [0.5, 0.5], np.zeros((2, 3)), [1.0, -0.5]
    with h5py.File(p("params_badshape.h5"), "w") as f:
        f["weights"], f["means"], f["covariances"] = [0.5, 0.5], np.zeros((2, 3)), np.ones(5)
    # An EM fit of the same data, for compare: EM's log-likelihood beside an ELBO.
    r = subprocess.run(mpirun(1) + [caviar, "-q", "gmm", "fit", "--data", p("good3d.h5"), "-k", "2",
                                    "--algorithm", "em", "--out", p("model3d_em.h5")],
                       capture_output=True, text=True, timeout=TIMEOUT)
    if r.returncode != 0:
        print(f"FAIL: could not fit the EM model the compare cases need:\n{r.stderr}")
        return 1
    shutil.copyfile(p("model3d.h5"), p("model3d_no_elbo.h5"))
    with h5py.File(p("model3d_no_elbo.h5"), "r+") as f:
        del f.attrs["elbo"]
    # Checkpoints for the --resume cases: a gmm one of the 2-D data (K = 2), one of the 3-D data,
    # and a VAE one; and other 2-D data of the same shape.
    with h5py.File(p("other.h5"), "w") as f:
        f["X"] = rng.normal(size=(600, 2))
    setup = [
        [caviar, "-q", "gmm", "fit", "--data", p("good.h5"), "-k", "2", "--max-iter", "3",
         "--checkpoint", p("ck.h5"), "--checkpoint-every", "1"],
        [caviar, "-q", "gmm", "fit", "--data", p("good3d.h5"), "-k", "2", "--max-iter", "3",
         "--checkpoint", p("ck3d.h5"), "--checkpoint-every", "1"],
        [caviar, "-q", "gmm", "fit", "--data", p("good.h5"), "-k", "2", "--algorithm", "svi",
         "--batch-size", "128", "--max-iter", "2", "--checkpoint", p("ck_svi.h5"),
         "--checkpoint-every", "1"],
        [caviar, "-q", "vae", "train", "--data", p("good.h5"), "--likelihood", "gaussian",
         "--hidden", "4", "--latent", "1", "--max-iter", "1", "--batch-size", "100",
         "--checkpoint", p("vae_ck.h5")],
        [caviar, "-q", "vae", "train", "--data", p("good.h5"), "--likelihood", "gaussian",
         "--hidden", "4", "--latent", "1", "--max-iter", "1", "--batch-size", "100",
         "--out", p("vae_model.h5")],
        [caviar, "-q", "vae", "train", "--data", p("good.h5"), "--likelihood", "gaussian",
         "--hidden", "4", "--latent", "1", "--max-iter", "1", "--batch-size", "100",
         "--bayesian-decoder", "--out", p("vae_bayes.h5")],
        [caviar, "-q", "vae", "train", "--data", p("good.h5"), "--likelihood", "gaussian",
         "--hidden", "4", "--latent", "2", "--max-iter", "1", "--batch-size", "100",
         "--posterior", "full", "--out", p("vae_full.h5")],
    ]
    for argv in setup:
        r = subprocess.run(mpirun(1) + argv, capture_output=True, text=True, timeout=TIMEOUT)
        if r.returncode != 0:
            print(f"FAIL: setup {' '.join(argv[1:4])} failed:\n{r.stderr}")
            return 1
    # An SVI checkpoint as caviar wrote it before SVI moved onto the engine's stochastic driver:
    # its own position attributes (t, epoch) and statistics at /stats, and no "layout" in its
    # fingerprint.
    shutil.copyfile(p("ck_svi.h5"), p("ck_svi_old.h5"))
    with h5py.File(p("ck_svi_old.h5"), "r+") as f:
        fp = json.loads(f.attrs["fingerprint"])
        del fp["layout"]
        f.attrs["fingerprint"] = json.dumps(fp)
        f.move("model/stats", "stats")
        f.attrs["t"] = 3
        f.attrs["epoch"] = 1
    # A Bayesian-decoder model whose prior scale was edited to a negative number.
    shutil.copyfile(p("vae_bayes.h5"), p("vae_bayes_bad_prior.h5"))
    with h5py.File(p("vae_bayes_bad_prior.h5"), "r+") as f:
        f.attrs["prior_scale"] = -1.0
    # A full-posterior model as earlier versions wrote it: no "lower" attribute, its lower
    # triangle absolute rather than relative to sigma.
    shutil.copyfile(p("vae_full.h5"), p("vae_full_old.h5"))
    with h5py.File(p("vae_full_old.h5"), "r+") as f:
        del f.attrs["lower"]
    # An SVI checkpoint whose model's step count is no whole number.
    shutil.copyfile(p("ck_svi.h5"), p("ck_svi_steps.h5"))
    with h5py.File(p("ck_svi_steps.h5"), "r+") as f:
        f.attrs["model.steps"] = 2.5
    # Checkpoints edited as fuzzing found them crash the readers (tests/fuzz/regressions): a
    # counter that is no integer, an attribute that is an array, a dataset declaring 3e8 values it
    # does not hold.
    edits = {
        "ck_iter_1e300.h5": lambda f: f.attrs.__setitem__("iteration", 1e300),
        "ck_attr_array.h5": lambda f: f.attrs.__setitem__("elapsed", np.arange(64.0)),
        "ck_unstored.h5": lambda f: (f.__delitem__("model/stats"),
                                     f.create_dataset("model/stats", shape=(3 * 10**8,),
                                                      dtype="f8", chunks=(64,),
                                                      maxshape=(None,))),
    }
    # A CAVI checkpoint as caviar wrote it before the batch fits moved onto the engine: the
    # statistics at /stats, and no "layout" in its fingerprint.
    def older_layout(f):
        fp = json.loads(f.attrs["fingerprint"])
        del fp["layout"]
        f.attrs["fingerprint"] = json.dumps(fp)
        f.move("model/stats", "stats")
    edits["ck_old.h5"] = older_layout
    for name, edit in edits.items():
        shutil.copyfile(p("ck.h5"), p(name))
        with h5py.File(p(name), "r+") as f:
            edit(f)
    # LDA: two corpora of the same shape, one with another vocabulary size, and a CAVI checkpoint
    # (K = 3) of the first.
    for argv in ([caviar, "generate", "lda", "--docs", "300", "--words", "60", "--topics", "3",
                  "--seed", "1", "--out", p("lda_a.h5")],
                 [caviar, "generate", "lda", "--docs", "300", "--words", "60", "--topics", "3",
                  "--seed", "2", "--out", p("lda_b.h5")],
                 [caviar, "generate", "lda", "--docs", "300", "--words", "70", "--topics", "3",
                  "--seed", "1", "--out", p("lda_v70.h5")],
                 [caviar, "-q", "lda", "fit", "--data", p("lda_a.h5"), "--topics", "3",
                  "--algorithm", "cavi", "--max-iter", "2", "--checkpoint", p("lda_ck.h5"),
                  "--checkpoint-every", "1"],
                 [caviar, "-q", "lda", "fit", "--data", p("lda_a.h5"), "--topics", "3",
                  "--algorithm", "svi", "--batch-size", "100", "--max-iter", "2",
                  "--checkpoint", p("lda_svi_ck.h5"), "--checkpoint-every", "1"]):
        r = subprocess.run(mpirun(1) + argv, capture_output=True, text=True, timeout=TIMEOUT)
        if r.returncode != 0:
            print(f"FAIL: setup {' '.join(argv[1:4])} failed:\n{r.stderr}")
            return 1
    # The same documents, words and shape with the counts of each entry reversed in order: only
    # the sampled-documents identity tells it apart.
    with h5py.File(p("lda_a.h5"), "r") as src, h5py.File(p("lda_same_shape.h5"), "w") as dst:
        for name in src:
            v = src[name][()]
            dst.create_dataset(name, data=v[::-1] if name == "data" else v, dtype=src[name].dtype)
        for k, v in src.attrs.items():
            dst.attrs[k] = v
    # A CAVI checkpoint with a negative gamma, and a corpus whose /indptr declares 3e8 entries it
    # does not hold.
    # An SVI checkpoint as caviar wrote it before SVI moved onto the engine's stochastic driver:
    # its own position attributes (t, step), and no "layout" in its fingerprint.
    shutil.copyfile(p("lda_svi_ck.h5"), p("lda_svi_ck_old.h5"))
    with h5py.File(p("lda_svi_ck_old.h5"), "r+") as f:
        fp = json.loads(f.attrs["fingerprint"])
        del fp["layout"]
        f.attrs["fingerprint"] = json.dumps(fp)
        f.attrs["t"] = 3
        f.attrs["step"] = 0
    shutil.copyfile(p("lda_ck.h5"), p("lda_ck_neg_gamma.h5"))
    with h5py.File(p("lda_ck_neg_gamma.h5"), "r+") as f:
        f["rows/gammas"][7, 1] = -1e-300
    # A collapsed Gibbs chain's checkpoint with a label outside [0, K).
    r = subprocess.run(mpirun(1) + [caviar, "-q", "gmm", "sample", "--data", p("good.h5") + ":/X",
                                    "-k", "2", "--sampler", "collapsed", "--sweeps", "3",
                                    "--burn-in", "0", "--checkpoint", p("chain_ck.h5"),
                                    "--checkpoint-every", "2", "--out", p("chain_ck_out.h5")],
                       capture_output=True, text=True, timeout=TIMEOUT)
    if r.returncode != 0:
        print(f"FAIL: setup of the collapsed chain's checkpoint failed:\n{r.stderr}")
        return 1
    # gmm summarize: 2-D references of K = 2 and 3, and a blocked chain that records no draws.
    for argv in ([caviar, "-q", "gmm", "fit", "--data", p("good.h5"), "-k", "2", "--max-iter", "5",
                  "--out", p("model2d.h5")],
                 [caviar, "-q", "gmm", "fit", "--data", p("good.h5"), "-k", "3", "--max-iter", "5",
                  "--out", p("model2d_k3.h5")],
                 [caviar, "-q", "gmm", "sample", "--data", p("good.h5"), "-k", "2", "--sweeps", "3",
                  "--burn-in", "2", "--thin", "2", "--out", p("chain_no_draws.h5")]):
        r = subprocess.run(mpirun(1) + argv, capture_output=True, text=True, timeout=TIMEOUT)
        if r.returncode != 0:
            print(f"FAIL: setup of the gmm summarize cases failed:\n{r.stderr}")
            return 1
    shutil.copyfile(p("chain_ck_out.h5"), p("chain_nan.h5"))
    with h5py.File(p("chain_nan.h5"), "r+") as f:
        f["draws/sums"][1, 0, 1] = np.nan
    shutil.copyfile(p("chain_ck.h5"), p("chain_ck_bad_label.h5"))
    with h5py.File(p("chain_ck_bad_label.h5"), "r+") as f:
        f["rows/labels"][11, 0] = 7
    shutil.copyfile(p("lda_a.h5"), p("lda_unstored.h5"))
    with h5py.File(p("lda_unstored.h5"), "r+") as f:
        del f["indptr"]
        f.create_dataset("indptr", shape=(3 * 10**8,), dtype="i8", chunks=(64,), maxshape=(None,))
        del f.attrs["shape"]
    lda = lambda data, *rest: [caviar, "lda", "fit", "--data", data, "--algorithm", "cavi"] + list(rest)
    # Corrupt corpora for pLSA (the same reader as LDA): one defect each.
    def corpus_copy(name, edit):
        with h5py.File(p("lda_a.h5"), "r") as src, h5py.File(p(name), "w") as dst:
            for key in src:
                dst.create_dataset(key, data=src[key][()], dtype=src[key].dtype)
            for k, v in src.attrs.items():
                dst.attrs[k] = v
            edit(dst)
    def set_entry(f, key, i, v):
        a = f[key][()].astype(type(v))
        a[i] = v
        del f[key]
        f.create_dataset(key, data=a)
    corpus_copy("c_negative.h5", lambda f: set_entry(f, "data", 5, -2))
    corpus_copy("c_fraction.h5", lambda f: set_entry(f, "data", 5, 1.5))  # float counts
    corpus_copy("c_word_range.h5", lambda f: set_entry(f, "indices", 9, 60))
    corpus_copy("c_not_monotone.h5", lambda f: set_entry(f, "indptr", 2, 0))
    corpus_copy("c_no_tokens.h5", lambda f: set_entry(f, "data", slice(None), 0))
    subprocess.run(mpirun(1) + [caviar, "-q", "plsa", "fit", "--data", p("lda_a.h5"), "--topics", "3",
                                "--max-iter", "2", "--out", p("plsa_m.h5")], check=True, capture_output=True)
    plsa = lambda data, *rest: [caviar, "plsa", "fit", "--data", data] + list(rest)
    # HMM sequences: /X (every step) and /offsets (n + 1 boundaries).
    def seqs(name, x, offsets):
        with h5py.File(p(name), "w") as f:
            f["X"] = x
            f["offsets"] = np.asarray(offsets, dtype=np.int64)
    sym = rng.integers(0, 4, size=40)
    seqs("hmm_cat.h5", sym, [0, 10, 25, 40])
    seqs("hmm_not_increasing.h5", sym, [0, 25, 10, 40])
    seqs("hmm_short_offsets.h5", sym, [0, 10, 25, 38])
    seqs("hmm_empty_seq.h5", sym, [0, 10, 10, 40])
    seqs("hmm_neg_symbol.h5", np.where(np.arange(40) == 31, -1, sym), [0, 10, 25, 40])
    seqs("hmm_big_symbol.h5", sym, [0, 10, 25, 40])
    gx = rng.normal(size=(40, 2))
    seqs("hmm_gauss.h5", gx, [0, 10, 25, 40])
    seqs("hmm_gauss_nan.h5", np.where(np.arange(80).reshape(40, 2) == 53, np.nan, gx), [0, 10, 25, 40])
    seqs("hmm_tiny.h5", sym[:3], [0, 1, 3])
    with h5py.File(p("hmm_no_offsets.h5"), "w") as f:
        f["X"] = sym
    subprocess.run(mpirun(1) + [caviar, "-q", "hmm", "fit", "--data", p("hmm_gauss.h5"), "--states", "2",
                                "--emission", "gaussian", "--max-iter", "2", "--out", p("hmm_gm.h5")],
                   check=True, capture_output=True)
    subprocess.run(mpirun(1) + [caviar, "-q", "hmm", "fit", "--data", p("hmm_cat.h5"), "--states", "2",
                                "--symbols", "4", "--max-iter", "2", "--out", p("hmm_cm.h5")],
                   check=True, capture_output=True)
    # An HMM SVI checkpoint as caviar wrote it before SVI checkpoints could be taken inside a pass:
    # no "layout" in its fingerprint and no rows/pass_terms.
    subprocess.run(mpirun(1) + [caviar, "-q", "hmm", "fit", "--data", p("hmm_cat.h5"), "--states", "2",
                                "--symbols", "4", "--algorithm", "svi", "--batch-size", "1",
                                "--max-iter", "2", "--checkpoint", p("hmm_svi_ck_old.h5"),
                                "--checkpoint-every", "1", "--out", p("hmm_svi_m.h5")],
                   check=True, capture_output=True)
    with h5py.File(p("hmm_svi_ck_old.h5"), "r+") as f:
        fp = json.loads(f.attrs["fingerprint"])
        del fp["layout"]
        f.attrs["fingerprint"] = json.dumps(fp)
        if "rows/pass_terms" in f:
            del f["rows/pass_terms"]
    hmm = lambda data, *rest: [caviar, "hmm", "fit", "--data", data, "--states", "2"] + list(rest)
    bx = rng.normal(size=(600, 3))
    by = (rng.random(600) < 0.5).astype(float)
    for name, xx, yy in [("glm_good.h5", bx, by), ("glm_label2.h5", bx, np.where(np.arange(600) == 411, 2.0, by)),
                         ("glm_short_y.h5", bx, by[:599]),
                         ("glm_nan.h5", np.where(np.arange(1800).reshape(600, 3) == 1000, np.nan, bx), by)]:
        with h5py.File(p(name), "w") as f:
            f["X"] = xx
            f["y"] = yy
    bbvi = lambda data, *rest: [caviar, "bbvi", "fit", "--data", data + ":/X", "--response", data + ":/y",
                                "--max-iter", "2", "--out", out] + list(rest)
    cases = [
        # (name, ranks, argv, expected substring of the error line)
        ("missing file", 2, fit(p("nope.h5") + ":/X", "-k", "2", "--out", out), "no such file"),
        ("missing dataset", 2, fit(p("good.h5") + ":/Y", "-k", "2", "--out", out), "no dataset '/Y'"),
        ("missing group", 2, fit(p("good.h5") + ":/nogrp/X", "-k", "2", "--out", out), "no dataset"),
        ("group not dataset", 2, fit(p("shapes.h5") + ":/a_group", "-k", "2", "--out", out), "not a dataset"),
        ("1-D dataset", 2, fit(p("shapes.h5") + ":/one_d", "-k", "2", "--out", out), "1-D"),
        ("3-D dataset", 2, fit(p("shapes.h5") + ":/three_d", "-k", "2", "--out", out), "3-D"),
        ("0-row dataset", 2, fit(p("shapes.h5") + ":/empty", "-k", "2", "--out", out), "empty"),
        ("string dtype", 2, fit(p("shapes.h5") + ":/strings", "-k", "2", "--out", out), "non-numeric"),
        ("not HDF5", 2, fit(p("not_hdf5.h5") + ":/X", "-k", "2", "--out", out), "not an HDF5 file"),
        ("truncated HDF5", 2, fit(p("truncated.h5") + ":/X", "-k", "2", "--out", out), "HDF5"),
        ("NaN", 2, fit(p("nan.h5") + ":/X", "-k", "2", "--out", out), "row 433, column 1"),
        ("NaN at 4 ranks", 4, fit(p("nan.h5") + ":/X", "-k", "2", "--out", out), "row 433, column 1"),
        ("-Inf", 2, fit(p("inf.h5") + ":/X", "-k", "2", "--out", out), "row 17, column 0"),
        ("+Inf in the last row", 3, fit(p("posinf.h5") + ":/X", "-k", "2", "--out", out), "row 599, column 1"),
        ("compound dtype", 2, fit(p("shapes.h5") + ":/compound", "-k", "2", "--out", out), "non-numeric"),
        ("K < 0", 2, fit(p("good.h5") + ":/X", "-k", "-3", "--out", out), "--components must be >= 1"),
        ("zero batch size", 2, fit(p("good.h5") + ":/X", "-k", "2", "--algorithm", "svi", "--batch-size", "0", "--out", out), "--batch-size must be >= 1"),
        ("negative batch size", 2, fit(p("good.h5") + ":/X", "-k", "2", "--algorithm", "svi", "--batch-size", "-5", "--out", out), "--batch-size must be >= 1"),
        ("svi: --tau0 with the adaptive schedule (its old meaning)", 2, fit(p("good.h5") + ":/X", "-k", "2", "--algorithm", "svi", "--schedule", "adaptive", "--tau0", "20", "--out", out), "the adaptive schedule's initial memory is --adaptive-memory"),
        ("svi: --kappa above 1", 2, fit(p("good.h5") + ":/X", "-k", "2", "--algorithm", "svi", "--kappa", "1.5", "--out", out), "--kappa must be in [0, 1]"),
        ("svi: --tau0 negative", 2, fit(p("good.h5") + ":/X", "-k", "2", "--algorithm", "svi", "--tau0", "-1", "--out", out), "--tau0 must be a finite number >= 0"),
        ("svi: --adaptive-memory below 1", 2, fit(p("good.h5") + ":/X", "-k", "2", "--algorithm", "svi", "--schedule", "adaptive", "--adaptive-memory", "0.5", "--out", out), "--adaptive-memory must be a finite number >= 1"),
        ("svi: a deprecated name with its replacement", 2, fit(p("good.h5") + ":/X", "-k", "2", "--algorithm", "svi", "--omega", "2", "--tau0", "3", "--out", out), "--tau0 excludes --omega (see --help)"),
        ("NaN tolerance", 2, fit(p("good.h5") + ":/X", "-k", "2", "--tol", "nan", "--out", out), "--tol"),
        ("negative reg_covar", 2, fit(p("good.h5") + ":/X", "-k", "2", "--algorithm", "em", "--reg-covar", "-1", "--out", out), "--reg-covar"),
        ("--reg-covar with a variational fit", 2, fit(p("good.h5") + ":/X", "-k", "2", "--reg-covar", "0.5", "--out", out), "--reg-covar applies to --algorithm em only"),
        ("single precision with diagonal covariance", 2, fit(p("good.h5") + ":/X", "-k", "2", "--covariance", "diag", "--precision", "single", "--out", out), "--precision single needs --covariance full"),
        ("score: model is not a model", 2, [caviar, "gmm", "score", "--model", p("good.h5"), "--data", p("good.h5") + ":/X"], "not a caviar gmm model"),
        ("init-params: another K", 2, fit(p("good3d.h5") + ":/X", "-k", "3", "--init-params", p("model3d.h5"), "--out", out), "this fit needs 3 and 3 x 3"),
        ("init-params: no covariances", 2, fit(p("good3d.h5") + ":/X", "-k", "2", "--init-params", p("good3d.h5"), "--out", out), "has no /weights"),
        ("init-params: a negative spherical variance", 2, fit(p("good3d.h5") + ":/X", "-k", "2", "--covariance", "spherical", "--init-params", p("params_spherical_neg.h5"), "--out", out), "the covariance of component 1 is not positive"),
        ("init-params: covariances of no known shape", 2, fit(p("good3d.h5") + ":/X", "-k", "2", "--init-params", p("params_badshape.h5"), "--out", out), "/covariances is 5; expected 2 x 3 x 3 (full), 2 x 3 (diagonal), 3 x 3 (tied) or 2 (spherical)"),
        ("tied covariance: nu0 at most D - 1", 2, fit(p("good3d.h5") + ":/X", "-k", "2", "--covariance", "tied", "--nu0", "1.5", "--out", out), "--nu0 must be > 2 (got 1.500000)"),
        ("single precision with spherical covariance", 2, fit(p("good.h5") + ":/X", "-k", "2", "--covariance", "spherical", "--precision", "single", "--out", out), "--precision single needs --covariance full or tied"),
        ("init-params: a singular covariance", 2, fit(p("good3d.h5") + ":/X", "-k", "2", "--init-params", p("params_singular.h5"), "--out", out), "the covariance of component 1 is not symmetric positive definite"),
        ("warm-start: another K", 2, fit(p("good3d.h5") + ":/X", "-k", "3", "--warm-start", p("model3d.h5"), "--out", out), "has K = 2; this fit has 3"),
        ("warm-start: another D", 2, fit(p("good.h5") + ":/X", "-k", "2", "--warm-start", p("model3d.h5"), "--out", out), "has D = 3; this fit has 2"),
        ("warm-start: another covariance type", 2, fit(p("good3d.h5") + ":/X", "-k", "2", "--covariance", "diag", "--warm-start", p("model3d.h5"), "--out", out), "has covariance type full; this fit has diag"),
        ("warm-start: another algorithm", 2, fit(p("good3d.h5") + ":/X", "-k", "2", "--algorithm", "em", "--warm-start", p("model3d.h5"), "--out", out), "has algorithm cavi; this fit has em"),
        ("warm-start: another weight prior", 2, fit(p("good3d.h5") + ":/X", "-k", "2", "--weights", "stick-breaking", "--warm-start", p("model3d.h5"), "--out", out), "has weight prior dirichlet; this fit has stick-breaking"),
        ("warm-start: a missing file", 2, fit(p("good3d.h5") + ":/X", "-k", "2", "--warm-start", p("no_such_model.h5"), "--out", out), "--warm-start"),
        ("warm-start: not a model file", 2, fit(p("good3d.h5") + ":/X", "-k", "2", "--warm-start", p("good3d.h5"), "--out", out), "not a caviar gmm model"),
        ("warm-start: with --n-init 2", 2, fit(p("good3d.h5") + ":/X", "-k", "2", "--n-init", "2", "--warm-start", p("model3d.h5"), "--out", out), "--n-init > 1 with --warm-start"),
        ("warm-start: with --init", 2, fit(p("good3d.h5") + ":/X", "-k", "2", "--init", "random", "--warm-start", p("model3d.h5"), "--out", out), "not with --init or --init-params"),
        ("warm-start: svi", 2, fit(p("good3d.h5") + ":/X", "-k", "2", "--algorithm", "svi", "--warm-start", p("model3d.h5"), "--out", out), "--warm-start applies to --algorithm cavi and em"),
        ("warm-start: with --checkpoint", 2, fit(p("good3d.h5") + ":/X", "-k", "2", "--checkpoint", p("ck_warm.h5"), "--warm-start", p("model3d.h5"), "--out", out), "cannot be checkpointed or resumed yet"),
        ("warm-start: the model is the output", 2, fit(p("good3d.h5") + ":/X", "-k", "2", "--warm-start", p("model3d.h5"), "--out", p("model3d.h5")), "model3d.h5"),
        ("gmm summarize: the chain is a model file", 2, [caviar, "gmm", "summarize", "--chain", p("model2d.h5"), "--reference", p("model2d.h5"), "--out", out], "is not a gmm Gibbs chain"),
        ("gmm summarize: the chain is a checkpoint", 2, [caviar, "gmm", "summarize", "--chain", p("chain_ck.h5"), "--reference", p("model2d.h5"), "--out", out], "is a checkpoint, not a Gibbs chain"),
        ("gmm summarize: the chain is not HDF5", 2, [caviar, "gmm", "summarize", "--chain", p("not_hdf5.h5"), "--reference", p("model2d.h5"), "--out", out], "not_hdf5.h5"),
        ("gmm summarize: a chain with no draws", 2, [caviar, "gmm", "summarize", "--chain", p("chain_no_draws.h5"), "--reference", p("model2d.h5"), "--out", out], "holds no draws (n_draws = 0)"),
        ("gmm summarize: a non-finite draw", 2, [caviar, "gmm", "summarize", "--chain", p("chain_nan.h5"), "--reference", p("model2d.h5"), "--out", out], "'draws/sums' holds a non-finite value"),
        ("gmm summarize: the reference is a chain", 2, [caviar, "gmm", "summarize", "--chain", p("chain_ck_out.h5"), "--reference", p("chain_ck_out.h5"), "--out", out], "is a Gibbs chain, not a fitted gmm model"),
        ("gmm summarize: the reference is an hmm model", 2, [caviar, "gmm", "summarize", "--chain", p("chain_ck_out.h5"), "--reference", p("hmm_cm.h5"), "--out", out], "is not a caviar gmm model"),
        ("gmm summarize: another K", 2, [caviar, "gmm", "summarize", "--chain", p("chain_ck_out.h5"), "--reference", p("model2d_k3.h5"), "--out", out], "has K = 2 components in D = 2 but the reference"),
        ("gmm summarize: another D", 2, [caviar, "gmm", "summarize", "--chain", p("chain_ck_out.h5"), "--reference", p("model3d.h5"), "--out", out], "has K = 2 in D = 3"),
        ("gmm summarize: --out is the chain", 2, [caviar, "gmm", "summarize", "--chain", p("chain_ck_out.h5"), "--reference", p("model2d.h5"), "--out", p("chain_ck_out.h5")], "is the same file as input"),
        ("gmm summarize: --out is the reference", 2, [caviar, "gmm", "summarize", "--chain", p("chain_ck_out.h5"), "--reference", p("model2d.h5"), "--out", p("model2d.h5")], "is the same file as input"),
        ("gmm summarize: --plot is --out", 2, [caviar, "gmm", "summarize", "--chain", p("chain_ck_out.h5"), "--reference", p("model2d.h5"), "--out", out, "--plot", out], "--plot and --out name the same file"),
        ("gmm sample: --n 0", 2, [caviar, "gmm", "sample", "--model", p("model3d.h5"), "--n", "0", "--out", out], "--n must be >= 1 (got 0)"),
        ("gmm sample: an hmm model", 2, [caviar, "gmm", "sample", "--model", p("hmm_cm.h5"), "--n", "5", "--out", out], "is not a caviar gmm model"),
        ("gmm sample: the model is the output", 2, [caviar, "gmm", "sample", "--model", p("model3d.h5"), "--n", "5", "--out", p("model3d.h5")], "model3d.h5"),
        ("bbvi predict: a gmm model", 2, [caviar, "bbvi", "predict", "--model", p("model3d.h5"), "--data", p("good3d.h5"), "--out", out], "is not a posterior written by caviar bbvi fit"),
        ("gmm sample: --burn-in >= --sweeps", 2, [caviar, "gmm", "sample", "--data", p("good.h5") + ":/X", "-k", "2", "--sweeps", "10", "--burn-in", "10", "--out", out], "--burn-in must be in [0, --sweeps)"),
        ("gmm sample: --thin 0", 2, [caviar, "gmm", "sample", "--data", p("good.h5") + ":/X", "-k", "2", "--sweeps", "10", "--thin", "0", "--out", out], "--thin must be >= 1 (got 0)"),
        ("gmm sample: --sampler bogus", 2, [caviar, "gmm", "sample", "--data", p("good.h5") + ":/X", "-k", "2", "--sampler", "bogus", "--out", out], "unknown sampler 'bogus'"),
        ("gmm sample: --block-rows with the blocked sampler", 2, [caviar, "gmm", "sample", "--data", p("good.h5") + ":/X", "-k", "2", "--block-rows", "8", "--out", out], "--block-rows is an option of --sampler collapsed"),
        ("gmm sample: --block-rows 0", 2, [caviar, "gmm", "sample", "--data", p("good.h5") + ":/X", "-k", "2", "--sampler", "collapsed", "--block-rows", "0", "--out", out], "--block-rows must be >= 1 (got 0)"),
        ("gmm sample: collapsed, diagonal covariance", 2, [caviar, "gmm", "sample", "--data", p("good.h5") + ":/X", "-k", "2", "--sampler", "collapsed", "--covariance", "diag", "--out", out], "--sampler collapsed needs --covariance full"),
        ("vae train: a diverging --lr", 2, [caviar, "vae", "train", "--data", p("good.h5"), "--likelihood", "gaussian", "--hidden", "4", "--latent", "1", "--max-iter", "3", "--batch-size", "100", "--lr", "1e30", "--out", out], "training diverged at epoch"),
        ("gmm sample resume: a label outside [0, K)", 2, [caviar, "gmm", "sample", "--data", p("good.h5") + ":/X", "-k", "2", "--sampler", "collapsed", "--sweeps", "3", "--burn-in", "0", "--resume", p("chain_ck_bad_label.h5"), "--out", out], "the labels of row 11 are not all whole numbers in [0, 2)"),
        ("gmm sample: collapsed, a block split between ranks", 2, [caviar, "gmm", "sample", "--data", p("good.h5") + ":/X", "-k", "2", "--sampler", "collapsed", "--block-rows", "100000", "--out", out], "would split a block between ranks at 2 ranks"),
        ("gmm sample: a chain option with --model", 2, [caviar, "gmm", "sample", "--model", p("model3d.h5"), "--n", "5", "--sweeps", "10", "--out", out], "--sweeps is for a Gibbs chain on --data"),
        ("gmm sample: --n with --data", 2, [caviar, "gmm", "sample", "--data", p("good.h5") + ":/X", "-k", "2", "--n", "5", "--out", out], "--n is for drawing rows from a --model"),
        ("gmm sample: --data and --model", 2, [caviar, "gmm", "sample", "--data", p("good.h5") + ":/X", "--model", p("model3d.h5"), "-k", "2", "--n", "5", "--out", out], "exactly one of --data"),
        ("gmm sample: neither --data nor --model", 2, [caviar, "gmm", "sample", "--n", "5", "--out", out], "exactly one of --data"),
        ("score: dimension mismatch", 2, [caviar, "gmm", "score", "--model", p("model3d.h5"), "--data", p("good.h5") + ":/X"], "features but the model has 3"),
        ("K = 0", 2, fit(p("good.h5") + ":/X", "-k", "0", "--out", out), "--components must be >= 1"),
        ("K > N", 2, fit(p("good.h5") + ":/X", "-k", "601", "--out", out), "exceeds the number of rows"),
        ("more ranks than rows", 2, fit(p("tiny.h5") + ":/X", "-k", "1", "--out", out), "fewer than the 2 MPI ranks"),
        ("negative tol", 2, fit(p("good.h5") + ":/X", "-k", "2", "--tol", "-1", "--out", out), "--tol"),
        ("bad nu0", 2, fit(p("good.h5") + ":/X", "-k", "2", "--nu0", "0.5", "--out", out), "--nu0"),
        ("unwritable output", 2, fit(p("good.h5") + ":/X", "-k", "2", "--out", p("no/such/dir/m.h5")), "cannot write output"),
        ("output is the input", 2, fit(p("good.h5") + ":/X", "-k", "2", "--out", p("good.h5")), "same file as input"),
        ("existing output kept on error", 2, fit(p("nan.h5") + ":/X", "-k", "2", "--out", existing), "non-finite"),
        ("resume: a VAE checkpoint", 2, fit(p("good.h5") + ":/X", "-k", "2", "--resume", p("vae_ck.h5"), "--out", out), "it was written by vae, not gmm"),
        ("resume: another dimension", 2, fit(p("good.h5") + ":/X", "-k", "2", "--resume", p("ck3d.h5"), "--out", out), "data dimension D = 3, this run has data dimension D = 2"),
        ("resume: another K", 2, fit(p("good.h5") + ":/X", "-k", "3", "--resume", p("ck.h5"), "--out", out), "--components 2, this run has --components 3"),
        ("resume: another data file", 2, fit(p("other.h5") + ":/X", "-k", "2", "--resume", p("ck.h5"), "--out", out), "its data differ from this run's --data"),
        ("resume: another algorithm", 2, fit(p("good.h5") + ":/X", "-k", "2", "--algorithm", "em", "--resume", p("ck.h5"), "--out", out), "--algorithm cavi, this run has --algorithm em"),
        ("resume: another seed", 2, fit(p("good.h5") + ":/X", "-k", "2", "--seed", "9", "--resume", p("ck.h5"), "--out", out), "--seed 0, this run has --seed 9"),
        ("resume: an SVI step count that is not an integer", 2, fit(p("good.h5") + ":/X", "-k", "2", "--algorithm", "svi", "--batch-size", "128", "--max-iter", "3", "--resume", p("ck_svi_steps.h5"), "--out", out), "the checkpoint's SVI steps = 2.5 is not an integer in [0, 9007199254740992]"),
        ("resume: an SVI checkpoint of an older caviar", 2, fit(p("good.h5") + ":/X", "-k", "2", "--algorithm", "svi", "--batch-size", "128", "--max-iter", "3", "--resume", p("ck_svi_old.h5"), "--out", out), "its fingerprint lacks 'layout'"),
        ("resume: a CAVI checkpoint of an older caviar", 2, fit(p("good.h5") + ":/X", "-k", "2", "--resume", p("ck_old.h5"), "--out", out), "its fingerprint lacks 'layout'"),
        ("resume: a model file", 2, fit(p("good3d.h5") + ":/X", "-k", "2", "--resume", p("model3d.h5"), "--out", out), "not a checkpoint of this caviar"),
        ("resume: a data file", 2, fit(p("good.h5") + ":/X", "-k", "2", "--resume", p("good.h5"), "--out", out), "not a caviar checkpoint"),
        ("resume: missing checkpoint", 2, fit(p("good.h5") + ":/X", "-k", "2", "--resume", p("nope_ck.h5"), "--out", out), "nope_ck.h5: no such file"),
        ("vae resume: a gmm checkpoint", 2, [caviar, "vae", "train", "--data", p("good.h5"), "--likelihood", "gaussian", "--hidden", "4", "--latent", "1", "--batch-size", "100", "--resume", p("ck.h5"), "--out", out], "it was written by gmm, not vae"),
        ("vae resume: another data file", 2, [caviar, "vae", "train", "--data", p("other.h5"), "--likelihood", "gaussian", "--hidden", "4", "--latent", "1", "--batch-size", "100", "--resume", p("vae_ck.h5"), "--out", out], "its data differ from this run's --data"),
        ("vae train: unknown --posterior", 2, [caviar, "vae", "train", "--data", p("good.h5"), "--likelihood", "gaussian", "--hidden", "4", "--latent", "2", "--posterior", "lowrank", "--out", out], "unknown --posterior 'lowrank'"),
        ("vae train: unknown --estimator", 2, [caviar, "vae", "train", "--data", p("good.h5"), "--likelihood", "gaussian", "--hidden", "4", "--latent", "2", "--estimator", "score", "--out", out], "unknown --estimator 'score' (expected reparam, stl or auto)"),
        ("vae train --arch conv: rows that are not a square image", 2, [caviar, "vae", "train", "--arch", "conv", "--data", p("good.h5"), "--likelihood", "gaussian", "--latent", "2", "--out", out], "columns are not a square image; give --image CxHxW"),
        ("vae train --arch conv: an --image of another size", 2, [caviar, "vae", "train", "--arch", "conv", "--image", "1x1x3", "--data", p("good.h5"), "--likelihood", "gaussian", "--latent", "2", "--out", out], "--image 1x1x3 has 3 values; the data has 2 columns"),
        ("vae train --arch conv: more layers than the image allows", 2, [caviar, "vae", "train", "--arch", "conv", "--image", "1x1x2", "--channels", "4", "--data", p("good.h5"), "--likelihood", "gaussian", "--latent", "2", "--out", out], "--channels has 1 stride-2 layers, too many for 1 x 2 images"),
        ("vae train --arch conv: a channel count of 0", 2, [caviar, "vae", "train", "--arch", "conv", "--channels", "4,0", "--data", p("good.h5"), "--likelihood", "gaussian", "--latent", "2", "--out", out], "--channels counts must be >= 1"),
        ("vae train: --bayesian-decoder with --arch conv", 2, [caviar, "vae", "train", "--arch", "conv", "--bayesian-decoder", "--data", p("good.h5"), "--likelihood", "gaussian", "--latent", "2", "--out", out], "--bayesian-decoder applies to --arch mlp only"),
        ("vae train --arch conv: --hidden given", 2, [caviar, "vae", "train", "--arch", "conv", "--hidden", "64", "--data", p("good.h5"), "--likelihood", "gaussian", "--latent", "2", "--out", out], "--hidden applies to --arch mlp"),
        ("vae train --arch mlp: --channels given", 2, [caviar, "vae", "train", "--channels", "8", "--data", p("good.h5"), "--likelihood", "gaussian", "--hidden", "4", "--latent", "2", "--out", out], "--channels and --image apply to --arch conv"),
        ("vae train: --prior-scale 0", 2, [caviar, "vae", "train", "--bayesian-decoder", "--prior-scale", "0", "--data", p("good.h5"), "--likelihood", "gaussian", "--hidden", "4", "--latent", "2", "--out", out], "--prior-scale must be > 0"),
        ("vae score: no importance samples", 2, [caviar, "vae", "score", "--model", p("vae_model.h5"), "--data", p("good.h5"), "--importance-samples", "0"], "--importance-samples must be >= 1"),
        ("vae score: a model file whose prior_scale is negative", 2, [caviar, "vae", "score", "--model", p("vae_bayes_bad_prior.h5"), "--data", p("good.h5")], "attribute prior_scale must be a positive number"),
        ("vae score: a full-posterior model of an earlier version", 2, [caviar, "vae", "score", "--model", p("vae_full_old.h5"), "--data", p("good.h5")], "a full-posterior VAE of an earlier caviar, whose lower triangle is not relative to sigma; train it again"),
        ("vae score: data of another width", 2, [caviar, "vae", "score", "--model", p("vae_model.h5"), "--data", p("good3d.h5")], "columns; the model has"),
        ("checkpoint is the input", 2, fit(p("good.h5") + ":/X", "-k", "2", "--checkpoint", p("good.h5"), "--out", out), "same file as input"),
        ("bad --checkpoint-every", 2, fit(p("good.h5") + ":/X", "-k", "2", "--checkpoint", p("ck_new.h5"), "--checkpoint-every", "10x", "--out", out), "--checkpoint-every must be"),
        ("--checkpoint-every alone", 2, fit(p("good.h5") + ":/X", "-k", "2", "--checkpoint-every", "5", "--out", out), "--checkpoint-every needs --checkpoint"),
        ("init file: every row zero", 2, fit(p("good.h5") + ":/X", "-k", "3", "--init", p("good.h5") + ":/zero_resp", "--out", out), "every row of the initial responsibilities is zero"),
        ("bad init file", 2, fit(p("good.h5") + ":/X", "-k", "3", "--init", p("good.h5") + ":/X", "--out", out), "expected 600 x 3"),
        ("lda resume: a gmm checkpoint", 2, lda(p("lda_a.h5"), "--topics", "3", "--resume", p("ck.h5"), "--out", out), "it was written by gmm, not lda"),
        ("gmm resume: an lda checkpoint", 2, fit(p("good.h5") + ":/X", "-k", "2", "--resume", p("lda_ck.h5"), "--out", out), "it was written by lda, not gmm"),
        ("lda resume: another K", 2, lda(p("lda_a.h5"), "--topics", "4", "--resume", p("lda_ck.h5"), "--out", out), "--topics 3, this run has --topics 4"),
        ("lda resume: another corpus (shape)", 2, lda(p("lda_b.h5"), "--topics", "3", "--resume", p("lda_ck.h5"), "--out", out), "--data (documents x vocabulary x entries) 300x60x"),
        ("lda resume: another corpus of the same shape", 2, lda(p("lda_same_shape.h5"), "--topics", "3", "--resume", p("lda_ck.h5"), "--out", out), "its corpus differs from this run's --data"),
        ("lda resume: another vocabulary", 2, lda(p("lda_v70.h5"), "--topics", "3", "--resume", p("lda_ck.h5"), "--out", out), "vocabulary size V = 60, this run has vocabulary size V = 70"),
        ("lda resume: another algorithm", 2, [caviar, "lda", "fit", "--data", p("lda_a.h5"), "--algorithm", "svi", "--topics", "3", "--resume", p("lda_ck.h5"), "--out", out], "--algorithm cavi, this run has --algorithm svi"),
        ("resume: a counter that is not an integer", 2, fit(p("good.h5") + ":/X", "-k", "2", "--resume", p("ck_iter_1e300.h5"), "--out", out), "its attribute 'iteration' = 1.0000000000000001e+300 is not an integer"),
        ("resume: an array attribute", 2, fit(p("good.h5") + ":/X", "-k", "2", "--resume", p("ck_attr_array.h5"), "--out", out), "attribute 'elapsed' of"),
        ("resume: a dataset the file does not hold", 2, fit(p("good.h5") + ":/X", "-k", "2", "--resume", p("ck_unstored.h5"), "--out", out), "'model/stats' in"),
        ("lda resume: an SVI checkpoint of an older caviar", 2, [caviar, "lda", "fit", "--data", p("lda_a.h5"), "--algorithm", "svi", "--batch-size", "100", "--topics", "3", "--resume", p("lda_svi_ck_old.h5"), "--out", out], "its fingerprint lacks 'layout'"),
        ("lda resume: a negative gamma", 2, lda(p("lda_a.h5"), "--topics", "3", "--resume", p("lda_ck_neg_gamma.h5"), "--out", out), "the gammas of document 7 are not all positive"),
        ("lda: an indptr the file does not hold", 2, lda(p("lda_unstored.h5"), "--topics", "3", "--out", out), "declares 300000000 elements"),
        ("lda checkpoint is the output", 2, lda(p("lda_a.h5"), "--topics", "3", "--checkpoint", out, "--out", out), "--checkpoint and --out name the same file"),
        ("plsa: missing corpus", 2, plsa(p("nope.h5"), "--topics", "3", "--out", out), "no such file"),
        ("plsa: K = 0", 2, plsa(p("lda_a.h5"), "--topics", "0", "--out", out), "--topics must be >= 1"),
        ("plsa: a negative count", 2, plsa(p("c_negative.h5"), "--topics", "3", "--out", out), "is negative"),
        ("plsa: a count that is no integer", 2, plsa(p("c_fraction.h5"), "--topics", "3", "--out", out), "/data[5]"),
        ("plsa: a word id out of range", 2, plsa(p("c_word_range.h5"), "--topics", "3", "--out", out), "/indices[9] = 60"),
        ("plsa: indptr not monotone", 2, plsa(p("c_not_monotone.h5"), "--topics", "3", "--out", out), "is not monotone"),
        ("plsa: an indptr the file does not hold", 2, plsa(p("lda_unstored.h5"), "--topics", "3", "--out", out), "declares 300000000 elements"),
        ("plsa: a corpus without tokens", 2, plsa(p("c_no_tokens.h5"), "--topics", "3", "--out", out), "has no tokens"),
        ("plsa: negative --smooth", 2, plsa(p("lda_a.h5"), "--topics", "3", "--smooth", "-1", "--out", out), "--smooth must be"),
        ("plsa: --doc-topics is --out", 2, plsa(p("lda_a.h5"), "--topics", "3", "--doc-topics", out, "--out", out), "--doc-topics and --out name the same file"),
        ("plsa: --heldout with another vocabulary", 2, plsa(p("lda_a.h5"), "--topics", "3", "--heldout", p("lda_v70.h5"), "--out", out), "vocabulary of 70 words but the model has 60"),
        ("plsa resume: an lda checkpoint", 2, plsa(p("lda_a.h5"), "--topics", "3", "--resume", p("lda_ck.h5"), "--out", out), "it was written by lda, not plsa"),
        ("plsa score: an lda model", 2, [caviar, "plsa", "score", "--model", p("lda_ck.h5"), "--data", p("lda_a.h5")], "is not a caviar plsa model"),
        ("plsa score: another vocabulary", 2, [caviar, "plsa", "score", "--model", p("plsa_m.h5"), "--data", p("lda_v70.h5")], "vocabulary of 70 words but the model has 60"),
        ("hmm: offsets not increasing", 2, hmm(p("hmm_not_increasing.h5"), "--out", out), "is not increasing at entry 2"),
        ("hmm: offsets not ending at T_total", 2, hmm(p("hmm_short_offsets.h5"), "--out", out), "ends at 38 but"),
        ("hmm: an empty sequence", 2, hmm(p("hmm_empty_seq.h5"), "--out", out), "sequence 1 of"),
        ("hmm: no /offsets", 2, hmm(p("hmm_no_offsets.h5"), "--out", out), "/offsets does not exist"),
        ("hmm: a negative symbol", 2, hmm(p("hmm_neg_symbol.h5"), "--out", out), "at step 31"),
        ("hmm: a symbol >= --symbols", 2, hmm(p("hmm_big_symbol.h5"), "--symbols", "3", "--out", out), "outside [0, --symbols 3)"),
        ("hmm: NaN in Gaussian data", 3, hmm(p("hmm_gauss_nan.h5"), "--emission", "gaussian", "--out", out), "not finite (NaN or inf) at step 26"),
        ("hmm: more states than time steps", 2, [caviar, "hmm", "fit", "--data", p("hmm_tiny.h5"), "--states", "4", "--out", out], "--states 4 is more than the 3 time steps"),
        ("hmm: categorical fit of 2-D data", 2, hmm(p("hmm_gauss.h5"), "--out", out), "categorical emissions need 1-D"),
        ("hmm: --posteriors is --out", 2, hmm(p("hmm_cat.h5"), "--posteriors", out, "--out", out), "--posteriors and --out name the same file"),
        ("hmm score: a Gaussian model on symbols", 2, [caviar, "hmm", "score", "--model", p("hmm_gm.h5"), "--data", p("hmm_cat.h5")], "is a gaussian-emission model but"),
        ("hmm decode: a categorical model on 2-D data", 2, [caviar, "hmm", "decode", "--model", p("hmm_cm.h5"), "--data", p("hmm_gauss.h5"), "--out", out], "is a categorical-emission model but"),
        ("hmm svi resume: a checkpoint of an older caviar", 2, [caviar, "hmm", "fit", "--data", p("hmm_cat.h5"), "--states", "2", "--symbols", "4", "--algorithm", "svi", "--batch-size", "1", "--max-iter", "3", "--resume", p("hmm_svi_ck_old.h5"), "--out", out], "its fingerprint lacks 'layout'"),
        ("hmm sample: --length 0", 2, [caviar, "hmm", "sample", "--model", p("hmm_cm.h5"), "--sequences", "3", "--length", "0", "--out", out], "--sequences and --length must be >= 1"),
        ("hmm sample: a plsa model", 2, [caviar, "hmm", "sample", "--model", p("plsa_m.h5"), "--sequences", "3", "--length", "4", "--out", out], "is not a caviar hmm model"),
        ("hmm score: a plsa model", 2, [caviar, "hmm", "score", "--model", p("plsa_m.h5"), "--data", p("hmm_cat.h5")], "is not a caviar hmm model"),
        ("hmm svi: --batch-size 0", 2, hmm(p("hmm_cat.h5"), "--algorithm", "svi", "--batch-size", "0", "--out", out), "--batch-size must be >= 1 (got 0)"),
        ("hmm --stream: NaN in Gaussian data", 3, hmm(p("hmm_gauss_nan.h5"), "--emission", "gaussian", "--stream", "--chunk-steps", "4", "--out", out), "not finite (NaN or inf) at step 26"),
        ("hmm --stream: a negative symbol", 2, hmm(p("hmm_neg_symbol.h5"), "--stream", "--chunk-steps", "4", "--out", out), "at step 31"),
        ("hmm svi --stream: a symbol >= --symbols", 2, hmm(p("hmm_big_symbol.h5"), "--algorithm", "svi", "--stream", "--symbols", "3", "--out", out), "outside [0, --symbols 3)"),
        ("hmm: --chunk-steps without --stream", 1, hmm(p("hmm_cat.h5"), "--chunk-steps", "10", "--out", out), "--chunk-steps needs --stream"),
        ("hmm: --chunk-steps 0", 1, hmm(p("hmm_cat.h5"), "--stream", "--chunk-steps", "0", "--out", out), "--chunk-steps must be >= 1 (got 0)"),
        ("hmm score: --chunk-steps without --stream", 1, [caviar, "hmm", "score", "--model", p("hmm_cm.h5"), "--data", p("hmm_cat.h5"), "--chunk-steps", "7"], "--chunk-steps needs --stream"),
        ("hmm decode --stream: NaN in Gaussian data", 2, [caviar, "hmm", "decode", "--model", p("hmm_gm.h5"), "--data", p("hmm_gauss_nan.h5"), "--stream", "--chunk-steps", "4", "--out", out], "not finite (NaN or inf) at step 26"),
        ("hmm score --stream: a negative symbol", 2, [caviar, "hmm", "score", "--model", p("hmm_cm.h5"), "--data", p("hmm_neg_symbol.h5"), "--stream", "--chunk-steps", "7"], "at step 31"),
        ("gmm compare: a missing file", 2, [caviar, "gmm", "compare", p("model3d.h5"), p("nope.h5"), "--plot", out], "nope.h5': no such file"),
        ("gmm compare: not HDF5", 2, [caviar, "gmm", "compare", p("not_hdf5.h5"), "--plot", out], "is not an HDF5 file"),
        ("gmm compare: a data file", 2, [caviar, "gmm", "compare", p("model3d.h5"), p("good3d.h5"), "--plot", out], "is not a caviar model file (no 'model' attribute)"),
        ("gmm compare: a checkpoint", 2, [caviar, "gmm", "compare", p("ck.h5"), "--plot", out], "is a checkpoint, not a fitted model"),
        ("gmm compare: a gmm and a plsa model", 2, [caviar, "gmm", "compare", p("model3d.h5"), p("plsa_m.h5"), "--plot", out], "is a plsa model, not a gmm model"),
        ("hmm compare: a gmm model", 1, [caviar, "hmm", "compare", p("hmm_cm.h5"), p("model3d.h5")], "is a gmm model, not an hmm model"),
        ("lda compare: an lda corpus, not a fit", 1, [caviar, "lda", "compare", p("lda_a.h5")], "lda_a.h5' is not a caviar model file"),
        ("gmm compare: a model without its final objective", 2, [caviar, "gmm", "compare", p("model3d_no_elbo.h5")], "records no final objective"),
        ("gmm compare: EM and variational fits", 2, [caviar, "gmm", "compare", p("model3d.h5"), p("model3d_em.h5"), "--plot", out], "records elbo but"),
        ("gmm compare: --plot onto a model", 2, [caviar, "gmm", "compare", p("model3d.h5"), "--plot", p("model3d.h5")], "is the same file as input"),
        ("hmm svi: --kappa 0.3", 2, hmm(p("hmm_cat.h5"), "--algorithm", "svi", "--kappa", "0.3", "--out", out), "--kappa must be in (0.5, 1]"),
        ("bbvi: logistic labels not 0/1", 2, bbvi(p("glm_label2.h5")), "row 411"),
        ("bbvi: X and y of different lengths", 2, bbvi(p("glm_short_y.h5")), "need one response per row"),
        ("bbvi: NaN in X", 2, bbvi(p("glm_nan.h5")), "row 333, column 1"),
        ("bbvi: --rank with meanfield", 2, bbvi(p("glm_good.h5"), "--rank", "2"), "--rank applies to --family lowrank only"),
        ("bbvi: --rank >= dimension", 2, bbvi(p("glm_good.h5"), "--family", "lowrank", "--rank", "4"), "--rank must be below the number of parameters (4)"),
        ("bbvi: unknown --model", 2, bbvi(p("glm_good.h5"), "--model", "probit"), "--model"),
        ("bbvi: --lr auto with --adapt-iter 0", 2, bbvi(p("glm_good.h5"), "--lr", "auto", "--adapt-iter", "0"), "--adapt-iter must be >= 1"),
    ]
    write_doc = sys.argv[4] if len(sys.argv) > 4 and sys.argv[3] == "--write-doc" else None
    failures, doc_rows = check_cases(cases, work, out)
    with open(existing, "rb") as f:
        if f.read() != b"previous contents":
            print("FAIL: an existing output was modified")
            failures += 1
    doc = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "docs", "errors.md")
    if write_doc:
        with open(write_doc, "w") as f:
            f.write(DOC_HEAD)
            f.write("| # | case | ranks | command (after `caviar`) | message |\n|---|---|---|---|---|\n")
            for i, (name, ranks, shown, line) in enumerate(doc_rows, 1):
                cell = lambda t: t.replace("|", "\\|")
                f.write(f"| {i} | {cell(name)} | {ranks} | `{cell(shown)}` | `{cell(line)}` |\n")
        print(f"wrote {write_doc}")
    else:
        with open(doc) as f:
            listed = set(re.findall(r"^\| \d+ \| (.+?) \| \d+ \|", f.read(), re.M))
        missing = [name.replace("|", "\\|") for name, *_ in cases if name.replace("|", "\\|") not in listed]
        if missing:
            print(f"FAIL: docs/errors.md does not list {missing} (regenerate it: see this file's docstring)")
            failures += 1
    print(f"{len(cases)} cases: {len(cases) - failures} passed, {failures} failed")
    return 1 if failures else 0


DOC_HEAD = """# Errors: what caviar says when the input is wrong

Every case below ends with exactly one line on stderr, `caviar: error: ...`, exit code 1 on
every rank, no hang, and no output file created or changed (outputs are written to a temporary
file and renamed only on success). The table is generated by running each case:
`tests/cli/test_bad_input.py build/caviar /tmp/bad --write-doc docs/errors.md`; the test suite
runs the same cases (ctest `cli.bad_input`) and fails if one is missing here. File names are
relative to the test's work directory.

The VAE (`tests/cli/test_vae.py`), LDA/CSR (`tests/cli/test_lda.py`) and `prep`
(`tests/cli/test_prep.py`) commands have their own bad-input cases in their tests.

"""


if __name__ == "__main__":
    sys.exit(main())
