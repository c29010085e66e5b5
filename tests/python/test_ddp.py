"""py:ddp — mhar-train-ddp (python/train_ddp.py) under torchrun, with the default routing (the
shared source buffer): 2 processes (gloo, loopback only) take the steps one process takes on the
same global batch, to float rounding; a stopped run resumes exactly; the result opens in
`mhar-toy eval` (PyTorch's loss) and `mhar-toy heatmap`, and `mhar-toy train --resume` continues
it."""

import json
import os
import socket
import sys
import time

import common

STEPS = 4
FLAGS = ["--mode", "mhar", "--heads", "4", "--d", "16", "--layers", "2", "--n-head", "2",
         "--n-kv-head", "1", "--ffn", "24", "--seq-len", "16", "--steps", str(STEPS), "--batch",
         "4", "--lr", "0.01", "--warmup", "1", "--eval-every", str(STEPS), "--eval-batches", "2",
         "--ckpt-every", "2", "--seed", "7", "--data", common.CORPUS, "--log-every", "1",
         "--routing", "fast"]
LOSS_TOL = 1e-5    # relative, per step: float32 sums in another order
PARAM_TOL = 1e-5   # absolute, largest over all parameters after STEPS steps
EVAL_TOL = 1e-5    # relative: mhar-toy eval (C++ float32) against PyTorch float32


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def metrics(run_dir):
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return [json.loads(l) for l in f if l.strip()]


def params(run_dir):
    from mhar_torch import load_checkpoint
    ck = load_checkpoint(run_dir)
    return ck, {n: p.detach().numpy().copy() for n, p in ck.model.checkpoint_parameters()}


def test_two_processes_take_one_process_steps(toy, work):
    import numpy as np
    from mhar_torch.evaluate import evaluate

    env = common.torch_env(threads=1)
    env["GLOO_SOCKET_IFNAME"] = "lo"  # loopback only
    train = common.TRAIN_DDP
    failures = []

    one, two = os.path.join(work, "one"), os.path.join(work, "two")
    t = time.monotonic()
    common.run(train + FLAGS + ["--out", one], env=env, timeout=120)
    t_one = time.monotonic() - t
    t = time.monotonic()
    # torchrun itself, with the one mend Debian's torch 1.13 on Python 3.11 needs
    torchrun = [sys.executable, os.path.join(common.PYTHON_DIR, "torchrun_compat.py"), "--nnodes", "1",
                "--nproc_per_node", "2", "--master_addr", "127.0.0.1", "--master_port",
                str(free_port())]
    trace = os.path.join(work, "trace")
    os.makedirs(trace)
    _, _, err2 = common.run(torchrun + [os.path.join(common.PYTHON_DIR, "train_ddp.py")] + FLAGS
                            + ["--out", two], env=dict(env, MHAR_DDP_TRACE=trace), timeout=180)
    t_two = time.monotonic() - t
    with open(os.path.join(two, "config.json")) as f:
        info = json.load(f)["pytorch"]
    if info["world_size"] != 2 or info["backend"] != "gloo" or "2 processes" not in err2:
        failures.append("the torchrun run did not run as 2 gloo processes: %s" % info)

    # a bad flag under torchrun: each worker's one line, torchrun_compat's one line, exit 2
    rc, _, err = common.run(torchrun[:-1] + [str(free_port()),
                                             os.path.join(common.PYTHON_DIR, "train_ddp.py")]
                            + FLAGS + ["--batch", "3", "--out", os.path.join(work, "bad")],
                            env=env, timeout=120, expect=None)
    if rc != 2 or "Traceback" in err or "not a multiple of the 2 processes" not in err:
        failures.append("torchrun with --batch 3 on 2 processes: exit %d, stderr %r" % (rc, err))
    else:
        print("torchrun --nproc_per_node 2 ... --batch 3: exit 2, no traceback: %s"
              % err.strip().splitlines()[-1])

    m1, m2 = metrics(one), metrics(two)
    # each process took its own half of the global batch mhar-toy draws, and the logged loss is
    # the mean of the two halves' losses
    from mhar_torch.data import Corpus, random_batch
    train_bytes = Corpus(common.CORPUS, 0.1, 16).train
    ranks = []
    for r in (0, 1):
        with open(os.path.join(trace, "rank%d.jsonl" % r)) as f:
            ranks.append([json.loads(l) for l in f if l.strip()])
    for s, (a, b) in enumerate(zip(*ranks), start=1):
        tok, _ = random_batch(train_bytes, 4, 16, 7, s)
        if a["tokens"] != tok[:2].tolist() or b["tokens"] != tok[2:].tolist():
            failures.append("step %d: the processes did not take windows 0-1 and 2-3 of the "
                            "global batch" % s)
        mean = (a["loss"] + b["loss"]) / 2
        if abs(mean - m2[s - 1]["train_loss"]) > 1e-12 or a["loss"] == b["loss"]:
            failures.append("step %d: logged loss %.9g, the processes' losses %.9g and %.9g"
                            % (s, m2[s - 1]["train_loss"], a["loss"], b["loss"]))
    if len(ranks[0]) != STEPS or len(ranks[1]) != STEPS:
        failures.append("the trace has %d and %d steps" % (len(ranks[0]), len(ranks[1])))
    else:
        print("each process took its half of the global batch; step 1 losses: rank 0 %.6f, "
              "rank 1 %.6f, mean %.6f" % (ranks[0][0]["loss"], ranks[1][0]["loss"],
                                          m2[0]["train_loss"]))
    print("step  loss (1 process)   loss (2 processes)  relative diff")
    for a, b in zip(m1, m2):
        rel = abs(a["train_loss"] - b["train_loss"]) / abs(a["train_loss"])
        print("%4d  %.9f       %.9f        %.2e" % (a["step"], a["train_loss"], b["train_loss"],
                                                    rel))
        if not rel <= LOSS_TOL:
            failures.append("step %d: loss %.9g (1 process) vs %.9g (2 processes)"
                            % (a["step"], a["train_loss"], b["train_loss"]))
    if len(m1) != STEPS or len(m2) != STEPS:
        failures.append("metrics.jsonl has %d and %d rows, expected %d" % (len(m1), len(m2), STEPS))
    v1, v2 = m1[-1].get("val_loss"), m2[-1].get("val_loss")
    if v1 is None or v2 is None or not abs(v1 - v2) <= LOSS_TOL * abs(v1):
        failures.append("validation loss %s (1 process) vs %s (2 processes)" % (v1, v2))
    ck1, p1 = params(one)
    _, p2 = params(two)
    worst = max(p1, key=lambda n: float(np.abs(p1[n] - p2[n]).max()))
    diff = float(np.abs(p1[worst] - p2[worst]).max())
    moved = max(float(np.abs(p1[n] - ck1.model.__class__(ck1.cfg, seed=7).state_dict()[n].numpy())
                      .max()) for n in p1)
    print("largest parameter difference after %d steps: %.3e (in '%s'); the parameters moved "
          "up to %.3e from their initialisation" % (STEPS, diff, worst, moved))
    print("wall time: 1 process %.1f s, 2 processes %.1f s" % (t_one, t_two))
    if not diff <= PARAM_TOL:
        failures.append("parameters differ by %.3g (tensor '%s') > %g" % (diff, worst, PARAM_TOL))
    if not moved > 1e-3:
        failures.append("training did not move the parameters (%.3g)" % moved)

    # a run stopped after step 2 and resumed equals the uninterrupted one
    res = os.path.join(work, "resumed")
    common.run(train + FLAGS + ["--out", res, "--stop-after", "2"], env=env, timeout=120)
    if len(metrics(res)) != 2:
        failures.append("--stop-after 2 left %d metric rows" % len(metrics(res)))
    _, _, err = common.run(train + ["--resume", res], env=env, timeout=120)
    if "resuming" not in err:
        failures.append("--resume did not say it resumed: " + err)
    _, pr = params(res)
    rdiff = max(float(np.abs(p1[n] - pr[n]).max()) for n in p1)
    mr = metrics(res)
    ldiff = max(abs(a["train_loss"] - b["train_loss"]) for a, b in zip(m1, mr))
    print("stopped at step 2 and resumed: largest parameter difference %.3e, loss difference "
          "%.3e, %d metric rows" % (rdiff, ldiff, len(mr)))
    if rdiff != 0.0 or ldiff != 0.0 or len(mr) != STEPS:
        failures.append("resume is not exact: parameters %.3g, losses %.3g, %d rows"
                        % (rdiff, ldiff, len(mr)))

    # mhar-toy reads the PyTorch run: eval gives PyTorch's loss, heatmap draws it
    _, out, _ = common.run([toy, "eval", two, "--data", common.CORPUS, "--max-windows", "40",
                            "--batch", "16", "--json"])
    toy_loss = json.loads(out)["loss"]
    ck2, _ = params(two)
    py_loss, windows = evaluate(ck2.model, common.CORPUS, batch=16, max_windows=40)
    rel = abs(toy_loss - py_loss) / py_loss
    print("mhar-toy eval %s: loss %.8f; PyTorch on the same %d windows: %.8f (relative %.2e)"
          % (two, toy_loss, windows, py_loss, rel))
    if not rel <= EVAL_TOL:
        failures.append("mhar-toy eval %.8f vs PyTorch %.8f" % (toy_loss, py_loss))
    heat = os.path.join(work, "heatmap")
    _, out, _ = common.run([toy, "heatmap", two, "--data", common.CORPUS, "--batch", "4",
                            "--format", "svg", "--out", heat])
    for name in ("alpha.csv", "alpha.json", "heatmap.svg"):
        if not os.path.isfile(os.path.join(heat, name)):
            failures.append("mhar-toy heatmap wrote no %s" % name)
    print("mhar-toy heatmap: " + " ".join(sorted(os.listdir(heat))))
    common.run([toy, "train", "--resume", two, "--steps", str(STEPS + 2), "--quiet"], timeout=120)
    if [r["step"] for r in metrics(two)] != list(range(1, STEPS + 3)):
        failures.append("mhar-toy train --resume did not continue the PyTorch run")
    else:
        print("mhar-toy train --resume continued the PyTorch run to step %d" % (STEPS + 2))

    assert not failures, "\n".join(failures)
