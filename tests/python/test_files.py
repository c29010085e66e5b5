"""py:files — mhar_torch reads and writes mhar-toy's files as mhar-toy does.

- A checkpoint mhar-toy wrote, loaded and saved again by mhar_torch, is the same file byte for
  byte; so is its optimizer state.
- Damaged files (truncated, another format or version, a bad config, a renamed, reshaped or
  non-finite tensor, garbage) are refused by mhar_torch.load_checkpoint with a message naming
  the problem, and by `mhar-toy eval` (exit 2): both readers agree.
- train_ddp.py turns bad input into one line and exit status 2, never a traceback.

Usage: test_files.py MHAR_TOY WORKDIR
"""

import os
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

SHAPE = ["--mode", "delta", "--heads", "4", "--d", "16", "--layers", "2", "--n-head", "2",
         "--n-kv-head", "1", "--ffn", "24", "--seq-len", "12", "--blocks", "2"]


def main():
    toy, work = common.start(__doc__)
    import numpy as np
    from mhar_torch import (CheckpointError, load_checkpoint, load_optimizer, save_checkpoint,
                            save_optimizer)
    from mhar_torch import safetensors_io as st

    failures = []
    run = os.path.join(work, "run")
    common.run([toy, "train", *SHAPE, "--steps", "3", "--batch", "2", "--eval-every", "3",
                "--eval-batches", "1", "--heatmap-every", "0", "--format", "svg", "--quiet",
                "--data", common.CORPUS, "--out", run])
    src = os.path.join(run, "checkpoint.safetensors")

    # round trip: the same bytes
    ck = load_checkpoint(run)
    again = os.path.join(work, "again.safetensors")
    save_checkpoint(again, ck.model, ck.step, {"seed": ck.metadata["seed"]})
    same = open(src, "rb").read() == open(again, "rb").read()
    print("checkpoint: mhar-toy's file, loaded and saved by mhar_torch: %s"
          % ("the same bytes" if same else "DIFFERENT bytes"))
    if not same:
        failures.append("save_checkpoint(load_checkpoint(f)) is not f")
    m, v, step = load_optimizer(os.path.join(run, "optimizer.safetensors"), ck.cfg)
    oagain = os.path.join(work, "optimizer.safetensors")
    save_optimizer(oagain, ck.cfg, m, v, step)
    osame = open(os.path.join(run, "optimizer.safetensors"), "rb").read() == open(oagain, "rb").read()
    print("optimizer:  likewise: %s" % ("the same bytes" if osame else "DIFFERENT bytes"))
    if not osame:
        failures.append("save_optimizer(load_optimizer(f)) is not f")

    # damaged files: both readers refuse them
    meta, tensors = st.load(src)
    raw = open(src, "rb").read()

    def variant(name, content=None, meta_change=None, tensor_change=None):
        path = os.path.join(work, name + ".safetensors")
        if content is None:
            mm, tt = dict(meta), {k: v.copy() for k, v in tensors.items()}
            if meta_change:
                meta_change(mm)
            if tensor_change:
                tt = tensor_change(tt)
            content = st.encode(tt, mm)
        with open(path, "wb") as f:
            f.write(content)
        return path

    def renamed(tt):
        return {("final_nrm" if k == "final_norm" else k): v for k, v in tt.items()}

    def reshaped(tt):
        tt["layers.0.wq"] = tt["layers.0.wq"].reshape(8, 32)
        return tt

    def nan(tt):
        tt["layers.1.w_up"][2, 3] = np.nan
        return tt

    def extra(tt):
        tt["extra"] = np.zeros((1, 1), np.float32)
        return tt

    cases = [  # name, file, words the mhar_torch message must hold
        ("truncated", variant("truncated", raw[:-10]), "truncated"),
        ("short", variant("short", raw[:5]), "too short"),
        ("garbage", variant("garbage", b"\x10\x00\x00\x00\x00\x00\x00\x00not json at all!"),
         "not valid JSON"),
        ("format", variant("format", meta_change=lambda m: m.update(format="mhar.optimizer")),
         "not an mhar checkpoint"),
        ("version", variant("version", meta_change=lambda m: m.update(format_version="2")),
         "format version 2 is not supported"),
        ("no config", variant("noconfig", meta_change=lambda m: m.pop("config")), "'config'"),
        ("bad config", variant("badconfig", meta_change=lambda m: m.update(
            config=m["config"].replace('"n_head":2', '"n_head":3'))), "n_head = 3 must divide"),
        ("config not JSON", variant("configjson", meta_change=lambda m: m.update(config="{")),
         "not JSON"),
        ("bad step", variant("step", meta_change=lambda m: m.update(step="many")), "bad step"),
        ("renamed tensor", variant("renamed", tensor_change=renamed), "'final_norm' is missing"),
        ("reshaped tensor", variant("reshaped", tensor_change=reshaped),
         "'layers.0.wq' is 8×32, the config expects 16×16"),
        ("non-finite", variant("nan", tensor_change=nan), "'layers.1.w_up' holds a non-finite"),
        ("extra tensor", variant("extra", tensor_change=extra), "parameters"),
        ("missing file", os.path.join(work, "nothing-here.safetensors"), "cannot open"),
    ]
    print("\n%-18s %-8s %s" % ("damage", "mhar-toy", "mhar_torch's message"))
    for name, path, words in cases:
        rc, _, err = common.run([toy, "eval", path, "--data", common.CORPUS, "--max-windows", "1"],
                                expect=None)
        try:
            load_checkpoint(path)
            msg = None
        except CheckpointError as e:
            msg = str(e)
        print("%-18s exit %-3d %s" % (name, rc, msg))
        if rc != 2:
            failures.append("%s: mhar-toy eval exited %d, expected 2 (refused)" % (name, rc))
        if msg is None:
            failures.append("%s: mhar_torch loaded the file" % name)
        elif words not in msg or path not in msg:
            failures.append("%s: the message %r does not say %r about %s" % (name, msg, words, path))

    # the command line: one line and exit 2 for bad input, no traceback
    train = [sys.executable, os.path.join(common.PYTHON_DIR, "train_ddp.py")]
    env = common.torch_env(threads=1)
    bad_run = os.path.join(work, "badrun")
    shutil.copytree(run, bad_run)
    shutil.copy(variant("truncated2", raw[:-10]), os.path.join(bad_run, "checkpoint.safetensors"))
    cli = [
        (["--resume", os.path.join(work, "no-such-run")], "no config.json"),
        (["--data", os.path.join(work, "no-such-file.txt"), "--out", os.path.join(work, "x")],
         "cannot open"),
        (["--d", "16", "--heads", "3", "--out", os.path.join(work, "y")], "must divide d = 16"),
        (["--resume", bad_run], "truncated"),
        (["--out", run, "--data", common.CORPUS], "already holds a run"),
        (["--batch", "3", "--steps", "0", "--out", os.path.join(work, "z")], "--steps must be"),
    ]
    print()
    for args, words in cli:
        rc, _, err = common.run(train + args, env=env, expect=None, timeout=60)
        last = err.strip().splitlines()[-1] if err.strip() else ""
        print("train_ddp.py %-40s exit %d: %s" % (" ".join(a.replace(work, "…") for a in args),
                                                  rc, last.replace(work, "…")))
        if rc != 2 or "Traceback" in err or words not in err:
            failures.append("train_ddp.py %s: exit %d, stderr %r (wanted exit 2 and %r)"
                            % (args, rc, err, words))

    if failures:
        print("\nFAILED (%d):" % len(failures))
        for f in failures:
            print("  " + f)
        return 1
    print("\nmhar_torch writes mhar-toy's bytes and refuses what mhar-toy refuses")
    return 0


if __name__ == "__main__":
    sys.exit(main())
