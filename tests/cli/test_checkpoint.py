#!/usr/bin/env -S /usr/bin/python3
"""Preemption: a real SIGTERM at random iterations, then --resume, must give the same bytes as an
uninterrupted run (README.md, "Checkpoint, resume, preemption").

Mode `trials` (default): for each algorithm (CAVI, SVI with the adaptive schedule, EM) one
uninterrupted 2-rank run is the reference. Then TRIALS trials (cycling over the algorithms) each
start the same fit with --checkpoint and no end (--max-iter 10^6: a run of the reference's
length could finish before a signal lands, as mpirun forwards stderr in bursts), wait for a
random (seeded) number of progress lines on stderr, and send SIGTERM the way SLURM does at
preemption: to mpirun and to every process of the job (its two ranks). Checks: a non-zero exit,
exactly one "stopped by SIGTERM" line, a checkpoint, no model written; then --resume runs to the
reference's length and its model file (every dataset and attribute, except timings and the
command line), labels file and JSON summary must equal the reference byte for byte. A stop at
or past that length resumes to a little past the stop and is compared with a straight run of
that length. Same rank and thread count throughout; the stop points must differ.

Mode `exit-codes`: the exit code 75 (kExitPreempted) and the launcher paths. "mpirun" trials
run until the signal, then resume to a little past the stop (5 iterations, or 2 epochs) and are
compared with a straight run of that length made afterwards: mpirun passes signals on with a
delay that depends on the machine's load, so a fixed-length run could end first.
  - SIGUSR1 to mpirun only (the jobscripts' path; mpirun forwards it to the ranks): mpirun must
    exit with 75, and the resumed run must match (one trial per algorithm).
  - SIGTERM to mpirun alone is not tested: Open MPI 4.1's mpirun then kills the job itself,
    signalling the ranks after a delay that depends on the load (about 2 s in our runs) and
    SIGKILLing them after odls_base_sigkill_timeout, and its stderr forwarding dies with it; on a
    clean CI machine the ranks were killed before they could checkpoint. That is Open MPI's
    behaviour, not caviar's, so the supported paths are SIGUSR1 to mpirun (the jobscript's) and a
    signal to the ranks (SLURM signals job steps), both tested.
  - SIGTERM to caviar run without mpirun (one process): exit code 75.
  - --checkpoint-every 7 and 0.01s without a signal: same outputs, checkpoints where expected, and
    a resume from the last one reproduces the reference.

Mode `vae`: the same for `caviar vae train` (Gaussian likelihood on the same data), six trials
alternating SIGTERM to the job and SIGUSR1 to mpirun (until the signal, as above), and four of
the convolutional VAE (`--arch conv`, batch norm, on 6 x 6 images), whose checkpoint must also
carry batch norm's running statistics. Checkpoints are taken mid-epoch: each model's stops must
include at least one that is not at an epoch boundary.

usage: test_checkpoint.py CAVIAR_BIN WORKDIR [trials [N] | exit-codes | vae]
"""
import concurrent.futures
import os
import random
import signal
import subprocess
import sys
import time

import h5py
import numpy as np

from clitest import fresh_workdir, h5_differences, json_summary, mpirun, rank_pids

TIMEOUT = 60
RANKS = 2
def main():
    caviar, work = sys.argv[1], sys.argv[2]
    mode = sys.argv[3] if len(sys.argv) > 3 else "trials"
    trials = int(sys.argv[4]) if len(sys.argv) > 4 else 20
    if mode not in ("trials", "exit-codes", "vae"):
        print(__doc__)
        return 2
    p = fresh_workdir(work)
    t_start = time.time()

    # Four well-separated blobs in 2-D; N large enough that one iteration takes some
    # milliseconds, so that a signal lands within an iteration or two of the line we aim for.
    rng = np.random.default_rng(7)
    n, d, k = 20000, 2, 4
    centres = np.array([[0, 0], [6, 0], [0, 6], [6, 6]], dtype=float)
    x = centres[rng.integers(0, k, n)] + rng.normal(size=(n, d))
    with h5py.File(p("data.h5"), "w") as f:
        f["X"] = x
    if mode == "vae":
        # 6 x 6 images of a bright 2 x 2 square at one of 25 places, with noise: for --arch conv.
        m = 4000
        img = rng.normal(0, 0.1, size=(m, 6, 6))
        at = rng.integers(0, 5, size=(m, 2))
        for i in range(m):
            img[i, at[i, 0]:at[i, 0] + 2, at[i, 1]:at[i, 1] + 2] += 1
        with h5py.File(p("images.h5"), "w") as f:
            f["X"] = img.reshape(m, 36)

    common = ["-k", str(k), "--seed", "5", "--tol", "0"]
    configs = {
        "cavi": common + ["--algorithm", "cavi"],
        "svi": common + ["--algorithm", "svi", "--schedule", "adaptive", "--adaptive-memory", "20",
                         "--batch-size", "200"],
        "em": common + ["--algorithm", "em"],
        "vae": ["--likelihood", "gaussian", "--hidden", "32", "--latent", "2", "--batch-size", "50",
                "--seed", "5"],
        "cvae": ["--arch", "conv", "--channels", "4,8", "--likelihood", "gaussian", "--latent", "2",
                 "--batch-size", "50", "--seed", "5"],
    }
    # The run length (iterations; SVI and VAE: epochs) of the references and "job" trials.
    length = {"cavi": 60, "em": 60, "svi": 10, "vae": 8, "cvae": 8}
    vaes = ("vae", "cvae")
    data = {"vae": "data.h5", "cvae": "images.h5"}

    def fit_cmd(alg, tag, extra=(), ranks=RANKS, iters=None):
        # Shared memory only: one node, and a faster start than probing the network transports.
        launch = mpirun(ranks) + ["--mca", "btl", "self,vader"] if ranks else []
        n_iter = str(iters or length[alg])
        if alg in vaes:
            return launch + [caviar, "vae", "train", "--data", p(data[alg]) + ":/X"] + configs[alg] + [
                "--max-iter", n_iter, "--out", p(f"{tag}_model.h5")] + list(extra)
        return launch + [caviar, "gmm", "fit", "--data", p("data.h5") + ":/X"] + configs[alg] + [
            "--max-iter", n_iter, "--out", p(f"{tag}_model.h5"), "--labels", p(f"{tag}_labels.h5")] + list(extra)

    pick = random.Random(20261123)
    algs = ["cavi", "svi", "em"]
    # (algorithm, signal, how): job = mpirun and its ranks (as SLURM signals a job step);
    # mpirun = mpirun only; self = one caviar process without mpirun (no resume). mpirun passes
    # signals on with a delay (USR1: up to some 0.5 s on a loaded machine; TERM: about 2 s). All
    # trials run until the signal; one that stops past the reference's length resumes to a
    # little past the stop and compares with a straight run of that length made afterwards.
    if mode == "trials":
        plan = [(algs[i % len(algs)], signal.SIGTERM, "job") for i in range(trials)]
    elif mode == "vae":
        plan = [("vae", signal.SIGTERM if i % 2 == 0 else signal.SIGUSR1, "job" if i % 2 == 0 else "mpirun")
                for i in range(6)]
        plan += [("cvae", signal.SIGTERM if i % 2 == 0 else signal.SIGUSR1, "job" if i % 2 == 0 else "mpirun")
                 for i in range(4)]
    else:
        plan = [(a, signal.SIGUSR1, "mpirun") for a in algs]
        plan += [("cavi", signal.SIGTERM, "self"), ("svi", signal.SIGTERM, "self")]

    failures = 0
    refs = {}
    for alg in sorted({a for a, _, _ in plan}):
        t0 = time.time()
        r = subprocess.run(fit_cmd(alg, f"ref_{alg}"), capture_output=True, text=True, timeout=TIMEOUT)
        if r.returncode != 0:
            print(f"FAIL: reference {alg} run failed:\n{r.stderr}")
            return 1
        lines = [l for l in r.stderr.splitlines() if l.startswith(("iter ", "epoch "))]
        refs[alg] = (len(lines), json_summary(r.stdout), time.time() - t0)
        print(f"reference {alg}: {len(lines)} progress lines, {time.time() - t0:.2f} s")

    # The random choices are drawn up front, so that they do not depend on the execution order.
    afters, delays = [], []
    for alg, _, _ in plan:
        # Epoch lines (SVI, VAE) come about 0.1 s apart: wait a random part of an epoch after the
        # line, so that the stop lands anywhere inside the next epoch, not only at its start.
        slow = alg == "svi" or alg in vaes
        delays.append(pick.uniform(0, 0.5 * refs[alg][2] / refs[alg][0]) if slow else 0.0)
        # After a random progress line, not the last several, so that most stops come before
        # the reference's length (the comparison with the uninterrupted run): iteration lines
        # come fast (1-10 ms apart, and mpirun forwards them in bursts), epoch lines slowly.
        margin = 20 if refs[alg][0] > 20 else 4
        afters.append(pick.randint(1, refs[alg][0] - margin))

    def run_trial(trial):
        """(failed, report lines, algorithm, stop point or None)."""
        alg, sig, how = plan[trial]
        after, delay = afters[trial], delays[trial]
        name = "SIGTERM" if sig == signal.SIGTERM else "SIGUSR1"
        tag = f"t{trial}"
        ck = p(f"{tag}_ck.h5")
        ranks = 0 if how == "self" else RANKS
        # Every trial runs until its signal: a run of the reference's length could end before
        # the signal lands (mpirun forwards the ranks' stderr in bursts, later on a loaded machine).
        proc = subprocess.Popen(fit_cmd(alg, tag, ["--checkpoint", ck], ranks, 10**6),
                                stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        seen, err_lines, sent, targets = 0, [], False, [proc.pid]
        deadline = time.time() + TIMEOUT
        for line in proc.stderr:
            err_lines.append(line.rstrip("\n"))
            if line.startswith(("iter ", "epoch ")):
                seen += 1
                if seen == 1 and how == "job":
                    targets += rank_pids(proc.pid)  # found once, so that the signal is prompt
                if seen == after and not sent:
                    time.sleep(delay)
                    for pid in targets:
                        os.kill(pid, sig)
                    sent = True
            if time.time() > deadline:
                proc.kill()
                break
        try:
            proc.communicate(timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            proc.kill()
            return True, [f"FAIL trial {trial} ({alg}): hung after {name}"], alg, None
        problems = []
        if how == "job" and len(targets) != 1 + RANKS:
            problems.append(f"found {len(targets) - 1} rank processes under mpirun, want {RANKS}")
        # SIGTERM to mpirun: it kills the job and exits 1 itself, whatever the ranks returned;
        # SIGUSR1 to mpirun, or a signal straight to caviar: the exit code is caviar's, 75.
        want = None if (sig == signal.SIGTERM and how != "self") else 75
        if proc.returncode == 0 or (want is not None and proc.returncode != want):
            problems.append(f"exit code {proc.returncode}" + (f", want {want}" if want else ""))
        stop_lines = [l for l in err_lines if f"stopped by {name}" in l]
        if len(stop_lines) != 1:
            problems.append(f"{len(stop_lines)} 'stopped by {name}' lines")
        if not os.path.exists(ck):
            problems.append("no checkpoint written")
        if os.path.exists(p(f"{tag}_model.h5")):
            problems.append("a model file was written by the interrupted run")
        if problems:
            return True, [f"FAIL trial {trial} ({alg}, {name} to {how} after line {after}): "
                          f"{'; '.join(problems)}",
                          "     stderr tail: " + " | ".join(err_lines[-4:])], alg, None
        with h5py.File(ck, "r") as f:
            # SVI: steps done (the model's step count under model/); VAE: optimiser steps done
            # (the gradient driver keeps them under driver/); both keep the epochs done as
            # "iteration". CAVI/EM: the next iteration.
            where = int(f.attrs["model.steps" if alg == "svi" else "driver.steps" if alg in vaes
                                else "iteration"])
            done = int(f.attrs["iteration"])  # iterations (CAVI, EM) or whole epochs done
        # Resume to the reference's length and compare with the uninterrupted reference; if the
        # stop came at or past that length, resume a little past the stop (5 iterations, or 2
        # epochs) and compare with a straight run of that length made afterwards.
        stop_at = None if done < length[alg] else done + (5 if alg in ("cavi", "em") else 2)
        unit = "step" if alg == "svi" or alg in vaes else "iteration"
        if how == "self":
            return False, [f"ok   trial {trial} ({alg}, one process): {name} after progress line "
                           f"{after}, exit {proc.returncode}, checkpoint at {unit} {where}"], alg, None
        ref_tag, ref_summary, iters = f"ref_{alg}", refs[alg][1], None
        if stop_at is not None:
            iters, ref_tag = stop_at, f"{tag}_ref"
            r = subprocess.run(fit_cmd(alg, ref_tag, iters=iters), capture_output=True, text=True,
                               timeout=TIMEOUT)
            if r.returncode != 0:
                return True, [f"FAIL trial {trial} ({alg}): reference exited {r.returncode}"], alg, where
            ref_summary = json_summary(r.stdout)
        r = subprocess.run(fit_cmd(alg, tag, ["--resume", ck, "--checkpoint", ck], iters=iters),
                           capture_output=True, text=True, timeout=TIMEOUT)
        if r.returncode != 0:
            return True, [f"FAIL trial {trial} ({alg}): resume exited {r.returncode}:\n"
                          f"{r.stderr[-500:]}"], alg, where
        diffs = h5_differences(p(f"{ref_tag}_model.h5"), p(f"{tag}_model.h5"))
        if os.path.exists(p(f"{ref_tag}_labels.h5")):
            diffs += ["labels: " + x for x in h5_differences(p(f"{ref_tag}_labels.h5"), p(f"{tag}_labels.h5"))]
        if json_summary(r.stdout) != ref_summary:
            diffs.append(f"JSON summary {json_summary(r.stdout)} != {ref_summary}")
        for f in (ck, p(f"{tag}_model.h5"), p(f"{tag}_labels.h5")):
            if os.path.exists(f):
                os.remove(f)
        if diffs:
            return True, [f"FAIL trial {trial} ({alg}, stopped at {unit} {where}): " +
                          "; ".join(diffs[:6])], alg, where
        return False, [f"ok   trial {trial} ({alg}): {name} to {how} after progress line {after}, "
                       f"exit {proc.returncode}, stopped at {unit} {where}, resumed: identical "
                       f"bytes"], alg, where

    # Two trials at a time: much of a launch is waiting, not computing (2 cores here).
    stops = {}
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        for failed, lines, alg, where in pool.map(run_trial, range(len(plan))):
            failures += failed
            print("\n".join(lines), flush=True)
            if where is not None and plan[0][2] != "self":
                stops.setdefault(alg, []).append(where)
    if mode == "exit-codes":
        # Periodic checkpoints without a signal: every 7 iterations, and every 0.01 s of rank 0's
        # clock; the run's own outputs are unchanged, and resuming from the last checkpoint (after
        # the run ended) gives the reference again.
        for alg, every in (("cavi", "7"), ("cavi", "0.01s")):
            tag = "every_" + every.replace(".", "_")
            ck = p(f"{tag}_ck.h5")
            problems = []
            r = subprocess.run(fit_cmd(alg, tag, ["--checkpoint", ck, "--checkpoint-every", every]),
                               capture_output=True, text=True, timeout=TIMEOUT)
            if r.returncode != 0 or not os.path.exists(ck):
                problems.append(f"exit {r.returncode}, checkpoint exists: {os.path.exists(ck)}")
            else:
                problems += h5_differences(p(f"ref_{alg}_model.h5"), p(f"{tag}_model.h5"))
                with h5py.File(ck, "r") as f:
                    where = int(f.attrs["iteration"])
                # 60 iterations: boundaries before iterations 7, 14, ..., 56 save.
                if every == "7" and where != 56:
                    problems.append(f"last checkpoint before iteration {where}, want 56")
                if every.endswith("s") and not 0 < where <= 60:
                    problems.append(f"timed checkpoint before iteration {where}")
                os.remove(p(f"{tag}_model.h5"))
                r = subprocess.run(fit_cmd(alg, tag, ["--resume", ck]), capture_output=True,
                                   text=True, timeout=TIMEOUT)
                if r.returncode != 0:
                    problems.append(f"resume exited {r.returncode}: {r.stderr[-300:]}")
                else:
                    problems += h5_differences(p(f"ref_{alg}_model.h5"), p(f"{tag}_model.h5"))
            if problems:
                failures += 1
                print(f"FAIL --checkpoint-every {every} ({alg}): {'; '.join(problems[:6])}")
            else:
                print(f"ok   --checkpoint-every {every} ({alg}): last checkpoint before iteration "
                      f"{where}; outputs and resumed outputs identical to the reference")

    # The trials must really have stopped at different points.
    for alg, s in stops.items():
        if len(s) >= 3 and len(set(s)) < 3:
            print(f"FAIL: the {alg} trials stopped at fewer than 3 distinct points: {s}")
            failures += 1
    # Mid-epoch: a stop at a step that is not a multiple of the epoch's steps (ceil(N / B)).
    for alg, s in stops.items():
        if alg in vaes:
            with h5py.File(p(data[alg]), "r") as f:
                rows = f["X"].shape[0]
            batch = int(configs[alg][configs[alg].index("--batch-size") + 1])
            per_epoch = -(-rows // batch)
            if all(w % per_epoch == 0 for w in s):
                print(f"FAIL: every {alg} stop was at an epoch boundary ({per_epoch} steps): {s}")
                failures += 1
    print(f"stop points: {stops}")
    print(f"{len(plan)} trials: {len(plan) - failures} passed, {failures} failed "
          f"({time.time() - t_start:.1f} s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
