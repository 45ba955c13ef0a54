"""caviar prep text / generate lda / lda fit|score|topics|export|import from the command line.

usage: test_lda.py CAVIAR WORKDIR
Checks: prep text on a tiny folder and on JSON lines (tokens, stopwords, df pruning, the CSR
layout read back with scipy), a fit at 1 and 2 ranks giving the same model bytes, the one-line
JSON summaries, held-out scoring of an imported scikit-learn-style matrix, and one-line errors.
"""
import json
import os
import subprocess
import sys

import h5py
import numpy as np
import scipy.sparse as sp

from clitest import fresh_workdir, mpirun

CAVIAR, WORK = sys.argv[1], sys.argv[2]
path = fresh_workdir(WORK)
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what)


def run(args, ranks=1, ok=True):
    cmd = (mpirun(ranks) if ranks > 1 else []) + [CAVIAR, "-q"] + args
    p = subprocess.run(cmd, capture_output=True, text=True)
    if ok and p.returncode != 0:
        raise SystemExit(f"command failed: {' '.join(cmd)}\n{p.stderr}")
    return p


def summary(p):
    return json.loads(p.stdout.strip().splitlines()[-1])


def read_csr(f):
    with h5py.File(f) as h:
        m = sp.csr_matrix((h["data"][:], h["indices"][:], h["indptr"][:]), shape=tuple(h.attrs["shape"]))
        vocab = [v.decode() for v in h["vocab"][:]]
    return m, vocab


# --- prep text: a folder of files --------------------------------------------------------------
folder = path("texts")
os.makedirs(folder)
docs = [
    "The cat sat on the mat. Cats and dogs!",
    "A dog and a cat: the DOG barks at the cat.",
    "Stock markets fell; the market closed lower.",
    "Markets and stocks: the stock market rallied.",
    "",  # an empty document
]
for i, t in enumerate(docs):
    with open(os.path.join(folder, f"{i:02d}.txt"), "w") as f:
        f.write(t)
p = run(["prep", "text", "--input", folder, "--out", path("folder.h5"), "--min-df", "2",
         "--max-df", "0.9"])
s = summary(p)
m, vocab = read_csr(path("folder.h5"))
# After stopwords ("the", "and", "a", "on", "at"): cat(3 docs? no: 2), dog 1 doc ("dog" in doc 1,
# "dogs" in doc 0), market(s), stock(s)... with min_df 2: cat, market, markets, stock.
check(vocab == ["cat", "market", "markets", "stock"], f"folder vocab {vocab}")
check(m.shape == (5, 4), f"folder shape {m.shape}")
dense = m.toarray()
check(dense[1].tolist() == [2, 0, 0, 0], f"doc 1 counts {dense[1].tolist()}")
check(dense[3].tolist() == [0, 1, 1, 1], f"doc 3 counts {dense[3].tolist()}")
check(dense[4].sum() == 0 and s["empty_documents"] >= 1, "empty document kept and counted")
check(s["documents"] == 5 and s["words"] == 4, f"summary {s}")
with h5py.File(path("folder.h5")) as h:
    check(h["data"].dtype == np.int32 and h["indptr"].dtype == np.int64, "dtypes int32/int64")

# --- prep text: JSON lines, with mail headers stripped -----------------------------------------
with open(path("mail.jsonl"), "w") as f:
    for body in ["budget meeting friday budget", "meeting notes friday", "budget cuts announced"]:
        f.write(json.dumps({"text": f"From: someone\nSubject: hello budget\n\n{body}"}) + "\n")
run(["prep", "text", "--input", path("mail.jsonl"), "--out", path("mail.h5"), "--min-df", "1",
     "--max-df", "1.0", "--strip-headers"])
m, vocab = read_csr(path("mail.h5"))
check("subject" not in vocab and "someone" not in vocab, f"headers stripped: {vocab}")
check(m[0, vocab.index("budget")] == 2, "budget counted twice in message 0")
check(m.shape[0] == 3, "three messages")

# --- bad input: one line, non-zero exit, nothing written ---------------------------------------
with open(path("bad.jsonl"), "w") as f:
    f.write('{"text": "fine"}\n{"body": "no text"}\n')
p = run(["prep", "text", "--input", path("bad.jsonl"), "--out", path("bad.h5")], ok=False)
check(p.returncode != 0 and "bad.jsonl:2: no string field" in p.stderr, f"bad jsonl: {p.stderr}")
check(not os.path.exists(path("bad.h5")), "nothing written for bad input")

# --- generate, fit at 1 and 2 ranks, score, topics, export/import -----------------------------
run(["generate", "lda", "--docs", "800", "--words", "200", "--topics", "5", "--seed", "2",
     "--out", path("syn.h5"), "--heldout", path("held.h5"), "--heldout-docs", "200"], ranks=2)
fits = {}
for n in (1, 2):
    p = run(["lda", "fit", "--data", path("syn.h5"), "--topics", "5", "--algorithm", "svi",
             "--max-iter", "3", "--batch-size", "100", "--out", path(f"m{n}.h5"),
             "--heldout", path("held.h5")], ranks=n)
    fits[n] = summary(p)
    check(fits[n]["ranks"] == n, "ranks in summary")
with h5py.File(path("m1.h5")) as a, h5py.File(path("m2.h5")) as b:
    check(np.array_equal(a["components"][:], b["components"][:]), "same model at 1 and 2 ranks")
    lam = a["components"][:]
check(fits[1]["elbo"] == fits[2]["elbo"], "same ELBO at 1 and 2 ranks")
# The retired name --passes still works (same fit), with one note; not together with --max-iter.
svi3 = ["lda", "fit", "--data", path("syn.h5"), "--topics", "5", "--algorithm", "svi",
        "--batch-size", "100", "--heldout", path("held.h5")]
p = run(svi3 + ["--passes", "3", "--out", path("m_passes.h5")])
check(summary(p)["elbo"] == fits[1]["elbo"], "--passes 3 is --max-iter 3")
check(p.stderr.count("caviar: note: --passes is deprecated") == 1, f"one note: {p.stderr}")
p = run(svi3 + ["--passes", "3", "--max-iter", "3"], ok=False)
check(p.returncode != 0 and "excludes" in p.stderr, f"--passes with --max-iter: {p.stderr}")
s = summary(run(["lda", "score", "--model", path("m1.h5"), "--data", path("held.h5")], ranks=2))
check(abs(s["perplexity"] - fits[1]["perplexity"]) == 0, f"score = fit's held-out {s}")
check(s["perplexity"] < 200, f"better than uniform: {s['perplexity']}")
t = summary(run(["lda", "topics", "--model", path("m1.h5"), "--top", "3"]))
check(len(t["topics"]) == 5 and all(len(x) == 3 for x in t["topics"]), "topics listing")

# A peer's matrix (e.g. scikit-learn's components_) imported and scored by the same estimator.
with h5py.File(path("peer.h5"), "w") as h:
    h["components"] = lam
run(["lda", "import", "--topics", path("peer.h5"), "--alpha", "0.2", "--eta", "0.2",
     "--vocab", path("syn.h5"), "--out", path("peer_model.h5")])
s2 = summary(run(["lda", "score", "--model", path("peer_model.h5"), "--data", path("held.h5")]))
with h5py.File(path("m1.h5")) as a:
    same_prior = a.attrs["alpha"] == 0.2
check(same_prior and s2["perplexity"] == s["perplexity"], f"imported = original {s2} {s}")
run(["lda", "export", "--model", path("m1.h5"), "--out", path("exported.h5")])
with h5py.File(path("exported.h5")) as h:
    check(np.array_equal(h["components"][:], lam), "export components")
    check(np.allclose(h["topic_word"][:].sum(axis=1), 1), "export topic_word rows sum to 1")

# Vocabulary mismatch is an error.
p = run(["lda", "score", "--model", path("m1.h5"), "--data", path("folder.h5")], ok=False)
check(p.returncode == 1 and "vocabulary of 4 words but the model has 200" in p.stderr,
      f"vocab mismatch: {p.stderr}")

if failures:
    print(f"{len(failures)} failure(s)")
    sys.exit(1)
print("ok")
