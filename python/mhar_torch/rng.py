"""The C++ standard library's random numbers, as mhar-toy draws them (GCC's libstdc++).

mhar-toy initialises a model with ``std::mt19937_64(seed)`` and ``std::normal_distribution``
(reference/tensor.h, ``Rng``), and draws its training windows from ``std::mt19937_64`` seeded
through ``std::seed_seq`` with ``std::uniform_int_distribution`` (tools/data.cpp,
``random_batch``). Reproducing those draws here gives the PyTorch twin the same initial
parameters, bit for bit, and the same batches as ``mhar-toy train``; the tests check both
against files mhar-toy wrote. The engine and the seed sequence are fixed by the C++ standard;
the two distributions follow libstdc++ (GCC 11 and later): Lemire's multiply-and-reject for
integers, and the Marsaglia polar method, one fresh distribution per draw, for normals.
"""

import math

import numpy as np

_MASK64 = (1 << 64) - 1
_MASK32 = (1 << 32) - 1

# mt19937_64's parameters ([rand.predef] in the C++ standard).
_N, _M = 312, 156
_MATRIX_A = 0xB5026F5AA96619E9
_UPPER = 0xFFFFFFFF80000000  # the top w − r = 33 bits
_LOWER = 0x000000007FFFFFFF  # the low r = 31 bits


def seed_seq_generate(values, n):
    """std::seed_seq(values).generate(n words): n 32-bit words ([rand.util.seedseq])."""
    v = [x & _MASK32 for x in values]
    s = len(v)
    b = [0x8B8B8B8B] * n
    t = 11 if n >= 623 else 7 if n >= 68 else 5 if n >= 39 else 3 if n >= 7 else (n - 1) // 2
    p = (n - t) // 2
    q = p + t
    m = max(s + 1, n)

    def mix(x):
        return x ^ (x >> 27)

    for k in range(m):
        r1 = (1664525 * mix(b[k % n] ^ b[(k + p) % n] ^ b[(k - 1) % n])) & _MASK32
        if k == 0:
            r2 = r1 + s
        elif k <= s:
            r2 = r1 + k % n + v[k - 1]
        else:
            r2 = r1 + k % n
        r2 &= _MASK32
        b[(k + p) % n] = (b[(k + p) % n] + r1) & _MASK32
        b[(k + q) % n] = (b[(k + q) % n] + r2) & _MASK32
        b[k % n] = r2
    for k in range(m, m + n):
        r3 = (1566083941 * mix((b[k % n] + b[(k + p) % n] + b[(k - 1) % n]) & _MASK32)) & _MASK32
        r4 = (r3 - k % n) & _MASK32
        b[(k + p) % n] ^= r3
        b[(k + q) % n] ^= r4
        b[k % n] = r4
    return b


class MT19937_64:
    """std::mt19937_64: seeded by an integer or by a std::seed_seq's values."""

    def __init__(self, seed=5489, seed_seq=None):
        if seed_seq is not None:
            words = seed_seq_generate(seed_seq, 2 * _N)
            x = [words[2 * i] | (words[2 * i + 1] << 32) for i in range(_N)]
            if (x[0] & _UPPER) == 0 and all(w == 0 for w in x[1:]):
                x[0] = 1 << 63
        else:
            x = [seed & _MASK64]
            for i in range(1, _N):
                prev = x[-1]
                x.append((6364136223846793005 * (prev ^ (prev >> 62)) + i) & _MASK64)
        self._state = np.array(x, dtype=np.uint64)
        self._out = np.empty(0, dtype=np.uint64)
        self._pos = 0

    def _twist(self):
        x = self._state
        one = np.uint64(1)
        a = np.uint64(_MATRIX_A)
        up, lo = np.uint64(_UPPER), np.uint64(_LOWER)

        def step(i0, i1):  # x[i] for i in [i0, i1): the recurrence, in place, in order
            i = np.arange(i0, i1)
            y = (x[i] & up) | (x[(i + 1) % _N] & lo)
            x[i] = x[(i + _M) % _N] ^ (y >> one) ^ np.where((y & one) == one, a, np.uint64(0))

        # x[i + m] is read before it is rewritten for i < n − m, after for i ≥ n − m; the last
        # entry reads the new x[0]. Three vectorised pieces keep the sequential order.
        step(0, _N - _M)
        step(_N - _M, _N - 1)
        step(_N - 1, _N)
        z = x.copy()
        z ^= (z >> np.uint64(29)) & np.uint64(0x5555555555555555)
        z ^= (z << np.uint64(17)) & np.uint64(0x71D67FFFEDA60000)
        z ^= (z << np.uint64(37)) & np.uint64(0xFFF7EEE000000000)
        z ^= z >> np.uint64(43)
        self._out = z
        self._pos = 0

    def next_u64(self):
        if self._pos >= len(self._out):
            self._twist()
        r = int(self._out[self._pos])
        self._pos += 1
        return r

    def next_block(self, count):
        """The next `count` outputs as a uint64 array."""
        parts = []
        while count > 0:
            if self._pos >= len(self._out):
                self._twist()
            take = min(count, len(self._out) - self._pos)
            parts.append(self._out[self._pos:self._pos + take])
            self._pos += take
            count -= take
        return np.concatenate(parts) if parts else np.empty(0, dtype=np.uint64)

    def unread(self, values):
        """Puts outputs drawn by next_block back, to be returned again next (in order)."""
        if len(values):
            self._out = np.concatenate([values, self._out[self._pos:]])
            self._pos = 0


def uniform_int(gen, lo, hi):
    """std::uniform_int_distribution<std::size_t>(lo, hi)(gen) with a 64-bit engine."""
    span = hi - lo + 1  # the engine's range (2^64) is larger: Lemire's method, 128-bit products
    product = gen.next_u64() * span
    low = product & _MASK64
    if low < span:
        threshold = ((1 << 64) - span) % span
        while low < threshold:
            product = gen.next_u64() * span
            low = product & _MASK64
    return lo + (product >> 64)


def _fma_square_plus(x, c):
    """x · x + c rounded once, as a fused multiply-add computes it. x² = hi + lo exactly
    (Dekker's product), hi + c = s + e exactly (Knuth's two-sum), then s + (e + lo) rounds the
    exact sum, but for the e + lo rounding: that matters only within 2⁻⁵³ relative of a rounding
    boundary of s, a case no draw of a test model meets (the tests check the draws bit for bit)."""
    split = 134217729.0 * x  # 2^27 + 1
    xh = split - (split - x)
    xl = x - xh
    hi = x * x
    lo = ((xh * xh - hi) + 2.0 * xh * xl) + xl * xl
    s = hi + c
    bb = s - hi
    e = (hi - (s - bb)) + (c - bb)
    return s + (e + lo)


def normals(gen, count, mean=0.0, stddev=1.0, fused=True):
    """`count` draws, each from a fresh std::normal_distribution<double>(mean, stddev), as
    float64. The polar method draws pairs (x, y) of uniforms in [−1, 1) until
    0 < r² = x² + y² ≤ 1 and returns y · sqrt(−2 log r² / r²); a fresh distribution per draw
    discards the other value. `fused`: r² = fma(x, x, y · y), as GCC contracts it when it may use
    FMA instructions (mhar's default -march=x86-64-v3 build); False: two roundings."""
    out = np.empty(count, dtype=np.float64)
    filled = 0
    two64 = float(1 << 64)
    below_one = math.nextafter(1.0, 0.0)
    while filled < count:
        need = count - filled
        raw = gen.next_block(2 * (need + need // 4 + 8))
        u = np.minimum(raw.astype(np.float64) / two64, below_one)  # generate_canonical
        x = 2.0 * u[0::2] - 1.0
        y = 2.0 * u[1::2] - 1.0
        r2 = _fma_square_plus(x, y * y) if fused else x * x + y * y
        ok = np.flatnonzero((r2 <= 1.0) & (r2 != 0.0))
        if len(ok) >= need:
            ok = ok[:need]
            gen.unread(raw[2 * (ok[-1] + 1):])
        rs = r2[ok]
        logs = np.array([math.log(v) for v in rs.tolist()])  # the C library's log, as in C++
        mult = np.sqrt(-2.0 * logs / rs)
        out[filled:filled + len(ok)] = y[ok] * mult * stddev + mean
        filled += len(ok)
    return out
