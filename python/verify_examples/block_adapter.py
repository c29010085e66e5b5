"""A multi-head block kernel with the paper's argument order behind the harness's signature:

    mh_block_attn_res(blocks, partial_block, proj, norm, num_heads) -> h [B, T, D]

blocks a list of [B, T, D] (the completed blocks), partial_block [B, T, D] (the last source),
proj.weight [1, D] the pseudo-query, norm.weight [D] and norm.eps the key's RMSNorm. It serves every
H; what it lacks is folded in float32:

  - sources [N, P, d] become blocks = sources[:-1] and partial_block = sources[-1], each [1, P, d];
  - the logit scale into the query: proj.weight = scale · q (float32; autograd carries dq);
  - no gain: norm.weight = ones;
  - delta: out = partial + gate · mix around it.

`adapter` wraps our stand-in (stand_ins.py); for your kernel, in a file of your own:
`adapter = make_adapter(my_block_kernel)`.
"""

from types import SimpleNamespace

import torch

from verify_examples.stand_ins import mh_block_attn_res


def make_adapter(kernel):
    def adapter(sources, q, g, H, eps, scale, partial=None, gate=None):
        N, P, d = sources.shape
        rows = [s.reshape(1, P, d) for s in sources.unbind(0)]
        proj = SimpleNamespace(weight=(q.float() * scale).reshape(1, d))
        norm = SimpleNamespace(weight=g if g is not None else torch.ones_like(q), eps=eps)
        mix = kernel(rows[:-1], rows[-1], proj, norm, H).reshape(P, d)
        if partial is None:
            return mix
        return (partial.float() + gate.float() * mix.float()).to(mix.dtype)

    return adapter


adapter = make_adapter(mh_block_attn_res)
