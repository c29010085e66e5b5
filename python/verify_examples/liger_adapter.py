"""Liger-Kernel's AttnRes behind the harness's signature, written from its public layout (nothing
copied): liger_attn_res(V, w_query, w_norm, eps=1e-6) with V [N, B, T, D] stacked sources, w_query
[D] the pseudo-query, w_norm [D] the key's RMSNorm weight; it returns h [B, T, D] and has one head
and no logit scale. The adapter folds what it lacks, in float32:

  - the logit scale into the query: w_query = scale · q (float32; autograd carries dq);
  - no gain: w_norm = ones;
  - delta: out = partial + gate · mix around it;
  - H > 1: declined (NotServed; grade it with --serves h1). The positions P become B = 1, T = P.

`adapter` wraps our stand-in (stand_ins.py); for the real one, in a file of your own:
`from liger_kernel.transformers.functional import liger_attn_res;
adapter = make_adapter(liger_attn_res)`.
"""

import torch

from verify_examples.stand_ins import liger_attn_res


class NotServed(Exception):
    pass


def make_adapter(attn_res):
    def adapter(sources, q, g, H, eps, scale, partial=None, gate=None):
        if H != 1:
            raise NotServed(f"H = {H}: Liger's AttnRes has one head")
        N, P, d = sources.shape
        w_query = q.float() * scale
        w_norm = g if g is not None else torch.ones_like(q)
        mix = attn_res(sources.reshape(N, 1, P, d), w_query, w_norm, eps=eps).reshape(P, d)
        if partial is None:
            return mix
        return (partial.float() + gate.float() * mix.float()).to(mix.dtype)

    return adapter


adapter = make_adapter(liger_attn_res)
