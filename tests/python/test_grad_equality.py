"""py:grad-equality — the PyTorch twin computes the reference's function, in every mode.

For each case, `mhar-toy grad` writes one batch, the loss and every gradient in double (f64); the
PyTorch model in float64, given the same parameters and batch, must give the same loss (relative
1e-12) and every gradient with a relative error (max |Δ| / max |reference|) of at most 1e-10 per
tensor, with either routing (the shared-buffer "fast" one and the plain reference). A failure
names the case, the routing and the tensor. Cases: every mode on a fresh model and on a
model `mhar-toy train` trained for a few steps (non-zero queries, open gates), `mhar` with H = d,
and a `block` model whose last block is short (L = 3 in 2 blocks: 2 + 1 layers).

The fresh files also check that mhar_torch draws mhar-toy's initialisation bit for bit
(MharModel(cfg, seed)) and the same batch windows (mhar_torch.data.random_batch).
"""

import os

import pytest

import common

LOSS_TOL = 1e-12
GRAD_TOL = 1e-10

SHAPE = ["--d", "16", "--layers", "2", "--n-head", "2", "--n-kv-head", "1", "--ffn", "24",
         "--seq-len", "12"]
CASES = [  # name (the test id), flags
    ("residual", ["--mode", "residual"] + SHAPE),
    ("attnres", ["--mode", "attnres"] + SHAPE),
    ("mhar H=4", ["--mode", "mhar", "--heads", "4"] + SHAPE),
    ("mhar H=d=16", ["--mode", "mhar", "--heads", "16"] + SHAPE),
    ("block L=3/2 (2+1)", ["--mode", "block", "--heads", "2", "--blocks", "2"] + SHAPE[:2]
     + ["--layers", "3"] + SHAPE[4:]),
    ("delta L=3/2 (2+1)", ["--mode", "delta", "--heads", "4", "--blocks", "2"] + SHAPE[:2]
     + ["--layers", "3"] + SHAPE[4:]),
]
TRAIN = ["--steps", "12", "--batch", "4", "--lr", "0.02", "--warmup", "2", "--eval-every", "12",
         "--eval-batches", "1", "--ckpt-every", "12", "--heatmap-every", "0", "--format", "svg",
         "--quiet", "--seed", "4", "--data", common.CORPUS]


def compare(tag, path, failures, rows):
    from mhar_torch import load_grad_file

    g = load_grad_file(path)
    if g.precision != "f64":
        failures.append("%s: %s holds %s gradients, not f64" % (tag, path, g.precision))
        return g
    for routing in ("fast", "plain"):
        compare_routing("%s %s" % (tag, routing), g, routing, failures, rows)
    return g


def compare_routing(tag, g, routing, failures, rows):
    import torch
    from mhar_torch import MharModel

    model = MharModel(g.cfg, seed=None, dtype=torch.float64, routing=routing).load_arrays(g.params)
    loss = model(torch.from_numpy(g.tokens), torch.from_numpy(g.targets))
    loss.backward()
    loss_rel = abs(loss.item() - g.loss) / abs(g.loss)
    if not loss_rel <= LOSS_TOL:
        failures.append("%s: loss %.17g, reference %.17g: relative difference %.3g > %g"
                        % (tag, loss.item(), g.loss, loss_rel, LOSS_TOL))
    worst, worst_name = -1.0, None
    for name, p in model.checkpoint_parameters():
        err = common.rel_error(p.grad.numpy(), g.grads[name])
        if not err <= GRAD_TOL:
            failures.append("%s: gradient of '%s': relative error %.3g > %g"
                            % (tag, name, err, GRAD_TOL))
        if err > worst:
            worst, worst_name = err, name
    rows.append((tag, loss.item() - g.loss, loss_rel, worst, worst_name))


@pytest.mark.parametrize("name,flags", CASES, ids=[c[0].replace(" ", "-") for c in CASES])
def test_equals_mhar_toy(toy, work, name, flags):
    import numpy as np
    import torch
    from mhar_torch import MharModel
    from mhar_torch.data import Corpus, random_batch

    failures, rows = [], []
    # fresh model: the initialisation and the batch are mhar-toy's, drawn here again
    fresh = os.path.join(work, "fresh.safetensors")
    common.run([toy, "grad", *flags, "--seed", "3", "--batch", "2", "--batch-seed", "5",
                "--data", common.CORPUS, "--out", fresh])
    g = compare(name + " fresh", fresh, failures, rows)
    init = MharModel(g.cfg, seed=3, dtype=torch.float32)
    for pname, p in init.checkpoint_parameters():
        if not np.array_equal(p.detach().numpy().astype(np.float64), g.params[pname]):
            failures.append("%s: MharModel(seed=3) tensor '%s' differs from mhar-toy's "
                            "initialisation" % (name, pname))
            break
    tokens, targets = random_batch(Corpus(common.CORPUS, 0.1, g.cfg.T).train, 2, g.cfg.T,
                                   5, 0, 3)
    if not (np.array_equal(tokens, g.tokens) and np.array_equal(targets, g.targets)):
        failures.append("%s: random_batch(seed 5, stream 3) differs from mhar-toy's batch"
                        % name)
    # trained model: queries away from zero, gates open
    run = os.path.join(work, "run")
    common.run([toy, "train", *flags, *TRAIN, "--out", run])
    trained = os.path.join(work, "trained.safetensors")
    common.run([toy, "grad", "--ckpt", run, "--batch", "3", "--batch-seed", "9", "--data",
                common.CORPUS, "--out", trained])
    g = compare(name + " trained", trained, failures, rows)
    if g.cfg.routed:
        qmax = float(np.abs(g.params["route.q"]).max())
        if qmax == 0.0:
            failures.append("%s trained: route.q is still zero (the test needs a trained "
                            "router)" % name)
    if g.cfg.mode == "delta":
        gmin = float(np.abs(g.params["delta.gate"]).min())
        if gmin == 0.0:
            failures.append("%s trained: a delta gate is still closed" % name)

    print("\n%-34s %14s %12s %12s  %s" % ("case", "loss diff", "loss rel", "worst grad", "tensor"))
    for tag, diff, rel, worst, tname in rows:
        print("%-34s %14.3e %12.3e %12.3e  %s" % (tag, diff, rel, worst, tname))
    assert not failures, "\n".join(failures)
