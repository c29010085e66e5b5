"""py:routing — depth_route and DepthRouting on their own, for use in any model: the properties
docs/design.md §1 lists, against a per-position loop written here from steps (1)-(4), and
autograd's gradients against central differences (torch.autograd.gradcheck, float64)."""

import math

import pytest

N, P, D = 5, 7, 12


@pytest.fixture
def data():
    import torch
    torch.manual_seed(0)
    S = torch.randn(N, P, D, dtype=torch.float64) * (0.5 + 3 * torch.rand(N, P, 1, dtype=torch.float64))
    q = torch.randn(D, dtype=torch.float64)
    g = 1 + 0.3 * torch.randn(D, dtype=torch.float64)
    return S, q, g


def loop(S, q, g, H, eps=1e-6):
    """Steps (1)-(4), one position and one head at a time."""
    import torch
    d, K = S.shape[-1], S.shape[-1] // H
    out = torch.zeros(S.shape[1], d, dtype=S.dtype)
    for p in range(S.shape[1]):
        r = [1 / math.sqrt(sum(float(S[i, p, c]) ** 2 for c in range(d)) / d + eps)
             for i in range(S.shape[0])]
        for h in range(H):
            cols = range(h * K, (h + 1) * K)
            z = [sum(float(q[c] * g[c]) * r[i] * float(S[i, p, c]) for c in cols)
                 for i in range(S.shape[0])]
            m = max(z)
            w = [math.exp(v - m) for v in z]
            a = [v / sum(w) for v in w]
            for c in cols:
                out[p, c] = sum(a[i] * float(S[i, p, c]) for i in range(S.shape[0]))
    return out


@pytest.mark.parametrize("H", [1, 3, 12], ids=lambda H: "H=%d" % H)
def test_properties(data, H):
    import torch
    from mhar_torch import depth_route
    S, q, g = data
    out, alpha = depth_route(S, q, g, H, return_weights=True)
    err = float((out - loop(S, q, g, H)).abs().max())
    print("H = %2d: equals steps (1)-(4) written as loops (%.1e)" % (H, err))
    assert err < 1e-13
    assert float((alpha.sum(0) - 1).abs().max()) < 1e-14, "the weights do not sum to one"
    perm = torch.tensor([3, 0, 4, 1, 2])
    assert torch.allclose(depth_route(S[perm], q, g, H), out, atol=1e-14, rtol=0), \
        "permuting the sources changed the output"
    scaled = S.clone()
    scaled[2] *= 7.5
    a2 = depth_route(scaled, q, g, H, return_weights=True)[1]
    assert torch.allclose(a2, alpha, atol=1e-6, rtol=0), "scaling a source changed α"
    assert torch.allclose(depth_route(S, torch.zeros(D, dtype=S.dtype), g, H), S.mean(0),
                          atol=1e-15, rtol=0), "q = 0 is not the mean"
    assert torch.equal(depth_route(S[:1], q, g, H), S[0]), "N = 1 does not return S_0"


def test_single_head_is_one_softmax(data):
    """H = 1 equals a separately written single-head routing."""
    import torch
    from mhar_torch import depth_route
    S, q, g = data
    z = ((S * torch.rsqrt(S.pow(2).mean(-1, keepdim=True) + 1e-6)) * (q * g)).sum(-1)
    single = (torch.softmax(z, 0).unsqueeze(-1) * S).sum(0)
    assert torch.allclose(depth_route(S, q, g, 1), single, atol=1e-14, rtol=0)


@pytest.mark.parametrize("H", [1, 4], ids=lambda H: "H=%d" % H)
def test_gradients_by_central_differences(data, H):
    import torch
    from mhar_torch import depth_route
    S, q, g = data
    Sg = S[:, :3].clone().requires_grad_()
    qg, gg = q.clone().requires_grad_(), g.clone().requires_grad_()
    assert torch.autograd.gradcheck(lambda a, b, c: depth_route(a, b, c, H), (Sg, qg, gg),
                                    eps=1e-6, atol=1e-8, raise_exception=False)


def test_depth_routing_module():
    import torch
    from mhar_torch import DepthRouting
    site = DepthRouting(D, heads=4)
    assert bool((site.q == 0).all() and (site.g == 1).all()), "q = 0, g = 1 at init"
    xs = [torch.randn(2, 3, D) for _ in range(3)]
    assert torch.allclose(site(xs), torch.stack(xs).mean(0), atol=1e-6), \
        "a fresh site is not the mean of its sources"
    with pytest.raises(ValueError, match="must divide"):
        DepthRouting(D, heads=5)


@pytest.mark.parametrize("what", ["none", "other-shape", "not-a-tensor"])
def test_bad_sources_are_refused_in_our_words(what):
    """A list of sources that cannot be routed: none, one of another shape, or something that is
    not a tensor. torch.stack's own messages ("stack expects each tensor to be equal size") named
    neither the routing nor which source is wrong."""
    import torch
    from mhar_torch import DepthRouting
    site = DepthRouting(D, heads=4)
    x = torch.randn(2, 3, D)
    if what == "none":
        with pytest.raises(ValueError, match="routing: there must be at least one source"):
            site([])
    elif what == "other-shape":
        with pytest.raises(ValueError, match=r"routing: source 2 has shape \[2, 4, %d\], source 0 "
                           r"\[2, 3, %d\]" % (D, D)):
            site([x, x, torch.randn(2, 4, D)])
    else:
        with pytest.raises(TypeError, match="routing: source 1 is a list, not a tensor"):
            site([x, [1.0] * D])
