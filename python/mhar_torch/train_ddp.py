"""Trains the mhar model (mhar_torch) on a byte corpus, on one process or many under torchrun,
with mhar-toy train's schedule and run directory. See docs/pytorch.md.

    mhar-train-ddp --mode mhar --d 64 --layers 4 --steps 300 --out runs/py
    torchrun --nproc_per_node 2 -m mhar_torch.train_ddp --mode mhar --steps 300 --out runs/py2
    mhar-train-ddp --resume runs/py --steps 600

`mhar-train-ddp` is the console script of the installed package (docs/pytorch.md); from a checkout
without installing, `python3 python/train_ddp.py` runs the same main().

--batch is the global batch: each of the N processes takes B / N of the windows mhar-toy would
draw at that step, and DistributedDataParallel averages the gradients, so N processes take the
steps one process takes (to float rounding). gloo on the CPU, NCCL on GPUs.

The run directory holds what mhar-toy train writes: config.json, metrics.jsonl, metrics.csv,
checkpoint.safetensors and optimizer.safetensors (rank 0 writes them, as mhar-toy does:
mhar_torch/run_dir.py), so `mhar-toy eval`, `mhar-toy heatmap`, `mhar-toy sample` and
`mhar-toy train --resume` open it.
Routing heatmaps are not drawn here: run `mhar-toy heatmap DIR`.
"""

import argparse
import errno
import json
import math
import os
import signal
import sys
import time
from typing import List, Optional

EXIT_FAILURE, EXIT_USAGE, EXIT_DIVERGED, EXIT_UNAVAILABLE, EXIT_INTERRUPTED = 1, 2, 3, 4, 130

# A file or folder the user named that cannot be read or written (missing, no permission,
# read-only) is unusable input (exit 2); any other OS error, a full disk included, is a failure
# (1): as mhar-toy (tools/mhar_toy.cpp, exit_code_of).
USAGE_ERRNOS = (errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOENT, errno.ENOTDIR,
                errno.EISDIR, errno.EEXIST)
# A write that lost data (a full disk or quota, a file size limit, a device error): without a file
# name, it was standard output's (the trainer's own files are named in their errors), as
# mhar_exit.py says it for mhar-verify.
LOST_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EIO)


class UsageError(Exception):
    pass


# The most threads --threads may ask for, as mhar-toy's (tools/thread_governor.h, kMaxThreads): a
# team of 20,000 OpenMP threads took minutes and gigabytes to start.
MAX_THREADS = 1024


class DivergedError(Exception):
    pass


def parse_args(argv):
    p = argparse.ArgumentParser(
        prog="mhar-train-ddp", description="Train the mhar model with PyTorch (torchrun for DDP)")
    m = p.add_argument_group("model (as mhar-toy train)")
    m.add_argument("--mode", default="mhar", help="residual | attnres | mhar | block | delta")
    m.add_argument("--heads", "-H", type=int, default=0, help="routing heads H (0 = n_kv_head)")
    m.add_argument("--d", type=int, default=128, help="model width d")
    m.add_argument("--layers", "-L", type=int, default=4, help="transformer blocks L")
    m.add_argument("--n-head", type=int, default=4, help="attention query heads")
    m.add_argument("--n-kv-head", type=int, default=2, help="attention key/value heads")
    m.add_argument("--ffn", type=int, default=352, help="SwiGLU hidden width")
    m.add_argument("--seq-len", "-T", type=int, default=128, help="bytes per sequence T")
    m.add_argument("--blocks", type=int, default=2, help="blocks for the block and delta modes")
    t = p.add_argument_group("training (as mhar-toy train)")
    t.add_argument("--steps", type=int, default=None, help="optimizer steps (default 600)")
    t.add_argument("--batch", "-B", type=int, default=16, help="global sequences per step")
    t.add_argument("--lr", type=float, default=3e-3, help="peak learning rate")
    t.add_argument("--min-lr-ratio", type=float, default=0.1, help="final lr / peak lr")
    t.add_argument("--warmup", type=int, default=30, help="warmup steps")
    t.add_argument("--weight-decay", type=float, default=0.1, help="AdamW decay (matrices only)")
    t.add_argument("--clip", type=float, default=1.0, help="global gradient-norm clip (0 = off)")
    t.add_argument("--seed", type=int, default=1, help="seed of the initialisation and batches")
    t.add_argument("--data", default="data/tinyshakespeare.txt", help="training text")
    t.add_argument("--out", "-o", default=None, help="run directory (never overwritten)")
    t.add_argument("--val-fraction", type=float, default=0.1, help="held-out tail")
    t.add_argument("--eval-every", type=int, default=100, help="validate every N steps")
    t.add_argument("--eval-batches", type=int, default=8, help="batches per validation")
    t.add_argument("--ckpt-every", type=int, default=100, help="checkpoint every N steps")
    t.add_argument("--log-every", type=int, default=10, help="progress line every N steps")
    t.add_argument("--stop-after", type=int, default=0, metavar="N",
                   help="stop after step N with a checkpoint, as an interruption would (for "
                        "time-limited jobs); continue with --resume")
    t.add_argument("--resume", default=None, metavar="DIR",
                   help="continue the run in DIR with its saved options (--steps N extends it)")
    t.add_argument("--quiet", "-q", action="store_true", help="print nothing but errors")
    x = p.add_argument_group("PyTorch")
    x.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"],
                   help="cuda: one GPU per process (NCCL); cpu: gloo")
    x.add_argument("--autocast", default="off", choices=["off", "bf16"],
                   help="bf16: forward and backward under torch.autocast in bfloat16 (weights, "
                        "moments and checkpoints stay float32); off: float32 throughout, as "
                        "mhar-toy")
    x.add_argument("--init", default="mhar", choices=["mhar", "torch"],
                   help="mhar: mhar-toy's initial parameters for --seed, bit for bit (about 2 s "
                        "per million parameters); torch: the same distribution from PyTorch's "
                        "generator (fast; for large models)")
    x.add_argument("--threads", type=int, default=0, help="CPU threads per process (0: torch's)")
    x.add_argument("--routing", default="fast", choices=["fast", "plain"],
                   help="fast: the shared source buffer (mhar_torch/routing_stack.py); plain: "
                        "depth_route, the readable reference (the same function, more memory)")
    return p.parse_args(argv)


# ---- options: the config.json of mhar-toy train ------------------------------------------------

TRAIN_KEYS = ("data", "steps", "batch", "lr", "min_lr_ratio", "warmup", "weight_decay", "clip",
              "seed", "val_fraction", "eval_every", "eval_batches", "ckpt_every", "heatmap_every",
              "figure_formats", "log_every", "device", "threads")


def options_from_args(a):
    from mhar_torch import Config
    cfg = Config(d=a.d, L=a.layers, n_head=a.n_head, n_kv_head=a.n_kv_head, ffn=a.ffn,
                 T=a.seq_len, mode=a.mode, H=a.heads, n_blocks=a.blocks)
    train = {"data": a.data, "steps": 600 if a.steps is None else a.steps, "batch": a.batch,
             "lr": a.lr, "min_lr_ratio": a.min_lr_ratio, "warmup": a.warmup,
             "weight_decay": a.weight_decay, "clip": a.clip, "seed": a.seed,
             "val_fraction": a.val_fraction, "eval_every": a.eval_every,
             "eval_batches": a.eval_batches, "ckpt_every": a.ckpt_every,
             # heatmaps are mhar-toy's (`mhar-toy heatmap DIR`); 0 = "only at the end" should
             # mhar-toy train --resume continue this run
             "heatmap_every": 0, "figure_formats": "png,svg", "log_every": a.log_every,
             "device": "cpu" if a.device == "cpu" else "auto", "threads": a.threads}
    return cfg, train


def options_to_json(cfg, train, world, backend, init, autocast):
    j = {"model": cfg.to_dict(), "train": {k: train[k] for k in TRAIN_KEYS},
         "pytorch": {"world_size": world, "backend": backend, "init": init,
                     "autocast": autocast, "trainer": "mhar_torch.train_ddp"}}
    return json.dumps(j, indent=2, sort_keys=True) + "\n"


# config.json "train": the integers, the other numbers and the strings (as mhar-toy writes them).
TRAIN_INTS = ("steps", "batch", "warmup", "seed", "eval_every", "eval_batches", "ckpt_every",
              "heatmap_every", "log_every", "threads")
TRAIN_STRINGS = ("data", "figure_formats", "device")


def read_run_config(path):
    """A run's config.json as a dict holding the objects "model" and "train"; UsageError, in our
    words, for a file that is missing, unreadable, not JSON (strictly, as mhar-toy reads it) or
    not shaped so."""
    from mhar_torch.safetensors_io import FormatError, open_regular, parse_json_strict
    if not os.path.lexists(path):
        raise UsageError("--resume %s: no config.json there (not a run directory)"
                         % os.path.dirname(path))
    try:
        f, _ = open_regular(path)  # a FIFO or a device is refused unread
        with f:
            raw = f.read((1 << 20) + 1)
    except FormatError as e:
        raise UsageError(str(e)) from None
    except OSError as e:
        raise UsageError("%s: cannot read it: %s" % (path, e.strerror or e)) from None
    if len(raw) > 1 << 20:
        raise UsageError("%s: over 1 MiB, not a run's config.json" % path)
    try:
        j = parse_json_strict(raw.decode("utf-8"), path, "the file")
    except UnicodeDecodeError as e:
        raise UsageError("%s: the file is not valid JSON at byte %d: not UTF-8"
                         % (path, e.start + 1)) from None
    except FormatError as e:
        raise UsageError(str(e)) from None
    for key in ("model", "train"):
        if not isinstance(j, dict) or not isinstance(j.get(key), dict):
            raise UsageError("%s: bad run config: '%s' must be an object" % (path, key))
    return j


def _train_value(t, key, path):
    """config.json train[key], of the type mhar-toy writes there."""
    if key not in t:
        raise UsageError("%s: bad run config: 'train.%s' is missing" % (path, key))
    v = t[key]
    kind, ok = (("a string", isinstance(v, str)) if key in TRAIN_STRINGS else
                ("an integer", type(v) is int) if key in TRAIN_INTS else
                ("a number", type(v) in (int, float)))
    if not ok:
        raise UsageError("%s: bad run config: 'train.%s' must be %s, got %s"
                         % (path, key, kind, json.dumps(v)[:40]))
    return v


def options_from_json(path):
    from mhar_torch import Config, ConfigError
    j = read_run_config(path)
    try:
        cfg = Config.from_dict(j["model"], path)
    except ConfigError as e:
        raise UsageError(str(e)) from None
    t = dict(j["train"])
    t.setdefault("figure_formats", "png,svg")
    train = {k: _train_value(t, k, path) for k in TRAIN_KEYS}
    # how step 0 was drawn (a run that mhar-toy started: its own initialisation)
    pt = j.get("pytorch")
    train["init"] = pt.get("init", "mhar") if isinstance(pt, dict) else "mhar"
    return cfg, train


def validate(cfg, train, world):
    from mhar_torch import ConfigError
    try:
        cfg.validate()
    except ConfigError as e:
        raise UsageError(str(e)) from None
    for key, flag in (("steps", "--steps"), ("batch", "--batch"), ("eval_every", "--eval-every"),
                      ("eval_batches", "--eval-batches"), ("ckpt_every", "--ckpt-every"),
                      ("log_every", "--log-every")):
        if not train[key] > 0:
            raise UsageError("%s must be positive, got %s" % (flag, train[key]))
    if train["warmup"] < 0:
        raise UsageError("--warmup must be 0 or positive")
    if not (train["lr"] > 0 and math.isfinite(train["lr"])):
        raise UsageError("--lr must be positive, got %s" % train["lr"])
    if not 0 <= train["min_lr_ratio"] <= 1:
        raise UsageError("--min-lr-ratio must be in [0, 1]")
    if not train["weight_decay"] >= 0:
        raise UsageError("--weight-decay must be 0 or positive")
    if not train["clip"] >= 0:
        raise UsageError("--clip must be 0 (off) or positive")
    if not 0 <= train["threads"] <= MAX_THREADS:
        raise UsageError("--threads must be from 0 to %d, got %s" % (MAX_THREADS, train["threads"]))
    if train["batch"] % world != 0:
        raise UsageError("--batch %d is not a multiple of the %d processes (each takes an equal "
                         "share of the global batch)" % (train["batch"], world))


def learning_rate(train, step):
    """Linear warmup, then cosine down to lr · min_lr_ratio (tools/train.cpp, learning_rate)."""
    lr, warmup, steps = train["lr"], train["warmup"], train["steps"]
    if warmup > 0 and step <= warmup:
        return lr * step / warmup
    span = max(1, steps - warmup)
    progress = min(1.0, (step - warmup) / span)
    cosine = 0.5 * (1.0 + math.cos(math.pi * progress))
    return lr * (train["min_lr_ratio"] + (1.0 - train["min_lr_ratio"]) * cosine)


def fmt_duration(s):
    if not math.isfinite(s) or s < 0:
        return "?"
    t = int(round(s))
    if t >= 3600:
        return "%dh%02dm" % (t // 3600, (t % 3600) // 60)
    if t >= 60:
        return "%dm%02ds" % (t // 60, t % 60)
    return "%ds" % t


# ---- metrics ----------------------------------------------------------------------------------

CSV_HEADER = "step,train_loss,val_loss,lr,grad_norm,tokens_per_s,elapsed_s\n"


def _row_step(line):
    """The step of a metrics row (JSON or CSV), 0 for the CSV header, None for a torn row."""
    if line.startswith("{"):
        try:
            return int(json.loads(line)["step"])
        except (ValueError, KeyError, TypeError):
            return None
    if line.startswith("step"):
        return 0
    fields = line.split(",")
    if len(fields) != CSV_HEADER.count(",") + 1:
        return None  # torn by a kill or a full disk: its "1" may be the start of step 12
    try:
        return int(fields[0])
    except ValueError:
        return None


def open_metrics(run_dir, keep_through_step):
    """As mhar-toy: on resume, rows past the checkpoint's step are dropped (they are redone)."""
    from mhar_torch.safetensors_io import write_atomic
    for name in ("metrics.jsonl", "metrics.csv"):
        path = os.path.join(run_dir, name)
        keep = []
        if os.path.exists(path):
            with open(path, errors="replace") as f:  # damaged bytes: rows that are dropped
                steps = [(line, _row_step(line)) for line in f.read().splitlines() if line]
            keep = [line for line, step in steps if step is not None and step <= keep_through_step]
        content = "".join(l + "\n" for l in keep)
        if name == "metrics.csv" and not keep:
            content = CSV_HEADER
        write_atomic(path, content.encode())
    return (open(os.path.join(run_dir, "metrics.jsonl"), "a"),
            open(os.path.join(run_dir, "metrics.csv"), "a"))


def write_metrics(files, step, loss, val, lr, gnorm, tps, elapsed):
    jsonl, csv = files
    row = {"step": step, "train_loss": loss, "lr": lr, "grad_norm": gnorm, "tokens_per_s": tps,
           "elapsed_s": elapsed}
    if val is not None:
        row["val_loss"] = val
    _append(jsonl, json.dumps(row, sort_keys=True, separators=(",", ":")) + "\n")
    _append(csv, "%d,%.6f,%s,%.6g,%.6g,%.1f,%.2f\n" % (
        step, loss, "" if val is None else "%.6f" % val, lr, gnorm, tps, elapsed))


def _append(f, text):
    """One metrics row, flushed; a full disk names the file (main prints one line, exit 1). A row
    torn by it is dropped by the next --resume (open_metrics)."""
    try:
        f.write(text)
        f.flush()
    except OSError as e:
        raise OSError(e.errno, "writing it failed: %s" % e.strerror, f.name) from None


# ---- the loop ---------------------------------------------------------------------------------

def train(argv):
    a = parse_args(argv)
    import torch
    import torch.distributed as dist
    from mhar_torch.allocator import keep_freed_memory
    from mhar_torch.data import Corpus

    keep_freed_memory()  # freed memory stays for the next step (mhar_torch/allocator.py)

    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if a.device == "cuda" and not torch.cuda.is_available():
        raise UsageError("--device cuda: this torch (%s) sees no CUDA device; use --device cpu"
                         % torch.__version__)
    use_cuda = a.device == "cuda" or (a.device == "auto" and torch.cuda.is_available())
    device = torch.device("cuda", local_rank) if use_cuda else torch.device("cpu")
    backend = "nccl" if use_cuda else "gloo"

    # options: from the flags, or the run being resumed
    if a.resume:
        run_dir = a.resume
        cfg, train = options_from_json(os.path.join(run_dir, "config.json"))
        if a.steps is not None:
            train["steps"] = a.steps
        train["threads"] = a.threads if a.threads else train["threads"]
    else:
        cfg, train = options_from_args(a)
        run_dir = a.out or "runs/%s-h%d-seed%d-torch" % (a.mode, cfg.route_heads, a.seed)
    try:
        validate(cfg, train, world)
    except UsageError as e:  # a value from the resumed run's file: name it, as mhar-toy does
        if not a.resume:
            raise
        raise UsageError("%s: %s" % (os.path.join(run_dir, "config.json"), e)) from None
    from mhar_torch.checkpoint import memory_shortfall
    short = memory_shortfall(cfg, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    if short:  # the kernel killed such a model before its first step
        raise UsageError(short)
    if train["threads"] > 0:  # the flag's, or the resumed run's as mhar-toy resumes it
        torch.set_num_threads(train["threads"])
    corpus = Corpus(train["data"], train["val_fraction"], cfg.T)  # fail before creating anything
    # rank 0 writes the run directory: locked (and a resume's kill leftovers cleared) before the
    # other ranks read it, since they join the process group only once rank 0 has
    lock = lock_run_dir(a, run_dir) if rank == 0 else None
    try:
        if world > 1:
            if use_cuda:
                torch.cuda.set_device(device)
            dist.init_process_group(backend=backend)
        quiet = a.quiet or rank != 0
        return _Trainer(a, cfg, train, run_dir, corpus, world, rank, device, backend,
                        quiet).run()
    finally:
        if world > 1 and dist.is_initialized():
            dist.destroy_process_group()
        if lock is not None:
            lock.release()


def lock_run_dir(a, run_dir: str):
    """The run directory (created for a new run) under mhar-toy's lock, before anything there is
    read or written: one writer at a time, mhar-toy included. A new run refuses a directory that
    holds one; a resumed one first clears what a killed writer left (mhar_torch/run_dir.py)."""
    from mhar_torch.run_dir import (CHECKPOINT_FILE, DirLock, RunDirBusy, recover_state,
                                    remove_stale_temporaries)
    if a.resume is None:
        os.makedirs(run_dir, exist_ok=True)
    try:
        lock = DirLock(run_dir, "train_ddp")
    except RunDirBusy as e:
        raise UsageError(str(e)) from None
    if a.resume is None and any(os.path.exists(os.path.join(run_dir, n))
                                for n in (CHECKPOINT_FILE, "config.json")):
        lock.release()
        raise UsageError("'%s' already holds a run; continue it with --resume %s or choose "
                         "another --out (nothing is overwritten)" % (run_dir, run_dir))
    if a.resume is not None:
        remove_stale_temporaries(run_dir)
        recover_state(run_dir)
    return lock


class _Trainer:
    """One process's part of a run: its model and AdamW, its share of each global batch, and (rank
    0) the run directory. ``run()`` takes the steps and returns the exit status."""

    def __init__(self, a, cfg, train: dict, run_dir: str, corpus, world: int, rank: int, device,
                 backend: str, quiet: bool) -> None:
        import torch
        self.torch = torch
        self.a, self.cfg, self.train, self.run_dir, self.corpus = a, cfg, train, run_dir, corpus
        self.world, self.rank, self.device, self.backend, self.quiet = (world, rank, device,
                                                                        backend, quiet)
        self.B, self.T = train["batch"], cfg.T
        local = self.B // world
        self.rows = slice(rank * local, (rank + 1) * local)  # this process's share of a batch
        self.metrics = None
        self.start_step, moments = self._model()
        if self.start_step is None:
            return
        self._optimizer(moments)
        self.net = self.model
        if world > 1:
            self.net = torch.nn.parallel.DistributedDataParallel(
                self.model, device_ids=[device.index] if device.type == "cuda" else None)

    def _model(self):
        """(start step, AdamW's moments): the resumed run's, or a new model at step 0; start step
        None when the resumed run has already taken its steps."""
        from mhar_torch import MharModel, load_checkpoint, load_optimizer
        from mhar_torch.run_dir import CHECKPOINT_FILE, OPTIMIZER_FILE
        a, train, run_dir = self.a, self.train, self.run_dir
        if not a.resume:
            # mhar-toy's initialisation, bit for bit (or, with --init torch, PyTorch's draws)
            self.model = MharModel(self.cfg, seed=train["seed"], init=a.init)
            return 0, None
        if not any(os.path.exists(os.path.join(run_dir, n))
                   for n in (CHECKPOINT_FILE, OPTIMIZER_FILE)):
            # stopped before its first checkpoint: step 0 is the seed's, as mhar-toy resumes it
            if train["init"] not in ("mhar", "torch"):
                raise UsageError("%s: no checkpoint to resume from, and config.json does not say "
                                 "how the model was initialised" % run_dir)
            self.model = MharModel(self.cfg, seed=train["seed"], init=train["init"])
            return 0, None
        ck = load_checkpoint(os.path.join(run_dir, CHECKPOINT_FILE))
        if ck.cfg.to_dict() != self.cfg.to_dict():
            raise UsageError("%s: checkpoint.safetensors holds a different model than config.json"
                             % run_dir)
        m, v, ostep = load_optimizer(os.path.join(run_dir, OPTIMIZER_FILE), self.cfg)
        if ostep != ck.step:
            raise UsageError("%s: the optimizer state is from step %d, the checkpoint from step %d"
                             % (run_dir, ostep, ck.step))
        if ck.step >= train["steps"]:
            if not self.quiet and self.a.steps is not None:  # as mhar-toy says it
                print("%s is already at step %d: --steps %d trains nothing (nothing changed)"
                      % (run_dir, ck.step, self.a.steps), file=sys.stderr)
            elif not self.quiet:
                print("%s already finished its %d steps (pass --steps N to train longer)"
                      % (run_dir, train["steps"]), file=sys.stderr)
            return None, None
        self.model = ck.model
        return ck.step, (m, v)

    def _optimizer(self, moments) -> None:
        """AdamW over the model (on its device), with the resumed run's moments if any."""
        from mhar_torch import decays
        torch, train = self.torch, self.train
        self.model.routing = self.a.routing
        self.model.to(self.device)
        self.named = self.model.checkpoint_parameters()
        groups = [{"params": [p for n, p in self.named if decays(n)],
                   "weight_decay": train["weight_decay"]},
                  {"params": [p for n, p in self.named if not decays(n)], "weight_decay": 0.0}]
        self.opt = torch.optim.AdamW(groups, lr=train["lr"], betas=(0.9, 0.95), eps=1e-8)
        if moments is not None:  # AdamW's moments and step count, as mhar-toy saved them
            m, v = moments
            for n, p in self.named:
                self.opt.state[p] = {"step": torch.tensor(float(self.start_step)),
                                     "exp_avg": m[n].to(self.device).clone(),
                                     "exp_avg_sq": v[n].to(self.device).clone()}

    def _open_run_dir(self) -> None:
        """Rank 0: the run directory, its config.json and its metrics files."""
        from mhar_torch.safetensors_io import write_atomic
        a, run_dir = self.a, self.run_dir
        if self.rank != 0:
            return  # (lock_run_dir made the folder of a new run)
        if not a.resume or a.steps is not None:
            # how step 0 was drawn: a run resumed before its first checkpoint still starts there
            if not a.resume:
                init = a.init
            elif self.start_step == 0:
                init = self.train["init"]
            else:
                init = "resumed at step %d" % self.start_step
            write_atomic(os.path.join(run_dir, "config.json"),
                         options_to_json(self.cfg, self.train, self.world, self.backend, init,
                                         a.autocast).encode())
        self.metrics = open_metrics(run_dir, self.start_step)

    def _announce(self) -> None:
        cfg, train, torch, world = self.cfg, self.train, self.torch, self.world
        threads = torch.get_num_threads()
        params = sum(p.numel() for _, p in self.named)
        print("train_ddp: %s%s, d=%d L=%d heads=%d/%d ffn=%d T=%d, %d parameters; %d steps of "
              "%d × %d bytes on %d process%s (%s, %s, %d thread%s each%s); data %s (%d train / %d "
              "val bytes) → %s" % (
                  cfg.mode, " (H=%d)" % cfg.route_heads if cfg.routed else "", cfg.d, cfg.L,
                  cfg.n_head, cfg.n_kv_head, cfg.ffn, cfg.T, params, train["steps"], self.B,
                  self.T, world, "" if world == 1 else "es", self.backend if world > 1 else
                  "no DDP", self.device, threads, "" if threads == 1 else "s",
                  ", bf16 autocast" if self.a.autocast == "bf16" else "", train["data"],
                  len(self.corpus.train), len(self.corpus.val), self.run_dir), file=sys.stderr)
        if self.start_step:
            print("resuming %s from step %d" % (self.run_dir, self.start_step), file=sys.stderr)

    def _to_dev(self, x):
        return self.torch.from_numpy(x[self.rows]).to(self.device)

    def _mean_over_ranks(self, *xs: float) -> List[float]:
        """Each of xs averaged over the processes, in one all_reduce."""
        t = self.torch.tensor(xs, dtype=self.torch.float64, device=self.device)
        if self.world > 1:
            self.torch.distributed.all_reduce(t)
        return [x / self.world for x in t.tolist()]

    def _autocast(self):
        """bfloat16 autocast (--autocast bf16), or nothing."""
        return self.torch.autocast(self.device.type, dtype=self.torch.bfloat16,
                                   enabled=self.a.autocast == "bf16")

    def _validation_loss(self, batches: Optional[int] = None) -> float:
        """The mean loss over the first `batches` (default --eval-batches) validation windows,
        the same at every evaluation, averaged over the processes."""
        from mhar_torch.data import random_batch
        train, total = self.train, 0.0
        batches = train["eval_batches"] if batches is None else batches
        with self.torch.no_grad():
            for k in range(batches):
                tok, tgt = random_batch(self.corpus.val, self.B, self.T, train["seed"], k, 1)
                with self._autocast():
                    loss = self.model(self._to_dev(tok), self._to_dev(tgt))
                total += self._mean_over_ranks(loss.float().item())[0]
        return total / batches

    def _kept(self) -> str:
        """What a stop leaves, as mhar-toy train says it."""
        if self.last_saved > 0:
            return "the last good checkpoint (step %d) is kept in %s" % (self.last_saved,
                                                                         self.run_dir)
        return "no checkpoint had been written yet"

    def _confirm_weights(self, s: int, val: Optional[float]) -> None:
        """A step's loss is measured before its update, so the weights after step s are
        confirmed before their checkpoint replaces the last good one: by the validation of step
        s, else by one validation batch (every process takes part, and all agree)."""
        loss = self._validation_loss(1) if val is None else val
        if not math.isfinite(loss):
            raise DivergedError("the weights after step %d give a validation loss of %s; stopping "
                                "without saving them: %s. Try a smaller --lr or a tighter --clip."
                                % (s, loss, self._kept()))

    def _save(self, step: int) -> None:
        """Rank 0: the checkpoint and the optimizer state of `step`, committed together as
        mhar-toy commits them (a kill at any moment leaves a pair of one step)."""
        from mhar_torch.run_dir import commit_state
        if self.rank != 0:
            return
        m = {n: self.opt.state[p]["exp_avg"] for n, p in self.named}
        v = {n: self.opt.state[p]["exp_avg_sq"] for n, p in self.named}
        commit_state(self.run_dir, self.model, m, v, step, {"seed": str(self.train["seed"])})

    def _step(self, s: int, trace) -> tuple:
        """Step s: forward, backward (DDP averages the gradients), clipping, AdamW. Returns (the
        loss averaged over the processes, the gradient norm before clipping, the learning rate,
        whether any process has had a Ctrl-C: all of them then stop after the same step)."""
        from mhar_torch.data import random_batch
        train = self.train
        tok, tgt = random_batch(self.corpus.train, self.B, self.T, train["seed"], s)
        with self._autocast():  # the mean over this process's windows
            loss = self.net(self._to_dev(tok), self._to_dev(tgt)).float()
        self.opt.zero_grad(set_to_none=True)
        loss.backward()  # DDP: every gradient is now the mean over all processes
        loss_all, stop = self._mean_over_ranks(loss.item(), float(self.interrupted))
        if trace is not None:  # test hook: which windows this process took, its own loss
            trace.write(json.dumps({"step": s, "rank": self.rank, "loss": loss.item(),
                                    "tokens": tok[self.rows].tolist()}) + "\n")
            trace.flush()
        if not math.isfinite(loss_all):
            raise DivergedError("the training loss became %s at step %d; stopping: %s. Try a "
                                "smaller --lr or a tighter --clip." % (loss_all, s, self._kept()))
        # global-norm clipping, as mhar-toy: scale by clip / norm when the norm exceeds it
        norm = math.sqrt(sum(float(p.grad.float().pow(2).sum()) for _, p in self.named))
        if not math.isfinite(norm):
            raise DivergedError("the gradient norm became %s at step %d; stopping: %s."
                                % (norm, s, self._kept()))
        if train["clip"] > 0 and norm > train["clip"]:
            for _, p in self.named:
                p.grad.mul_(train["clip"] / norm)
        lr = learning_rate(train, s)
        for g in self.opt.param_groups:
            g["lr"] = lr
        self.opt.step()
        return loss_all, norm, lr, stop > 0

    def _report(self, s: int, loss: float, norm: float, lr: float, step_s: float,
                elapsed: float) -> Optional[float]:
        """After step s: validation when due, the metrics row (rank 0) and the progress line.
        Returns the validation loss, or None when none was due."""
        train = self.train
        tps = self.B * self.T / step_s
        val = None
        if s % train["eval_every"] == 0 or s == train["steps"]:
            val = self._validation_loss()
        if self.metrics is not None:
            write_metrics(self.metrics, s, loss, val, lr, norm, tps, elapsed)
        eta = elapsed / (s - self.start_step) * (train["steps"] - s)
        if not self.quiet and (s % train["log_every"] == 0 or s == train["steps"]
                               or val is not None):
            _tell("step %6d/%d  loss %.4f%s  lr %.2e  %.0f tok/s  ETA %s"
                  % (s, train["steps"], loss, "" if val is None else "  val %.4f" % val,
                     lr, tps, fmt_duration(eta)))
        return val

    def run(self) -> int:
        """The steps from the start step to the last, checkpoints as due; the exit status. A
        Ctrl-C (SIGINT), a SIGTERM (`kill`, a job scheduler's time limit, torchrun passing on
        its own) or a SIGHUP (the terminal closed) is noted and acted on after the step it came
        in, as mhar-toy train does: the step finishes, its checkpoint is written, exit 130. (A
        KeyboardInterrupt raised at any bytecode could stop AdamW half-way through the
        parameters, and the checkpoint would mix two steps.)"""
        if self.start_step is None:
            return 0
        self.interrupted = False
        self.stop_signal = 0

        def note(signum, _frame):
            self.interrupted, self.stop_signal = True, signum
        old = {sig: signal.signal(sig, note)
               for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
        try:
            self._open_run_dir()
            if not self.quiet:
                self._announce()
            # MHAR_DDP_TRACE=DIR (a test hook, py:ddp): each process appends the windows it took
            # and its own loss at every step to DIR/rank<r>.jsonl
            trace_dir = os.environ.get("MHAR_DDP_TRACE")
            trace = open(os.path.join(trace_dir, "rank%d.jsonl" % self.rank), "a") \
                if trace_dir else None
            return self._loop(trace)
        finally:
            for sig, handler in old.items():
                signal.signal(sig, handler)

    def _loop(self, trace) -> int:
        """Steps until the last, --stop-after or a Ctrl-C; the exit status."""
        a, train, run_dir = self.a, self.train, self.run_dir
        t0 = time.monotonic()
        last_val, last_loss, step = None, float("nan"), self.start_step
        self.last_saved = self.start_step  # a resumed run starts from its checkpoint
        while step < train["steps"]:
            s = step + 1
            ts = time.monotonic()
            last_loss, norm, lr, interrupted = self._step(s, trace)
            step = s
            val = self._report(s, last_loss, norm, lr, time.monotonic() - ts,
                               time.monotonic() - t0)
            last_val = last_val if val is None else val
            stop = interrupted or (a.stop_after > 0 and s >= a.stop_after and s < train["steps"])
            if s % train["ckpt_every"] == 0 or s == train["steps"] or stop:
                self._confirm_weights(s, val)
                self._save(s)
                self.last_saved = s
            if stop and not self.quiet:
                if interrupted:  # by this process's signal, or another process's
                    by = {signal.SIGTERM: " (SIGTERM)",
                          signal.SIGHUP: " (SIGHUP)"}.get(self.stop_signal, "")
                    how = "\ninterrupted%s: checkpoint of step %d saved in %s" % (by, s, run_dir)
                else:
                    how = ("stopped after step %d (--stop-after): checkpoint saved in %s"
                           % (s, run_dir))
                _tell(how + "; continue with `mhar-train-ddp --resume %s`" % run_dir)
            if stop:
                return EXIT_INTERRUPTED if interrupted else 0
        if not self.quiet:
            _tell("done: %d steps, final train loss %.4f, val loss %s; run in %s (heatmaps: "
                  "mhar-toy heatmap %s)" % (train["steps"], last_loss,
                                            "-" if last_val is None else "%.4f" % last_val,
                                            run_dir, run_dir))
        return 0


def _tell(line: str) -> None:
    """A line on stderr, where a failed write is not an error: a progress line that cannot be
    shown (the terminal closed under SIGHUP, stderr into a pipe whose reader has gone, or onto a
    full disk) must not stop a run whose metrics and checkpoints go to their own files. After one
    failure stderr is the null device: what stayed in its buffer would fail again at exit, and
    Python then exits 120, not with the run's status."""
    try:
        print(line, file=sys.stderr, flush=True)
    except OSError:
        sys.stderr = open(os.devnull, "w")


def main(argv: Optional[List[str]] = None) -> int:
    """The command line (`mhar-train-ddp`): exit 0, 1 when a file cannot be written (a full disk),
    2 for unusable input, 3 when the loss diverged, 4 when PyTorch or NumPy is missing, 130 when
    interrupted (after a checkpoint): mhar-toy's codes (docs/cli.md)."""
    try:
        try:
            code = train(sys.argv[1:] if argv is None else argv)
        except SystemExit:  # argparse's --help (its refusals are on stderr)
            sys.stdout.flush()  # a --help that did not reach stdout must not read as success
            raise
        sys.stdout.flush()
        return code
    except UsageError as e:
        print("mhar-train-ddp: error: %s" % e, file=sys.stderr)
        return EXIT_USAGE
    except DivergedError as e:
        print("mhar-train-ddp: %s" % e, file=sys.stderr)
        return EXIT_DIVERGED
    except KeyboardInterrupt:  # a Ctrl-C before the steps began (during them, run() saves)
        print("\nmhar-train-ddp: interrupted before the first step; nothing was saved",
              file=sys.stderr)
        return EXIT_INTERRUPTED
    except ImportError as e:
        print("mhar-train-ddp: cannot import %s (install PyTorch and NumPy: Debian's python3-torch "
              "and python3-numpy)" % e.name, file=sys.stderr)
        return EXIT_UNAVAILABLE
    except OSError as e:  # a run directory or file that cannot be written: one line, no traceback
        if e.filename is None and e.errno in LOST_ERRNOS:
            print("mhar-train-ddp: error: writing the output (standard output) failed: %s; it is "
                  "incomplete" % (e.strerror or e), file=sys.stderr)
            # what is still buffered would fail again when Python flushes it at exit
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return EXIT_FAILURE
        where = "%s: " % e.filename if e.filename else ""
        print("mhar-train-ddp: error: %s%s" % (where, e.strerror or e), file=sys.stderr)
        return EXIT_USAGE if e.errno in USAGE_ERRNOS else EXIT_FAILURE
    except Exception as e:  # the package's own refusals: data and checkpoint files
        from mhar_torch import CheckpointError
        from mhar_torch.data import DataError
        if isinstance(e, (CheckpointError, DataError)):
            print("mhar-train-ddp: error: %s" % e, file=sys.stderr)
            return EXIT_USAGE
        raise


if __name__ == "__main__":
    sys.exit(main())
