#!/usr/bin/env -S /usr/bin/python3
"""caviar hmm decode --png (scripts/plot_hmm.py): a few sequences coloured by decoded state and the
model's trace.

- Gaussian CAVI at 2 ranks and categorical EM at 1 rank: --png writes a PNG (signature, IHDR
  size of the figure drawn for 4 sequences, and more than 10 kB, i.e. drawn, not blank), the JSON
  summary names it, the decoded paths are the same as without --png, and no temporary file is
  left;
- bad input gives exactly one error line and no output: --png into a missing directory (caviar,
  before anything is written), and plot_hmm.py run by hand on paths one step short of the data
  and on a data file given as the model.

usage: test_hmm_png.py CAVIAR_BIN WORKDIR
"""
import os
import struct
import subprocess
import sys

import h5py
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from clitest import Checks, fresh_workdir, summary  # noqa: E402

caviar, work = sys.argv[1], sys.argv[2]
path = fresh_workdir(work)
checks = Checks(caviar)
check, run = checks.check, checks.run
script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts",
                      "plot_hmm.py")
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def png_header(f):
    with open(f, "rb") as h:
        head = h.read(24)
    ok = head[:8] == PNG_MAGIC and head[12:16] == b"IHDR"
    return ok, struct.unpack(">II", head[16:24]) if ok else None


for emission, algorithm, ranks, extra in [("gaussian", "cavi", 2, ["--dim", "2"]),
                                          ("categorical", "em", 1, ["--symbols", "6"])]:
    tag = emission[:3]
    data, model = path(tag + ".h5"), path(tag + "_m.h5")
    run(["-q", "generate", "hmm", "--sequences", "30", "--length", "60-150", "--states", "3",
         "--emission", emission, "--seed", "7", "--out", data] + extra)
    run(["-q", "hmm", "fit", "--data", data, "--states", "3", "--emission", emission,
         "--algorithm", algorithm, "--max-iter", "30", "--out", model])
    png = path(tag + ".png")
    r = run(["-q", "hmm", "decode", "--model", model, "--data", data, "--out",
             path(tag + "_paths.h5"), "--png", png], ranks=ranks)
    check(summary(r).get("png") == png, f"{tag}: the JSON summary names the PNG")
    ok, size = png_header(png)
    # figsize (14, 2 n + 1.5) inches at 100 dpi with n = 4 sequences drawn.
    check(ok and size == (1400, 950), f"{tag} {algorithm} at {ranks} rank(s): --png wrote a "
                                      f"1400x950 PNG (got {size})")
    check(os.path.getsize(png) > 10_000, f"{tag}: the PNG has content "
                                         f"({os.path.getsize(png)} bytes)")
    run(["-q", "hmm", "decode", "--model", model, "--data", data, "--out", path(tag + "_p2.h5")])
    with h5py.File(path(tag + "_paths.h5"), "r") as a, h5py.File(path(tag + "_p2.h5"), "r") as b:
        check(np.array_equal(a["states"][()], b["states"][()]),
              f"{tag}: the paths are the same with and without --png")
    check(not [f for f in os.listdir(work) if ".tmp-" in f], f"{tag}: no temporary files left")

# Bad input: one error line, nothing written.
r = run(["hmm", "decode", "--model", path("gau_m.h5"), "--data", path("gau.h5"), "--out",
         path("bad_paths.h5"), "--png", path("no_such_dir/x.png")], ok=False)
err = [line for line in r.stderr.splitlines() if "error" in line]  # mpirun adds its own lines
check(r.returncode == 1 and len(err) == 1 and err[0].startswith("caviar: error:")
      and "no_such_dir" in err[0], f"--png into a missing directory: one error line ({err})")
check(not os.path.exists(path("bad_paths.h5")), "--png into a missing directory: no paths written")
# Paths one step short of the data.
with h5py.File(path("gau_paths.h5"), "r") as a, h5py.File(path("short_paths.h5"), "w") as b:
    b["states"] = a["states"][:-1]
r = subprocess.run(["/usr/bin/python3", script, "--model", path("gau_m.h5"), "--data",
                    path("gau.h5"), "--paths", path("short_paths.h5"), "--out", path("bad.png")],
                   capture_output=True, text=True)
err = [line for line in r.stderr.splitlines() if line.strip()]
check(r.returncode == 2 and len(err) == 1 and err[0].startswith("plot_hmm.py: error:")
      and "steps" in err[0], f"plot_hmm.py on paths one step short: one error line ({err})")
check(not os.path.exists(path("bad.png")), "plot_hmm.py on bad input: no PNG")
r = subprocess.run(["/usr/bin/python3", script, "--model", path("gau.h5"), "--data",
                    path("gau.h5"), "--paths", path("gau_paths.h5"), "--out", path("bad.png")],
                   capture_output=True, text=True)
err = [line for line in r.stderr.splitlines() if line.strip()]
check(r.returncode == 2 and len(err) == 1 and "not a caviar hmm model" in err[0],
      f"plot_hmm.py with a data file as --model: one error line ({err})")
checks.finish()
