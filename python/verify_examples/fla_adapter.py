"""fla's naive_attnres behind the harness's signature, written from fla's current public signature
(nothing copied):

    naive_attnres(query, residuals, rms_weight, output_rms_weight=None, rms_eps=1e-6, scale=1.0,
                  return_weights=False)

residuals is a sequence of [..., D] tensors (the sources, first first); query [D] is one head
(Attention Residuals); rms_weight [D] is the key gain. Every argument goes by keyword: fla has
moved output_rms_weight into fourth place before, and a positional call then passes eps as a
weight. The adapter maps the protocol onto it:

  - H > 1 cases are declined (NotServed): it has one head (grade it with --serves h1);
  - a gain-free case passes rms_weight = ones; output_rms_weight stays None (no output norm);
  - a delta case composes out = partial + gate · mix around it, in float32;
  - return_weights=True gives alpha [N, P, 1] to verify.

    /usr/bin/python3 python/mhar_verify.py --framework torch --serves h1 \\
        --impl verify_examples.fla_adapter:adapter --cases DIR

`adapter` wraps our stand-in with fla's exact signature (stand_ins.py); for the real one, in a file
of your own: `from fla.ops.attnres import naive_attnres; adapter = make_adapter(naive_attnres)`.
"""

import torch

from verify_examples.stand_ins import fla_naive_attnres


class NotServed(Exception):
    pass


def make_adapter(naive_attnres):
    def adapter(sources, q, g, H, eps, scale, partial=None, gate=None):
        if H != 1:
            raise NotServed(f"H = {H}: fla's naive_attnres has one head")
        weight = g if g is not None else torch.ones_like(q)
        mix, p = naive_attnres(query=q, residuals=list(sources.unbind(0)), rms_weight=weight,
                               rms_eps=eps, scale=scale, return_weights=True)
        alpha = p.unsqueeze(-1)                                        # [N, P, 1]
        if partial is None:
            return mix, alpha
        out = partial.float() + gate.float() * mix.float()
        return out.to(mix.dtype), alpha

    return adapter


adapter = make_adapter(fla_naive_attnres)
