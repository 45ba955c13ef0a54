#!/usr/bin/env -S /usr/bin/python3
"""A preemption signal during start-up (README.md, "Checkpoint, resume, preemption"): main()
installs the flag-only SIGTERM/SIGUSR1 handlers before MPI_Init, so a signal that arrives then is honoured at the first
iteration boundary (checkpoint, exit 75) instead of killing the rank.

Deterministic: the hidden test hook CAVIAR_TEST_SIGNAL_AT_START makes every rank raise SIGTERM
on itself at a fixed point, `before_init` (right after the handlers are installed; every case) or
`after_init` (right after MPI_Init returned: this fails if Open MPI's MPI_Init replaced the
handlers; lda cavi). Checks, at 2 ranks:
  - lda fit (CAVI and SVI, both on the engine's drivers) and gmm fit: exit code 75, one "stopped
    by SIGTERM before iteration 0" line, a checkpoint at the start, no model; resuming it gives the model
    of an uninterrupted run byte for byte (timings and provenance excluded);
  - a command that polls no flag (generate gmm, one process): killed by the SIGTERM as before the
    early handlers (the pending signal is raised again once the command is known).

usage: test_early_signal.py CAVIAR_BIN WORKDIR
"""
import concurrent.futures
import os
import signal
import subprocess
import sys

from clitest import fresh_workdir, h5_differences, mpirun

TIMEOUT = 60


def main():
    caviar, work = sys.argv[1], sys.argv[2]
    p = fresh_workdir(work)
    launch = mpirun(2) + ["--mca", "btl", "self,vader", "-x", "CAVIAR_TEST_SIGNAL_AT_START"]

    def run(argv, when=None):
        env = dict(os.environ)
        env.pop("CAVIAR_TEST_SIGNAL_AT_START", None)
        if when:
            env["CAVIAR_TEST_SIGNAL_AT_START"] = when
        return subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT, env=env)

    setup = [
        [caviar, "generate", "lda", "--docs", "400", "--words", "80", "--topics", "3", "--seed",
         "1", "--out", p("corpus.h5")],
        [caviar, "generate", "gmm", "--n", "500", "--dim", "2", "--components", "3", "--seed", "1",
         "--out", p("gmm.h5") + ":/X"],
    ]
    for argv in setup:
        r = run(mpirun(1) + argv)
        if r.returncode != 0:
            print(f"FAIL: setup {' '.join(argv[1:3])}: {r.stderr}")
            return 1

    fits = {
        "lda cavi": [caviar, "lda", "fit", "--data", p("corpus.h5"), "--topics", "3",
                     "--algorithm", "cavi", "--max-iter", "5", "--tol", "0"],
        "lda svi": [caviar, "lda", "fit", "--data", p("corpus.h5"), "--topics", "3",
                    "--algorithm", "svi", "--batch-size", "100", "--max-iter", "2"],
        "gmm cavi": [caviar, "gmm", "fit", "--data", p("gmm.h5") + ":/X", "-k", "3",
                     "--max-iter", "5", "--tol", "0"],
    }
    failures = 0
    for name, argv in fits.items():
        r = run(launch + argv + ["--out", p(name.replace(" ", "_") + "_ref.h5")])
        if r.returncode != 0:
            print(f"FAIL {name}: reference run exited {r.returncode}: {r.stderr[-300:]}")
            return 1
    # after_init once (it is what shows that MPI_Init kept the handlers), before_init for all.
    plan = [("lda cavi", "after_init")] + [(name, "before_init") for name in fits]

    def trial(name_when):
        name, when = name_when
        argv, tag = fits[name], name.replace(" ", "_")
        ck, out = p(f"{tag}_{when}_ck.h5"), p(f"{tag}_{when}.h5")
        r = run(launch + argv + ["--out", out, "--checkpoint", ck], when)
        stops = [l for l in r.stderr.splitlines() if "stopped by SIGTERM" in l]
        problems = []
        if r.returncode != 75:
            problems.append(f"exit code {r.returncode}, want 75")
        want = "before iteration 0"
        if len(stops) != 1 or want not in stops[0]:
            problems.append(f"stop lines {stops}, want one '... {want}'")
        if os.path.exists(out):
            problems.append("a model was written")
        if not os.path.exists(ck):
            problems.append("no checkpoint")
        if not problems:
            r = run(launch + argv + ["--out", out, "--resume", ck])
            if r.returncode != 0:
                problems.append(f"resume exited {r.returncode}: {r.stderr[-300:]}")
            else:
                diffs = h5_differences(p(f"{tag}_ref.h5"), out)
                if diffs:
                    problems.append(f"resumed model differs: {diffs[:5]}")
        if problems:
            return True, (f"FAIL {name}, SIGTERM {when}: {'; '.join(problems)}\n"
                          f"     stderr tail: {r.stderr[-300:]}")
        return False, (f"ok   {name}, SIGTERM {when}: exit 75 at the first boundary, resumed "
                       f"model identical to the uninterrupted one")

    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        for failed, line in pool.map(trial, plan):
            failures += failed
            print(line, flush=True)

    # A command without checkpoints: the SIGTERM still ends it (default disposition restored and
    # the pending signal raised again).
    r = run([caviar, "generate", "gmm", "--n", "100", "--dim", "2", "--components", "2", "--out",
             p("gen.h5") + ":/X"], "before_init")
    if r.returncode != -signal.SIGTERM or os.path.exists(p("gen.h5")):
        failures += 1
        print(f"FAIL generate gmm, SIGTERM before_init: exit {r.returncode} (want killed by "
              f"SIGTERM), output written: {os.path.exists(p('gen.h5'))}")
    else:
        print("ok   generate gmm, SIGTERM before_init: killed by SIGTERM, nothing written")
    print(f"{failures} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
