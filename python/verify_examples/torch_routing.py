"""Depth routing in PyTorch eager mode, differentiated by autograd: a candidate for
`python/mhar_verify.py --framework torch --impl verify_examples.torch_routing:routing`.
Written as a user would write it, straight from docs/design.md#routing-steps.
"""

import torch


def routing(sources, q, g, H, eps, scale, partial=None, gate=None):
    N, P, d = sources.shape
    K = d // H
    x = sources.float()
    r = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)        # (1) [N, P, 1]
    key = x * r * (g.float() if g is not None else 1.0)           # normalised, gained key
    z = scale * (key * q.float()).view(N, P, H, K).sum(-1)        # (2) [N, P, H]
    alpha = torch.softmax(z, dim=0)                                # (3) over depth
    mix = (alpha.unsqueeze(-1) * x.view(N, P, H, K)).sum(0).reshape(P, d)  # (4)
    out = mix if partial is None else partial.float() + gate.float() * mix
    return out.to(sources.dtype), alpha
