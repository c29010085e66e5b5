#!/usr/bin/python3
"""The adapters of python/verify_examples/ against the peers' current public signatures: each
stand-in has exactly the signature its peer publishes today (names, order, defaults), the fla
adapter calls every argument by keyword (a keyword-only twin of the stand-in must work, and fla's
old positional order must not be what it relies on), and the torch 1.13 shims behave as the
functions they stand for. Exit 0 when all hold, 1 when one does not, 77 without torch.

    PYTHONPATH=python /usr/bin/python3 tests/verify/check_adapters.py
"""

import inspect
import sys

try:
    import torch
except ImportError as e:
    print(f"MHAR_SKIP: torch cannot be imported by {sys.executable}: {e}")
    sys.exit(77)

from verify_examples import block_adapter, fla_adapter, liger_adapter, stand_ins, torch_shims

EMPTY = inspect.Parameter.empty

# The peers' public signatures today: (name, default) in order (docs/verify.md, "Hooking up a
# real implementation").
SIGNATURES = {
    "fla_naive_attnres": [("query", EMPTY), ("residuals", EMPTY), ("rms_weight", EMPTY),
                          ("output_rms_weight", None), ("rms_eps", 1e-6), ("scale", 1.0),
                          ("return_weights", False)],
    "liger_attn_res": [("V", EMPTY), ("w_query", EMPTY), ("w_norm", EMPTY), ("eps", 1e-6)],
    "mh_block_attn_res": [("blocks", EMPTY), ("partial_block", EMPTY), ("proj", EMPTY),
                          ("norm", EMPTY), ("num_heads", EMPTY)],
}

failures = []


def check(cond, what):
    print(("ok: " if cond else "FAIL: ") + what)
    if not cond:
        failures.append(what)


for name, want in SIGNATURES.items():
    got = [(p.name, p.default) for p in inspect.signature(getattr(stand_ins, name)).parameters.values()]
    check(got == want, f"stand_ins.{name}{tuple(n for n, _ in got)} is the peer's signature")


def case(N=4, P=3, d=16):
    g = torch.Generator().manual_seed(1)
    S = torch.randn(N, P, d, generator=g, requires_grad=True)
    q = torch.randn(d, generator=g, requires_grad=True)
    w = (1 + 0.2 * torch.randn(d, generator=g)).requires_grad_()
    return S, q, w


def keyword_only(*, query, residuals, rms_weight, output_rms_weight=None, rms_eps=1e-6, scale=1.0,
                 return_weights=False):
    if isinstance(residuals, torch.Tensor):
        raise TypeError("residuals must be a sequence of tensors, not one stacked tensor")
    return stand_ins.fla_naive_attnres(query, residuals, rms_weight, output_rms_weight, rms_eps,
                                       scale, return_weights)


S, q, w = case()
out, alpha = fla_adapter.make_adapter(keyword_only)(S, q, w, 1, 1e-6, 0.5)
ref, _ = fla_adapter.adapter(S, q, w, 1, 1e-6, 0.5)
check(torch.equal(out, ref) and alpha.shape == (4, 3, 1),
      "the fla adapter calls by keyword only, residuals as a sequence (a keyword-only stand-in "
      "that refuses a stacked tensor gives the same out)")
try:
    fla_adapter.adapter(S, q, w, 2, 1e-6, 0.5)
    check(False, "the fla adapter declines H = 2")
except Exception as e:  # noqa: BLE001
    check(type(e).__name__ == "NotServed", f"the fla adapter declines H = 2 ({e})")

# The same routing through all three adapters at H = 1 (scale folded into Liger's and the block
# kernel's query, in float32), and autograd reaches q through the fold.
outs = []
for ad in (fla_adapter.adapter, liger_adapter.adapter, block_adapter.adapter):
    S, q, w = case()
    r = ad(S, q, w, 1, 1e-6, 0.5)
    o = r[0] if isinstance(r, tuple) else r
    o.sum().backward()
    outs.append((o.detach(), q.grad.clone()))
check(all(torch.allclose(o, outs[0][0], atol=1e-6) and torch.allclose(dq, outs[0][1], atol=1e-5)
          for o, dq in outs), "fla, Liger and block adapters agree at H = 1 (out and dq)")

x = torch.randn(3, 8)
wt = torch.rand(8) + 0.5
want = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * wt
check(torch.allclose(torch_shims.rms_norm(x, (8,), wt, 1e-5), want), "the F.rms_norm shim")
check(torch_shims.compile_identity(len) is len and torch_shims.compile_identity()(len) is len,
      "the torch.compile shim returns the function, also as a decorator")
torch_shims.install()
check(hasattr(torch.nn.functional, "rms_norm") and hasattr(torch, "compile"),
      "install() provides F.rms_norm and torch.compile")

print(f"{len(failures)} failed" if failures else "every check holds")
sys.exit(1 if failures else 0)
