"""What Debian's torch 1.13 lacks and peers' pure-PyTorch paths call: `F.rms_norm` (torch 2.4)
and `torch.compile` (torch 2.0). install() adds our own few lines for each where it is missing,
and leaves a newer torch untouched (docs/verify.md, "Hooking up a real implementation").
"""

import torch
import torch.nn.functional as F


def rms_norm(x, normalized_shape, weight=None, eps=None):
    """F.rms_norm's contract: x / sqrt(mean(x², over normalized_shape) + eps) · weight, in x's
    dtype; eps None means the machine epsilon of x's dtype."""
    if eps is None:
        eps = torch.finfo(x.dtype).eps
    dims = tuple(range(-len(normalized_shape), 0))
    y = x * torch.rsqrt(x.pow(2).mean(dims, keepdim=True) + eps)
    return y if weight is None else y * weight


def compile_identity(model=None, **_options):
    """torch.compile without a compiler: returns the function itself (also as a decorator)."""
    return model if model is not None else (lambda fn: fn)


def install():
    if not hasattr(F, "rms_norm"):
        F.rms_norm = rms_norm
    if not hasattr(torch, "compile"):
        torch.compile = compile_identity
