"""The tiny Qwen3-style decoder on bytes in all five residual modes (docs/design.md §2): the
PyTorch twin of reference/model.cpp, with the parameter names and shapes of the checkpoint format
(docs/checkpoint-format.md), so that ``model.state_dict()`` is a checkpoint's tensors.

Sub-layer j is attention for j = 2l and the MLP for j = 2l + 1; out_j = f_j(RMSNorm_j(input_j)).
Only how input_j and the final read are formed depends on the mode:

    residual  input_j = h_j = E + Σ_{k<j} out_k                  final: the stream h
    attnres   input_j = route_1([E, out_0 … out_{j−1}])          final: route over all 2L + 1
    mhar      input_j = route_H([E, out_0 … out_{j−1}])          final: likewise, H heads
    block     input_j = route_H([b_0 = E, completed blocks, partial sum of this block])
    delta     input_j = h_j + a_j · route_H([ν, b_0, completed blocks, partial])   final: h
"""

import math
from typing import Any, List, Mapping, Optional, Tuple

import numpy as np
import torch
import torch.nn.functional as F
import torch.utils.checkpoint
from torch import nn

from . import rng as crng
from .config import Config
from .routing import depth_route
from .routing_stack import SourceStack

NORM_EPS = 1e-6
ROPE_THETA = 10000.0
NULL_SOURCE = -1  # the primitive index of the null source ν (delta mode)
ROUTINGS = ("fast", "plain")  # routing_stack.SourceStack (version 2), routing.depth_route (1)


def rmsnorm(x: torch.Tensor, gain: torch.Tensor, eps: float = NORM_EPS) -> torch.Tensor:
    """x / sqrt(mean_c x² + eps) · gain, over the last dimension."""
    return x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps) * gain


def rope_tables(T, hd, dtype, device=None):
    """cos and sin [T, hd/2] of the angle t · θ^(−2i/hd), computed in double with the C library's
    pow, cos and sin (Python's math), as reference/layers.cpp does, then rounded to dtype."""
    half = hd // 2
    freq = [math.pow(ROPE_THETA, -2.0 * i / hd) for i in range(half)]
    cos = [[math.cos(t * f) for f in freq] for t in range(T)]
    sin = [[math.sin(t * f) for f in freq] for t in range(T)]
    as_t = lambda v: torch.tensor(v, dtype=torch.float64, device=device).to(dtype)
    return as_t(cos), as_t(sin)


def rope(x, cos, sin):
    """Rotate-half RoPE on x [B, T, heads, hd]: column i pairs with column i + hd/2."""
    half = x.shape[-1] // 2
    xa, xb = x[..., :half], x[..., half:]
    c, s = cos[:, None, :], sin[:, None, :]  # [T, 1, hd/2] broadcast over batch and heads
    return torch.cat([xa * c - xb * s, xa * s + xb * c], dim=-1)


def site_groups(cfg: Config, j: int) -> List[Tuple[str, List[int]]]:
    """The sources routing site j reads (site 2L is the final read), each as (name, primitives):
    0 = E, k + 1 = out_k, NULL_SOURCE = ν. Mirrors reference/model.cpp, site_groups."""
    def prim_name(k):
        if k == NULL_SOURCE:
            return "null"
        if k == 0:
            return "emb"
        return ("attn" if (k - 1) % 2 == 0 else "mlp") + str((k - 1) // 2)

    if cfg.mode in ("attnres", "mhar"):
        return [(prim_name(i), [i]) for i in range(j + 1)]
    n_sub = 2 * cfg.L
    per = 2 * cfg.layers_per_block  # sub-layers per block
    n_complete = (n_sub + per - 1) // per if j == n_sub else j // per
    groups = [("null", [NULL_SOURCE])] if cfg.mode == "delta" else []
    groups.append(("emb", [0]))  # b_0 = E
    for n in range(n_complete):
        groups.append(("block%d" % (n + 1), [k + 1 for k in range(n * per, min((n + 1) * per, n_sub))]))
    if j < n_sub and j > n_complete * per:  # the partial sum of the current block
        groups.append(("partial", [k + 1 for k in range(n_complete * per, j)]))
    return groups


def site_slots(cfg: Config, j: int) -> List[int]:
    """The slots of the shared source buffer (routing_stack.SourceStack) that site j reads, in
    site_groups' order. Every slot is written once: attnres and mhar keep slot k = primitive k
    (0 = E, j + 1 = out_j); block keeps slot 0 = E and slot j + 1 = c_j, the running sum of
    sub-layer j's block up to out_j, so that a completed block is its last c and the partial sum
    at site j is c_{j−1}; delta puts ν in slot 0 and shifts the rest by one."""
    off = 1 if cfg.mode == "delta" else 0
    return [0 if members == [NULL_SOURCE] else off + members[-1]
            for _, members in site_groups(cfg, j)]


def parameter_names(cfg: Config) -> List[str]:
    """The checkpoint's tensor names in the order of reference/model.h's Params::for_each."""
    names = ["embed"]
    for l in range(cfg.L):
        names += ["layers.%d.%s" % (l, n) for n in
                  ("attn_norm", "wq", "wk", "wv", "wo", "mlp_norm", "w_gate", "w_up", "w_down")]
    names.append("final_norm")
    if cfg.routed:
        names += ["route.q", "route.g"]
    if cfg.mode == "delta":
        names += ["delta.null", "delta.gate"]
    return names


def decays(name: str) -> bool:
    """Whether AdamW's weight decay applies to a tensor: matrices yes; gains, routing, gates no."""
    last = name.rsplit(".", 1)[-1]
    return name == "embed" or last in ("wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down")


def site_names(cfg: Config) -> List[str]:
    """"attn0", "mlp0", …, "final": the rows of route.q and route.g."""
    return ["final" if s == 2 * cfg.L else ("attn" if s % 2 == 0 else "mlp") + str(s // 2)
            for s in range(cfg.n_sites)]


class Layer(nn.Module):
    """One transformer block's parameters, stored in × out (y = x · W), as in the checkpoint."""

    def __init__(self, cfg, dtype):
        super().__init__()
        d, hd, z = cfg.d, cfg.head_dim, lambda *s: nn.Parameter(torch.zeros(*s, dtype=dtype))
        self.attn_norm = z(1, d)
        self.wq = z(d, cfg.n_head * hd)
        self.wk = z(d, cfg.n_kv_head * hd)
        self.wv = z(d, cfg.n_kv_head * hd)
        self.wo = z(cfg.n_head * hd, d)
        self.mlp_norm = z(1, d)
        self.w_gate = z(d, cfg.ffn)
        self.w_up = z(d, cfg.ffn)
        self.w_down = z(cfg.ffn, d)


class Route(nn.Module):
    """route.q (sites × d, init 0) and route.g (sites × d, init 1): one pair per site."""

    def __init__(self, sites, d, dtype):
        super().__init__()
        self.q = nn.Parameter(torch.zeros(sites, d, dtype=dtype))
        self.g = nn.Parameter(torch.zeros(sites, d, dtype=dtype))


class Delta(nn.Module):
    """delta.null (1 × d, the null source ν, init 0) and delta.gate (1 × 2L, the a_j, init 0)."""

    def __init__(self, cfg, dtype):
        super().__init__()
        self.null = nn.Parameter(torch.zeros(1, cfg.d, dtype=dtype))
        self.gate = nn.Parameter(torch.zeros(1, 2 * cfg.L, dtype=dtype))


class MharModel(nn.Module):
    """The decoder; ``state_dict()`` keys and shapes are the checkpoint's tensor names and shapes,
    in the order of reference/model.h's Params::for_each.

    ``MharModel(cfg, seed=1)`` draws mhar-toy's initialisation for that seed exactly (see
    ``init_parameters``; about 2 s per million parameters); ``init="torch"`` draws the same
    distribution with PyTorch's generator instead (fast, for large models, not mhar-toy's
    numbers); ``seed=None`` leaves every tensor zero (to be loaded into).
    """

    def __init__(self, cfg: Config, seed: Optional[int] = 1, dtype: torch.dtype = torch.float32,
                 init: str = "mhar", routing: str = "fast", checkpoint: bool = False) -> None:
        super().__init__()
        self.cfg = cfg.validate()
        if routing not in ROUTINGS:
            raise ValueError("routing must be one of %s, got %r" % (", ".join(ROUTINGS), routing))
        self.routing = routing  # "fast": the shared buffer (routing_stack.py); "plain": depth_route
        self.checkpoint = checkpoint  # recompute each sub-layer in the backward (not the routing)
        self.embed = nn.Parameter(torch.zeros(cfg.vocab, cfg.d, dtype=dtype))
        self.layers = nn.ModuleList(Layer(cfg, dtype) for _ in range(cfg.L))
        self.final_norm = nn.Parameter(torch.zeros(1, cfg.d, dtype=dtype))
        if cfg.routed:
            self.route = Route(cfg.n_sites, cfg.d, dtype)
        if cfg.mode == "delta":
            self.delta = Delta(cfg, dtype)
        self._groups = [site_groups(cfg, s) for s in range(cfg.n_sites)]
        self._slots = [site_slots(cfg, s) for s in range(cfg.n_sites)]
        self._pool = []  # the fast routing's buffers, reused from step to step
        self._rope = {}
        if init not in ("mhar", "torch"):
            raise ValueError("init must be 'mhar' or 'torch', got %r" % (init,))
        if seed is not None:
            self.init_parameters(seed, torch_rng=init == "torch")

    # ---- parameters ---------------------------------------------------------------------------

    def checkpoint_parameters(self) -> List[Tuple[str, nn.Parameter]]:
        """(name, parameter) in checkpoint order (PyTorch's own named_parameters order differs:
        it lists a module's direct parameters before its children's)."""
        params = dict(self.named_parameters())
        return [(name, params[name]) for name in parameter_names(self.cfg)]

    @torch.no_grad()
    def init_parameters(self, seed: int, fused: bool = True, torch_rng: bool = False) -> "MharModel":
        """docs/design.md §2: matrices N(0, 0.02²), gains 1, route.q 0, route.g 1, ν and gates 0.
        The matrices are drawn, in checkpoint order and row-major, exactly as mhar-toy draws them
        (std::mt19937_64(seed), std::normal_distribution; mhar_torch.rng), then rounded to float32:
        the same bits as `mhar-toy train --seed` and `mhar-toy grad --seed` (`fused`: see
        rng.normals). `torch_rng`: the same distribution from torch.Generator(seed) instead."""
        gen = torch.Generator().manual_seed(seed) if torch_rng else crng.MT19937_64(seed)
        for name, p in self.checkpoint_parameters():
            if decays(name) and torch_rng:
                p.copy_(torch.empty(p.shape).normal_(0.0, 0.02, generator=gen).to(p.dtype))
            elif decays(name):
                v = crng.normals(gen, p.numel(), 0.0, 0.02, fused=fused).astype(np.float32)
                p.copy_(torch.from_numpy(v).reshape(p.shape).to(p.dtype))
            elif name.endswith("norm") or name == "route.g":
                p.fill_(1.0)
            else:
                p.zero_()
        return self

    @torch.no_grad()
    def load_arrays(self, arrays: Mapping[str, Any]) -> "MharModel":
        """Copies name → array (a checkpoint's or a gradient file's tensors, in any float dtype)
        into the parameters, converting to the model's dtype; every name must be present."""
        for name, p in self.checkpoint_parameters():
            a = torch.as_tensor(np.asarray(arrays[name]))
            if tuple(a.shape) != tuple(p.shape):
                raise ValueError("tensor '%s' is %s, the model expects %s"
                                 % (name, tuple(a.shape), tuple(p.shape)))
            p.copy_(a.to(p.dtype))
        return self

    # ---- forward ------------------------------------------------------------------------------

    def _rope_for(self, T, dtype, device):
        key = (T, dtype, device)
        if key not in self._rope:
            self._rope[key] = rope_tables(T, self.cfg.head_dim, dtype, device)
        return self._rope[key]

    def _attention(self, y, x):
        cfg = self.cfg
        B, T, _ = x.shape
        hd, nh, nkv = cfg.head_dim, cfg.n_head, cfg.n_kv_head
        cos, sin = self._rope_for(T, x.dtype, x.device)
        q = rope((x @ y.wq).view(B, T, nh, hd), cos, sin).transpose(1, 2)   # [B, nh, T, hd]
        k = rope((x @ y.wk).view(B, T, nkv, hd), cos, sin).transpose(1, 2)  # [B, nkv, T, hd]
        v = (x @ y.wv).view(B, T, nkv, hd).transpose(1, 2)
        G = nh // nkv  # query heads per key/value head: query head h reads kv head h // G
        k = k.repeat_interleave(G, dim=1)
        v = v.repeat_interleave(G, dim=1)
        scores = (q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(hd))
        causal = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
        probs = torch.softmax(scores.masked_fill(~causal, float("-inf")), dim=-1)
        out = (probs @ v).transpose(1, 2).reshape(B, T, nh * hd)
        return out @ y.wo

    @staticmethod
    def _mlp(y, x):
        gate = x @ y.w_gate
        return (gate * torch.sigmoid(gate) * (x @ y.w_up)) @ y.w_down  # silu(gate) ⊙ up

    def _sources(self, s, prims):
        """Site s's sources [N, B, T, d]: the primitives (attnres, mhar) or their group sums."""
        if self.cfg.mode in ("attnres", "mhar"):
            return torch.stack(prims[: s + 1])
        srcs = []
        for _, members in self._groups[s]:
            total = None
            for k in members:
                term = self.delta.null[0].expand_as(prims[0]) if k == NULL_SOURCE else prims[k]
                total = term if total is None else total + term
            srcs.append(total)
        return torch.stack(srcs)

    def _sublayer(self, j, inp):
        """out_j = f_j(RMSNorm_j(inp)): attention for even j, the MLP for odd j; with
        ``checkpoint``, recomputed in the backward instead of kept (torch.utils.checkpoint)."""
        y = self.layers[j // 2]
        if j % 2 == 0:
            f = lambda x: self._attention(y, rmsnorm(x, y.attn_norm[0]))
        else:
            f = lambda x: self._mlp(y, rmsnorm(x, y.mlp_norm[0]))
        if self.checkpoint and torch.is_grad_enabled():
            return torch.utils.checkpoint.checkpoint(f, inp, use_reentrant=False)
        return f(inp)

    def _check_tokens(self, tokens):
        if tokens.dim() != 2 or tokens.shape[1] != self.cfg.T:
            raise ValueError("model: tokens must be B × T = B × %d, got %s"
                             % (self.cfg.T, tuple(tokens.shape)))

    def hidden(self, tokens: torch.Tensor, return_weights: bool = False):
        """The final norm's output [B, T, d] (and, with return_weights, α per site, computed by
        the plain routing whatever ``routing`` says)."""
        self._check_tokens(tokens)
        if self.cfg.routed and self.routing == "fast" and not return_weights:
            return self._hidden_fast(tokens)
        cfg = self.cfg
        H = cfg.route_heads
        stream = cfg.mode in ("residual", "delta")
        weights = []

        def route(s):
            out, alpha = depth_route(self._sources(s, prims), self.route.q[s], self.route.g[s], H,
                                     return_weights=True)
            weights.append(alpha)
            return out

        x = F.embedding(tokens, self.embed)  # E[tokens]
        prims, h = [x], x
        for j in range(2 * cfg.L):
            if cfg.mode == "residual":
                inp = h
            elif cfg.mode == "delta":
                inp = h + self.delta.gate[0, j] * route(j)
            else:
                inp = route(j)
            out = self._sublayer(j, inp)
            if stream:
                h = h + out
            prims.append(out)
        final = h if stream else route(2 * cfg.L)
        normed = rmsnorm(final, self.final_norm[0])
        return (normed, weights) if return_weights else normed

    def _hidden_fast(self, tokens):
        """hidden() with the sources in one shared buffer (site_slots): each slot written once,
        each site reading its slots in place (routing_stack.py)."""
        cfg = self.cfg
        per = 2 * cfg.layers_per_block
        x = F.embedding(tokens, self.embed)
        stack = SourceStack(self.route.q, self.route.g, cfg.route_heads, self._slots, x,
                            pool=self._pool)
        if cfg.mode == "delta":
            stack.write(self.delta.null[0].expand_as(x))  # ν
        stack.write(x)
        h, c = x, None
        for j in range(2 * cfg.L):
            if cfg.mode == "delta":
                inp = h + self.delta.gate[0, j] * stack.read(j)
            else:
                inp = stack.read(j)
            out = self._sublayer(j, inp)
            if cfg.mode == "delta":
                h = h + out
            if cfg.mode in ("attnres", "mhar"):
                stack.write(out)
            elif j < 2 * cfg.L - 1 or cfg.mode == "block":  # delta's last block has no reader
                c = out if j % per == 0 else c + out  # c_j: the block's running sum
                stack.write(c)
        final = h if cfg.mode == "delta" else stack.read(2 * cfg.L)
        return rmsnorm(final, self.final_norm[0])

    def forward(self, tokens: torch.Tensor, targets: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Logits [B, T, vocab] (tied head: RMSNorm_final(final) · Eᵀ), or with targets the mean
        cross-entropy over all B · T positions."""
        logits = self.hidden(tokens) @ self.embed.t()
        if targets is None:
            return logits
        return F.cross_entropy(logits.reshape(-1, self.cfg.vocab), targets.reshape(-1))

    def routing_weights(self, tokens: torch.Tensor) -> List[torch.Tensor]:
        """α per routing site: a list of [N_s, B, T, H] tensors (site order: attn0, mlp0, …)."""
        with torch.no_grad():
            return self.hidden(tokens, return_weights=True)[1]
