"""py:routing-fast — the shared-buffer routing (mhar_torch/routing_stack.py, MharModel's default
routing "fast") computes what the plain reference (depth_route, routing "plain") computes.

- The whole model in float64, every routed mode (attnres; mhar with H = 1, 2 and d; block with an
  uneven last block; delta with open gates and a non-zero null source), queries away from zero:
  the same loss and every gradient to a relative 1e-10 (max |Δ| / max |reference| per tensor).
- Gradient checkpointing of the sub-layers gives the same gradients; torch.no_grad evaluation
  gives the same logits.
- On its own: central differences (gradcheck), a second backward (retain_graph), the run-time
  order checks, and a negative control (another eps is seen)."""

import pytest

TOL = 1e-10
SHAPE = dict(d=16, n_head=2, n_kv_head=1, ffn=24, T=12)
CASES = {  # id: mode, H, L, blocks
    "attnres": ("attnres", 0, 2, 1),
    "mhar-H=1": ("mhar", 1, 2, 1),
    "mhar-H=2": ("mhar", 2, 2, 1),
    "mhar-H=d=16": ("mhar", 16, 2, 1),
    "mhar-H=2-L=5": ("mhar", 2, 5, 1),  # 11 sites: two blocks of the backward's products
    "block-L=3-2+1": ("block", 2, 3, 2),
    "delta-L=3-2+1-open": ("delta", 4, 3, 2),
}


def model(case, routing, checkpoint=False):
    import torch
    from mhar_torch import Config, MharModel
    mode, H, L, blocks = CASES[case]
    cfg = Config(L=L, mode=mode, H=H, n_blocks=blocks, **SHAPE)
    m = MharModel(cfg, seed=3, dtype=torch.float64, init="torch", routing=routing,
                  checkpoint=checkpoint)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():  # a trained-looking router: queries, gains, gates and ν away from init
        m.route.q.copy_(torch.randn(m.route.q.shape, generator=gen, dtype=torch.float64))
        m.route.g.add_(0.3 * torch.randn(m.route.g.shape, generator=gen, dtype=torch.float64))
        if mode == "delta":
            m.delta.gate.copy_(torch.randn(m.delta.gate.shape, generator=gen, dtype=torch.float64))
            m.delta.null.copy_(torch.randn(m.delta.null.shape, generator=gen, dtype=torch.float64))
    return m


def batch(B=3, T=12):
    import torch
    gen = torch.Generator().manual_seed(5)
    return (torch.randint(0, 256, (B, T), generator=gen),
            torch.randint(0, 256, (B, T), generator=gen))


def loss_and_grads(m):
    x, y = batch()
    loss = m(x, y)
    loss.backward()
    return loss.item(), {n: p.grad.clone() for n, p in m.checkpoint_parameters()}


def rel(a, b):
    scale = float(b.abs().max())
    diff = float((a - b).abs().max())
    return diff / scale if scale else (0.0 if diff == 0 else float("inf"))


@pytest.mark.parametrize("case", list(CASES))
def test_fast_equals_plain(case):
    import torch
    lp, gp = loss_and_grads(model(case, "plain"))
    lf, gf = loss_and_grads(model(case, "fast"))
    errs = {n: rel(gf[n], gp[n]) for n in gp}
    worst = max(errs, key=errs.get)
    loss_rel = abs(lf - lp) / abs(lp)
    print("\n%-20s loss %.12f  loss rel %.1e  worst gradient rel %.1e (%s), %d tensors"
          % (case, lf, loss_rel, errs[worst], worst, len(errs)))
    assert loss_rel <= TOL
    bad = ["%s: %.3g" % (n, e) for n, e in errs.items() if not e <= TOL]
    assert not bad, "gradients differ: " + ", ".join(bad)
    assert all(float(gp[n].abs().max()) > 0 for n in ("route.q", "route.g")), \
        "the router's gradients vanish: the case tests nothing"
    if CASES[case][0] == "delta":
        assert float(gp["delta.null"].abs().max()) > 0 and bool((gp["delta.gate"] != 0).all())
    assert torch.isfinite(torch.tensor(lf))


@pytest.mark.parametrize("block", [2, 3], ids=lambda b: "block=%d" % b)
def test_blocks_whole_model(block, every_block, monkeypatch):
    """The 11-site mhar model in float64 with blocks of 2 and 3 (forward leaders and backward
    block tops at every size, pairs inside): the plain routing's loss and every gradient."""
    import mhar_torch.routing_stack as rs
    monkeypatch.setattr(rs, "BLOCK", block)
    lp, gp = loss_and_grads(model("mhar-H=2-L=5", "plain"))
    lf, gf = loss_and_grads(model("mhar-H=2-L=5", "fast"))
    errs = {n: rel(gf[n], gp[n]) for n in gp}
    name = max(errs, key=errs.get)
    print("\nblocks of %d, mhar L 5: loss rel %.1e, worst gradient rel %.1e (%s)"
          % (block, abs(lf - lp) / abs(lp), errs[name], name))
    assert abs(lf - lp) <= TOL * abs(lp) and errs[name] <= TOL


@pytest.mark.parametrize("case", ["mhar-H=2", "block-L=3-2+1", "delta-L=3-2+1-open"])
def test_checkpointed_sublayers_same_gradients(case):
    def counted(m):  # counts the MLP forwards: a checkpointed step runs each twice
        calls, mlp = [0], m._mlp
        def wrapped(*args):
            calls[0] += 1
            return mlp(*args)
        m._mlp = wrapped
        return m, calls

    m, calls = counted(model(case, "fast"))
    _, plain = loss_and_grads(m)
    mc, calls_ck = counted(model(case, "fast", checkpoint=True))
    _, ck = loss_and_grads(mc)
    worst = max(rel(ck[n], plain[n]) for n in plain)
    print("\n%-20s checkpointed vs not: worst gradient rel %.1e (MLP forwards %d vs %d)"
          % (case, worst, calls_ck[0], calls[0]))
    assert calls_ck[0] == 2 * calls[0], "the checkpointed run did not recompute the sub-layers"
    assert worst <= 1e-14


@pytest.mark.parametrize("case", ["mhar-H=2", "block-L=3-2+1", "delta-L=3-2+1-open"])
def test_no_grad_evaluation(case):
    import torch
    x, _ = batch()
    with torch.no_grad():
        fast = model(case, "fast")(x)
        plain = model(case, "plain")(x)
    assert not fast.requires_grad
    assert rel(fast, plain) <= 1e-12


def stack_route(S, W, q, g, H, eps=1e-6, block=None):
    """Sub-layer j: tanh(site j's output · W_j) written to slot j + 1; the final site's output."""
    import torch
    from mhar_torch.routing_stack import SourceStack
    n = len(W) + 1
    st = SourceStack(q, g, H, [list(range(s + 1)) for s in range(n)], S, eps, block=block)
    st.write(S)
    for j, w in enumerate(W):
        st.write(torch.tanh(st.read(j) @ w))
    return st.read(len(W))


def plain_route(S, W, q, g, H):
    import torch
    from mhar_torch import depth_route
    srcs = [S]
    for j, w in enumerate(W):
        srcs.append(torch.tanh(depth_route(torch.stack(srcs), q[j], g[j], H) @ w))
    return depth_route(torch.stack(srcs), q[len(W)], g[len(W)], H)


def unit(d=8, sites=3):
    import torch
    gen = torch.Generator().manual_seed(2)
    r = lambda *s: torch.randn(*s, generator=gen, dtype=torch.float64)
    S = r(2, 3, d).requires_grad_()
    W = [(r(d, d) / 3).requires_grad_() for _ in range(sites - 1)]
    q, g = r(sites, d).requires_grad_(), (1 + 0.3 * r(sites, d)).requires_grad_()
    return S, W, q, g


@pytest.fixture
def every_block(monkeypatch):
    """Blocks however few pairs they cover (at these sizes the default MIN_PAIRS leaves none)."""
    import mhar_torch.routing_stack as rs
    monkeypatch.setattr(rs, "MIN_PAIRS", 1)


@pytest.mark.parametrize("H", [1, 2, 8], ids=lambda H: "H=%d" % H)
@pytest.mark.parametrize("block", [1, 2, 3, 8], ids=lambda b: "block=%d" % b)
def test_stack_by_central_differences(H, block, every_block):
    """Six sites: with blocks of 2 and 3 the backward has several blocks, each with pairs inside,
    and the forward's later sites follow a leader; block 1 goes pair by pair; 8 is one block
    (the default size)."""
    import torch
    S, W, q, g = unit(sites=6)
    assert torch.autograd.gradcheck(lambda S, q, g, *W: stack_route(S, list(W), q, g, H,
                                                                    block=block),
                                    (S, q, g, *W), eps=1e-6, atol=1e-8, raise_exception=False)


@pytest.mark.parametrize("min_pairs", [1, None], ids=["every-block", "default-min-pairs"])
@pytest.mark.parametrize("block", [1, 2, 3, 8], ids=lambda b: "block=%d" % b)
def test_blocks_equal_plain(block, min_pairs, monkeypatch):
    """Eleven sites, blocks of 1 (pair by pair), 2, 3 and 8 slots (2 and 3: several blocks, the
    last one short), with every block used or only those the default MIN_PAIRS lets through:
    the stack's output and every gradient are the plain routing's."""
    import torch
    import mhar_torch.routing_stack as rs
    if min_pairs is not None:
        monkeypatch.setattr(rs, "MIN_PAIRS", min_pairs)
    S, W, q, g = unit(sites=11)
    out, ref = stack_route(S, W, q, g, 2, block=block), plain_route(S, W, q, g, 2)
    got = torch.autograd.grad(out.pow(2).sum(), [S, q, g, *W])
    want = torch.autograd.grad(ref.pow(2).sum(), [S, q, g, *W])
    worst = max(rel(a, b) for a, b in zip(got, want))
    print("\nblock %d, 11 sites: output rel %.1e, worst gradient rel %.1e"
          % (block, rel(out, ref), worst))
    assert rel(out, ref) <= 1e-14 and worst <= TOL


def test_second_backward_and_negative_control():
    import torch
    S, W, q, g = unit()
    out = stack_route(S, W, q, g, 2)
    first = torch.autograd.grad(out.pow(2).sum(), [S, q, g], retain_graph=True)
    again = torch.autograd.grad(out.pow(2).sum(), [S, q, g])
    assert all(torch.equal(a, b) for a, b in zip(first, again)), "a second backward differs"
    ref = plain_route(S, W, q, g, 2)
    assert rel(out, ref) <= 1e-14
    other = stack_route(S, W, q, g, 2, eps=1e-2)  # another eps: the comparison must see it
    assert rel(other, ref) > TOL


def test_order_is_checked():
    import torch
    from mhar_torch.routing_stack import SourceStack
    S, W, q, g = unit()
    st = SourceStack(q, g, 2, [[0], [0, 1], [0, 1, 2]], S)
    st.write(S)
    with pytest.raises(RuntimeError, match="site 1 reads slot 1, which is not written yet"):
        st.read(1)
    st.write(S * 2)
    st.write(S * 3)
    with pytest.raises(RuntimeError, match="already written"):
        st.write(S)
    with pytest.raises(ValueError, match="must divide"):
        SourceStack(q, g, 3, [[0], [0, 1], [0, 1, 2]], S)


@pytest.mark.parametrize("what", ["other-positions", "same-size-transposed", "site-past-the-end",
                                  "site-negative"])
def test_misuse_is_refused_in_our_words(what):
    """A source of another shape, even one of the same size (a reshape would mix the positions
    up: it was accepted and routed the wrong rows together), or a site that does not exist (an
    IndexError of a list, or for -1 a message about slot 2): refused, saying what is wrong."""
    import torch
    from mhar_torch.routing_stack import DepthRoutingStack
    r = DepthRoutingStack(d=16, sites=3, heads=4)
    st = r.sources(torch.randn(2, 5, 16))
    if what == "other-positions":
        with pytest.raises(ValueError, match=r"slot 1 must have the first source's shape "
                           r"\[2, 5, 16\], got \[2, 6, 16\]"):
            st.write(torch.randn(2, 6, 16))
    elif what == "same-size-transposed":
        with pytest.raises(ValueError, match=r"got \[5, 2, 16\]"):
            st.write(torch.randn(5, 2, 16))
    else:
        site = 3 if what == "site-past-the-end" else -1
        with pytest.raises(IndexError, match="there is no site %d: this stack has 3 sites, 0 to 2"
                           % site):
            st.read(site)


def test_saves_no_per_site_copy():
    """What autograd keeps (saved tensors, counted once each) with the fast routing is within 10 %
    of the residual model's at the same size; the plain routing keeps several times more."""
    import torch
    from mhar_torch import Config, MharModel

    def saved(mode, routing):
        cfg = Config(d=32, L=6, n_head=2, n_kv_head=1, ffn=48, T=16, mode=mode, H=2)
        m = MharModel(cfg, seed=1, init="torch", routing=routing)
        seen = {}

        def pack(t):
            seen[(t.data_ptr(), t.storage().size())] = t.storage().size() * t.element_size()
            return t
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            m(*batch(4, 16))
        return sum(seen.values())

    res, fast, plain = saved("residual", "fast"), saved("mhar", "fast"), saved("mhar", "plain")
    print("\nsaved by autograd: residual %d B, mhar fast %d B, mhar plain %d B" % (res, fast, plain))
    assert fast <= 1.1 * res
    assert plain > 1.5 * res


def test_two_graphs_alive_at_once():
    """Two forwards, then their two backwards in the other order (gradient accumulation): each
    graph keeps its own buffers (the pool hands a buffer on only once its graph is freed), and a
    third step reuses one."""
    import torch
    x, y = batch()
    sums = {}
    for routing in ("fast", "plain"):
        m = model("mhar-H=2", routing)
        first, second = m(x, y), m(x.flip(0), y.flip(0))
        second.backward()
        first.backward()
        m(x, y).backward()
        sums[routing] = {n: p.grad.clone() for n, p in m.checkpoint_parameters()}
        if routing == "fast":
            assert len(m._pool) >= 1, "no buffer came back to the pool"
    worst = max(rel(sums["fast"][n], sums["plain"][n]) for n in sums["plain"])
    print("\naccumulated over 3 steps, 2 graphs alive at once: worst gradient rel %.1e" % worst)
    assert worst <= TOL


def test_depth_routing_stack_module():
    """DepthRoutingStack as docs/pytorch.md drops it into a nanoGPT-style model: sites 2L + 1,
    ``sources(x)``, read / write per sub-layer; equal to depth_route site by site; a site with
    one source returns it."""
    import torch
    from torch import nn
    from mhar_torch import DepthRoutingStack, depth_route

    torch.manual_seed(3)
    d, L = 8, 2
    subs = nn.ModuleList(nn.Sequential(nn.LayerNorm(d), nn.Linear(d, d)) for _ in range(2 * L))
    route = DepthRoutingStack(d, sites=2 * L + 1, heads=2).double()
    subs.double()
    with torch.no_grad():
        route.q.normal_()
    x = torch.randn(2, 5, d, dtype=torch.float64)

    stack = route.sources(x)
    for j, f in enumerate(subs):
        stack.write(f(stack.read(j)))
    fast = stack.read(2 * L)
    srcs = [x]
    for j, f in enumerate(subs):
        srcs.append(f(depth_route(srcs, route.q[j], route.g[j], 2)))
    plain = depth_route(srcs, route.q[2 * L], route.g[2 * L], 2)
    gf = torch.autograd.grad(fast.sum(), [route.q, route.g, *subs.parameters()])
    gp = torch.autograd.grad(plain.sum(), [route.q, route.g, *subs.parameters()])
    assert rel(fast, plain) <= TOL
    assert max(rel(a, b) for a, b in zip(gf, gp)) <= TOL
    fresh = DepthRoutingStack(d, sites=1).double().sources(x).read(0)
    assert torch.equal(fresh, x)


@pytest.mark.parametrize("block", [1, 2, 8], ids=lambda b: "block=%d" % b)
def test_partial_backward_then_full(block, every_block):
    """A backward that reaches part of the graph (torch.autograd.grad for one weight, keeping the
    graph), then a full one, and a site whose output is never used: the plain gradients each
    time (the per-pass state is reset when the engine ends a pass)."""
    import torch
    from mhar_torch.routing_stack import SourceStack
    S, W, q, g = unit(sites=4)

    def fast():
        st = SourceStack(q, g, 2, [list(range(s + 1)) for s in range(4)], S, block=block)
        st.write(S)
        st.read(0)  # read and never used
        for j, w in enumerate(W):
            st.write(torch.tanh(st.read(j) @ w))
        return st.read(3)

    out, ref = fast(), plain_route(S, W, q, g, 2)
    got = torch.autograd.grad(out.pow(2).sum(), [W[2]], retain_graph=True)[0]
    want = torch.autograd.grad(ref.pow(2).sum(), [W[2]], retain_graph=True)[0]
    assert rel(got, want) <= TOL
    got = torch.autograd.grad(out.pow(2).sum(), [S, q, g, *W])
    want = torch.autograd.grad(ref.pow(2).sum(), [S, q, g, *W])
    worst = max(rel(a, b) for a, b in zip(got, want))
    print("\npartial backward, then a full one: worst gradient rel %.1e" % worst)
    assert worst <= TOL
