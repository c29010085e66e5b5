"""The byte corpus and the batches of tools/data.cpp: any file is a sequence of bytes 0…255, its
tail held out for validation; training windows are drawn by a generator seeded by
(seed, step, stream), the same windows mhar-toy draws (mhar_torch.rng)."""

import os

import numpy as np

from . import rng as crng

DEFAULT_CORPUS = "data/tinyshakespeare.txt"
_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class DataError(Exception):
    """A corpus that cannot be used; the message names the file."""


def resolve_data_path(path):
    """The default corpus is looked up in the current folder, then in this repository."""
    if path != DEFAULT_CORPUS or os.path.exists(path):
        return path
    candidate = os.path.join(_REPO, DEFAULT_CORPUS)
    return candidate if os.path.isfile(candidate) else path


def memory_available():
    """Bytes the kernel says a new allocation can have (MemAvailable), or None where unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def read_bytes(path):
    """The file's bytes. As tools/data.cpp: a directory, a FIFO or a device such as /dev/zero
    (which never ends) is refused unread, and so is a file larger than the memory available."""
    from .safetensors_io import FormatError, open_regular
    path = resolve_data_path(path)
    if os.path.isdir(path):
        raise DataError("'%s' is a directory, not a file (give a text file, e.g. --data %s)"
                        % (path, DEFAULT_CORPUS))
    try:
        f, size = open_regular(path)
    except FormatError as e:
        raise DataError(str(e)) from None
    with f:
        have = memory_available()
        if have is not None and size > have:
            raise DataError("'%s' is %d bytes, more than this machine has available"
                            % (path, size))
        try:
            return np.frombuffer(f.read(), dtype=np.uint8)
        except OSError as e:
            raise DataError("cannot read '%s': %s" % (path, e.strerror or e)) from None


class Corpus:
    def __init__(self, path, val_fraction, T):
        if not 0.0 < val_fraction < 1.0:
            raise DataError("--val-fraction must be in (0, 1), got %s" % val_fraction)
        self.path = resolve_data_path(path)
        data = read_bytes(path)
        n_val = int(len(data) * val_fraction)  # truncation, as static_cast<size_t>
        need = T + 1
        if len(data) - n_val < need or n_val < need:
            raise DataError("data file '%s' has %d bytes: too short for sequences of T = %d (each "
                            "of the training and validation splits needs at least T + 1 = %d "
                            "bytes; use a longer file or a smaller --seq-len)"
                            % (path, len(data), T, need))
        self.train = data[: len(data) - n_val]
        self.val = data[len(data) - n_val:]


def random_batch(data, B, T, seed, step, stream=0):
    """(tokens, targets), each B × T int64: B random windows of T + 1 bytes, from a generator
    seeded by (seed, step, stream) through std::seed_seq, as tools/data.cpp draws them."""
    seq = [seed & 0xFFFFFFFF, (seed >> 32) & 0xFFFFFFFF, step & 0xFFFFFFFF,
           (step >> 32) & 0xFFFFFFFF, stream & 0xFFFFFFFF]
    gen = crng.MT19937_64(seed_seq=seq)
    starts = [crng.uniform_int(gen, 0, len(data) - T - 1) for _ in range(B)]
    windows = np.stack([data[o:o + T + 1] for o in starts]).astype(np.int64)
    return windows[:, :T], windows[:, 1:]


def window_count(data, T):
    """How many non-overlapping windows of stride T fit in data."""
    return 0 if len(data) < T + 1 else (len(data) - 1) // T


def sequential_batch(data, first_window, B, T):
    """Windows first_window … first_window + B − 1 of the stride-T tiling (mhar-toy eval's)."""
    starts = [(first_window + s) * T for s in range(B)]
    windows = np.stack([data[o:o + T + 1] for o in starts]).astype(np.int64)
    return windows[:, :T], windows[:, 1:]
