#!/usr/bin/env python3
"""The PyTorch twin's training step time, on the shapes of `mhar-toy bench step`: forward,
backward, global-norm clipping and AdamW on one batch of random bytes, the median of --repeats
timed steps per mode after one untimed warm-up step, the modes interleaved. Run it beside
`mhar-toy bench step` with the same flags and --threads to compare (docs/pytorch.md).

    python3 python/bench_step.py --modes residual,attnres,mhar --threads 2
"""

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def main(argv):
    p = argparse.ArgumentParser(prog="bench_step.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--modes", default="residual,attnres,mhar")
    p.add_argument("--heads", "-H", type=int, default=0)
    p.add_argument("--d", type=int, default=128)
    p.add_argument("--layers", "-L", type=int, default=4)
    p.add_argument("--n-head", type=int, default=4)
    p.add_argument("--n-kv-head", type=int, default=2)
    p.add_argument("--ffn", type=int, default=352)
    p.add_argument("--seq-len", "-T", type=int, default=128)
    p.add_argument("--blocks", type=int, default=2)
    p.add_argument("--batch", "-B", type=int, default=16)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    a = p.parse_args(argv)
    import torch
    from mhar_torch import Config, ConfigError, MharModel, decays

    if a.threads > 0:
        torch.set_num_threads(a.threads)
    print("PyTorch %s, %d thread%s; d=%d L=%d T=%d batch %d; median of %d steps"
          % (torch.__version__, torch.get_num_threads(), "" if torch.get_num_threads() == 1 else "s",
             a.d, a.layers, a.seq_len, a.batch, a.repeats))
    print("%-10s %10s %10s %12s %12s" % ("mode", "ms/step", "steps/s", "tokens/s", "÷ first"))
    steps = {}
    for mode in a.modes.split(","):
        cfg = Config(d=a.d, L=a.layers, n_head=a.n_head, n_kv_head=a.n_kv_head, ffn=a.ffn,
                     T=a.seq_len, mode=mode, H=a.heads, n_blocks=a.blocks)
        try:
            model = MharModel(cfg, seed=1, init="torch")  # the numbers do not change the cost
        except ConfigError as e:
            print("bench_step.py: error: %s" % e, file=sys.stderr)
            return 2
        if cfg.routed:  # open the routing a little, as mhar-toy bench does
            with torch.no_grad():
                model.route.q.normal_(0.0, 0.1, generator=torch.Generator().manual_seed(1))
        named = model.checkpoint_parameters()
        opt = torch.optim.AdamW(
            [{"params": [q for n, q in named if decays(n)], "weight_decay": 0.1},
             {"params": [q for n, q in named if not decays(n)], "weight_decay": 0.0}],
            lr=1e-3, betas=(0.9, 0.95), eps=1e-8)
        g = torch.Generator().manual_seed(2)
        x = torch.randint(0, 256, (a.batch, a.seq_len), generator=g)
        y = torch.randint(0, 256, (a.batch, a.seq_len), generator=g)

        def step(model=model, opt=opt, x=x, y=y):
            t0 = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            model(x, y).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            return time.perf_counter() - t0

        step()  # warm-up: allocations, the RoPE tables
        steps[mode] = (step, [])
    for _ in range(a.repeats):  # interleaved, as mhar-toy bench: a load change hits every mode
        for mode, (step, times) in steps.items():
            times.append(step())
    first = None
    for mode, (_, times) in steps.items():
        s = statistics.median(times)
        first = first or s
        print("%-10s %10.1f %10.2f %12.0f %11.3f×" % (mode, 1e3 * s, 1 / s,
                                                      a.batch * a.seq_len / s, s / first))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
