"""Stand-ins for three peers' public entry points, with their exact current signatures and our
own bodies (nothing copied), so that each adapter in this folder is tested as it will be called:

  fla_naive_attnres   fla's fla.ops.attnres.naive_attnres(query, residuals, rms_weight,
                      output_rms_weight=None, rms_eps=1e-6, scale=1.0, return_weights=False):
                      residuals a sequence of [..., D] tensors, returns o [..., D] (and the depth
                      weights [L, ...] with return_weights=True)
  liger_attn_res      Liger-Kernel's liger_kernel.transformers.functional.liger_attn_res(V, w_query,
                      w_norm, eps=1e-6): V [N, B, T, D], returns h [B, T, D]; no logit scale
  mh_block_attn_res   a multi-head block kernel with the paper's argument order
                      (blocks, partial_block, proj, norm) and the head count last: blocks a list of
                      [B, T, D], partial_block [B, T, D], proj.weight [1, D] (the pseudo-query),
                      norm.weight [D] and norm.eps (the key's RMSNorm); heads of D / num_heads
                      contiguous columns

Each computes in float32 and returns its sources' dtype, as the peers' pure-PyTorch paths do.
"""

import torch
import torch.nn.functional as F

from verify_examples import torch_shims

torch_shims.install()  # fla's path calls F.rms_norm, which torch 1.13 lacks


def fla_naive_attnres(query, residuals, rms_weight, output_rms_weight=None, rms_eps=1e-6,
                      scale=1.0, return_weights=False):
    shape = residuals[0].shape
    D = shape[-1]
    v = torch.stack([r.reshape(-1, D) for r in residuals]).float()     # [L, M, D]
    k = F.rms_norm(v, (D,), rms_weight.reshape(-1).float(), rms_eps)
    p = torch.softmax((k * (query.reshape(-1).float() * scale)).sum(-1), dim=0)  # [L, M]
    o = (p.unsqueeze(-1) * v).sum(0).reshape(shape)
    if output_rms_weight is not None:
        o = F.rms_norm(o, (D,), output_rms_weight.float(), rms_eps)
    o = o.to(residuals[0].dtype)
    return (o, p.reshape(len(residuals), *shape[:-1])) if return_weights else o


def liger_attn_res(V, w_query, w_norm, eps=1e-6):
    x = V.float()
    k = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w_norm.float()
    alpha = torch.softmax((k * w_query.float()).sum(-1), dim=0)         # [N, B, T]
    return (alpha.unsqueeze(-1) * x).sum(0).to(V.dtype)                 # [B, T, D]


def mh_block_attn_res(blocks, partial_block, proj, norm, num_heads):
    v = torch.stack(list(blocks) + [partial_block]).float()              # [N, B, T, D]
    N, B, T, D = v.shape
    k = v * torch.rsqrt(v.pow(2).mean(-1, keepdim=True) + norm.eps) * norm.weight.float()
    q = proj.weight.reshape(-1).float()
    z = (k * q).reshape(N, B, T, num_heads, D // num_heads).sum(-1)     # [N, B, T, heads]
    alpha = torch.softmax(z, dim=0)
    h = (alpha.unsqueeze(-1) * v.reshape(N, B, T, num_heads, -1)).sum(0)
    return h.reshape(B, T, D).to(partial_block.dtype)
