"""py:routing — depth_route and DepthRouting on their own, for use in any model: the properties
docs/design.md §1 lists, against a per-position loop written here from steps (1)-(4), and
autograd's gradients against central differences (torch.autograd.gradcheck, float64).

Usage: test_routing.py
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402


def main():
    common.need_torch()
    import math
    import torch
    from mhar_torch import DepthRouting, depth_route

    torch.manual_seed(0)
    failures = []

    def check(ok, what):
        print("%-62s %s" % (what, "ok" if ok else "FAILED"))
        if not ok:
            failures.append(what)

    N, P, d = 5, 7, 12
    S = torch.randn(N, P, d, dtype=torch.float64) * (0.5 + 3 * torch.rand(N, P, 1, dtype=torch.float64))
    q = torch.randn(d, dtype=torch.float64)
    g = 1 + 0.3 * torch.randn(d, dtype=torch.float64)

    def loop(S, q, g, H, eps=1e-6):  # steps (1)-(4), one position and one head at a time
        K = d // H
        out = torch.zeros(S.shape[1], d, dtype=S.dtype)
        for p in range(S.shape[1]):
            r = [1 / math.sqrt(sum(float(S[i, p, c]) ** 2 for c in range(d)) / d + eps)
                 for i in range(S.shape[0])]
            for h in range(H):
                cols = range(h * K, (h + 1) * K)
                z = [sum(float(q[c] * g[c]) * r[i] * float(S[i, p, c]) for c in cols)
                     for i in range(S.shape[0])]
                m = max(z)
                w = [math.exp(v - m) for v in z]
                a = [v / sum(w) for v in w]
                for c in cols:
                    out[p, c] = sum(a[i] * float(S[i, p, c]) for i in range(S.shape[0]))
        return out

    for H in (1, 3, 12):
        out, alpha = depth_route(S, q, g, H, return_weights=True)
        err = float((out - loop(S, q, g, H)).abs().max())
        check(err < 1e-13, "H = %2d: equals steps (1)-(4) written as loops (%.1e)" % (H, err))
        check(float((alpha.sum(0) - 1).abs().max()) < 1e-14, "H = %2d: weights sum to one" % H)
        perm = torch.tensor([3, 0, 4, 1, 2])
        check(torch.allclose(depth_route(S[perm], q, g, H), out, atol=1e-14, rtol=0),
              "H = %2d: permuting the sources leaves the output unchanged" % H)
        scaled = S.clone()
        scaled[2] *= 7.5
        a2 = depth_route(scaled, q, g, H, return_weights=True)[1]
        check(torch.allclose(a2, alpha, atol=1e-6, rtol=0),
              "H = %2d: scaling a source leaves its key (so α) unchanged" % H)
        check(torch.allclose(depth_route(S, torch.zeros(d, dtype=S.dtype), g, H), S.mean(0),
                             atol=1e-15, rtol=0), "H = %2d: q = 0 gives the mean" % H)
        check(torch.equal(depth_route(S[:1], q, g, H), S[0]), "H = %2d: N = 1 returns S_0" % H)
    # H = 1 is one softmax shared by every column
    z = ((S * torch.rsqrt(S.pow(2).mean(-1, keepdim=True) + 1e-6)) * (q * g)).sum(-1)
    single = (torch.softmax(z, 0).unsqueeze(-1) * S).sum(0)
    check(torch.allclose(depth_route(S, q, g, 1), single, atol=1e-14, rtol=0),
          "H = 1 equals a separately written single-head routing")
    # gradients of sources, q and g by central differences
    Sg = S[:, :3].clone().requires_grad_()
    qg, gg = q.clone().requires_grad_(), g.clone().requires_grad_()
    for H in (1, 4):
        ok = torch.autograd.gradcheck(lambda a, b, c: depth_route(a, b, c, H), (Sg, qg, gg),
                                      eps=1e-6, atol=1e-8, raise_exception=False)
        check(ok, "H = %d: autograd's gradients match central differences" % H)
    site = DepthRouting(d, heads=4)
    check(bool((site.q == 0).all() and (site.g == 1).all()), "DepthRouting: q = 0, g = 1 at init")
    xs = [torch.randn(2, 3, d) for _ in range(3)]
    check(torch.allclose(site(xs), torch.stack(xs).mean(0), atol=1e-6),
          "DepthRouting: a fresh site is the mean of its sources")
    try:
        DepthRouting(d, heads=5)
        check(False, "DepthRouting(d = 12, heads = 5) is refused")
    except ValueError as e:
        check("must divide" in str(e), "DepthRouting(d = 12, heads = 5) is refused: %s" % e)
    if failures:
        print("\nFAILED (%d): %s" % (len(failures), "; ".join(failures)))
        return 1
    print("\ndepth routing on its own: every property holds")
    return 0


if __name__ == "__main__":
    sys.exit(main())
