"""Planted candidates, each with a verdict the tests know in advance (tests/verify/CMakeLists.txt).

Six mistakes, each a candidate that verify must fail:

  rms_per_head     RMS per head instead of over the full width d
  inv_sqrt_k       a 1/sqrt(K) logit scale
  no_eps           eps dropped
  no_rms_backward  the RMS term of the backward dropped
  interleaved      heads interleaved (column c in head c mod H) instead of contiguous
  softmax_short    the softmax taken over one source too few

    /usr/bin/python3 python/mhar_verify.py --impl verify_examples.planted:no_eps --cases DIR

Two single-head kernels (Attention Residuals: they decline every case with H > 1), graded with
`--serves h1`:

  single_head          the NumPy example, one head: COMPLETE and passing within scope h1
  single_head_eps_f32  the same with eps hard-coded to float32's machine epsilon, as one peer does:
                       it must fail the H = 1 cases where eps matters, with a hint naming eps
"""

import numpy as np

from verify_examples.numpy_routing import MISTAKES, make_routing

for _m in MISTAKES:
    globals()[_m] = make_routing(_m)


class NotServed(Exception):
    """The harness's decline signal (matched by name)."""


def make_single_head(eps=None):
    """The example restricted to H = 1; eps, when given, replaces the case's (a planted mistake)."""
    base = make_routing()

    def check(H):
        if H != 1:
            raise NotServed(f"H = {H}: a single-head kernel")

    def routing(sources, q, g, H, case_eps, scale, partial=None, gate=None):
        check(H)
        return base(sources, q, g, 1, case_eps if eps is None else eps, scale, partial, gate)

    def backward(sources, q, g, H, case_eps, scale, dout, partial=None, gate=None):
        check(H)
        return base.backward(sources, q, g, 1, case_eps if eps is None else eps, scale, dout,
                             partial, gate)

    routing.backward = backward
    return routing


single_head = make_single_head()
single_head_eps_f32 = make_single_head(eps=float(np.finfo(np.float32).eps))
