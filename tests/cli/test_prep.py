#!/usr/bin/env -S /usr/bin/python3
"""`caviar prep fashion-mnist` on small IDX files written here (gzip and plain), checked against
the bytes and against numpy's PCA; the same file at 1 and 3 ranks; malformed inputs give one
clear error and no output; and, when Debian's dataset-fashion-mnist is installed, the real data.

usage: test_prep.py CAVIAR_BIN WORKDIR
"""
import gzip
import json
import os
import struct
import subprocess
import sys

import h5py
import numpy as np

from clitest import fresh_workdir, mpirun

REAL = "/usr/share/datasets/fashion-mnist"
NAMES = {
    "train_images": "train-images-idx3-ubyte",
    "train_labels": "train-labels-idx1-ubyte",
    "test_images": "t10k-images-idx3-ubyte",
    "test_labels": "t10k-labels-idx1-ubyte",
}


def idx_bytes(a):
    a = np.asarray(a, dtype=np.uint8)
    return struct.pack(">I", 0x800 | a.ndim) + b"".join(struct.pack(">I", s) for s in a.shape) + a.tobytes()


def write_set(d, arrays, gz=True, override=None):
    os.makedirs(d, exist_ok=True)
    for key, name in NAMES.items():
        data = (override or {}).get(key, idx_bytes(arrays[key]))
        if gz:
            with gzip.open(os.path.join(d, name + ".gz"), "wb") as f:
                f.write(data)
        else:
            with open(os.path.join(d, name), "wb") as f:
                f.write(data)


def run(argv, expect_ok=True):
    r = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    if expect_ok and r.returncode != 0:
        raise SystemExit(f"FAIL: {' '.join(argv)}\n{r.stderr}")
    return r


def main():
    caviar, work = sys.argv[1], sys.argv[2]
    p = fresh_workdir(work)
    rng = np.random.default_rng(5)
    arrays = {
        "train_images": rng.integers(0, 256, size=(700, 6, 5)),
        "train_labels": rng.integers(0, 10, size=700),
        "test_images": rng.integers(0, 256, size=(130, 6, 5)),
        "test_labels": rng.integers(0, 10, size=130),
    }
    # Give the pixels some correlation so that the principal components are well separated.
    arrays["train_images"][:, :3, :] = arrays["train_images"][:, 3:, :] // 2 + rng.integers(0, 60, size=(700, 3, 5))
    write_set(p("gz"), arrays, gz=True)
    write_set(p("plain"), arrays, gz=False)

    outs = {}
    for name, src, np_ in [("gz1", "gz", 1), ("gz3", "gz", 3), ("plain2", "plain", 2)]:
        out = p(name + ".h5")
        r = run(mpirun(np_) + [caviar, "prep", "fashion-mnist", "--source", p(src), "--out", out, "--pca", "4"])
        summary = json.loads(r.stdout.strip().splitlines()[-1])
        assert summary["train"] == 700 and summary["test"] == 130 and summary["pixels"] == 30, summary
        outs[name] = out

    with h5py.File(outs["gz1"]) as f:
        for split, n in [("train", 700), ("test", 130)]:
            img = f[f"{split}/images"]
            assert img.dtype == np.float32 and img.shape == (n, 30), (img.dtype, img.shape)
            want = (arrays[f"{split}_images"].reshape(n, 30) / 255.0).astype(np.float32)
            assert np.array_equal(img[:], want), f"{split} pixels differ from the IDX bytes / 255"
            assert np.array_equal(f[f"{split}/labels"][:], arrays[f"{split}_labels"])
        x = arrays["train_images"].reshape(700, 30) / 255.0
        mean = x.mean(0)
        cov = np.cov(x.T, bias=True)
        w, v = np.linalg.eigh(cov)
        w, v = w[::-1][:4], v[:, ::-1][:, :4]
        assert np.allclose(f["pca/mean"][:], mean, rtol=0, atol=1e-12)
        ev = f["pca/explained_variance"][:]
        assert np.allclose(ev, w, rtol=1e-10, atol=0), (ev, w)
        comp = f["pca/components"][:]
        for k in range(4):
            # Sign convention: the largest-magnitude entry of each component is positive.
            assert comp[k, np.argmax(np.abs(comp[k]))] > 0
            assert abs(abs(comp[k] @ v[:, k]) - 1) < 1e-9, f"component {k} differs from numpy's"
        assert np.allclose(f["train/pca"][:], (x - mean) @ comp.T, rtol=0, atol=1e-10)
        xt = arrays["test_images"].reshape(130, 30) / 255.0
        assert np.allclose(f["test/pca"][:], (xt - mean) @ comp.T, rtol=0, atol=1e-10)

    # Rank count and compression change nothing (the PCA up to the rounding of its sums).
    with h5py.File(outs["gz1"]) as a, h5py.File(outs["gz3"]) as b, h5py.File(outs["plain2"]) as c:
        for name in ["train/images", "train/labels", "test/images", "test/labels"]:
            assert np.array_equal(a[name][:], b[name][:]) and np.array_equal(a[name][:], c[name][:]), name
        for name in ["pca/components", "train/pca"]:
            assert np.allclose(a[name][:], b[name][:], rtol=0, atol=1e-12), name

    # Malformed inputs: one clear line on stderr, exit 1, no output file.
    bad_cases = {
        "missing directory": (None, "not found"),
        "bad magic": ({"train_images": struct.pack(">I", 0x803 + 0x100) + b"\0" * 16}, "not an IDX file"),
        "truncated data": ({"train_images": idx_bytes(arrays["train_images"])[:-7]}, "truncated"),
        "label out of range": ({"test_labels": idx_bytes(np.full(130, 11))}, "labels are 0..9"),
        "count mismatch": ({"test_labels": idx_bytes(np.zeros(129))}, "129 labels"),
    }
    for i, (case, (override, needle)) in enumerate(bad_cases.items()):
        src = p(f"bad{i}")
        if override is not None:
            write_set(src, arrays, gz=(i % 2 == 0), override=override)
        out = p(f"bad{i}.h5")
        r = run(mpirun(2) + [caviar, "prep", "fashion-mnist", "--source", src, "--out", out], expect_ok=False)
        lines = [l for l in r.stderr.splitlines() if l.startswith("caviar: error:")]
        assert r.returncode != 0, f"{case}: exit 0"
        assert len(lines) == 1 and needle in lines[0], f"{case}: {r.stderr!r}"
        assert not os.path.exists(out), f"{case}: output written"
        assert not any(n.startswith(f"bad{i}.h5") for n in os.listdir(work)), f"{case}: temp file left"
    r = run(mpirun(1) + [caviar, "prep", "fashion-mnist", "--source", p("gz"), "--out", p("x.h5"), "--pca", "31"],
            expect_ok=False)
    assert r.returncode != 0 and "exceeds the 30 pixels" in r.stderr, r.stderr

    if os.path.isdir(REAL):
        out = p("fmnist.h5")
        run(mpirun(2) + [caviar, "prep", "fashion-mnist", "--out", out])
        with h5py.File(out) as f:
            assert f["train/images"].shape == (60000, 784) and f["test/images"].shape == (10000, 784)
            with gzip.open(os.path.join(REAL, NAMES["test_images"] + ".gz")) as g:
                raw = np.frombuffer(g.read()[16:16 + 784], dtype=np.uint8)
            assert np.array_equal(f["test/images"][0], (raw / 255.0).astype(np.float32))
            counts = np.bincount(f["train/labels"][:], minlength=10)
            assert (counts == 6000).all(), counts
        print("real Fashion-MNIST checked")
    else:
        print(f"{REAL} not installed: real-data check skipped")
    print("PASS")


if __name__ == "__main__":
    main()
