"""py:train-vs-mhar-toy — python/train_ddp.py takes the steps `mhar-toy train` takes.

Same flags, same seed: the initialisation and the batches are mhar-toy's (bit for bit, checked in
py:grad-equality), the schedule is the same (warmup + cosine, AdamW β = (0.9, 0.95), decay on
matrices only, clipping; the clip is tight enough here to act), so the float32 losses, gradient
norms and learning rates of the two runs agree per step to float rounding, and so do the
parameters at the end. With either routing of the PyTorch model (the shared-buffer "fast" one,
the default, and the plain reference).
"""

import json
import os

import pytest

import common

FLAGS = ["--mode", "block", "--heads", "4", "--d", "16", "--layers", "3", "--blocks", "2",
         "--n-head", "2", "--n-kv-head", "1", "--ffn", "24", "--seq-len", "16", "--steps", "6",
         "--batch", "4", "--lr", "0.01", "--warmup", "2", "--clip", "0.5", "--eval-every", "3",
         "--eval-batches", "2", "--ckpt-every", "6", "--seed", "11", "--data", common.CORPUS]
TOL = 1e-4  # relative per step, and absolute on the parameters
BF16_TOL = 3e-2  # relative per step: --autocast bf16 against mhar-toy's float32


@pytest.mark.parametrize("routing", ["fast", "plain"])
def test_same_steps_as_mhar_toy(toy, work, routing):
    from mhar_torch import load_checkpoint

    a, b = os.path.join(work, "mhar-toy"), os.path.join(work, "torch")
    common.run([toy, "train", *FLAGS, "--heatmap-every", "0", "--format", "svg", "--quiet",
                "--threads", "1", "--out", a])
    flags = FLAGS + ["--quiet", "--routing", routing]
    common.run(common.TRAIN_DDP + flags + ["--out", b], env=common.torch_env(threads=1))
    c = os.path.join(work, "torch-bf16")
    common.run(common.TRAIN_DDP + flags + ["--autocast", "bf16", "--out", c],
               env=common.torch_env(threads=1))
    rows = []
    for d in (a, b, c):
        with open(os.path.join(d, "metrics.jsonl")) as f:
            rows.append([json.loads(l) for l in f if l.strip()])
    failures = []
    print("\nstep  loss mhar-toy   loss PyTorch   rel diff   grad norm rel   lr equal  val rel")
    for x, y in zip(rows[0], rows[1]):
        rel = abs(x["train_loss"] - y["train_loss"]) / x["train_loss"]
        grel = abs(x["grad_norm"] - y["grad_norm"]) / x["grad_norm"]
        vrel = (abs(x["val_loss"] - y["val_loss"]) / x["val_loss"]) if "val_loss" in x else None
        print("%4d  %.8f   %.8f   %.2e   %.2e       %-8s  %s" % (
            x["step"], x["train_loss"], y["train_loss"], rel, grel, x["lr"] == y["lr"],
            "" if vrel is None else "%.2e" % vrel))
        if not (rel <= TOL and grel <= TOL and x["lr"] == y["lr"]):
            failures.append("step %d: mhar-toy %s, PyTorch %s" % (x["step"], x, y))
        if ("val_loss" in x) != ("val_loss" in y) or (vrel is not None and not vrel <= TOL):
            failures.append("step %d: validation differs: %s vs %s"
                            % (x["step"], x.get("val_loss"), y.get("val_loss")))
    if len(rows[0]) != 6 or len(rows[1]) != 6 or len(rows[2]) != 6:
        failures.append("expected 6 metric rows each, got %d, %d and %d" % tuple(map(len, rows)))
    # bf16 autocast: near float32, and visibly not float32 (so the switch does something)
    bf = [abs(x["train_loss"] - z["train_loss"]) / x["train_loss"] for x, z in zip(rows[0], rows[2])]
    print("--autocast bf16 against mhar-toy's float32: loss relative differences %s"
          % " ".join("%.1e" % e for e in bf))
    if not (max(bf) <= BF16_TOL and max(bf) > 1e-5):
        failures.append("bf16 losses differ from float32 by up to %.3g (expected within %g and "
                        "above %g)" % (max(bf), BF16_TOL, 1e-5))
    pa, pb = load_checkpoint(a).model, load_checkpoint(b).model
    worst, name = 0.0, None
    for (n, p), (_, q) in zip(pa.checkpoint_parameters(), pb.checkpoint_parameters()):
        diff = float((p - q).abs().max())
        if diff >= worst:
            worst, name = diff, n
    print("largest parameter difference after 6 steps: %.3e (in '%s')" % (worst, name))
    if not worst <= TOL:
        failures.append("parameters differ by %.3g in '%s'" % (worst, name))
    assert not failures, "\n".join(failures)
