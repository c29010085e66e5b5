"""safetensors files with the standard library and NumPy, checked as tools/io/safetensors.cpp
checks them.

Layout: an 8-byte little-endian length N, N bytes of JSON header (``__metadata__``: string →
string; each tensor: dtype, shape, data_offsets into the data area), then the raw little-endian
row-major data. Only the dtypes mhar uses are read or written: F32, F64, I64. Every problem is a
FormatError whose message starts with the path, in the words of the C++ reader.

When the ``safetensors`` package is installed, ``load`` still parses the header itself (so that the
refusals stay those of the C++ reader) and hands the data to NumPy; the package is not needed.
"""

import json
import os
import tempfile

import numpy as np

MAX_HEADER_BYTES = 100_000_000  # the bound of the C++ reader and the reference implementation
DTYPES = {"F32": np.dtype("<f4"), "F64": np.dtype("<f8"), "I64": np.dtype("<i8")}
_NAMES = {v: k for k, v in DTYPES.items()}


class FormatError(Exception):
    """A file that is not valid safetensors; the message starts with the path."""


def _fail(path, *parts):
    raise FormatError(str(path) + ": " + "".join(str(p) for p in parts))


def _is_uint(v):
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def load(path):
    """Returns (metadata: dict[str, str], tensors: dict[str, np.ndarray]) in file order."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except IsADirectoryError:
        _fail(path, "cannot open: Is a directory")
    except OSError as e:
        _fail(path, "cannot open: ", e.strerror or e)
    size = len(data)
    if size < 8:
        _fail(path, "file is ", size, " bytes, too short for the 8-byte header length")
    n = int.from_bytes(data[:8], "little")
    if n > MAX_HEADER_BYTES:
        _fail(path, "header length ", n, " is absurd (limit ", MAX_HEADER_BYTES,
              "); not a safetensors file?")
    if n > size - 8:
        _fail(path, "header length ", n, " runs past the end of the file (", size, " bytes)")
    try:
        header = json.loads(data[8:8 + n].decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        _fail(path, "header is not valid JSON: ", e)
    if not isinstance(header, dict):
        _fail(path, "header must be a JSON object, got ", type(header).__name__)

    metadata, entries = {}, []
    for name, entry in header.items():
        if name == "__metadata__":
            if not isinstance(entry, dict):
                _fail(path, "__metadata__ must be an object of strings")
            for k, v in entry.items():
                if not isinstance(v, str):
                    _fail(path, "__metadata__ value of '", k, "' must be a string, got ",
                          json.dumps(v))
                metadata[k] = v
            continue
        entries.append(_parse_entry(path, name, entry))

    data_size = size - 8 - n
    _check_ranges(path, entries, data_size)
    area = memoryview(data)[8 + n:]
    tensors = {}
    for name, dtype, shape, begin, end in entries:
        arr = np.frombuffer(area[begin:end], dtype=DTYPES[dtype]).reshape(shape).copy()
        tensors[name] = arr
    return metadata, tensors


def _parse_entry(path, name, j):
    if not isinstance(j, dict):
        _fail(path, "tensor '", name, "': entry must be a JSON object, got ", json.dumps(j))
    for key in ("dtype", "shape", "data_offsets"):
        if key not in j:
            _fail(path, "tensor '", name, "': missing \"", key, "\"")
    dtype = j["dtype"]
    if not isinstance(dtype, str):
        _fail(path, "tensor '", name, "': dtype must be a string, got ", json.dumps(dtype))
    if dtype not in DTYPES:
        _fail(path, "tensor '", name, "': unknown dtype '", dtype, "' (supported: F32, F64, I64)")
    shape = j["shape"]
    if not isinstance(shape, list):
        _fail(path, "tensor '", name, "': shape must be an array, got ", json.dumps(shape))
    for d in shape:
        if not _is_uint(d):
            _fail(path, "tensor '", name, "': shape must hold non-negative integers, got ",
                  json.dumps(d))
    offsets = j["data_offsets"]
    if not isinstance(offsets, list) or len(offsets) != 2:
        _fail(path, "tensor '", name, "': data_offsets must be [begin, end], got ",
              json.dumps(offsets))
    for o in offsets:
        if not _is_uint(o):
            _fail(path, "tensor '", name, "': data_offsets must hold non-negative integers, got ",
                  json.dumps(o))
    begin, end = offsets
    if end < begin:
        _fail(path, "tensor '", name, "': data_offsets [", begin, ", ", end,
              "] end before they begin")
    numel = 1
    for d in shape:
        numel *= d
    need = numel * DTYPES[dtype].itemsize
    if end - begin != need:
        _fail(path, "tensor '", name, "': shape [", ", ".join(map(str, shape)), "] of ", dtype,
              " needs ", need, " bytes but data_offsets [", begin, ", ", end, "] span ",
              end - begin)
    return name, dtype, tuple(shape), begin, end


def _check_ranges(path, entries, data_size):
    ordered = sorted(entries, key=lambda e: (e[3], e[4], e[0]))
    max_end, cursor, tiled = 0, 0, True
    for e in ordered:
        tiled = tiled and e[3] == cursor
        cursor = e[4]
        max_end = max(max_end, e[4])
    if max_end <= data_size:
        return
    if tiled:
        _fail(path, "truncated: expected ", max_end, " bytes of tensor data, file has ", data_size)
    for e in ordered:
        if e[4] > data_size:
            _fail(path, "tensor '", e[0], "': data_offsets [", e[3], ", ", e[4],
                  "] lie outside the data area (", data_size, " bytes)")


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
    """Writes bytes to `path` through a temporary file in the same folder, fsync and rename: a
    reader (or a crash) sees the old file or the new one, never half of one."""
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(path) + ".", suffix=".tmp",
                               dir=folder)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(content)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    try:  # make the rename itself durable
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
