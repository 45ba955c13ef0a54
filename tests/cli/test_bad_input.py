#!/usr/bin/env -S /usr/bin/python3
"""Bad input to `caviar gmm fit` must end with exactly one clear error line, a non-zero exit on
every rank, no hang (a timeout fails the case), and no output file, new or changed.

usage: test_bad_input.py CAVIAR_BIN WORKDIR
"""
import os
import subprocess
import sys

import h5py
import numpy as np

from clitest import fresh_workdir, mpirun

TIMEOUT = 60




def main():
    caviar, work = sys.argv[1], sys.argv[2]
    p = fresh_workdir(work)

    rng = np.random.default_rng(0)
    good = rng.normal(size=(600, 2))
    with h5py.File(p("good.h5"), "w") as f:
        f["X"] = good
        f["grp/X"] = good
    with h5py.File(p("nan.h5"), "w") as f:
        x = good.copy()
        x[433, 1] = np.nan
        f["X"] = x
    with h5py.File(p("inf.h5"), "w") as f:
        x = good.copy()
        x[17, 0] = -np.inf
        f["X"] = x
    with h5py.File(p("shapes.h5"), "w") as f:
        f["one_d"] = good[:, 0]
        f["three_d"] = good.reshape(600, 2, 1)
        f["empty"] = np.zeros((0, 2))
        f["strings"] = np.array([b"a", b"b"] * 300).reshape(300, 2)
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
        ("K = 0", 2, fit(p("good.h5") + ":/X", "-k", "0", "--out", out), "--components must be >= 1"),
        ("K > N", 2, fit(p("good.h5") + ":/X", "-k", "601", "--out", out), "exceeds the number of rows"),
        ("more ranks than rows", 2, fit(p("tiny.h5") + ":/X", "-k", "1", "--out", out), "fewer than the 2 MPI ranks"),
        ("negative tol", 2, fit(p("good.h5") + ":/X", "-k", "2", "--tol", "-1", "--out", out), "--tol"),
        ("bad nu0", 2, fit(p("good.h5") + ":/X", "-k", "2", "--nu0", "0.5", "--out", out), "--nu0"),
        ("unwritable output", 2, fit(p("good.h5") + ":/X", "-k", "2", "--out", p("no/such/dir/m.h5")), "cannot write output"),
        ("output is the input", 2, fit(p("good.h5") + ":/X", "-k", "2", "--out", p("good.h5")), "same file as input"),
        ("existing output kept on error", 2, fit(p("nan.h5") + ":/X", "-k", "2", "--out", existing), "non-finite"),
        ("bad init file", 2, fit(p("good.h5") + ":/X", "-k", "3", "--init", p("good.h5") + ":/X", "--out", out), "expected 600 x 3"),
    ]
    failures = 0
    for name, ranks, argv, expect in cases:
        before = {f: os.stat(p(f)).st_mtime_ns for f in os.listdir(work) if os.path.isfile(p(f))}
        try:
            r = subprocess.run(mpirun(ranks) + argv, capture_output=True, text=True, timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            print(f"FAIL {name}: hung (no exit within {TIMEOUT} s)")
            failures += 1
            continue
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
        if os.path.exists(out):
            problems.append("output file was written")
            os.remove(out)
        leftovers = [f for f in os.listdir(work) if f.endswith(".tmp-caviar")]
        if leftovers:
            problems.append(f"temporary files left: {leftovers}")
        after = {f: os.stat(p(f)).st_mtime_ns for f in before if os.path.exists(p(f))}
        if after != before:
            problems.append("an existing file was changed or removed")
        line = err_lines[0] if err_lines else r.stderr.strip()[-300:]
        if problems:
            failures += 1
            print(f"FAIL {name}: {'; '.join(problems)}\n     exit={r.returncode} stderr: {line}")
        else:
            print(f"ok   {name}: exit={r.returncode}  {line}")
    with open(existing, "rb") as f:
        if f.read() != b"previous contents":
            print("FAIL: an existing output was modified")
            failures += 1
    print(f"{len(cases) - failures} passed, {failures} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
