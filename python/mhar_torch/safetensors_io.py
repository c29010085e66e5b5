"""safetensors files with the standard library and NumPy, checked as tools/io/safetensors.cpp
checks them.

Layout: an 8-byte little-endian length N, N bytes of JSON header (``__metadata__``: string →
string; each tensor: dtype, shape, data_offsets into the data area), then the raw little-endian
row-major data. F32, F64 and I64 are read and written; BF16 and F16 (the verify kit's storage
dtypes) are read. Every file is held to the rules of docs/checkpoint-format.md ("What a reader
refuses"), and every problem is a FormatError whose message starts with the path, in the words of
the C++ reader (tools/io/safetensors_header.cpp).

When the ``safetensors`` package is installed, ``load`` still parses the header itself (so that the
refusals stay those of the C++ reader) and hands the data to NumPy; the package is not needed.
"""

import json
import os
import stat

import numpy as np

MAX_HEADER_BYTES = 100_000_000  # the bound of the C++ reader and the reference implementation
MAX_METADATA_ENTRIES = 4096     # tools/io/safetensors.h, kMaxMetadataEntries
MAX_TENSORS = 65536             # tools/io/safetensors.h, kMaxTensors
MAX_INDEX = 2 ** 63 - 1         # shape and data_offsets values: int64 in the C++ reader
DTYPES = {"F32": np.dtype("<f4"), "F64": np.dtype("<f8"), "I64": np.dtype("<i8")}
_NAMES = {v: k for k, v in DTYPES.items()}
# Read, never written: the verify kit's storage dtypes (tools/io/half.h).
_READ_ONLY = {"BF16": None, "F16": np.dtype("<f2")}


class FormatError(Exception):
    """A file that is not valid safetensors; the message starts with the path."""


def _fail(path, *parts):
    raise FormatError(str(path) + ": " + "".join(str(p) for p in parts))


def _is_index(v):
    return type(v) is int and 0 <= v <= MAX_INDEX


def _kind(mode):
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"


def open_regular(path):
    """A regular file opened for reading, and its size. stat() comes first, so a FIFO (which
    would block) or a device such as /dev/zero (which never ends) is refused unread."""
    try:
        mode = os.stat(path).st_mode
    except OSError as e:
        _fail(path, "cannot open: ", e.strerror or e)
    if not stat.S_ISREG(mode):
        _fail(path, "is ", _kind(mode), ", not a regular file")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        _fail(path, "cannot open: ", e.strerror or e)
    f = os.fdopen(fd, "rb")
    size = os.fstat(fd).st_size
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        f.close()
        _fail(path, "is not a regular file")
    return f, size


def _read_exact(f, path, n):
    data = f.read(n)
    if len(data) != n:
        _fail(path, "ended early (was it truncated while being read?)")
    return data


class _Duplicate(Exception):
    pass


def _pairs(pairs):
    """object_pairs_hook: a key may appear once in an object."""
    d = {}
    for k, v in pairs:
        if k in d:
            raise _Duplicate(k)
        d[k] = v
    return d


def _no_constant(name):
    raise ValueError("%s is not JSON" % name)


def parse_json_strict(text, path, what="header"):
    """One JSON value under the rules of docs/checkpoint-format.md: no duplicate key, no NaN or
    Infinity, no byte-order mark; nesting too deep is refused, never a RecursionError."""
    try:
        return json.loads(text, object_pairs_hook=_pairs, parse_constant=_no_constant)
    except _Duplicate as e:
        _fail(path, what, ": the key '", str(e)[:40], "' appears twice in one object")
    except RecursionError:
        _fail(path, what, " is nested too deeply")
    except ValueError as e:  # JSONDecodeError, and int() of a number with too many digits
        pos = getattr(e, "pos", None)
        _fail(path, what, " is not valid JSON", "" if pos is None else " at byte %d" % (pos + 1))


def read_header(f, path, size):
    """(metadata, entries, header length) of an open file, every rule checked."""
    if size < 8:
        _fail(path, "file is ", size, " bytes, too short for the 8-byte header length")
    n = int.from_bytes(_read_exact(f, path, 8), "little")
    if n > MAX_HEADER_BYTES:
        _fail(path, "header length ", n, " is absurd (limit ", MAX_HEADER_BYTES,
              "); not a safetensors file?")
    if n > size - 8:
        _fail(path, "header length ", n, " runs past the end of the file (", size, " bytes)")
    raw = _read_exact(f, path, n)
    if not raw.startswith(b"{"):
        _fail(path, "the header must be a JSON object starting with '{', it starts with ",
              repr(raw[:8]))
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        _fail(path, "header is not valid JSON at byte ", e.start + 1, ": not UTF-8")
    header = parse_json_strict(text, path)
    if len(header) - ("__metadata__" in header) > MAX_TENSORS:
        _fail(path, "the header lists more than ", MAX_TENSORS, " tensors")
    metadata, entries = {}, []
    for name, entry in header.items():
        if name == "__metadata__":
            metadata = _parse_metadata(path, entry)
        else:
            entries.append(_parse_entry(path, name, entry))
    _check_tiling(path, entries, size - 8 - n)
    return metadata, entries, n


def load(path, check=None):
    """Returns (metadata: dict[str, str], tensors: dict[str, np.ndarray]) in offset order.
    `check(metadata, entries)`, when given, runs on the checked header before any tensor is read
    (entries: (name, dtype, shape, begin, end)); it refuses by raising."""
    f, size = open_regular(path)
    with f:
        metadata, entries, n = read_header(f, path, size)
        if check is not None:
            check(metadata, entries)
        tensors = {}
        for name, dtype, shape, begin, end in entries:
            f.seek(8 + n + begin)
            raw = _read_exact(f, path, end - begin)
            tensors[name] = _decode(raw, dtype, shape)
    return metadata, tensors


def _decode(raw, dtype, shape):
    if dtype == "BF16":  # the high half of a float32
        bits = np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16
        return bits.view(np.float32).reshape(shape).copy()
    return np.frombuffer(raw, dtype=DTYPES.get(dtype, _READ_ONLY.get(dtype))).reshape(shape).copy()


def _parse_metadata(path, entry):
    if not isinstance(entry, dict):
        _fail(path, "__metadata__ must be an object of strings")
    if len(entry) > MAX_METADATA_ENTRIES:
        _fail(path, "__metadata__ holds more than ", MAX_METADATA_ENTRIES, " entries")
    for k, v in entry.items():
        if not isinstance(v, str):
            _fail(path, "__metadata__ value of '", k[:40], "' must be a string, got ",
                  type(v).__name__)
    return dict(entry)


def _parse_entry(path, name, j):
    where = "tensor '%s': " % name[:40]
    if not isinstance(j, dict):
        _fail(path, where, "entry must be a JSON object, got ", type(j).__name__)
    for key in ("dtype", "shape", "data_offsets"):
        if key not in j:
            _fail(path, where, "missing \"", key, "\"")
    extra = sorted(set(j) - {"dtype", "shape", "data_offsets"})
    if extra:
        _fail(path, where, "unknown field '", extra[0][:40],
              "' (an entry holds dtype, shape and data_offsets)")
    dtype = j["dtype"]
    if not isinstance(dtype, str):
        _fail(path, where, "dtype must be a string, got ", type(dtype).__name__)
    if dtype not in DTYPES and dtype not in _READ_ONLY:
        _fail(path, where, "unsupported dtype '", dtype[:40],
              "' (supported: F32, F64, I64, BF16, F16)")
    shape, offsets = j["shape"], j["data_offsets"]
    if not isinstance(shape, list):
        _fail(path, where, "shape must be an array, got ", type(shape).__name__)
    if not isinstance(offsets, list) or len(offsets) != 2:
        _fail(path, where, "data_offsets must be [begin, end]")
    for field, values in (("shape", shape), ("data_offsets", offsets)):
        for v in values:
            if not _is_index(v):
                _fail(path, where, field, " must hold exact non-negative integers, got ",
                      json.dumps(v) if isinstance(v, (int, float, bool)) else type(v).__name__)
    begin, end = offsets
    if end < begin:
        _fail(path, where, "data_offsets [", begin, ", ", end, "] end before they begin")
    numel = 1
    for d in shape:
        numel *= d
    itemsize = 2 if dtype in _READ_ONLY else DTYPES[dtype].itemsize
    need = numel * itemsize
    if end - begin != need:
        _fail(path, where, "shape [", ", ".join(map(str, shape)), "] of ", dtype, " needs ", need,
              " bytes but data_offsets [", begin, ", ", end, "] span ", end - begin)
    return name, dtype, tuple(shape), begin, end


def _check_tiling(path, entries, data_size):
    """The tensors, in offset order, tile [0, data_size) exactly: no overlap, gap or tail."""
    entries.sort(key=lambda e: (e[3], e[4]))
    cursor, prev = 0, None
    for name, _, _, begin, end in entries:
        where = "tensor '%s': data_offsets [%d, %d]" % (name[:40], begin, end)
        if begin < cursor:
            _fail(path, where, " overlap tensor '", prev[:40], "' (tensors may not share bytes)")
        if begin > cursor:
            _fail(path, where, " leave a gap of ", begin - cursor, " bytes before it (the data "
                  "area must be fully indexed, without holes)")
        cursor, prev = end, name
    if cursor > data_size:
        _fail(path, "truncated: expected ", cursor, " bytes of tensor data, file has ", data_size)
    if cursor < data_size:
        _fail(path, data_size - cursor, " bytes follow the last tensor (the data area must be "
              "fully indexed, with nothing after it)")


def encode(tensors, metadata=None):
    """The bytes of a safetensors file: tensors (name → array, in order) back to back from 0."""
    header = {}
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in sorted(metadata.items())}
    blobs, offset = [], 0
    for name, arr in tensors.items():
        if not name or name == "__metadata__":
            raise FormatError("cannot save a tensor named '%s' (empty or reserved)" % name)
        a = np.ascontiguousarray(arr)
        dt = a.dtype.newbyteorder("<") if a.dtype.byteorder == ">" else a.dtype
        if dt not in _NAMES:
            raise FormatError("tensor '%s': dtype %s is not F32, F64 or I64" % (name, a.dtype))
        raw = a.astype(dt, copy=False).tobytes()
        header[name] = {"dtype": _NAMES[dt], "shape": list(a.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    text = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    text += b" " * ((8 - len(text) % 8) % 8)  # the data area starts at a multiple of 8
    return len(text).to_bytes(8, "little") + text + b"".join(blobs)


def write_atomic(path, content):
    """Writes bytes to `path` through a temporary file beside it, fsync and rename: a reader (or a
    crash) sees the old file or the new one, never half of one. The temporary is
    "<path>.tmp-<pid>", the name mhar-toy's writer gives its own, so that either program's resume
    removes what a killed writer left (run_dir.remove_stale_temporaries, tools/run_dir.h); the
    file gets the permissions the umask allows, as one `open` would give it. An OSError names
    `path` (its filename) and says what failed."""
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    tmp = "%s.tmp-%d" % (path, os.getpid())
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o666)
    except OSError as e:  # name the file asked for, not the temporary one
        raise OSError(e.errno, "cannot write it: %s" % e.strerror, path) from None
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(content)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        if isinstance(e, OSError):  # name the file being written, not the temporary one
            raise OSError(e.errno, "writing it failed: %s (an earlier file of that name is kept)"
                          % e.strerror, path) from None
        raise
    fsync_dir(folder)  # make the rename itself durable


def fsync_dir(folder):
    """fsync a folder, so that a rename in it survives a crash (best effort: some file systems
    refuse it)."""
    try:
        dfd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    except OSError:
        pass


def save(path, tensors, metadata=None):
    """Writes a safetensors file atomically."""
    write_atomic(path, encode(tensors, metadata))
