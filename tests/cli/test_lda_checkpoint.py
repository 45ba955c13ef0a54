#!/usr/bin/env -S /usr/bin/python3
"""Preemption of `caviar lda fit` (README.md, "Checkpoint, resume, preemption"): a real SIGTERM
at random points, then --resume, must give the same bytes as an uninterrupted run.

Four configurations: CAVI in memory and --stream, SVI in memory (with a held-out corpus, so the
perplexity trace is checked too) and --stream. For each, one uninterrupted 2-rank run is the
reference. Then 8 trials (two per configuration, points drawn from a fixed seed) start the same
fit with --checkpoint and no end (--max-iter 10^6, so that it cannot finish before the signal
lands), wait for a random progress line plus a random part of an iteration, and send SIGTERM to
the ranks (as SLURM signals a job step). Checks: exit code 75, exactly one "stopped by SIGTERM"
line, a checkpoint, no model written. --resume then runs to the reference's length (two
trials at another rank count, 3 and 1: LDA's results do not depend on it) and the model file
(every dataset and attribute except timings and provenance) and the JSON summary (except timings
and the rank count) must equal the reference byte for byte. A stop at or past that length
resumes a little further and is compared with a straight run of that length.

Then SIGTERM inside an SVI pass (in memory and --stream; the stop point is checked to be a
minibatch boundary inside a pass, retried with another delay if the signal landed on a pass
boundary), resumed at another rank count (3 and 1): the same bytes as the reference.

Finally --checkpoint-every 5 (SVI passes) without a signal: the outputs are unchanged, and a resume
from the last checkpoint reproduces the reference.

usage: test_lda_checkpoint.py CAVIAR_BIN WORKDIR
"""
import concurrent.futures
import os
import random
import signal
import subprocess
import sys
import time

import h5py

from clitest import fresh_workdir, h5_differences, json_summary, mpirun, rank_pids

TIMEOUT = 60
RANKS = 2
STEPS = 20  # SVI minibatches per pass: 2000 documents in minibatches of 100


def stop_point(ck, cfg):
    """Where a checkpoint stands: SVI minibatch steps done (passes x STEPS + steps inside the pass),
    or CAVI iterations done."""
    with h5py.File(ck, "r") as f:
        done = int(f.attrs["iteration"])
        if cfg.startswith("svi"):
            done = done * STEPS + int(f.attrs["driver.step_in_epoch"])
    return done

def run(argv, timeout=TIMEOUT):
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout)


def main():
    caviar, work = sys.argv[1], sys.argv[2]
    p = fresh_workdir(work)
    t_start = time.time()
    r = run(mpirun(1) + [caviar, "generate", "lda", "--docs", "2000", "--words", "400", "--topics",
                         "8", "--seed", "3", "--out", p("corpus.h5"), "--heldout", p("held.h5"),
                         "--heldout-docs", "200"])
    if r.returncode != 0:
        print(f"FAIL: generate lda: {r.stderr}")
        return 1

    common = ["--topics", "8", "--seed", "4"]
    configs = {
        "cavi": common + ["--algorithm", "cavi", "--tol", "0", "--max-iter", "25"],
        "cavi-stream": common + ["--algorithm", "cavi", "--tol", "0", "--max-iter", "15",
                                 "--stream"],
        "svi": common + ["--algorithm", "svi", "--batch-size", "100", "--max-iter", "8",
                         "--heldout", p("held.h5")],
        "svi-stream": common + ["--algorithm", "svi", "--batch-size", "100", "--max-iter", "12",
                                "--stream"],
    }

    def length(cfg):
        return int(configs[cfg][configs[cfg].index("--max-iter") + 1])

    def fit_cmd(cfg, tag, extra=(), ranks=RANKS, iters=None):
        args = list(configs[cfg])
        if iters is not None:
            args[args.index("--max-iter") + 1] = str(iters)
        return mpirun(ranks) + ["--mca", "btl", "self,vader", caviar, "lda", "fit", "--data",
                                p("corpus.h5")] + args + ["--out", p(f"{tag}_model.h5")
                                                          ] + list(extra)

    refs = {}
    for cfg in configs:
        t0 = time.time()
        r = run(fit_cmd(cfg, f"ref_{cfg}"))
        if r.returncode != 0:
            print(f"FAIL: reference {cfg} run failed:\n{r.stderr}")
            return 1
        lines = [l for l in r.stderr.splitlines() if l.startswith(("iter ", "pass "))]
        # The fit's own time between progress lines (their last field is seconds since the
        # start), not the wall time, which MPI start-up dominates for these short fits.
        stamps = [float(l.rsplit(None, 1)[-1].rstrip("s")) for l in lines]
        interval = (stamps[-1] - stamps[0]) / max(1, len(lines) - 1)
        refs[cfg] = (len(lines), json_summary(r.stdout), interval)
        print(f"reference {cfg}: {len(lines)} progress lines, {time.time() - t0:.2f} s")

    pick = random.Random(20261123)
    names = list(configs)
    plan = []
    for trial in range(8):
        cfg = names[trial % len(names)]
        n_lines = refs[cfg][0]
        after = pick.randint(1, n_lines - 3)
        # A random part of one progress interval after the line, so that SVI stops inside a pass.
        delay = pick.uniform(0, 0.8 * refs[cfg][2])
        resume_ranks = {3: 3, 6: 1}.get(trial, RANKS)
        plan.append((cfg, after, delay, resume_ranks))

    def run_trial(trial, mid_pass=False):
        cfg, after, delay, resume_ranks = plan[trial]
        tag = f"t{trial}"
        ck = p(f"{tag}_ck.h5")
        # Until the signal (--max-iter 10^6): a run of the reference's length could end before
        # the signal lands, as mpirun forwards the ranks' stderr in bursts.
        proc = subprocess.Popen(fit_cmd(cfg, tag, ["--checkpoint", ck], iters=10**6),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        seen, err_lines, sent, targets = 0, [], False, []
        deadline = time.time() + TIMEOUT
        for line in proc.stderr:
            err_lines.append(line.rstrip("\n"))
            if line.startswith(("iter ", "pass ")):
                seen += 1
                if seen == 1:
                    targets = rank_pids(proc.pid)
                if seen == after and not sent:
                    time.sleep(delay)
                    for pid in targets:
                        os.kill(pid, signal.SIGTERM)
                    sent = True
            if time.time() > deadline:
                proc.kill()
                break
        try:
            proc.communicate(timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            proc.kill()
            return True, f"FAIL trial {trial} ({cfg}): hung after SIGTERM", cfg, None
        problems = []
        if len(targets) != RANKS:
            problems.append(f"found {len(targets)} rank processes under mpirun, want {RANKS}")
        if proc.returncode != 75:
            problems.append(f"exit code {proc.returncode}, want 75")
        stops = [l for l in err_lines if "stopped by SIGTERM" in l]
        if len(stops) != 1:
            problems.append(f"{len(stops)} 'stopped by SIGTERM' lines")
        if not os.path.exists(ck):
            problems.append("no checkpoint written")
        if os.path.exists(p(f"{tag}_model.h5")):
            problems.append("a model file was written by the interrupted run")
        if problems:
            return True, (f"FAIL trial {trial} ({cfg}, SIGTERM after line {after}): "
                          f"{'; '.join(problems)}\n     stderr tail: {' | '.join(err_lines[-4:])}"
                          ), cfg, None
        where = stop_point(ck, cfg)
        unit = "step" if cfg.startswith("svi") else "iteration"
        if mid_pass and where % STEPS == 0:
            return None, f"stopped at a pass boundary (step {where})", cfg, where
        # Resume to the reference's length; a stop at or past it resumes a little further (5
        # iterations, or 2 passes) and is compared with a straight run of that length.
        with h5py.File(ck, "r") as f:
            done = int(f.attrs["iteration"])
        ref_tag, ref_summary, iters = f"ref_{cfg}", refs[cfg][1], None
        if done >= length(cfg):
            iters, ref_tag = done + (2 if cfg.startswith("svi") else 5), f"{tag}_ref"
            r = run(fit_cmd(cfg, ref_tag, iters=iters))
            if r.returncode != 0:
                return True, f"FAIL trial {trial} ({cfg}): reference exited {r.returncode}", cfg, where
            ref_summary = json_summary(r.stdout)
        r = run(fit_cmd(cfg, tag, ["--resume", ck, "--checkpoint", ck], ranks=resume_ranks,
                        iters=iters))
        if r.returncode != 0:
            return True, (f"FAIL trial {trial} ({cfg}): resume exited {r.returncode}:\n"
                          f"{r.stderr[-500:]}"), cfg, where
        diffs = h5_differences(p(f"{ref_tag}_model.h5"), p(f"{tag}_model.h5"))
        if json_summary(r.stdout) != ref_summary:
            diffs.append(f"JSON summary {json_summary(r.stdout)} != {ref_summary}")
        if diffs:
            return True, (f"FAIL trial {trial} ({cfg}, stopped at {unit} {where}, resumed at "
                          f"{resume_ranks} ranks): " + "; ".join(diffs[:6])), cfg, where
        return False, (f"ok   trial {trial} ({cfg}): SIGTERM after progress line {after}, exit 75, "
                       f"stopped at {unit} {where}, resumed at {resume_ranks} ranks: identical "
                       f"bytes"), cfg, where

    failures = 0
    stops = {}
    # Two trials at a time: much of a launch is waiting, not computing (2 cores here).
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        for failed, line, cfg, where in pool.map(run_trial, range(len(plan))):
            failures += failed
            print(line, flush=True)
            if where is not None:
                stops.setdefault(cfg, []).append(where)
    print(f"stop points: {stops}")

    # A stop inside an SVI pass, resumed at another rank count: the delays are fractions of a
    # pass, so a signal rarely lands on a pass boundary; if it does, the trial is run again with
    # the next delay (the test is about the mid-pass resume, not the timing).
    for cfg, resume_ranks in (("svi", 3), ("svi-stream", 1)):
        for attempt in range(4):
            after = 1 + attempt % max(1, refs[cfg][0] - 3)
            plan.append((cfg, after, (0.2 + 0.2 * attempt) * refs[cfg][2], resume_ranks))
            failed, line, _, where = run_trial(len(plan) - 1, mid_pass=True)
            if failed is not None:
                break
        if failed is None:
            failed, line = True, f"FAIL mid-pass ({cfg}): every attempt {line}"
        failures += failed
        print(line.replace("ok   trial", "ok   mid-pass trial"), flush=True)

    # Periodic checkpoints without a signal (every 5 SVI steps): same outputs, and resuming from
    # the last checkpoint (after the run ended) gives the reference again.
    ck = p("every_ck.h5")
    problems = []
    r = run(fit_cmd("svi", "every", ["--checkpoint", ck, "--checkpoint-every", "5"]))
    if r.returncode != 0 or not os.path.exists(ck):
        problems.append(f"exit {r.returncode}, checkpoint exists: {os.path.exists(ck)}")
    else:
        problems += h5_differences(p("ref_svi_model.h5"), p("every_model.h5"))
        where = stop_point(ck, "svi")
        # 8 passes: the last boundary that saves by count is the start of pass 5 (step 100).
        if where != 5 * STEPS:
            problems.append(f"last checkpoint after step {where}, want {5 * STEPS}")
        os.remove(p("every_model.h5"))
        r = run(fit_cmd("svi", "every", ["--resume", ck]))
        if r.returncode != 0:
            problems.append(f"resume exited {r.returncode}: {r.stderr[-300:]}")
        else:
            problems += h5_differences(p("ref_svi_model.h5"), p("every_model.h5"))
    if problems:
        failures += 1
        print(f"FAIL --checkpoint-every 5 (svi): {'; '.join(problems[:6])}")
    else:
        print("ok   --checkpoint-every 5 (svi): last checkpoint after pass 5; outputs and "
              "resumed outputs identical to the reference")

    print(f"{len(plan)} trials (mid-pass retries included) + --checkpoint-every: {failures} failed "
          f"({time.time() - t_start:.1f} s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
