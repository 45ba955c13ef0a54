#!/usr/bin/env -S /usr/bin/python3
"""The start-up CPU check (src/core/isa_check.cpp): a binary run on a CPU without an extension it
was built for exits with one line naming the extension and the portable-build option, on every
rank, before doing anything else. A test hook (CAVIAR_TEST_ISA_MISSING=ext) plays the older CPU.

usage: test_isa.py CAVIAR_BIN WORKDIR
"""
import os
import re
import subprocess
import sys

from clitest import fresh_workdir, mpirun


def main():
    caviar, work = sys.argv[1], sys.argv[2]
    path = fresh_workdir(work)
    r = subprocess.run([caviar, "--version"], capture_output=True, text=True, timeout=60)
    m = re.search(r"built for -march=(\S+): (.*)\)", r.stdout)
    if r.returncode != 0 or not m:
        sys.exit(f"FAIL: --version does not say what the binary was built for: {r.stdout!r}")
    exts = m.group(2).split()
    print(f"built for -march={m.group(1)}: {len(exts)} extensions")
    if not exts:
        print("PASS: a baseline x86-64 binary has nothing to check")
        return
    out = path("model.h5")
    for ext in sorted({exts[0], exts[-1]}):
        env = dict(os.environ, CAVIAR_TEST_ISA_MISSING=ext)
        argv = [caviar, "generate", "gmm", "--n", "100", "--dim", "2", "--components", "2",
                "--out", out]
        for ranks in (1, 2):
            cmd = argv if ranks == 1 else mpirun(ranks) + argv
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
            ours = [line for line in r.stderr.splitlines() if line.startswith("caviar:")]
            want = f"caviar: error: this CPU lacks {ext}, which this binary was built to use"
            if r.returncode == 0 or len(ours) != 1 or not ours[0].startswith(want) or \
                    "-DCAVIAR_NATIVE=OFF -DCAVIAR_ARCH=x86-64-v" not in ours[0]:
                sys.exit(f"FAIL: {ranks} rank(s), {ext} missing: exit {r.returncode}, "
                         f"stderr {r.stderr!r}")
            if os.path.exists(out):
                sys.exit(f"FAIL: {out} was written although the CPU check failed")
            print(f"{ext} missing, {ranks} rank(s): exit {r.returncode}, one line")
    r = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    if r.returncode != 0 or not os.path.exists(out):
        sys.exit(f"FAIL: without the hook the same command fails: {r.stderr}")
    print("PASS: the CPU check refuses with one line on every rank, and passes on this CPU")


if __name__ == "__main__":
    main()
