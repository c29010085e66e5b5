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
checkpoint.safetensors and optimizer.safetensors (rank 0 writes them, atomically), so
`mhar-toy eval`, `mhar-toy heatmap`, `mhar-toy sample` and `mhar-toy train --resume` open it.
Routing heatmaps are not drawn here: run `mhar-toy heatmap DIR`.
"""

import argparse
import json
import math
import os
import sys
import time
from typing import List, Optional

EXIT_USAGE, EXIT_DIVERGED, EXIT_UNAVAILABLE, EXIT_INTERRUPTED = 2, 3, 4, 130


class UsageError(Exception):
    pass


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


def options_from_json(path):
    from mhar_torch import Config, ConfigError
    try:
        with open(path) as f:
            j = json.load(f)
    except FileNotFoundError:
        raise UsageError("--resume %s: no config.json there (not a run directory)"
                         % os.path.dirname(path)) from None
    except (OSError, ValueError) as e:
        raise UsageError("%s: not valid JSON: %s" % (path, e)) from None
    try:
        cfg = Config.from_dict(j["model"], path)
        train = {k: j["train"][k] for k in TRAIN_KEYS if k != "figure_formats"}
        train["figure_formats"] = j["train"].get("figure_formats", "png,svg")
    except ConfigError as e:
        raise UsageError(str(e)) from None
    except (KeyError, TypeError) as e:
        raise UsageError("%s: bad run config: missing %s" % (path, e)) from None
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
    if train["threads"] < 0:
        raise UsageError("--threads must be 0 or positive")
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


def open_metrics(run_dir, keep_through_step):
    """As mhar-toy: on resume, rows past the checkpoint's step are dropped (they are redone)."""
    from mhar_torch.safetensors_io import write_atomic
    for name in ("metrics.jsonl", "metrics.csv"):
        path = os.path.join(run_dir, name)
        keep = []
        if os.path.exists(path):
            with open(path) as f:
                for line in f.read().splitlines():
                    if not line:
                        continue
                    if line.startswith("{"):
                        try:
                            step = int(json.loads(line)["step"])
                        except (ValueError, KeyError, TypeError):
                            continue  # a torn last line
                    elif line.startswith("step"):
                        keep.append(line)
                        continue
                    else:
                        try:
                            step = int(line.split(",", 1)[0])
                        except ValueError:
                            continue
                    if step <= keep_through_step:
                        keep.append(line)
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
    jsonl.write(json.dumps(row, sort_keys=True, separators=(",", ":")) + "\n")
    jsonl.flush()
    csv.write("%d,%.6f,%s,%.6g,%.6g,%.1f,%.2f\n" % (
        step, loss, "" if val is None else "%.6f" % val, lr, gnorm, tps, elapsed))
    csv.flush()


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
    if a.threads > 0:
        torch.set_num_threads(a.threads)

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
    validate(cfg, train, world)
    corpus = Corpus(train["data"], train["val_fraction"], cfg.T)  # fail before creating anything
    if a.resume is None and rank == 0:
        if os.path.exists(os.path.join(run_dir, "checkpoint.safetensors")) or \
                os.path.exists(os.path.join(run_dir, "config.json")):
            raise UsageError("'%s' already holds a run; continue it with --resume %s or choose "
                             "another --out (nothing is overwritten)" % (run_dir, run_dir))

    if world > 1:
        if use_cuda:
            torch.cuda.set_device(device)
        dist.init_process_group(backend=backend)
    quiet = a.quiet or rank != 0
    try:
        return run(a, cfg, train, run_dir, corpus, world, rank, device, backend, quiet)
    finally:
        if world > 1 and dist.is_initialized():
            dist.destroy_process_group()


def run(a, cfg, train, run_dir, corpus, world, rank, device, backend, quiet):
    import torch
    import torch.distributed as dist
    from mhar_torch import (MharModel, decays, load_checkpoint, load_optimizer, save_checkpoint,
                            save_optimizer)
    from mhar_torch.data import random_batch
    from mhar_torch.safetensors_io import write_atomic

    # ---- model and optimiser state
    start_step = 0
    if a.resume:
        ck = load_checkpoint(os.path.join(run_dir, "checkpoint.safetensors"))
        if ck.cfg.to_dict() != cfg.to_dict():
            raise UsageError("%s: checkpoint.safetensors holds a different model than config.json"
                             % run_dir)
        model = ck.model
        m, v, ostep = load_optimizer(os.path.join(run_dir, "optimizer.safetensors"), cfg)
        if ostep != ck.step:
            raise UsageError("%s: the optimizer state is from step %d, the checkpoint from step %d"
                             % (run_dir, ostep, ck.step))
        start_step = ck.step
        if start_step >= train["steps"]:
            if not quiet:
                print("%s already finished its %d steps (pass --steps N to train longer)"
                      % (run_dir, train["steps"]), file=sys.stderr)
            return 0
    else:
        # mhar-toy's initialisation, bit for bit (or, with --init torch, PyTorch's draws)
        model = MharModel(cfg, seed=train["seed"], init=a.init)
    model.routing = a.routing
    model.to(device)
    named = model.checkpoint_parameters()
    groups = [{"params": [p for n, p in named if decays(n)], "weight_decay": train["weight_decay"]},
              {"params": [p for n, p in named if not decays(n)], "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=train["lr"], betas=(0.9, 0.95), eps=1e-8)
    if a.resume:  # AdamW's moments and step count, as mhar-toy saved them
        for n, p in named:
            opt.state[p] = {"step": torch.tensor(float(start_step)),
                            "exp_avg": m[n].to(device).clone(),
                            "exp_avg_sq": v[n].to(device).clone()}
    net = model
    if world > 1:
        net = torch.nn.parallel.DistributedDataParallel(
            model, device_ids=[device.index] if device.type == "cuda" else None)

    if rank == 0:
        os.makedirs(run_dir, exist_ok=True)
        if not a.resume or a.steps is not None:
            write_atomic(os.path.join(run_dir, "config.json"),
                         options_to_json(cfg, train, world, backend,
                                         "resumed at step %d" % start_step if a.resume
                                         else a.init, a.autocast).encode())
        metrics = open_metrics(run_dir, start_step)
    B, T = train["batch"], cfg.T
    local = B // world
    rows = slice(rank * local, (rank + 1) * local)  # this process's share of the global batch

    def to_dev(x):
        return torch.from_numpy(x[rows]).to(device)

    def mean_over_ranks(x):
        t = torch.tensor([x], dtype=torch.float64, device=device)
        if world > 1:
            dist.all_reduce(t)
        return t.item() / world

    def autocast():
        """bfloat16 autocast (--autocast bf16), or nothing."""
        return torch.autocast(device.type, dtype=torch.bfloat16, enabled=a.autocast == "bf16")

    def validation_loss():
        total = 0.0
        with torch.no_grad():
            for k in range(train["eval_batches"]):
                tok, tgt = random_batch(corpus.val, B, T, train["seed"], k, 1)
                with autocast():
                    total += mean_over_ranks(model(to_dev(tok), to_dev(tgt)).float().item())
        return total / train["eval_batches"]

    def save(step):
        if rank != 0:
            return
        m = {n: opt.state[p]["exp_avg"] for n, p in named}
        v = {n: opt.state[p]["exp_avg_sq"] for n, p in named}
        # the optimizer first: a checkpoint never refers to moments that are not on disk yet
        save_optimizer(os.path.join(run_dir, "optimizer.safetensors"), cfg, m, v, step)
        save_checkpoint(os.path.join(run_dir, "checkpoint.safetensors"), model, step,
                        {"seed": str(train["seed"])})

    if not quiet:
        params = sum(p.numel() for _, p in named)
        print("train_ddp: %s%s, d=%d L=%d heads=%d/%d ffn=%d T=%d, %d parameters; %d steps of "
              "%d × %d bytes on %d process%s (%s, %s, %d thread%s each%s); data %s (%d train / %d "
              "val bytes) → %s" % (
                  cfg.mode, " (H=%d)" % cfg.route_heads if cfg.routed else "", cfg.d, cfg.L,
                  cfg.n_head, cfg.n_kv_head, cfg.ffn, cfg.T, params, train["steps"], B, T, world,
                  "" if world == 1 else "es", backend if world > 1 else "no DDP", device,
                  torch.get_num_threads(), "" if torch.get_num_threads() == 1 else "s",
                  ", bf16 autocast" if a.autocast == "bf16" else "", train["data"],
                  len(corpus.train), len(corpus.val), run_dir), file=sys.stderr)
        if start_step:
            print("resuming %s from step %d" % (run_dir, start_step), file=sys.stderr)

    # MHAR_DDP_TRACE=DIR (a test hook, py:ddp): each process appends the windows it took and its
    # own loss at every step to DIR/rank<r>.jsonl
    trace_dir = os.environ.get("MHAR_DDP_TRACE")
    trace = open(os.path.join(trace_dir, "rank%d.jsonl" % rank), "a") if trace_dir else None
    t0 = time.monotonic()
    last_val, last_loss, step = None, float("nan"), start_step
    try:
        while step < train["steps"]:
            s = step + 1
            ts = time.monotonic()
            tok, tgt = random_batch(corpus.train, B, T, train["seed"], s)
            with autocast():
                loss = net(to_dev(tok), to_dev(tgt)).float()  # the mean over this process's windows
            opt.zero_grad(set_to_none=True)
            loss.backward()  # DDP: every gradient is now the mean over all processes
            loss_all = mean_over_ranks(loss.item())
            if trace is not None:  # test hook: which windows this process took, its own loss
                trace.write(json.dumps({"step": s, "rank": rank, "loss": loss.item(),
                                        "tokens": tok[rows].tolist()}) + "\n")
                trace.flush()
            if not math.isfinite(loss_all):
                raise DivergedError("the training loss became %s at step %d; stopping. Try a "
                                    "smaller --lr or a tighter --clip." % (loss_all, s))
            last_loss = loss_all
            # global-norm clipping, as mhar-toy: scale by clip / norm when the norm exceeds it
            norm = math.sqrt(sum(float(p.grad.float().pow(2).sum()) for _, p in named))
            if not math.isfinite(norm):
                raise DivergedError("the gradient norm became %s at step %d; stopping." % (norm, s))
            if train["clip"] > 0 and norm > train["clip"]:
                scale = train["clip"] / norm
                for _, p in named:
                    p.grad.mul_(scale)
            lr = learning_rate(train, s)
            for g in opt.param_groups:
                g["lr"] = lr
            opt.step()
            step = s
            step_s = time.monotonic() - ts
            elapsed = time.monotonic() - t0
            tps = B * T / step_s
            val = None
            if s % train["eval_every"] == 0 or s == train["steps"]:
                last_val = val = validation_loss()
            if rank == 0:
                write_metrics(metrics, s, loss_all, val, lr, norm, tps, elapsed)
            eta = elapsed / (s - start_step) * (train["steps"] - s)
            if not quiet and (s % train["log_every"] == 0 or s == train["steps"] or val is not None):
                print("step %6d/%d  loss %.4f%s  lr %.2e  %.0f tok/s  ETA %s"
                      % (s, train["steps"], loss_all, "" if val is None else "  val %.4f" % val,
                         lr, tps, fmt_duration(eta)), file=sys.stderr, flush=True)
            stop = a.stop_after > 0 and s >= a.stop_after and s < train["steps"]
            if s % train["ckpt_every"] == 0 or s == train["steps"] or stop:
                save(s)
            if stop:
                if not quiet:
                    print("stopped after step %d (--stop-after): checkpoint saved in %s; continue "
                          "with `mhar-train-ddp --resume %s`" % (s, run_dir, run_dir),
                          file=sys.stderr)
                return 0
    except KeyboardInterrupt:
        save(step)
        if not quiet:
            print("\ninterrupted: checkpoint of step %d saved in %s; continue with "
                  "`mhar-train-ddp --resume %s`" % (step, run_dir, run_dir),
                  file=sys.stderr)
        return EXIT_INTERRUPTED
    if not quiet:
        print("done: %d steps, final train loss %.4f, val loss %s; run in %s (heatmaps: "
              "mhar-toy heatmap %s)" % (train["steps"], last_loss,
                                        "-" if last_val is None else "%.4f" % last_val, run_dir,
                                        run_dir), file=sys.stderr)
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    """The command line (`mhar-train-ddp`): exit 0, 2 for unusable input, 3 when the loss
    diverged, 4 when PyTorch or NumPy is missing, 130 when interrupted (after a checkpoint)."""
    try:
        return train(sys.argv[1:] if argv is None else argv)
    except UsageError as e:
        print("mhar-train-ddp: error: %s" % e, file=sys.stderr)
        return EXIT_USAGE
    except DivergedError as e:
        print("mhar-train-ddp: %s" % e, file=sys.stderr)
        return EXIT_DIVERGED
    except ImportError as e:
        print("mhar-train-ddp: cannot import %s (install PyTorch and NumPy: Debian's python3-torch "
              "and python3-numpy)" % e.name, file=sys.stderr)
        return EXIT_UNAVAILABLE
    except Exception as e:  # the package's own refusals: data and checkpoint files
        from mhar_torch import CheckpointError
        from mhar_torch.data import DataError
        if isinstance(e, (CheckpointError, DataError)):
            print("mhar-train-ddp: error: %s" % e, file=sys.stderr)
            return EXIT_USAGE
        raise


if __name__ == "__main__":
    sys.exit(main())
