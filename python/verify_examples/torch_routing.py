"""Depth routing in PyTorch eager mode, differentiated by autograd: candidates for
`python/mhar_verify.py --framework torch --impl verify_examples.torch_routing:routing`.
Written as a user would write it, straight from docs/design.md#routing-steps.

routing_hf_rmsnorm is the same with Hugging Face's RMSNorm habit (the paper's eager code and
Liger's reference have it): normalise in float32, round the normalised key back to the storage
dtype, then multiply by the gain in that dtype. With bf16 inputs it fails the peaked cases under
`--convention exact` and passes under `--convention hf-rmsnorm` (tests/verify/CMakeLists.txt).
"""

import torch


def _route(sources, q, H, scale, key, partial, gate):
    N, P, d = sources.shape
    x = sources.float()
    z = scale * (key.float() * q.float()).view(N, P, H, d // H).sum(-1)  # (2) [N, P, H]
    alpha = torch.softmax(z, dim=0)                                      # (3) over depth
    mix = (alpha.unsqueeze(-1) * x.view(N, P, H, d // H)).sum(0).reshape(P, d)  # (4)
    out = mix if partial is None else partial.float() + gate.float() * mix
    return out.to(sources.dtype), alpha


def routing(sources, q, g, H, eps, scale, partial=None, gate=None):
    x = sources.float()
    r = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)              # (1) [N, P, 1]
    key = x * r * (g.float() if g is not None else 1.0)                 # normalised, gained key
    return _route(sources, q, H, scale, key, partial, gate)


def routing_hf_rmsnorm(sources, q, g, H, eps, scale, partial=None, gate=None):
    x = sources.float()
    normed = (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)).to(sources.dtype)
    key = normed * g if g is not None else normed                       # in the storage dtype
    return _route(sources, q, H, scale, key, partial, gate)
