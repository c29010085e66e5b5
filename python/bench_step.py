#!/usr/bin/env python3
"""The PyTorch twin's training step time and peak memory, on the shapes of `mhar-toy bench step`:
forward, backward, global-norm clipping and AdamW on one batch of random bytes.

Each (depth, mode) runs in a fresh process, so that peak RSS (getrusage's ru_maxrss: the most
resident memory the process ever held, the interpreter and torch included) is that
configuration's alone. One process takes --warmup untimed steps (default 3) and --repeats timed
steps. The warm-up is three steps because the heap reaches its peak over the first two or three:
at L 24 here (d 256, T 256, batch 4, one thread) the first step takes about 200,000 page faults,
the second 30,000 to 40,000 (and ran 25–60 % slower than later steps, in either mode), the third
about 1,500, later steps almost none; with one warm-up step, the first timed step was that
second one.
--rounds repeats the whole set, the configurations interleaved (round 1: every depth and mode,
then round 2, …), so that a change of load hits every mode. ms/step is the median of all timed
steps of a configuration, peak RSS the largest of its rounds; below the table, each round's own
ratio of a mode to the first mode, which a slow stretch of the machine moves less. A last line
gives the speed of a 64 MiB copy and read, measured before each round: the routing is bound by
memory, so mhar ÷ residual rises where this machine's memory is slow.

    python3 python/bench_step.py --modes residual,mhar --layers 6,12,24 --d 256 -T 256 -B 4 \\
        --threads 1 --rounds 3
    python3 python/bench_step.py ... --package-dir /tmp/base/python --package-dir python
        # before and after in one sitting: each --package-dir's mhar_torch, interleaved too

With --one-process every configuration (and every --package-dir's mhar_torch, each imported under
its own name) runs in this process instead, one step of each in turn, --rounds × --repeats times:
no peak RSS then, but no difference between processes either (the same residual step read 7 %
apart in two processes of one sitting here), and the round-by-round lines pair each step with
the first mode's step just before it.
"""

import argparse
import importlib
import importlib.util
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from typing import List, Optional

from mhar_exit import command_exit


def layer_list(text: str) -> str:
    """--layers: one depth or a comma-separated list of them (kept as text: the child processes
    get "L,mode"); the depths' own bounds are Config's to check."""
    try:
        [int(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError("'%s' is not an integer or a comma-separated list of "
                                         "integers" % text) from None
    return text


def parse_args(argv: List[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="bench_step.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--modes", default="residual,attnres,mhar", help="comma-separated modes")
    p.add_argument("--heads", "-H", type=int, default=0, help="routing heads (0 = n_kv_head)")
    p.add_argument("--d", type=int, default=128)
    p.add_argument("--layers", "-L", default="4", type=layer_list,
                   help="blocks L, or a comma-separated list")
    p.add_argument("--n-head", type=int, default=4)
    p.add_argument("--n-kv-head", type=int, default=2)
    p.add_argument("--ffn", type=int, default=352)
    p.add_argument("--seq-len", "-T", type=int, default=128)
    p.add_argument("--blocks", type=int, default=2)
    p.add_argument("--batch", "-B", type=int, default=16)
    p.add_argument("--repeats", type=int, default=5, help="timed steps per process")
    p.add_argument("--warmup", type=int, default=3,
                   help="untimed steps first, per configuration (the heap's growth: see above)")
    p.add_argument("--rounds", type=int, default=1, help="processes per configuration")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument("--routing", default="fast", choices=["fast", "plain"],
                   help="the routing of the routed modes (MharModel's routing)")
    p.add_argument("--malloc", default="keep", choices=["keep", "default"],
                   help="keep: glibc keeps freed memory between steps, as mhar-train-ddp does "
                        "(mhar_torch.allocator); default: glibc's own thresholds")
    p.add_argument("--package-dir", action="append", default=None,
                   help="import mhar_torch from this folder (e.g. an older checkout's python/); "
                        "repeat it to measure several, interleaved (default: this file's folder)")
    p.add_argument("--one-process", action="store_true",
                   help="every configuration in this process, steps alternating (no peak RSS)")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)  # "L,mode": one process
    return p.parse_args(argv)


def set_malloc(a: argparse.Namespace, mt) -> str:
    """The --malloc setting, through mt's allocator module (the whole process); says which ran."""
    if a.malloc != "keep":
        return "default"
    try:
        allocator = importlib.import_module(mt.__name__ + ".allocator")
    except ImportError:  # an mhar_torch from before the allocator module
        return "default (no mhar_torch.allocator)"
    return "keep" if allocator.keep_freed_memory() else "default (no glibc)"


def make_step(a: argparse.Namespace, mt, L: str, mode: str):
    """One configuration's training step on mt (an mhar_torch): (step, routing name), where
    step() runs forward, backward, clipping and AdamW and returns its seconds; None for a
    configuration mhar_torch refuses (the error printed)."""
    import torch
    cfg = mt.Config(d=a.d, L=int(L), n_head=a.n_head, n_kv_head=a.n_kv_head, ffn=a.ffn,
                    T=a.seq_len, mode=mode, H=a.heads, n_blocks=a.blocks)
    # a model too large for this machine: one line, not a child the kernel kills (an older
    # mhar_torch, from --package-dir, may lack the check)
    short = mt.memory_shortfall(cfg) if hasattr(mt, "memory_shortfall") else None
    if short:
        print("bench_step.py: error: %s" % short, file=sys.stderr)
        return None
    try:
        model = mt.MharModel(cfg, seed=1, init="torch")  # the numbers do not change the cost
    except mt.ConfigError as e:
        print("bench_step.py: error: %s" % e, file=sys.stderr)
        return None
    has_routing = hasattr(model, "routing")  # mhar_torch before the shared buffer: plain only
    if has_routing:
        model.routing = a.routing
    if cfg.routed:  # open the routing a little, as mhar-toy bench does
        with torch.no_grad():
            model.route.q.normal_(0.0, 0.1, generator=torch.Generator().manual_seed(1))
    named = model.checkpoint_parameters()
    opt = torch.optim.AdamW(
        [{"params": [q for n, q in named if mt.decays(n)], "weight_decay": 0.1},
         {"params": [q for n, q in named if not mt.decays(n)], "weight_decay": 0.0}],
        lr=1e-3, betas=(0.9, 0.95), eps=1e-8)
    g = torch.Generator().manual_seed(2)
    x = torch.randint(0, 256, (a.batch, a.seq_len), generator=g)
    y = torch.randint(0, 256, (a.batch, a.seq_len), generator=g)

    def step() -> float:
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        model(x, y).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        return time.perf_counter() - t0

    for _ in range(a.warmup):  # the heap's growth, the RoPE tables
        step()
    return step, (a.routing if has_routing else "plain (only)") if cfg.routed else "-"


def child(a: argparse.Namespace) -> int:
    """One configuration: prints one JSON line with the timed steps and the peak RSS."""
    import torch
    import mhar_torch
    L, mode = a.child.split(",")
    malloc = set_malloc(a, mhar_torch)
    if a.threads > 0:
        torch.set_num_threads(a.threads)
    made = make_step(a, mhar_torch, L, mode)
    if made is None:
        return 2
    step, routing = made
    times = [step() for _ in range(a.repeats)]
    print(json.dumps({"times": times, "maxrss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
                      "torch": torch.__version__, "threads": torch.get_num_threads(),
                      "routing": routing, "package": os.path.dirname(mhar_torch.__file__),
                      "malloc": malloc}))
    return 0


def load_package(pkg: Optional[str], k: int):
    """The mhar_torch in folder pkg as a module of its own name (None: the one on the path), so
    that several load into one process."""
    if pkg is None:
        return importlib.import_module("mhar_torch")
    init = os.path.join(os.path.abspath(pkg), "mhar_torch", "__init__.py")
    name = "mhar_torch_bench_%d" % k
    spec = importlib.util.spec_from_file_location(
        name, init, submodule_search_locations=[os.path.dirname(init)])
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def one_process(a: argparse.Namespace, configs: list, speeds: List[tuple]) -> Optional[dict]:
    """--one-process: every configuration in this process, one step of each in turn, rounds ×
    repeats times, so that each step's neighbours in time are the other configurations' steps
    (no process-to-process difference: page placement, the allocator's state). memory_speed is
    appended to `speeds` before each round (every `repeats` steps of each). Peak RSS is the
    whole process's, so it is not reported. Returns the runs as run_child's results."""
    import torch
    mods = {pkg: load_package(pkg, k) for k, pkg in enumerate(dict.fromkeys(c[1] for c in configs))}
    malloc = set_malloc(a, next(iter(mods.values())))
    if a.threads > 0:
        torch.set_num_threads(a.threads)
    steps = {}
    for L, pkg, mode in configs:
        made = make_step(a, mods[pkg], L, mode)
        if made is None:
            return None
        steps[(L, pkg, mode)] = made
    times = {c: [] for c in configs}
    for k in range(a.rounds * a.repeats):
        if k % a.repeats == 0:
            speeds.append(memory_speed(a.threads))
        for c in configs:
            times[c].append(steps[c][0]())
    info = {"torch": torch.__version__, "threads": torch.get_num_threads(), "malloc": malloc,
            "maxrss_kib": None}
    return {c: [dict(info, times=[t], routing=steps[c][1],
                     package=os.path.dirname(mods[c[1]].__file__)) for t in times[c]]
            for c in configs}


def memory_speed(threads: int) -> tuple:
    """(copy GB/s counting read + write bytes, read GB/s) of torch on 64 MiB buffers, too large
    for the caches, on `threads` threads (0: torch's default): the fastest of 5 each. The
    routing's passes are bound by memory and the matrix products mostly are not, so a stretch
    where this machine's memory is slower (a neighbour streaming) raises mhar ÷ residual;
    print_memory's line, measured between the rounds, lets a reader see that."""
    import torch
    if threads > 0:
        torch.set_num_threads(threads)
    src = torch.ones(16 << 20)
    dst = torch.empty_like(src)
    dst.copy_(src)
    src.sum()
    copy = read = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        dst.copy_(src)
        copy = min(copy, time.perf_counter() - t0)
        t0 = time.perf_counter()
        src.sum()
        read = min(read, time.perf_counter() - t0)
    size = src.numel() * src.element_size()
    return 2 * size / copy / 1e9, size / read / 1e9


def _count(n: int, noun: str) -> str:
    """'1 round', '6 rounds'."""
    return "%d %s%s" % (n, noun, "" if n == 1 else "s")


def print_memory(speeds: List[tuple], threads: int) -> None:
    """The memory line: the speeds measured before each round, as median and range."""
    def span(xs):
        return "%.1f GB/s (%.1f–%.1f)" % (statistics.median(xs), min(xs), max(xs))
    print("memory, before each of %s (torch, %s): a 64 MiB copy %s counting read + write, "
          "a 64 MiB read %s" % (_count(len(speeds), "round"),
                                _count(threads, "thread") if threads > 0 else "default threads",
                                span([c for c, _ in speeds]), span([r for _, r in speeds])))


def run_child(argv: List[str], package: Optional[str], L: str, mode: str) -> Optional[dict]:
    env, python = dict(os.environ), [sys.executable]
    if package:  # first on the path: -P keeps this file's folder (and its mhar_torch) off
        env["PYTHONPATH"] = os.pathsep.join([os.path.abspath(package),
                                             os.path.dirname(os.path.abspath(__file__))])
        python.append("-P")
    p = subprocess.run(python + [os.path.abspath(__file__), *argv, "--child", "%s,%s" % (L, mode)],
                       env=env, capture_output=True, text=True)
    if p.returncode != 0:
        sys.stderr.write(p.stderr)
        if p.returncode < 0:  # killed, most often by the kernel's out-of-memory killer: say so
            print("bench_step.py: error: the process timing L %s %s was killed by signal %d%s"
                  % (L, mode, -p.returncode, " (SIGKILL: out of memory?)"
                     if p.returncode == -9 else ""), file=sys.stderr)
        return None
    return json.loads(p.stdout.strip().splitlines()[-1])


def main(argv: Optional[List[str]] = None) -> int:
    """The command line; exit codes as mhar-toy's (docs/cli.md)."""
    return command_exit("bench_step.py", run, argv, "; no table")


def run(argv: Optional[List[str]]) -> int:
    argv = sys.argv[1:] if argv is None else argv
    a = parse_args(argv)
    if a.warmup < 0 or a.repeats < 1 or a.rounds < 1:
        print("bench_step.py: error: --warmup must be 0 or more, --repeats and --rounds 1 or more",
              file=sys.stderr)
        return 2
    if a.batch < 1 or not 0 <= a.threads <= 1024:  # a batch of none times nothing; Config checks
        # the model; 1024 threads at most, as mhar-toy and mhar-train-ddp
        print("bench_step.py: error: --batch must be 1 or more, --threads from 0 (torch's default) "
              "to 1024", file=sys.stderr)
        return 2
    if a.child:
        return child(a)
    if a.package_dir and sys.version_info < (3, 11) and not a.one_process:
        print("bench_step.py: error: --package-dir needs Python 3.11 or later (python -P)",
              file=sys.stderr)
        return 2
    missing = [d for d in a.package_dir or [] if not os.path.isfile(
        os.path.join(d, "mhar_torch", "__init__.py"))]
    if missing:
        print("bench_step.py: error: --package-dir %s holds no mhar_torch package" % missing[0],
              file=sys.stderr)
        return 2
    modes, depths, packages = a.modes.split(","), a.layers.split(","), a.package_dir or [None]
    configs = [(L, pkg, m) for L in depths for pkg in packages for m in modes]
    speeds: List[tuple] = []
    runs = (one_process(a, configs, speeds) if a.one_process
            else in_processes(a, argv, configs, speeds))
    if runs is None:
        return 2
    info = runs[configs[0]][0]
    print("PyTorch %s, %d thread%s; d=%d T=%d batch %d; median of %d × %d steps after %d warm-up "
          "step%s, %s; malloc: %s" % (
              info["torch"], info["threads"], "" if info["threads"] == 1 else "s", a.d, a.seq_len,
              a.batch, a.rounds, a.repeats, a.warmup, "" if a.warmup == 1 else "s",
              "one process, the configurations' steps alternating" if a.one_process else
              "peak RSS of each configuration in its own process",
              ", ".join(sorted({r["malloc"] for rs in runs.values() for r in rs}))))
    names = {pkg: runs[(depths[0], pkg, modes[0])][0]["package"] for pkg in packages}
    for k, pkg in enumerate(packages):
        print("[%d] mhar_torch from %s" % (k + 1, names[pkg]))
    print("%4s %3s %-10s %-13s %10s %9s %9s %14s %9s" % (
        "L", "pkg", "mode", "routing", "ms/step", "steps/s", "÷ first", "peak RSS MiB", "÷ first"))
    for L in depths:
        for k, pkg in enumerate(packages):
            first = None
            for mode in modes:
                rs = runs[(L, pkg, mode)]
                t = statistics.median([x for r in rs for x in r["times"]])
                rss = None if a.one_process else max(r["maxrss_kib"] for r in rs) / 1024
                first = first or (t, rss)
                mem = ("%14s %9s" % ("-", "-") if rss is None else
                       "%14.0f %8.3f×" % (rss, rss / first[1]))
                print("%4s %3s %-10s %-13s %10.1f %9.2f %8.3f× %s" % (
                    L, "[%d]" % (k + 1), mode, rs[0]["routing"], 1e3 * t, 1 / t, t / first[0],
                    mem))
    print_round_ratios(runs, depths, packages, modes)
    print_memory(speeds, a.threads)
    return 0


def in_processes(a: argparse.Namespace, argv: List[str], configs: list,
                 speeds: List[tuple]) -> Optional[dict]:
    """Each configuration in a fresh process per round, the rounds interleaved (round 1: every
    depth and mode, then round 2, …), memory_speed appended to `speeds` before each round.
    Returns {config: [run_child's result per round]}."""
    runs = {c: [] for c in configs}
    for _ in range(a.rounds):
        speeds.append(memory_speed(a.threads))
        for L, pkg, mode in configs:
            r = run_child(argv, pkg, L, mode)
            if r is None:
                return None
            runs[(L, pkg, mode)].append(r)
    return runs


def print_round_ratios(runs: dict, depths: List[str], packages: list, modes: List[str]) -> None:
    """Each round's own ratio: a mode's median step in that round over the first mode's, their
    processes run one after the other, so a slow stretch of the machine hits both; the spread of
    these says how far the table's ratio of medians can be trusted (as `mhar-toy bench step`'s
    "round by round" lines)."""
    for L in depths:
        for k, pkg in enumerate(packages):
            base = runs[(L, pkg, modes[0])]
            for mode in modes[1:]:
                ratios = sorted(statistics.median(r["times"]) / statistics.median(b["times"])
                                for r, b in zip(runs[(L, pkg, mode)], base))
                print("round by round, L %s [%d] %s ÷ %s: median %.3f×, range %.3f×–%.3f× "
                      "(%s)" % (L, k + 1, mode, modes[0], statistics.median(ratios),
                                ratios[0], ratios[-1], _count(len(ratios), "round")))


if __name__ == "__main__":
    sys.exit(main())
