"""Depth routing at one site (docs/design.md §1), as a function and as a module of its own.

For each position, N sources S_0 … S_{N−1} (each of width d), a pseudo-query q and a key gain g
(both of length d), H heads of K = d / H contiguous columns:

    (1)  r_i      = 1 / sqrt( (1/d) Σ_c S_i[c]² + eps )      RMS over all d columns, not per head
    (2)  z_i[h]   = Σ_{c∈h} q_c · g_c · r_i · S_i[c]          no 1/√d, no temperature, no bias
    (3)  α_i[h]   = softmax over i of z_i[h]                  one softmax over depth per head
    (4)  out[c]   = Σ_i α_i[h(c)] · S_i[c]                    the values are the raw sources

H = 1 is Attention Residuals, H > 1 Multi-Head Attention Residuals (no extra parameter: q is read
as H slices of K). With q = 0 a site is the plain mean of its sources. The backward is PyTorch's
autograd; the tests hold it to the reference's hand-written one (tools: `mhar-toy grad`).
"""

from typing import Sequence, Tuple, Union

import torch
from torch import Tensor, nn

ROUTING_EPS = 1e-6


def depth_route(sources: Union[Tensor, Sequence[Tensor]], q: Tensor, g: Tensor, heads: int,
                eps: float = ROUTING_EPS, return_weights: bool = False
                ) -> Union[Tensor, Tuple[Tensor, Tensor]]:
    """Routes over `sources` (a sequence of tensors of shape [..., d], or one tensor [N, ..., d]).

    Returns out [..., d], and with return_weights also α [N, ..., H].
    """
    S = sources if torch.is_tensor(sources) else _stacked(list(sources))
    d = S.shape[-1]
    if heads < 1 or d % heads != 0:
        raise ValueError("routing: H = %d must divide d = %d" % (heads, d))
    if q.shape[-1] != d or g.shape[-1] != d:
        raise ValueError("routing: q and g must have d = %d entries" % d)
    K = d // heads
    r = torch.rsqrt(S.pow(2).mean(dim=-1, keepdim=True) + eps)          # (1)  [N, ..., 1]
    keys = (r * S) * g                                                  # the normalised sources
    z = (keys * q).unflatten(-1, (heads, K)).sum(dim=-1)                # (2)  [N, ..., H]
    alpha = torch.softmax(z, dim=0)                                     # (3)  over depth
    out = (alpha.unsqueeze(-1) * S.unflatten(-1, (heads, K))).sum(dim=0).flatten(-2)  # (4)
    return (out, alpha) if return_weights else out


def _stacked(sources: Sequence[Tensor]) -> Tensor:
    """The sources as one tensor [N, ..., d]; a missing or misshapen source is refused in our
    words (torch.stack's own message names neither the routing nor which source is wrong)."""
    if not sources:
        raise ValueError("routing: there must be at least one source, got none")
    for i, x in enumerate(sources):
        if not torch.is_tensor(x):
            raise TypeError("routing: source %d is a %s, not a tensor" % (i, type(x).__name__))
        if x.shape != sources[0].shape:
            raise ValueError("routing: source %d has shape %s, source 0 %s: every source must "
                             "have the same shape" % (i, list(x.shape), list(sources[0].shape)))
    return torch.stack(list(sources))


class DepthRouting(nn.Module):
    """One routing site with its own parameters: q (zeros) and g (ones), both of length d.

    Use it in any model in place of a residual add: out = site([x_0, x_1, …, x_{n−1}]).
    """

    def __init__(self, d: int, heads: int = 1, eps: float = ROUTING_EPS) -> None:
        super().__init__()
        if heads < 1 or d % heads != 0:
            raise ValueError("DepthRouting: heads = %d must divide d = %d" % (heads, d))
        self.heads, self.eps = heads, eps
        self.q = nn.Parameter(torch.zeros(d))  # zero-init: a fresh site is the mean
        self.g = nn.Parameter(torch.ones(d))

    def forward(self, sources: Union[Tensor, Sequence[Tensor]], return_weights: bool = False
                ) -> Union[Tensor, Tuple[Tensor, Tensor]]:
        return depth_route(sources, self.q, self.g, self.heads, self.eps, return_weights)

    def extra_repr(self) -> str:
        return "d=%d, heads=%d" % (self.q.shape[0], self.heads)
