#!/usr/bin/env -S /usr/bin/python3
"""The HDF5 reader accepts float64, float32 and integer datasets, contiguous or chunked and
gzip-compressed, at any group path; each gives the same fit as the same values stored as
contiguous float64. Also checks `gmm predict` writes one label per row, in row order, and that the
generator's file is identical at 1 and 3 ranks.

usage: test_formats.py CAVIAR_BIN WORKDIR
"""
import sys

import h5py
import numpy as np

from clitest import fresh_workdir, mpirun, run_summary


def main():
    caviar, work = sys.argv[1], sys.argv[2]
    p = fresh_workdir(work)
    rng = np.random.default_rng(3)
    centers = np.array([[0, 0, 0], [40, 10, -20], [-30, 25, 10]])
    x = np.concatenate([c + 3 * rng.normal(size=(700, 3)) for c in centers])
    x = np.round(x)  # integer-valued, so every dtype below holds exactly the same numbers
    with h5py.File(p("data.h5"), "w") as f:
        f["X"] = x
        f["f32"] = x.astype(np.float32)
        f["i32"] = x.astype(np.int32)
        f["i16"] = x.astype(np.int16)
        f.create_dataset("deep/group/chunked", data=x, chunks=(100, 3), compression="gzip")
        f.create_dataset("chunked_f32", data=x.astype(np.float32), chunks=(333, 1), compression="gzip", shuffle=True)

    def fit(path, ranks, out):
        run_summary(mpirun(ranks) + [caviar, "-q", "gmm", "fit", "--data", p("data.h5") + ":" + path,
                             "-k", "3", "--seed", "4", "--max-iter", "30", "--tol", "0", "--out", out])
        with h5py.File(out, "r") as m:
            return {k: m[k][:] for k in ("weights", "means", "covariances", "trace/elbo")}

    failures = 0
    ref = fit("/X", 1, p("ref.h5"))
    for path in ["/f32", "/i32", "/i16", "/deep/group/chunked", "/chunked_f32"]:
        got = fit(path, 2, p("m.h5"))
        err = max(np.abs(got[k] - ref[k]).max() / np.abs(ref[k]).max() for k in ref)
        ok = err < 1e-10
        failures += not ok
        print(f"{'ok  ' if ok else 'FAIL'} {path}: max norm-wise relative difference {err:.2e}")

    run_summary(mpirun(3) + [caviar, "-q", "gmm", "predict", "--model", p("ref.h5"), "--data",
                     p("data.h5") + ":/deep/group/chunked", "--out", p("labels.h5")])
    with h5py.File(p("labels.h5"), "r") as f:
        labels = f["labels"][:]
    # Rows come in blocks of 700 per true cluster: each block must get a single label.
    blocks_ok = labels.shape == (2100,) and all(len(set(labels[i * 700:(i + 1) * 700])) == 1 for i in range(3)) \
        and len(set(labels)) == 3
    failures += not blocks_ok
    print(f"{'ok  ' if blocks_ok else 'FAIL'} predict labels in row order: {np.bincount(labels)}")

    for ranks in (1, 3):
        run_summary(mpirun(ranks) + [caviar, "-q", "generate", "gmm", "--n", "5000", "--dim", "4",
                             "--components", "3", "--seed", "9", "--out", p(f"gen{ranks}.h5") + ":/data/X"])
    with h5py.File(p("gen1.h5"), "r") as a, h5py.File(p("gen3.h5"), "r") as b:
        same = all(np.array_equal(a[k][:], b[k][:]) for k in ("data/X", "data/labels", "data/true/means"))
        shape_ok = a["data/X"].shape == (5000, 4) and a["data/true/covariances"].shape == (3, 4, 4)
    failures += not (same and shape_ok)
    print(f"{'ok  ' if same and shape_ok else 'FAIL'} generate identical at 1 and 3 ranks")
    print(f"{7 - failures} passed, {failures} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
