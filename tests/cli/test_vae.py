#!/usr/bin/env -S /usr/bin/python3
"""`caviar vae ...` end to end on a small synthetic image set: the model file's layout, weights
that do not depend on the rank count, resume identity, encode against a numpy forward pass of the
saved weights, the PNG commands, and one-line errors for bad input.

usage: test_vae.py CAVIAR_BIN WORKDIR
"""
import json
import os
import subprocess
import sys

import h5py
import numpy as np

from clitest import fresh_workdir, mpirun

TIMEOUT = 120
FAILURES = []


def check(cond, what):
    if not cond:
        FAILURES.append(what)
        print("FAIL:", what, file=sys.stderr)


def run(cmd, ranks=1, expect_ok=True):
    full = (mpirun(ranks) if ranks > 1 else []) + cmd
    p = subprocess.run(full, capture_output=True, text=True, timeout=TIMEOUT)
    if expect_ok and p.returncode != 0:
        raise SystemExit(f"command failed ({p.returncode}): {' '.join(full)}\n{p.stderr}")
    return p


def summary(p):
    lines = [l for l in p.stdout.splitlines() if l.strip()]
    check(len(lines) == 1, f"one JSON line on stdout, got {lines}")
    return json.loads(lines[-1])


def images(n, rng):
    """4x4 'images': one of three bar patterns with grey levels, values in [0, 1]."""
    pats = np.zeros((3, 16))
    pats[0, :4] = pats[0, 8:12] = 1
    pats[1, ::4] = pats[1, 2::4] = 1
    pats[2, [0, 5, 10, 15, 3, 6, 9, 12]] = 1
    x = pats[np.arange(n) % 3] * 0.8 + 0.1
    return np.clip(x + rng.uniform(-0.1, 0.1, size=x.shape), 0, 1)


def with_opt(cmd, flag, value):
    """cmd with `flag value` set (replacing an earlier value: options may be given once)."""
    cmd = list(cmd)
    if flag in cmd:
        cmd[cmd.index(flag) + 1] = value
        return cmd
    return cmd + [flag, value]


def weights(path):
    with h5py.File(path, "r") as f:
        out = {}
        f.visititems(lambda name, obj: out.__setitem__(name, np.asarray(obj))
                     if isinstance(obj, h5py.Dataset) and name.endswith(("/W", "/b")) else None)
        return out


def main():
    caviar, work = sys.argv[1], sys.argv[2]
    p = fresh_workdir(work)
    rng = np.random.default_rng(0)
    with h5py.File(p("data.h5"), "w") as f:
        f["train"] = images(400, rng).astype(np.float32)
        f["test"] = images(120, rng).astype(np.float32)
        bad = images(50, rng)
        bad[13, 5] = 255.0  # raw pixel values, not scaled to [0, 1]
        f["bad"] = bad
        f["wide"] = rng.uniform(size=(50, 9))
    train = [caviar, "vae", "train", "--data", p("data.h5") + ":/train", "--test",
             p("data.h5") + ":/test", "--hidden", "8,6", "--latent", "2", "--batch-size", "40",
             "--lr", "3e-3", "--seed", "5"]

    # Train at 1 and 2 ranks: same weights, bit for bit.
    train = with_opt(train, "--max-iter", "3")
    r1 = run(train + ["--out", p("m1.h5")])
    s1 = summary(r1)
    r2 = run(train + ["--out", p("m2.h5")], ranks=2)
    s2 = summary(r2)
    for key in ("train_elbo", "test_elbo", "epochs", "seconds"):
        check(key in s1, f"summary has {key}: {s1}")
    check(s1["epochs"] == 3 and s2["ranks"] == 2, f"summaries {s1} {s2}")
    check(s1["train_elbo"] == s2["train_elbo"] and s1["test_elbo"] == s2["test_elbo"],
          f"ELBO at 1 and 2 ranks: {s1} vs {s2}")
    check(r1.stderr.count("rows/s") == 3, f"one progress line per epoch:\n{r1.stderr}")
    w1, w2 = weights(p("m1.h5")), weights(p("m2.h5"))
    check(sorted(w1) == sorted(w2) and all(np.array_equal(w1[k], w2[k]) for k in w1),
          "weights at 1 and 2 ranks are bitwise equal")

    # The model file: weights by layer name (PyTorch's out x in layout), architecture, traces.
    expect = {"encoder/hidden0/W": (8, 16), "encoder/hidden1/W": (6, 8), "encoder/mu/W": (2, 6),
              "encoder/logvar/W": (2, 6), "decoder/hidden0/W": (6, 2), "decoder/hidden1/W": (8, 6),
              "decoder/logits/W": (16, 8), "decoder/logits/b": (16,)}
    for k, shape in expect.items():
        check(k in w1 and w1[k].shape == shape, f"{k} has shape {shape}")
    with h5py.File(p("m1.h5"), "r") as f:
        check(list(f["architecture/hidden"][()]) == [8, 6], "architecture/hidden")
        check(int(f.attrs["latent"]) == 2 and f.attrs["likelihood"] in ("bernoulli", b"bernoulli"),
              "latent and likelihood attributes")
        check(f["trace/train_elbo"].shape == (3,) and f["trace/test_elbo"].shape == (3,), "traces")
        check(abs(f["trace/test_elbo"][-1] - s1["test_elbo"]) < 1e-9, "trace ends at the summary")

    # Checkpoint after 2 epochs, resume for the 3rd: identical to 3 epochs straight.
    run(with_opt(train, "--max-iter", "2") + ["--checkpoint", p("ck.h5")], ranks=2)
    s3 = summary(run(train + ["--resume", p("ck.h5"), "--out", p("m3.h5")]))
    w3 = weights(p("m3.h5"))
    check(all(np.array_equal(w1[k], w3[k]) for k in w1), "resumed weights equal straight ones")
    check(s3["test_elbo"] == s1["test_elbo"], f"resumed ELBO {s3} vs {s1}")

    # --checkpoint-every 2 (epochs): written after epoch 2 only (epoch 3 is not a multiple);
    # resuming from it at 2 ranks gives the straight run's bits again.
    run(train + ["--checkpoint", p("ck2.h5"), "--checkpoint-every", "2", "--out", p("m4.h5")])
    with h5py.File(p("ck2.h5"), "r") as f:
        check(int(f.attrs["iteration"]) == 2 and int(f.attrs["driver.step_in_epoch"]) == 0,
              f"--checkpoint-every 2: a checkpoint after epoch 2, got {dict(f.attrs)}")
    s5 = summary(run(train + ["--resume", p("ck2.h5"), "--out", p("m5.h5")], ranks=2))
    w5 = weights(p("m5.h5"))
    check(all(np.array_equal(w1[k], w5[k]) for k in w1) and s5["test_elbo"] == s1["test_elbo"],
          "resumed from --checkpoint-every 2 at 2 ranks: the straight run's weights")
    r = run(train + ["--checkpoint", p("ck3.h5"), "--checkpoint-every", "2x"], expect_ok=False)
    check(r.returncode == 1 and "--checkpoint-every" in r.stderr, f"--checkpoint-every 2x: {r.stderr}")

    # A checkpoint of the VAE's own older layout (before the engine's gradient driver) is refused
    # with one line.
    with h5py.File(p("old_ck.h5"), "w") as f:
        f.attrs["model"] = "vae"
        f.attrs["checkpoint"] = 1
        f.attrs["fingerprint"] = json.dumps({"data_shape": "400x16", "seed": "5"})
        f.attrs["epoch"] = 1
        f["params"] = np.zeros(10)
    r = run(train + ["--resume", p("old_ck.h5"), "--out", p("m6.h5")], expect_ok=False)
    errs = [l for l in r.stderr.splitlines() if l.startswith("caviar: error:")]
    check(r.returncode == 1 and len(errs) == 1 and "lacks 'layout'" in errs[0],
          f"the older checkpoint layout is refused with one line: {r.stderr}")

    # encode (2 ranks, parallel writes) against numpy's forward pass of the saved weights.
    summary(run([caviar, "vae", "encode", "--model", p("m1.h5"), "--data", p("data.h5") + ":/test",
                 "--out", p("codes.h5")], ranks=2))
    with h5py.File(p("codes.h5"), "r") as f, h5py.File(p("data.h5"), "r") as d:
        mu, lv, x = np.asarray(f["mu"]), np.asarray(f["logvar"]), np.asarray(d["test"], float)
    h = x
    for k in ("encoder/hidden0", "encoder/hidden1"):
        h = np.maximum(h @ w1[k + "/W"].T + w1[k + "/b"], 0)
    check(mu.shape == (120, 2) and lv.shape == (120, 2), f"codes shapes {mu.shape} {lv.shape}")
    check(np.allclose(mu, h @ w1["encoder/mu/W"].T + w1["encoder/mu/b"], atol=1e-4), "mu")
    check(np.allclose(lv, h @ w1["encoder/logvar/W"].T + w1["encoder/logvar/b"], atol=1e-4), "logvar")

    # PNG commands (matplotlib through scripts/plot_vae.py).
    image_cases = [(["sample", "--n", "12"], 12, 12),
                   (["reconstruct", "--data", p("data.h5") + ":/test", "--n", "7"], 7, 14),
                   (["manifold", "--grid", "5"], 25, 25)]
    for cmd, count, n in image_cases:
        name = cmd[0]
        r = run([caviar, "vae"] + cmd + ["--model", p("m1.h5"), "--png", p(name + ".png"), "--out",
                                          p(name + ".h5")], ranks=2 if name == "sample" else 1)
        check(summary(r)["images"] == count, f"{name} summary")
        with open(p(name + ".png"), "rb") as f:
            check(f.read(8) == b"\x89PNG\r\n\x1a\n", f"{name}.png is a PNG")
        with h5py.File(p(name + ".h5"), "r") as f:
            im = np.asarray(f["images"])
            check(im.shape[1] == 16 and im.shape[0] >= n and im.min() >= 0 and im.max() <= 1,
                  f"{name} images {im.shape}")
    check(not [f for f in os.listdir(work) if "tmp-caviar" in f], "no temporary files left")

    # Bad input: one error line, exit 1, on every rank, nothing written.
    one = with_opt(train, "--max-iter", "1")
    bad_cases = [
        (with_opt(one, "--data", p("data.h5") + ":/bad"), "row 13, column 5"),
        (with_opt(one, "--latent", "0"), "--latent"),
        (with_opt(one, "--hidden", "8,x"), "--hidden"),
        (with_opt(one, "--test", p("data.h5") + ":/wide"), "columns"),
        (with_opt(one, "--batch-size", "0"), "--batch-size"),
        ([caviar, "vae", "manifold", "--model", p("nope.h5"), "--png", p("x.png")], "nope"),
    ]
    for i, (cmd, fragment) in enumerate(bad_cases):
        out = p("bad_out.h5")
        # Every other case at 2 ranks (tests/mpi covers errors at 1, 2 and 4 ranks); mpirun's
        # start-up is most of this test's time on a busy machine.
        r = run(cmd + ["--out", out] if cmd[2] == "train" else cmd, ranks=2 - i % 2,
                expect_ok=False)
        errs = [l for l in r.stderr.splitlines() if l.startswith("caviar: error:")]
        check(r.returncode != 0, f"non-zero exit for {fragment}")
        check(len(errs) == 1 and fragment in errs[0], f"one error line with '{fragment}': {r.stderr}")
        check(not os.path.exists(out) and not os.path.exists(p("x.png")), f"no output for {fragment}")

    # The convolutional VAE (4x4 images -> 2x2 -> 1x1, batch norm over the global minibatch):
    # the same bits at 1 and 2 ranks, the layers in PyTorch's shapes with batch norm's running
    # statistics, and a model file that reproduces the run's final test ELBO in vae score.
    conv = [caviar, "vae", "train", "--arch", "conv", "--channels", "4,6", "--data",
            p("data.h5") + ":/train", "--test", p("data.h5") + ":/test", "--latent", "2",
            "--batch-size", "40", "--lr", "3e-3", "--seed", "5", "--max-iter", "2"]
    c1 = summary(run(conv + ["--out", p("c1.h5")]))
    c2 = summary(run(conv + ["--out", p("c2.h5")], ranks=2))
    check(c1["test_elbo"] == c2["test_elbo"], f"conv test ELBO at 1 and 2 ranks: {c1} vs {c2}")

    def datasets(path):
        with h5py.File(path, "r") as f:
            out = {}
            f.visititems(lambda name, obj: out.__setitem__(name, np.asarray(obj))
                         if isinstance(obj, h5py.Dataset) and not name.startswith("trace") else None)
            return out
    d1, d2 = datasets(p("c1.h5")), datasets(p("c2.h5"))
    check(sorted(d1) == sorted(d2) and all(np.array_equal(d1[k], d2[k]) for k in d1),
          "conv model files at 1 and 2 ranks are bitwise equal")
    expect = {"encoder/conv0/W": (4, 1, 4, 4), "encoder/conv1/W": (6, 4, 4, 4),
              "encoder/mu/W": (2, 6), "decoder/project/W": (6, 2), "decoder/deconv0/W": (6, 4, 4, 4),
              "decoder/deconv1/W": (4, 1, 4, 4), "decoder/deconv1/b": (1,),
              "encoder/bn1/running_var": (6,), "decoder/bn_project/gamma": (6,),
              "decoder/bn0/running_mean": (4,), "architecture/image": (3,)}
    for k, shape in expect.items():
        check(k in d1 and d1[k].shape == shape, f"conv {k} has shape {shape}")
    check(np.all(d1["encoder/bn1/running_var"] > 0) and
          not np.array_equal(d1["encoder/bn1/running_var"], np.ones(6)),
          "the running variances were updated")
    sc = summary(run([caviar, "vae", "score", "--model", p("c1.h5"), "--data", p("data.h5") + ":/test",
                      "--importance-samples", "20", "--seed", "5"], ranks=2))
    check(sc["elbo"] == c1["test_elbo"], f"vae score of the conv model file gives the run's test ELBO: "
          f"{sc['elbo']} vs {c1['test_elbo']}")
    check(sc["log_px"] >= sc["elbo"] - 1.0, f"importance-weighted log p(x) near or above the ELBO: {sc}")
    for cmd in (["sample", "--model", p("c1.h5"), "--n", "9", "--png", p("c_samples.png")],
                ["reconstruct", "--model", p("c1.h5"), "--data", p("data.h5") + ":/test", "--n", "6",
                 "--png", p("c_recon.png")]):
        run([caviar, "vae"] + cmd)
        check(os.path.getsize(cmd[-1]) > 0, f"vae {cmd[0]} of a conv model writes a PNG")

    # A latent-3 model cannot draw a 2-D manifold.
    run(with_opt(one, "--latent", "3") + ["--out", p("z3.h5")])
    r = run([caviar, "vae", "manifold", "--model", p("z3.h5"), "--png", p("z3.png")], expect_ok=False)
    check(r.returncode != 0 and "latent 2" in r.stderr, f"manifold needs latent 2: {r.stderr}")

    if FAILURES:
        print(f"{len(FAILURES)} check(s) failed", file=sys.stderr)
        sys.exit(1)
    print("ok")


if __name__ == "__main__":
    main()
