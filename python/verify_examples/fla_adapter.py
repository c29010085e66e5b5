"""How to verify a function with fla's signature `naive_attnres(query, residuals, rms_weight,
rms_eps, scale)` (fla/ops/attnres), written here from that signature alone (nothing copied).

Assumed shapes, to check against your fla version: residuals stacked [N, ..., d] (the earlier
outputs, sources first), query [d] (one head: Attention Residuals), rms_weight [d] (the key gain),
returning the mix [..., d]. The adapter maps the protocol onto it:

  - H > 1 cases are declined (NotServed): this signature has one head;
  - a gain-free case passes rms_weight = ones;
  - a delta case composes out = partial + gate * mix around it (autograd does the rest).

Run with:  /usr/bin/python3 python/mhar_verify.py --framework torch \
               --impl verify_examples.fla_adapter:adapter --cases DIR
To verify the real one, replace the stand-in below by `from fla.ops.attnres import naive_attnres`.
"""

import torch


class NotServed(Exception):
    pass


def naive_attnres(query, residuals, rms_weight, rms_eps, scale):
    """A stand-in with fla's signature (our own few lines, for a runnable example)."""
    x = residuals.float()
    k = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + rms_eps) * rms_weight.float()
    logits = scale * (k * query.float()).sum(-1)                   # [N, ...]
    w = torch.softmax(logits, dim=0)
    return (w.unsqueeze(-1) * x).sum(0).to(residuals.dtype)


def adapter(sources, q, g, H, eps, scale, partial=None, gate=None):
    if H != 1:
        raise NotServed(f"H = {H}: fla's naive_attnres has one head")
    weight = g if g is not None else torch.ones_like(q)
    mix = naive_attnres(q, sources, weight, eps, scale)
    return mix if partial is None else partial + gate * mix
