"""Six planted mistakes, each a candidate that verify must fail (tests/verify/CMakeLists.txt):

  rms_per_head     RMS per head instead of over the full width d
  inv_sqrt_k       a 1/sqrt(K) logit scale
  no_eps           eps dropped
  no_rms_backward  the RMS term of the backward dropped
  interleaved      heads interleaved (column c in head c mod H) instead of contiguous
  softmax_short    the softmax taken over one source too few

    /usr/bin/python3 python/mhar_verify.py --impl verify_examples.planted:no_eps --cases DIR
"""

from verify_examples.numpy_routing import MISTAKES, make_routing

for _m in MISTAKES:
    globals()[_m] = make_routing(_m)
