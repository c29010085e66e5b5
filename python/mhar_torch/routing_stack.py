"""Depth routing over one shared source buffer: version 2 of the twin's routing (version 1, the
readable reference, is routing.py's ``depth_route``). The same function, docs/design.md §1, steps
(1)–(4); what changes is where the sources live and what autograd keeps:

- The sources live in one buffer [slots, B, T, d]: each slot is written once per forward (sub-layer
  j writes slot j + 1), and a site reads its slots where they are, never stacked or copied.
- Steps (1) and (2) depend on one source and one site's q ⊙ g only, so when a source is written its
  RMS r_i and its un-scaled logits kp_i = Σ_{c∈h} q_c g_c S_i[c] at every later site are computed
  at once, one batched product per head (docs/design.md §4, "Across sites, forward"). A site's
  forward is then the softmax over r_i · kp_i and one weighted sum over its sources. Saved for the
  backward: α (N × P × H) per site, r (P) and kp (readers × P × H) per source, and the site's
  output (which the next sub-layer's norm keeps alive anyway); no key tensor, no stack, no product.
- The backward runs one source at a time (docs/design.md §4, "Across sites"; the CPU's B3 does the
  same): a site's backward only keeps its dout and D = Σ_{c∈h} dout ⊙ out (P × H); the write of
  slot i, reached by autograd after every site that read slot i, goes over those sites' douts once
  each, with S_i in cache: per site a_i = Σ_{c∈h} dout ⊙ S_i, dz = α_i (a_i − D), and the value
  term α_i · dout added into dS_i; then the key and RMS terms of all those sites at once (batched
  products) and returns the source's whole gradient, written once. Each (site, source) pair
  reads one dout from memory, where the site-by-site order also read and wrote the source's
  gradient (about 12 % less backward time at L 12, d 256, T 256, batch 4).
- Where site s reads slots 0 … s (attnres, mhar), the backward goes down the slots in blocks of
  BLOCK (``_block_top``): the first slot of a block that autograd reaches (its top) does the pairs
  of every slot of the block with every site above the block at once, as two batched matrix
  products over the P · H (position, head) rows, a = douts · sources^T and the value terms
  α^T · douts, with the sites' douts side by side (``dbuf``, one more [sites, P, d] buffer). A
  dout then comes from memory once per block of slots, not once per slot, and two products
  replace a product, a sum and a scaled add per pair. The pairs inside a block (a slot below the
  top with the sites between it and the top, whose douts did not exist at the top's turn) go one
  by one (``_pair``), and so do the slots where a block would cover fewer than MIN_PAIRS pairs
  (near the top of the stack, and every slot of a shallow one).
- Other plans (block, delta), and the slots just named, go pair by pair with slots in pairs: a
  slot whose pairs the slot above did not start (``early``) also does, from the same reads of each
  dout, the pairs of the slot below (10–13 % of the backward at L 24, two sittings).
- Sites go in pairs in the forward too, as the CPU's F3: when site s + 1 reads site s's slots and
  one more, site s also sums, from the same reads of its sources, site s + 1's weighted sum over
  them with weights exp(z' − m') left unnormalised (an online softmax's carry), and site s + 1
  reads two tensors, the carry and its new slot, instead of s + 2 (``_follow``; at L 24, 13 % of
  the forward with another process streaming memory on the other core, 0–10 % without). Where
  site s reads slots 0 … s and a block of BLOCK sites would cover MIN_PAIRS pairs, a site leads
  the next BLOCK − 1 instead (``_lead_block``): one batched product per (position, head) gives
  every block site's carry over the leader's slots, and each follower adds its later slots.
- The buffers' slices lie a little more than P · d apart (``_rows_apart``): the products read one
  row of every slice in turn, and rows a power of two apart would share cache sets.

Measured alone (d 256, T 256, batch 4, H 2, one thread, sub-layers replaced by a scaling; the
training step is in docs/pytorch.md), blocks against pair by pair everywhere, side by side: at
L 24 0.71×, 0.72× and 0.82× of the time (forward 100 against 140 ms, backward 159 against 229 in
the first), at L 12 0.94× and 0.95×, at L 6 0.92× (none of its blocks passes MIN_PAIRS).

Why the in-place writes stay correct. The buffers are plain tensors that autograd never sees
(never in ``save_for_backward``, so no version counter to trip or to silence); correctness rests
on three rules, the first two asserted at run time:
  1. a slot is written once per forward, before any site reads it (``write`` refuses a second
     write; ``read`` refuses an unwritten slot), and each forward owns its buffers until its graph
     is freed: a ``SourceStack`` takes them from ``pool`` only once the stack that had them is
     gone (``_Buffers.__del__`` hands them back: no node of any graph refers to them any more),
     else allocates new ones; so what a backward reads is what its forward wrote;
  2. autograd runs the backward of slot i's write after the backward of every site that read it:
     each write and each read takes the previous write's ``link`` (an empty tensor) as an input, so
     slot i's write is an ancestor of every later site in the graph, and the engine runs a node
     only after every node that uses its output; a site's backward asserts that none of its
     slots has given its gradient away yet in this backward pass;
  3. per backward pass, a site's backward records that it ran and keeps its dout, D and α; the
     write of slot i sums over the sites that ran, and a callback queued on the engine drops that
     state when the pass ends, so a second backward (``retain_graph=True``), or one that reaches
     only part of the graph (``torch.autograd.grad``), starts clean. A site's row of ``dbuf`` is
     written by its backward and read by the block tops after it in the same pass; a block top
     checks that no slot of its block gave its gradient away before it. The work tensor (one pair's
     products) is used up inside one node's backward, and the engine runs one node at a time per
     device (on CUDA, queued on one stream).

Under ``torch.no_grad`` only the forwards run. Under ``torch.utils.checkpoint``, checkpoint the
sub-layers, not the routing (which saves little): a recomputed ``write`` would write its slot twice.
Plain PyTorch ops only, so the same code runs on the CPU and on CUDA devices.
"""

from typing import List, Optional, Sequence, Tuple

import torch
from torch import Tensor, nn

from .routing import ROUTING_EPS

# Slots per block of the backward's batched products (_block_top): a block's top slot does every
# pair of the block's slots with the sites above it in two batched matrix products; the pairs
# inside the block (block · (block − 1) / 2) go one by one (_pair).
BLOCK = 8
# Pairs that a block's products must cover (sites × slots) for them to be used: the two
# products cost a fixed set-up per (position, head), about as much as 60 pairs one by one at
# d 256, P 1024 (measured here); below it, the pairs go one by one.
MIN_PAIRS = 64
# Elements between consecutive slots of the source and dout buffers beyond P · d (_rows_apart).
ROW_PAD = 16


class SourceStack:
    """One forward's shared source buffer for a stack of routing sites.

    sites: per site, the slots it reads, in source order. q, g: sites × d (one row per site).
    ``write(x)`` fills the next slot; ``read(s)`` routes site s over its slots. pool: a list the
    module keeps, through which later forwards reuse the buffers (allocating [slots, B, T, d]
    afresh every step costs page faults), or None. block: slots per block of the backward's
    batched products (default BLOCK; 1: pair by pair), where site s reads slots 0 … s.
    """

    def __init__(self, q: Tensor, g: Tensor, heads: int, sites: Sequence[Sequence[int]],
                 like: Tensor, eps: float = ROUTING_EPS, pool: Optional[list] = None,
                 block: Optional[int] = None) -> None:
        d = q.shape[-1]
        if heads < 1 or d % heads != 0:
            raise ValueError("routing: H = %d must divide d = %d" % (heads, d))
        if like.shape[-1] != d or q.shape != g.shape or q.shape[0] != len(sites):
            raise ValueError("routing: q and g must be sites × d = %d × %d, sources [..., %d]"
                             % (len(sites), d, d))
        # The autograd nodes hold `_Buffers`, never this object: it holds the latest link, whose
        # node would otherwise hold it back (a reference cycle through the graph that Python's
        # collector does not see, keeping every step's buffers alive).
        block = BLOCK if block is None else block
        if block < 1:
            raise ValueError("routing: block = %d must be at least 1" % block)
        self.bufs = _Buffers(q, g, heads, sites, like, eps, pool, block)
        self.written = 0
        self.link: Optional[Tensor] = None

    def write(self, x: Tensor) -> None:
        """Fills the next slot with x [B, T, d] (slot 0 first): the shape of the stack's first
        source (its dtype may differ, as under autocast: the slot keeps the buffer's)."""
        b = self.bufs
        if self.written >= b.buf.shape[0]:
            raise RuntimeError("routing: every slot of the source buffer is already written")
        if tuple(x.shape) != b.shape:  # a reshape of the same size would mix the positions up
            raise ValueError("routing: slot %d must have the first source's shape %s, got %s"
                             % (self.written, list(b.shape), list(x.shape)))
        self.link = _Write.apply(x, self.link, b.q, b.g, b, self.written)
        self.written += 1

    def read(self, site: int) -> Tensor:
        """Site `site`'s output [B, T, d]: the routing over its slots."""
        n = len(self.bufs.sites)
        if not 0 <= site < n:
            raise IndexError("routing: there is no site %d: this stack has %d sites, 0 to %d"
                             % (site, n, n - 1))
        need = max(self.bufs.sites[site])
        if need >= self.written:
            raise RuntimeError("routing: site %d reads slot %d, which is not written yet"
                               % (site, need))
        return _Read.apply(self.link, self.bufs, site)


class _Buffers:
    """What the autograd nodes share: the sources, their gradients, r, kp, dz and the plan."""

    def __init__(self, q, g, heads, sites, like, eps, pool, block):
        self.q, self.g, self.heads, self.eps = q, g, heads, eps
        self.sites = [list(s) for s in sites]
        # Blocks of slots in the backward (_block_top) where site s reads slots 0 … s (attnres,
        # mhar); other plans go pair by pair (block = 1).
        prefix = all(slots == list(range(s + 1)) for s, slots in enumerate(self.sites))
        n = len(self.sites)  # where no block could pass MIN_PAIRS, no dout buffer either
        pays = any((n - i) * min(block, i + 1) >= MIN_PAIRS for i in range(n))
        self.block = block if prefix and pays else 1
        n_slots = 1 + max(max(s) for s in self.sites)
        self.shape = tuple(like.shape)  # B × T × d
        d = like.shape[-1]
        self.P = like.numel() // d
        self.pool = pool
        size = (n_slots, self.P, d)
        dsize = (len(self.sites) if self.block > 1 else 0, self.P, d)
        for k, (buf, work, dbuf) in enumerate(pool or []):
            if (buf.shape == size and dbuf.shape == dsize and buf.dtype == like.dtype
                    and buf.device == like.device):
                self.buf, self.work, self.dbuf = pool.pop(k)
                break
        else:
            self.buf = _rows_apart(size, like)
            self.work = torch.empty_like(self.buf[0])  # P × d: one pair's products
            # the sites' douts side by side, for the blocks' batched products (none without)
            self.dbuf = _rows_apart(dsize, like)
        self.taken = [False] * n_slots  # per slot: its write's backward ran in this pass
        self.ran = [False] * len(self.sites)  # per site: its backward ran in this pass
        self.in_pass = False
        self.readers = [[s for s, slots in enumerate(self.sites) if k in slots]
                        for k in range(n_slots)]
        self.where = [{k: n for n, k in enumerate(slots)} for slots in self.sites]  # slot → n
        self.reader_at = [{s: m for m, s in enumerate(r)} for r in self.readers]  # site → row
        self.rms: List[Optional[Tensor]] = [None] * n_slots  # per slot: r, P
        self.kp: List[Optional[Tensor]] = [None] * n_slots   # per slot: readers × P × H
        # per site, kept by its backward for its slots' writes in this pass:
        self.dout: List[Optional[Tensor]] = [None] * len(self.sites)   # ∂loss/∂out, P × H × K
        self.D: List[Optional[Tensor]] = [None] * len(self.sites)      # Σ_{c∈h} dout ⊙ out, P × H
        self.alpha: List[Optional[Tensor]] = [None] * len(self.sites)  # α, N × P × H
        # per slot, the pairs the slot above did for it: (Σ of their value terms, {site: dz})
        self.early: dict = {}
        self.carry: dict = {}  # per site, what the site before (its leader) summed for it, and z

    def start_pass(self) -> None:
        """Called by every backward of a routing node: the first of a pass queues the reset of
        the per-pass state for the pass's end."""
        if not self.in_pass:
            self.in_pass = True
            torch.autograd.Variable._execution_engine.queue_callback(self.end_pass)

    def end_pass(self) -> None:
        n, m = len(self.taken), len(self.sites)
        self.taken, self.ran = [False] * n, [False] * m
        self.dout, self.D, self.alpha = [None] * m, [None] * m, [None] * m
        self.early = {}
        self.in_pass = False

    def scratch(self, shape) -> Tensor:
        """The P × d work tensor, viewed as `shape`: one product of a backward (a site's D, a
        pair's a), used up before the next routing node runs (the engine runs one node at a time
        per device, and on CUDA they queue on one stream), so no backward allocates one."""
        return self.work.view(shape)

    def __del__(self):
        if self.pool is not None and len(self.pool) < 2:
            self.pool.append((self.buf, self.work, self.dbuf))


def _rows_apart(size, like: Tensor) -> Tensor:
    """An empty [n, P, d] buffer whose n slices lie ROW_PAD elements more than P · d apart. The
    blocks' products read the same (position, head) row of every slice in turn: P · d apart
    (a power of two times d), those rows would fall in the same cache sets and evict each other
    (the first product ran 2× slower so, with the rows coming from memory)."""
    n, P, d = size
    flat = torch.empty((n, P * d + ROW_PAD), dtype=like.dtype, device=like.device)
    return flat[:, :P * d].view(n, P, d)


def _qg(stack: "_Buffers", rows: List[int]) -> Tensor:
    """(q ⊙ g) of the given sites, as rows × H × K."""
    K = stack.q.shape[-1] // stack.heads
    return (stack.q[rows] * stack.g[rows]).detach().view(len(rows), stack.heads, K)


class _Write(torch.autograd.Function):
    """Writes one slot; its backward gathers that source's whole gradient."""

    @staticmethod
    def forward(ctx, x, link, q, g, stack, slot):
        ctx.stack, ctx.slot = stack, slot
        S = stack.buf[slot]  # P × d
        with torch.no_grad(), _no_autocast(x):
            S.copy_(x.reshape(S.shape))
            rows = stack.readers[slot]
            d, H = S.shape[-1], stack.heads
            # (1)  r_i = 1 / sqrt((1/d) Σ_c S_i[c]² + eps), Σ_c S_i[c]² as a norm: one reduction,
            # no P × d temporary of squares
            sq = torch.linalg.vector_norm(S, dim=-1).square_()
            stack.rms[slot] = torch.rsqrt(sq.div_(d).add_(stack.eps))
            # (2) without r_i: kp_i[s, h] = Σ_{c∈h} (q_s g_s)_c S_i[c], per head
            # [readers, K] · [K, P], so that the stack lays them out readers × P × H directly
            qg, K = _qg(stack, rows), d // H
            stack.kp[slot] = torch.stack([qg[:, h] @ S[:, h * K:(h + 1) * K].t()
                                          for h in range(H)], dim=-1)  # readers × P × H
        ctx.x_dtype = x.dtype
        return S.new_empty(0)

    @staticmethod
    def backward(ctx, _dlink):
        stack, i = ctx.stack, ctx.slot
        stack.start_pass()
        stack.taken[i] = True
        rows = [s for s in stack.readers[i] if stack.ran[s]]  # the sites this backward reached
        S, P, d = stack.buf[i], stack.P, stack.buf.shape[-1]
        H = stack.heads
        K = d // H
        if not rows:
            dS = torch.zeros_like(S).view(stack.shape).to(ctx.x_dtype)
            return dS, None, None, None, None, None
        dS, dz = _slot_pairs(stack, i, rows)
        dS = dS.view(P, d)
        # r_i dz (the factor of both key terms)
        r, qg = stack.rms[i], _qg(stack, rows)
        w = torch.empty((H,) + dz.shape[:2], dtype=dz.dtype, device=dz.device)
        torch.mul(dz.permute(2, 0, 1), r, out=w)  # r_i dz: H × m × P, in one pass
        # dS_i −= (r_i³/d) (Σ_c u_i[c] S_i[c]) S_i, with Σ_c u_i S_i = Σ_h dz kp  (RMS, (1))
        kp = stack.kp[i]  # readers × P × H: the rows of the sites that ran
        if len(rows) < len(stack.readers[i]):
            kp = kp[[stack.reader_at[i][s] for s in rows]]
        # (the sum over sites first, then over the H heads: one reduction over two dimensions,
        # one of them not the last, ran 6–12× slower on the CPU)
        beta = -(r.pow(3) / d) * (dz * kp).sum(dim=0).sum(dim=-1)
        dS.addcmul_(beta[:, None], S)
        M = torch.empty((len(rows), d), dtype=S.dtype, device=S.device)
        for h in range(H):
            cols = slice(h * K, (h + 1) * K)
            # dS_i += r_i u_i = Σ_s r_i dz_s[h(c)] (q_s g_s)_c            (key, step (2))
            dS[:, cols].addmm_(w[h].t(), qg[:, h])
            # M_s[c] = Σ_p r_i dz_s[h(c)] S_i[c], for dq_s = g_s ⊙ M_s, dg_s = q_s ⊙ M_s  ((2))
            torch.mm(w[h], S[:, cols], out=M[:, cols])
        q, g = stack.q.detach(), stack.g.detach()
        dq = dg = None
        if ctx.needs_input_grad[2]:
            dq = torch.zeros_like(q)
            dq[rows] = g[rows] * M
        if ctx.needs_input_grad[3]:
            dg = torch.zeros_like(g)
            dg[rows] = q[rows] * M
        return dS.view(stack.shape).to(ctx.x_dtype), None, dq, dg, None, None



def _slot_pairs(stack: "_Buffers", i: int, rows: List[int]):
    """Slot i's value terms and dz (m × P × H, in the order of `rows`), from the pairs (site s in
    rows, slot i). What an earlier slot did for it waits in stack.early[i] as (value terms,
    {site: dz}): a block's top did the pairs with the sites above the block (_block_top), or the
    slot above did those with its own sites. If nothing waits, a slot starts a block where the
    block's products pay (site s reads slots 0 … s, at least MIN_PAIRS pairs), else it does
    its pairs one by one and, from the same reads of each dout, the slot below's pairs with the
    same sites (each dout from memory once for two slots, as the C++ forward's pairs of sites
    read their sources once). The pairs left are done one by one (_pair)."""
    if (i not in stack.early and stack.block > 1
            and len(rows) * min(stack.block, i + 1) >= MIN_PAIRS):
        _block_top(stack, i, rows)
    acc, dz_of = stack.early.pop(i, (None, {}))
    below = i - 1 if not dz_of and i >= 1 and not stack.taken[i - 1] else None
    below_acc, below_dz = None, {}
    for s in rows:
        if s in dz_of:
            continue
        acc = _pair(stack, s, i, stack.dout[s], acc, dz_of)
        if below is not None and below in stack.where[s]:
            below_acc = _pair(stack, s, below, stack.dout[s], below_acc, below_dz)
    if below_dz:
        stack.early[below] = (below_acc, below_dz)
    return acc, torch.stack([dz_of[s] for s in rows])


def _block_top(stack: "_Buffers", top: int, rows: List[int]) -> None:
    """For slots j0 … top (a block, j0 = top − BLOCK + 1 or 0) and the m sites `rows` (those
    reading slot `top` that ran, so each reads every slot of the block), every pair at once,
    per (position, head) a matrix product over the m douts and the block's sources, each read
    once (the douts side by side in dbuf):
        a[s, j] = Σ_{c∈h} dout_s[c] S_j[c]          PH × (m × K) · (K × b)
        V[j, c] = Σ_s α_{s,j}[h(c)] dout_s[c]       PH × (b × m) · (m × K), the value terms
        dz[s, j] = α_{s,j} (a[s, j] − D_s)
    Leaves (V_j, {site: dz[site, j]}) in stack.early[j] for each slot j of the block."""
    j0 = max(0, top - stack.block + 1)
    if any(stack.taken[j] or j in stack.early for j in range(j0, top)):
        raise RuntimeError("routing: a slot below %d gave its gradient away, or was started, "
                           "before it" % top)
    P, d, H = stack.P, stack.buf.shape[-1], stack.heads
    K, PH, m, b = d // H, stack.P * stack.heads, len(rows), top - j0 + 1
    if rows == list(range(rows[0], rows[0] + m)):
        douts = stack.dbuf[rows[0]:rows[0] + m]
    else:  # a backward that reached only some sites: gather theirs
        douts = stack.dbuf[rows]
    Dv = douts.view(m, PH, K).transpose(0, 1)  # PH × m × K
    a = torch.bmm(Dv, stack.buf[j0:top + 1].view(b, PH, K).permute(1, 2, 0))  # PH × m × b
    # α_{s,j} as PH × m × b: stacked m × b × PH, then one transposing copy (_by_position)
    al = _by_position(torch.stack([stack.alpha[s][j0:top + 1] for s in rows])).view(PH, m, b)
    V = torch.bmm(al.transpose(1, 2), Dv)  # PH × b × K
    D = torch.stack([stack.D[s] for s in rows]).view(m, PH).t()  # PH × m
    dz = a.sub_(D.unsqueeze(-1)).mul_(al)  # PH × m × b
    dz = dz.view(PH, m * b).t().contiguous().view(m, b, P, H)  # back: site, slot, P × H
    for j in range(j0, top + 1):
        stack.early[j] = (V[:, j - j0].contiguous().view(P, H, K),
                          {s: dz[n, j - j0] for n, s in enumerate(rows)})


def _by_position(x: Tensor) -> Tensor:
    """x [..., P, H] (its leading dimensions flattened to R) as PH × R, contiguous: one 2-D
    transposing copy. Stacking the R pieces along a new last dimension instead writes each
    element R apart, which ran about 5× slower (R = 384: 4.0 against 0.9 ms; AMD EPYC Zen 5,
    one thread)."""
    PH = x.shape[-1] * x.shape[-2]
    return x.reshape(-1, PH).t().contiguous()


def _pair(stack: "_Buffers", s: int, i: int, dout: Tensor, acc: Optional[Tensor],
          dz_of: dict) -> Tensor:
    """The pair (site s, slot i), from one read of dout (P × H × K) with S_i:
         a[h] = Σ_{c∈h} dout[c] S_i[c]      (∂loss/∂α_i[h], step (4))
         dz_of[s] = α_{s,i} (a − D_s)       (softmax Jacobian, step (3))
         acc[c] += α_{s,i}[h(c)] dout[c]    (the value term of dS_i, step (4); acc None: a new one)
    Returns acc."""
    al = stack.alpha[s][stack.where[s][i]]  # P × H
    prod = stack.scratch(dout.shape)
    torch.mul(stack.buf[i].view(dout.shape), dout, out=prod)
    dz_of[s] = prod.sum(dim=-1).sub_(stack.D[s]).mul_(al)
    if acc is None:
        return al.unsqueeze(-1) * dout
    return acc.addcmul_(al.unsqueeze(-1), dout)


def _logits(stack: "_Buffers", site: int, slots: List[int]) -> Tensor:
    """z_i = r_i kp_i of `site` over `slots`, N × P × H (step (2), from what the writes saved)."""
    return torch.stack([stack.rms[i][:, None] * stack.kp[i][stack.reader_at[i][site]]
                        for i in slots])


def _weighted_sums(stack: "_Buffers", slots: List[int], w: Tensor, shape,
                   w2: Optional[Tensor] = None):
    """Step (4) over `slots`: Σ_i w_i[h(c)] S_i[c] (w: N × P × H), and with w2 also Σ_i w2_i[h(c)]
    S_i[c] from the same reads of each source (a leader's carry). Returns both (the second None
    without w2)."""
    S = stack.buf[slots[0]].view(shape)
    out = w[0].unsqueeze(-1) * S
    two = None if w2 is None else w2[0].unsqueeze(-1) * S
    for n in range(1, len(slots)):
        S = stack.buf[slots[n]].view(shape)
        out.addcmul_(w[n].unsqueeze(-1), S)
        if two is not None:
            two.addcmul_(w2[n].unsqueeze(-1), S)
    return out, two


def _follow(stack: "_Buffers", new: List[int], zk: Tensor, carry, shape) -> Tuple[Tensor, Tensor]:
    """A follower's output and α from its leader's carry C = Σ_i exp(z_i − m') S_i over the slots
    before `new` (m' = max of those z_i, l' = Σ exp(z_i − m'), and those z_i) and its `new` slots
    (its last ones, with logits zk, len(new) × P × H):
        m = max(m', max_new z_k),  l = exp(m' − m) l' + Σ_new exp(z_k − m),
        out = (exp(m' − m) C + Σ_new exp(z_k − m) S_k) / l,   α_i = exp(z_i − m) / l,
    the same weighted sum and softmax as steps (3) and (4), summed in another order: α is written
    from m and l, not by a softmax over the logits concatenated (two passes fewer over N × P × H
    per follower: 0.16 → 0.07 ms at 17 sources, 0.51 → 0.13 at 41, P · H = 4096; AMD EPYC Zen 5,
    one thread)."""
    C, mx, lsum, zold = carry
    m = torch.maximum(mx, zk.amax(dim=0))
    a, e = torch.exp(mx - m), torch.exp(zk - m)
    inv = 1.0 / (a * lsum + e.sum(dim=0))
    n_old = zold.shape[0]
    alpha = torch.empty((n_old + len(new),) + tuple(m.shape), dtype=m.dtype, device=m.device)
    torch.sub(zold, m, out=alpha[:n_old])
    alpha[:n_old].exp_().mul_(inv)
    torch.mul(e, inv, out=alpha[n_old:])
    out = torch.empty(shape, dtype=C.dtype, device=C.device)
    torch.mul(C, (a * inv).unsqueeze(-1), out=out)  # C may be a view of a block's products
    for n, k in enumerate(new):
        out.addcmul_(alpha[n_old + n].unsqueeze(-1), stack.buf[k].view(shape))
    return out, alpha


def _lead_block(stack: "_Buffers", site: int, shape):
    """Site `site` (reading slots 0 … site = N₀ − 1) leads the sites after it, up to BLOCK in
    all: per (position, head), one matrix product gives every block site t's carry over the
    leader's slots, each source read once (docs/design.md §1 step (4), in another order):
        C_t = Σ_{i<N₀} exp(z_{t,i} − m'_t) S_i          PH × (b × N₀) · (N₀ × K)
    with m'_t = max_i z_{t,i}; site t then adds its slots after N₀ (_follow). The leader's own
    output is C_site / l'_site. Returns (out, α) and leaves each follower's carry."""
    N0, K = site + 1, shape[-1]
    b, PH = min(stack.block, len(stack.sites) - site), stack.P * stack.heads
    # z_{t,i} for the N₀ slots i and the b sites t: N₀ × b × P × H (slot i's readers are the
    # sites i, i + 1, …, so its rows for t = site … site + b − 1 are one slice)
    Z = torch.stack([stack.rms[i][:, None] * stack.kp[i][site - i:site - i + b]
                     for i in range(N0)])
    mx = Z.amax(dim=0)  # b × P × H
    E = torch.exp(Z - mx)
    lsum = E.sum(dim=0)
    Et = _by_position(E).view(PH, N0, b).transpose(1, 2)  # PH × b × N₀
    C = torch.bmm(Et, stack.buf[:N0].view(N0, PH, K).transpose(0, 1))  # PH × b × K
    for t in range(1, b):
        stack.carry[site + t] = (C[:, t].view(shape), mx[t], lsum[t], Z[:, t])
    alpha = E[:, 0] / lsum[0]  # N₀ × P × H
    out = torch.empty(shape, dtype=C.dtype, device=C.device)
    torch.div(C[:, 0].view(shape), lsum[0].unsqueeze(-1), out=out)
    return out, alpha


class _Read(torch.autograd.Function):
    """Routes one site over its slots; saves only α."""

    @staticmethod
    def forward(ctx, link, stack, site):
        ctx.stack, ctx.site = stack, site
        slots = stack.sites[site]
        P, d, H = stack.P, stack.buf.shape[-1], stack.heads
        shape = (P, H, d // H)
        with torch.no_grad(), _no_autocast(stack.buf):
            # (3)  α_i[h] = softmax over i of z_i[h] = r_i kp_i[h]
            # carry: a leader before us summed our sources but the last few: (C, m', l', their z)
            carry = stack.carry.pop(site, None)
            nxt = site + 1
            if carry is not None:
                new = slots[carry[3].shape[0]:]
                out, alpha = _follow(stack, new, _logits(stack, site, new), carry, shape)
            elif (stack.block > 1 and nxt < len(stack.sites)
                  and len(slots) * min(stack.block, len(stack.sites) - site) >= MIN_PAIRS):
                out, alpha = _lead_block(stack, site, shape)
            else:
                z = _logits(stack, site, slots)
                alpha = torch.softmax(z, dim=0)
                # (4)  out[c] = Σ_i α_i[h(c)] S_i[c]
                if nxt < len(stack.sites) and stack.sites[nxt][:-1] == slots:
                    # A leader also sums, from the same reads, the next site's weighted sum over
                    # the same slots, with weights exp(z' − m') left unnormalised (an online
                    # softmax's carry): that site then reads two tensors, the carry and its new
                    # slot, not N + 1.
                    zn = _logits(stack, nxt, slots)
                    mx = zn.amax(dim=0)
                    e = torch.exp(zn - mx)
                    out, c = _weighted_sums(stack, slots, alpha, shape, e)
                    stack.carry[nxt] = (c, mx, e.sum(dim=0), zn)
                else:
                    out, _ = _weighted_sums(stack, slots, alpha, shape)
        ctx.alpha = alpha
        out = out.view(stack.shape)
        ctx.save_for_backward(out)  # for D; the next sub-layer's norm keeps it alive anyway
        return out

    @staticmethod
    def backward(ctx, dout):
        stack, site, alpha = ctx.stack, ctx.site, ctx.alpha
        slots = stack.sites[site]
        d, H, P = stack.buf.shape[-1], stack.heads, stack.P
        dout = dout.reshape(P, H, d // H).to(stack.buf.dtype)
        stack.start_pass()
        late = [i for i in slots if stack.taken[i]]
        if late:
            raise RuntimeError("routing: site %d's backward came after slot %d gave its gradient "
                               "away" % (site, late[0]))
        stack.ran[site] = True
        # Kept for the writes of the site's slots, which do the per-source work (each source's
        # gradient in one place, summed over the sites that read it): dout, α, and
        #   D[h] = Σ_{c∈h} dout[c] out[c] = Σ_j α_j[h] a_j[h]   (the softmax Jacobian's sum, (3))
        out, = ctx.saved_tensors
        out = out.reshape(P, H, d // H).to(stack.buf.dtype)
        prod = stack.scratch(dout.shape)
        torch.mul(dout, out, out=prod)
        stack.D[site] = prod.sum(dim=-1)
        if stack.block > 1:  # side by side with the other sites' douts, for _block_top
            stack.dbuf[site].view(dout.shape).copy_(dout)
            dout = stack.dbuf[site].view(dout.shape)
        stack.dout[site], stack.alpha[site] = dout, alpha
        return None, None, None


class _no_autocast:
    """Runs the routing in the buffer's dtype, whatever autocast the caller has on."""

    def __init__(self, t: Tensor) -> None:
        self.ctx = torch.autocast(device_type=t.device.type, enabled=False)

    def __enter__(self):
        return self.ctx.__enter__()

    def __exit__(self, *exc):
        return self.ctx.__exit__(*exc)


class DepthRoutingStack(nn.Module):
    """Every routing site of a model, with the shared source buffer: q (zeros) and g (ones) as
    sites × d, site s reading slots [0, s] (attnres / mhar: slot 0 the embedding, slot j + 1 the
    output of sub-layer j). Per forward, ``sources(x0)`` starts a ``SourceStack``:

        stack = routing.sources(x)          # slot 0 = x
        for j, f in enumerate(sublayers):
            stack.write(f(stack.read(j)))   # site j reads slots 0..j, f's output is slot j + 1
        y = stack.read(len(sublayers))      # the final read
    """

    def __init__(self, d: int, sites: int, heads: int = 1, eps: float = ROUTING_EPS) -> None:
        super().__init__()
        if heads < 1 or d % heads != 0:
            raise ValueError("DepthRoutingStack: heads = %d must divide d = %d" % (heads, d))
        self.heads, self.eps = heads, eps
        self.q = nn.Parameter(torch.zeros(sites, d))  # zero-init: a fresh site is the mean
        self.g = nn.Parameter(torch.ones(sites, d))
        self._pool: list = []

    def sources(self, x0: Tensor) -> SourceStack:
        stack = SourceStack(self.q, self.g, self.heads,
                            [list(range(s + 1)) for s in range(self.q.shape[0])], x0, self.eps,
                            self._pool)
        stack.write(x0)
        return stack

    def extra_repr(self) -> str:
        return "sites=%d, d=%d, heads=%d" % (self.q.shape[0], self.q.shape[1], self.heads)
