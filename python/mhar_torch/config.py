"""The model config: the fields, defaults and checks of reference/model.h (``mhar::Config``)."""

import dataclasses
import json

MODES = ("residual", "attnres", "mhar", "block", "delta")
FIELDS = ("vocab", "d", "L", "n_head", "n_kv_head", "ffn", "T", "mode", "H", "n_blocks")


class ConfigError(ValueError):
    """A config that the reference would refuse; the message names the field."""


@dataclasses.dataclass
class Config:
    vocab: int = 256    # bytes
    d: int = 128        # model width
    L: int = 4          # transformer blocks (2L sub-layers)
    n_head: int = 4     # query heads (hd = d / n_head)
    n_kv_head: int = 2  # key/value heads (grouped-query attention)
    ffn: int = 352      # SwiGLU hidden width
    T: int = 128        # tokens per sequence
    mode: str = "mhar"
    H: int = 0          # routing heads; 0 = n_kv_head (attnres always uses 1)
    n_blocks: int = 2   # blocks for `block` and `delta`

    @property
    def head_dim(self):
        return self.d // self.n_head

    @property
    def route_heads(self):
        """Routing heads actually used: 1 for attnres, H (or n_kv_head when H = 0) otherwise."""
        if self.mode == "attnres":
            return 1
        return self.H if self.H > 0 else self.n_kv_head

    @property
    def routed(self):
        return self.mode != "residual"

    @property
    def n_sites(self):
        """0 (residual), 2L (delta: the final read is the stream), 2L + 1 otherwise."""
        if self.mode == "residual":
            return 0
        return 2 * self.L if self.mode == "delta" else 2 * self.L + 1

    @property
    def layers_per_block(self):
        return (self.L + self.n_blocks - 1) // self.n_blocks

    def validate(self):
        """Raises ConfigError with the reference's message (Config::validate)."""
        def require(ok, *parts):
            if not ok:
                raise ConfigError("config: " + "".join(str(p) for p in parts))

        for name in FIELDS:
            v = getattr(self, name)
            if name == "mode":
                require(isinstance(v, str), "mode must be a string, got ", repr(v))
            else:
                require(isinstance(v, int) and not isinstance(v, bool), name,
                        " must be an integer, got ", repr(v))
        require(self.mode in MODES, "unknown residual mode '", self.mode,
                "' (allowed: residual, attnres, mhar, block, delta)")
        require(self.vocab >= 2, "vocab must be at least 2, got ", self.vocab)
        require(self.d >= 1, "d must be positive, got ", self.d)
        require(self.L >= 1, "L must be positive, got ", self.L)
        require(self.T >= 1, "T (sequence length) must be positive, got ", self.T)
        require(self.ffn >= 1, "ffn must be positive, got ", self.ffn)
        require(self.n_head >= 1 and self.n_kv_head >= 1,
                "n_head and n_kv_head must be positive, got ", self.n_head, " and ", self.n_kv_head)
        require(self.n_head % self.n_kv_head == 0, "n_head = ", self.n_head,
                " must be a multiple of n_kv_head = ", self.n_kv_head)
        require(self.d % self.n_head == 0, "n_head = ", self.n_head, " must divide d = ", self.d)
        require(self.head_dim % 2 == 0, "head width d / n_head = ", self.head_dim,
                " must be even (RoPE rotates column pairs)")
        require(self.H >= 0, "routing heads H must be positive (or 0 for the default), got ",
                self.H)
        if self.routed:
            divisors = ", ".join(str(k) for k in range(1, self.d + 1) if self.d % k == 0)
            require(self.d % self.route_heads == 0, "routing heads H = ", self.route_heads,
                    " must divide d = ", self.d, " (allowed: ", divisors, ")")
        if self.mode in ("block", "delta"):
            require(1 <= self.n_blocks <= self.L, "n_blocks must be in [1, L = ", self.L,
                    "], got ", self.n_blocks)
        return self

    def to_dict(self):
        """The checkpoint's `config` object; H is the heads actually used (1 for attnres)."""
        d = {name: getattr(self, name) for name in FIELDS}
        d["H"] = self.route_heads
        return d

    def to_json(self):
        """As mhar-toy writes it: keys sorted, no spaces."""
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_dict(cls, j, where="config"):
        """Reads and validates a config; ConfigError naming `where` on a missing or bad field."""
        if not isinstance(j, dict):
            raise ConfigError("%s: bad model config: not a JSON object" % where)
        missing = [k for k in FIELDS if k not in j]
        if missing:
            raise ConfigError("%s: bad model config: missing key '%s'" % (where, missing[0]))
        try:
            return cls(**{k: j[k] for k in FIELDS}).validate()
        except ConfigError as e:
            raise ConfigError("%s: bad model config: %s" % (where, e)) from None
