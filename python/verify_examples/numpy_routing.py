"""Depth routing at one site in NumPy, float32 throughout: docs/design.md#routing-steps with the
verify kit's conventions (H heads, eps, logit scale, optional gain, delta output). A candidate for
python/mhar_verify.py: `--impl verify_examples.numpy_routing:routing` (its backward is
routing.backward).

make_routing(mistake) builds the same function with one deliberate mistake, for the tests that
prove the kit catches them (planted.py).
"""

import numpy as np

MISTAKES = ("rms_per_head", "inv_sqrt_k", "no_eps", "no_rms_backward", "interleaved",
            "softmax_short")


def make_routing(mistake=None):
    if mistake is not None and mistake not in MISTAKES:
        raise ValueError(f"unknown mistake {mistake!r} (one of {MISTAKES})")
    f32 = np.float32

    def layout(d, H):
        K = d // H
        if mistake == "interleaved":  # head h = columns h, h+H, h+2H, ... (wrong)
            heads = lambda x: np.swapaxes(x.reshape(x.shape[:-1] + (K, H)), -1, -2)
            flat = lambda y: np.swapaxes(y, -1, -2).reshape(y.shape[:-2] + (d,))
        else:  # head h = columns [hK, (h+1)K)
            heads = lambda x: x.reshape(x.shape[:-1] + (H, K))
            flat = lambda y: y.reshape(y.shape[:-2] + (d,))
        return K, heads, flat

    def forward(sources, q, g, H, eps, scale):
        S = np.asarray(sources, dtype=f32)
        N, P, d = S.shape
        K, heads, flat = layout(d, H)
        gg = np.ones(d, f32) if g is None else np.asarray(g, dtype=f32)
        qg = np.asarray(q, dtype=f32) * gg
        e = f32(0 if mistake == "no_eps" else eps)
        Sh = heads(S)                                              # [N, P, H, K]
        if mistake == "rms_per_head":
            r = 1 / np.sqrt((Sh * Sh).mean(-1, keepdims=True) + e)  # [N, P, H, 1] (wrong)
        else:
            r = (1 / np.sqrt((S * S).mean(-1) + e))[..., None, None]  # (1) [N, P, 1, 1]
        s = f32(scale) / (f32(np.sqrt(K)) if mistake == "inv_sqrt_k" else f32(1))
        z = s * (r * Sh * heads(qg)).sum(-1)                       # (2) [N, P, H]
        m = z.max(0, keepdims=True)
        ez = np.exp(z - m)
        den = ez[:-1].sum(0, keepdims=True) if mistake == "softmax_short" else ez.sum(0, keepdims=True)
        alpha = ez / den                                           # (3)
        mix = flat((alpha[..., None] * Sh).sum(0))                 # (4) [P, d]
        return dict(S=S, Sh=Sh, r=r, s=s, alpha=alpha, mix=mix, gg=gg, qg=qg, heads=heads,
                    flat=flat, K=K)

    def routing(sources, q, g, H, eps, scale, partial=None, gate=None):
        f = forward(sources, q, g, H, eps, scale)
        out = f["mix"] if partial is None else np.asarray(partial, f32) + f32(gate) * f["mix"]
        return out, f["alpha"]

    def backward(sources, q, g, H, eps, scale, dout, partial=None, gate=None):
        f = forward(sources, q, g, H, eps, scale)
        heads, flat, S, Sh, r, s, alpha = (f[k] for k in ("heads", "flat", "S", "Sh", "r", "s", "alpha"))
        N, P, d = S.shape
        dout = np.asarray(dout, f32)
        dmix = dout if partial is None else f32(gate) * dout
        dmh, mixh = heads(dmix), heads(f["mix"])
        D = (dmh * mixh).sum(-1)                                   # [P, H]
        a = (dmh[None] * Sh).sum(-1)                               # [N, P, H]
        sdz = s * alpha * (a - D)                                  # ∂/∂(unscaled logit)
        u = sdz[..., None] * heads(f["qg"])                        # ∂/∂(r S): [N, P, H, K]
        dSh = alpha[..., None] * dmh[None] + r * u
        if mistake != "no_rms_backward":
            if mistake == "rms_per_head":
                dSh -= (r ** 3 / f["K"]) * (u * Sh).sum(-1, keepdims=True) * Sh
            else:
                dSh -= (r ** 3 / d) * (u * Sh).sum((-1, -2), keepdims=True) * Sh
        w = (sdz[..., None] * r * Sh).sum((0, 1))                  # Σ_{p,i} dz·r·S: [H, K]
        q32 = np.asarray(q, f32)
        res = {"dsources": flat(dSh), "dq": flat(w) * f["gg"]}
        if g is not None:
            res["dg"] = flat(w) * q32
        if partial is not None:
            res["dpartial"] = dout.copy()
            res["dgate"] = np.asarray((dout * f["mix"]).sum(), dtype=f32)
        return res

    routing.backward = backward
    routing.__name__ = "routing" if mistake is None else f"routing_{mistake}"
    return routing


routing = make_routing()

# For --backward verify_examples.numpy_routing:backward (the same as routing.backward).
backward = routing.backward
