#!/usr/bin/python3
"""mhar_verify: run anyone's depth-routing function on the mhar conformance cases, then grade it
with `mhar-toy verify` (one grader, in C++). Needs the standard library and NumPy; PyTorch only
for PyTorch functions. Protocol and conventions: docs/verify.md.

    /usr/bin/python3 python/mhar_verify.py --impl MODULE:FUNCTION --cases DIR [--results DIR]
        [--framework numpy|torch] [--backward MODULE:FUNCTION] [--forward-only] [--json]
        [--serves all|h1] [--convention exact|hf-rmsnorm] [--input-dtype case|float32]
        [--repeat] [--toy PATH]

The function (NumPy or PyTorch):

    fn(sources, q, g, H, eps, scale)                  -> out, or (out, alpha)
    fn(sources, q, g, H, eps, scale, partial, gate)   -> the same, for delta cases

sources [N, P, d], q [d], g [d] or None (a case without a key gain), partial [P, d], gate a
0-d value; out [P, d]; alpha [N, P, H]. By default (--input-dtype case) the arrays come in the
case's own dtype where the framework has it (torch: float32, bfloat16, float16; NumPy: float32 and
float16, and a bf16 case's values, exact, in float32 arrays: NumPy has no bfloat16);
--input-dtype float32 upcasts every input to float32. The verdict line says which was used.
The backward: for --framework torch, autograd (out.backward(dout)); for NumPy, a function given
with --backward, or as the attribute fn.backward:

    backward(sources, q, g, H, eps, scale, dout[, partial, gate]) -> dict with
        "dsources", "dq", and "dg" (gain cases) or "dpartial" and "dgate" (delta cases)

Without a backward the candidate is forward-only (announced; verify grades only out and alpha).
A function may decline a case by raising an exception named NotServed: the harness then writes
the decline marker RESULTS/<case>.declined (its reason) instead of a results file, and verify
reports the case declined (neither missing nor passed). --serves h1 declares a single-head
candidate: only the H = 1 cases are run and graded, and the verdict is COMPLETE when every one of
them is. --convention names the rounding convention verify grades under (exact, hf-rmsnorm).
Results are written as the arrays' dtype (F64, F32, BF16 or F16), with metadata "inputs" saying
what fed the case.
"""

import argparse
import contextlib
import importlib
import importlib.machinery
import importlib.util
import json
import os
import shutil
import stat
import struct
import subprocess
import sys
import tempfile
import traceback

import numpy as np

from mhar_exit import USAGE_ERRNOS, command_exit

HERE = os.path.dirname(os.path.abspath(__file__))


def die(msg, code=2):
    """A usage error (exit 2, as mhar-toy's): a bad flag, a module that does not import."""
    print(f"mhar_verify: error: {msg}", file=sys.stderr)
    sys.exit(code)


class NotServed(Exception):
    """Raise from an implementation to decline a case it does not support."""


# ---- safetensors, the few lines the protocol needs -------------------------------------------

class CaseFileError(ValueError):
    """A cases folder or case file that cannot be used; its text names the file and the fault."""


DTYPES = {"F64": "<f8", "F32": "<f4", "F16": "<f2", "BF16": "<u2"}


def read_bytes(path):
    """A regular file's bytes: a FIFO (which blocks) or a device such as /dev/zero (which never
    ends), even behind a symbolic link, is refused unread."""
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            raise CaseFileError(f"{path}: not a regular file")
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        raise CaseFileError(f"{path}: cannot read it: {e.strerror or e}") from None


def parse_json(path, text):
    """The JSON object in text (bytes), or CaseFileError in the words mhar-toy uses."""
    try:
        obj = json.loads(text)
    except UnicodeDecodeError as e:
        raise CaseFileError(f"{path}: not valid JSON (at byte {e.start + 1}: not UTF-8)") from None
    except ValueError as e:  # json.JSONDecodeError
        raise CaseFileError(f"{path}: not valid JSON (at byte {e.pos + 1})") from None
    except RecursionError:
        raise CaseFileError(f"{path}: not valid JSON here (nested too deep)") from None
    if not isinstance(obj, dict):
        raise CaseFileError(f"{path}: not a JSON object")
    return obj


def read_tensor(path, name, e, body):
    """One tensor of a safetensors file as a float32/float64 ndarray, every field checked."""
    try:
        t, shape, (b, end) = e["dtype"], [int(n) for n in e["shape"]], e["data_offsets"]
        b, end = int(b), int(end)
    except (TypeError, KeyError, ValueError, OverflowError):
        raise CaseFileError(f"{path}: tensor '{name}': dtype, shape and data_offsets "
                            "[begin, end] expected") from None
    if t not in DTYPES:
        raise CaseFileError(f"{path}: tensor '{name}' has dtype {t} (F64, F32, BF16, F16 only)")
    size = int(np.dtype(DTYPES[t]).itemsize)
    count = int(np.prod(shape, dtype=object)) if shape else 1
    if min(shape, default=0) < 0 or not 0 <= b <= end <= len(body) or end - b != count * size:
        raise CaseFileError(f"{path}: tensor '{name}': data_offsets [{b}, {end}] do not hold "
                            f"shape {shape} of {t} in {len(body)} bytes of data")
    a = np.frombuffer(body[b:end], dtype=DTYPES[t])
    if t == "F16":
        a = a.astype(np.float32)
    elif t == "BF16":
        a = (a.astype(np.uint32) << 16).view(np.float32)
    return a.reshape(shape).copy()


def read_safetensors(path):
    """(metadata dict, {name: float32/float64 ndarray}) of a safetensors file; CaseFileError,
    naming the file, for one that cannot be read or is not safetensors."""
    data = read_bytes(path)
    if len(data) < 8:
        raise CaseFileError(f"{path}: too short to be safetensors")
    (n,) = struct.unpack("<Q", data[:8])
    if n > len(data) - 8:
        raise CaseFileError(f"{path}: header length {n} runs past the end of the file")
    header = parse_json(path, data[8:8 + n])
    meta = header.pop("__metadata__", {})
    if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
        raise CaseFileError(f"{path}: __metadata__ must map names to strings")
    body = data[8 + n:]
    return meta, {name: read_tensor(path, name, e, body) for name, e in header.items()}


def read_manifest(cases):
    """The manifest of a cases folder, its "cases" list checked; CaseFileError otherwise."""
    if not os.path.isdir(cases):
        raise CaseFileError(f"{cases}: no such directory (make one with "
                            f"`mhar-toy cases --out {cases}`)")
    path = os.path.join(cases, "manifest.json")
    manifest = parse_json(path, read_bytes(path))
    entries = manifest.get("cases")
    if not isinstance(entries, list) or not all(
            isinstance(c, dict) and isinstance(c.get("file"), str) for c in entries):
        raise CaseFileError(f"{path}: malformed manifest: \"cases\" must be a list of "
                            "{\"file\": ...} objects")
    for c in entries:  # results are written under the same name: never outside --results
        f = c["file"]
        if not f or "/" in f or "\0" in f or f.startswith("."):
            raise CaseFileError(f"{path}: case file name '{f}' is not a plain file name")
    return manifest


CASE_META = ("H", "eps", "scale", "gain", "delta", "dtype")
CASE_TENSORS = ("sources", "q", "dout")


def load_case(path):
    """(meta, tensors) of one case file, with the fields the harness reads checked."""
    meta, t = read_safetensors(path)
    missing = [k for k in CASE_META if k not in meta] + [k for k in CASE_TENSORS if k not in t]
    if meta.get("gain") == "1" and "g" not in t:
        missing.append("g")
    if meta.get("delta") == "1":
        missing += [k for k in ("partial", "gate") if k not in t]
    if missing:
        raise CaseFileError(f"{path}: not a case file (no {', '.join(missing)})")
    try:
        int(meta["H"]), float(meta["eps"]), float(meta["scale"])
    except ValueError:
        raise CaseFileError(f"{path}: metadata H, eps and scale must be numbers") from None
    return meta, t


def write_error(path, e):
    """A result that cannot be written: one line naming it, mhar-toy's exit code (2 or 1)."""
    die(f"{path}: cannot write it: {e.strerror or e}", 2 if e.errno in USAGE_ERRNOS else 1)


@contextlib.contextmanager
def writing(path):
    """An OSError inside becomes write_error(path, ...)."""
    try:
        yield
    except OSError as e:
        write_error(path, e)


def write_safetensors(path, tensors, metadata=None):
    """tensors: {name: (dtype string, ndarray of the matching numpy dtype or uint16 bits)}."""
    header, blobs, offset = {}, [], 0
    if metadata:
        header["__metadata__"] = metadata
    for name, (dtype, arr) in tensors.items():
        raw = np.ascontiguousarray(arr).tobytes()
        header[name] = {"dtype": dtype, "shape": list(arr.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    text = json.dumps(header).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    tmp = path + ".tmp"
    try:
        with open(tmp, "wb") as f:
            f.write(struct.pack("<Q", len(text)))
            f.write(text)
            for b in blobs:
                f.write(b)
        os.replace(tmp, path)
    except OSError as e:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        write_error(path, e)


def as_stored(x):
    """A result (NumPy array or torch tensor) as (safetensors dtype, little-endian array)."""
    if hasattr(x, "detach"):  # torch
        import torch
        x = x.detach().cpu()
        if x.dtype == torch.bfloat16:
            bits = x.contiguous().view(torch.int16).numpy().view(np.uint16)
            return "BF16", bits.astype("<u2")
        x = x.numpy()
    x = np.asarray(x)
    if x.dtype == np.float64:
        return "F64", x.astype("<f8")
    if x.dtype == np.float16:
        return "F16", x.astype("<f2")
    return "F32", x.astype("<f4")


# ---- running an implementation ----------------------------------------------------------------

def import_from_cwd(name):
    """Imports module `name` as `python -m` would, the current folder first (the `mhar-verify`
    console script's import path lacks it), without changing sys.path."""
    top = name.split(".")[0]
    spec = None
    if top not in sys.modules:
        spec = importlib.machinery.PathFinder.find_spec(top, [os.getcwd()])
    if spec is not None:
        sys.modules[top] = importlib.util.module_from_spec(spec)
        try:
            spec.loader.exec_module(sys.modules[top])
        except BaseException:
            del sys.modules[top]
            raise
    return importlib.import_module(name)


def load_callable(spec, what):
    if ":" not in spec:
        die(f"{what} '{spec}' must be MODULE:FUNCTION")
    mod_name, fn_name = spec.rsplit(":", 1)
    try:
        if mod_name.endswith(".py") or os.sep in mod_name:
            s = importlib.util.spec_from_file_location(os.path.basename(mod_name)[:-3], mod_name)
            mod = importlib.util.module_from_spec(s)
            s.loader.exec_module(mod)
        else:
            mod = import_from_cwd(mod_name)
    except Exception as e:  # the user's module: say what failed, no traceback wall
        die(f"cannot import {mod_name}: {type(e).__name__}: {e}")
    fn = getattr(mod, fn_name, None)
    if not callable(fn):
        die(f"{mod_name} has no function '{fn_name}'")
    return fn


def case_inputs(meta, t):
    H = int(meta["H"])
    eps = float(meta["eps"])
    scale = float(meta["scale"])
    gain = meta["gain"] == "1"
    delta = meta["delta"] == "1"
    return dict(sources=t["sources"], q=t["q"], g=t["g"] if gain else None, H=H, eps=eps,
                scale=scale, partial=t["partial"] if delta else None,
                gate=t["gate"] if delta else None, dout=t["dout"], gain=gain, delta=delta)


def split_result(r):
    if isinstance(r, (tuple, list)):
        return r[0], (r[1] if len(r) > 1 else None)
    return r, None


def numpy_inputs(c, meta, input_dtype):
    """The case's arrays for a NumPy candidate, and what to record as its "inputs"."""
    if input_dtype == "float32" or meta["dtype"] == "f32":
        return c, "float32" if meta["dtype"] != "f32" else "case"
    if meta["dtype"] == "bf16":
        return c, "case (bf16 values in float32 arrays: NumPy has no bfloat16)"
    c = dict(c)
    for k in ("sources", "q", "g", "partial", "gate", "dout"):
        if c[k] is not None:
            c[k] = np.asarray(c[k]).astype(np.float16)
    return c, "case"


def run_numpy(fn, backward, c):
    args = [c["sources"], c["q"], c["g"], c["H"], c["eps"], c["scale"]]
    if c["delta"]:
        args += [c["partial"], c["gate"]]
    out, alpha = split_result(fn(*args))
    res = {"out": out}
    if alpha is not None:
        res["alpha"] = alpha
    if backward is not None:
        bargs = args[:6] + [c["dout"]] + args[6:]
        grads = backward(*bargs)
        for k in ("dsources", "dq", "dg", "dpartial", "dgate"):
            if k in grads and grads[k] is not None:
                res[k] = grads[k]
    return res


def run_torch(fn, c, input_dtype, meta):
    import torch
    dt = torch.float32
    if input_dtype == "case":
        dt = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}[meta["dtype"]]

    def leaf(a):
        return torch.tensor(np.asarray(a, dtype=np.float32), dtype=dt, requires_grad=True)

    S, q = leaf(c["sources"]), leaf(c["q"])
    g = leaf(c["g"]) if c["gain"] else None
    args = [S, q, g, c["H"], c["eps"], c["scale"]]
    partial = gate = None
    if c["delta"]:
        partial, gate = leaf(c["partial"]), leaf(c["gate"])
        args += [partial, gate]
    out, alpha = split_result(fn(*args))
    out.backward(torch.tensor(np.asarray(c["dout"], dtype=np.float32), dtype=out.dtype))
    res = {"out": out}
    if alpha is not None:
        res["alpha"] = alpha
    res["dsources"], res["dq"] = S.grad, q.grad
    if g is not None:
        res["dg"] = g.grad
    if partial is not None:
        res["dpartial"], res["dgate"] = partial.grad, gate.grad
    for k in list(res):
        if res[k] is None:
            del res[k]  # an input the function never used: verify reports it missing
    return res


def run_case(a, fn, backward, c, meta):
    """Runs the candidate on one case: (results dict, what fed it)."""
    if a.framework == "torch":
        fed = "case" if a.input_dtype == "case" or meta["dtype"] == "f32" else "float32"
        return run_torch(fn, c, a.input_dtype, meta), fed
    c, fed = numpy_inputs(c, meta, a.input_dtype)
    return run_numpy(fn, backward, c), fed


def decline_marker(path):
    """RESULTS/NN-id.dtype.declined for RESULTS/NN-id.dtype.safetensors (verify's name)."""
    return path[:-len(".safetensors")] + ".declined" if path.endswith(".safetensors") else path + ".declined"


def run_all(a, fn, backward, manifest, out_dir):
    """Runs every case in scope into out_dir: results files, or decline markers."""
    with writing(out_dir):
        os.makedirs(out_dir, exist_ok=True)
    declined = failed = skipped = 0
    for entry in manifest["cases"]:
        try:
            meta, t = load_case(os.path.join(a.cases, entry["file"]))
        except CaseFileError as e:
            die(str(e))
        target = os.path.join(out_dir, entry["file"])
        for old in (target, decline_marker(target)):
            if os.path.lexists(old):
                with writing(old):
                    os.remove(old)
        if a.serves == "h1" and int(meta["H"]) != 1:
            skipped += 1
            continue
        try:
            res, fed = run_case(a, fn, backward, case_inputs(meta, t), meta)
        except Exception as e:  # noqa: BLE001: the user's code; report and go on
            if type(e).__name__ == "NotServed":
                declined += 1
                with writing(decline_marker(target)), open(decline_marker(target), "w") as f:
                    f.write(f"{e}\n")
                print(f"  {entry['file']}: declined ({e})")
            else:
                failed += 1
                last = traceback.extract_tb(e.__traceback__)[-1]
                print(f"  {entry['file']}: the function raised {type(e).__name__}: {e} "
                      f"({os.path.basename(last.filename)}:{last.lineno}); no results")
            continue
        write_safetensors(target, {k: as_stored(v) for k, v in res.items()}, {"inputs": fed})
    scope = f", {skipped} out of scope (--serves h1)" if skipped else ""
    print(f"mhar_verify: {a.impl} ({a.framework}) on {len(manifest['cases']) - skipped} cases -> "
          f"{out_dir} ({declined} declined, {failed} raised{scope})")


def find_toy(arg):
    for cand in (arg, os.environ.get("MHAR_TOY"),
                 os.path.join(HERE, "..", "build", "tools", "mhar-toy"), shutil.which("mhar-toy")):
        if cand and os.path.isfile(cand) and os.access(cand, os.X_OK):
            return cand
    die("mhar-toy not found (build it with scripts/build.sh, or pass --toy PATH or set MHAR_TOY)")


def main(argv=None):
    """The command line (`mhar-verify`); exit codes as mhar-toy's (docs/cli.md)."""
    return command_exit("mhar_verify", run, argv, "; no verdict")


def run(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--impl", required=True, help="MODULE:FUNCTION (module name or path to a .py)")
    ap.add_argument("--cases", required=True, help="directory written by `mhar-toy cases`")
    ap.add_argument("--results", help="where to write the results (default: a temporary folder)")
    ap.add_argument("--framework", choices=["numpy", "torch"], default="numpy")
    ap.add_argument("--backward", help="MODULE:FUNCTION of a NumPy backward (default fn.backward)")
    ap.add_argument("--forward-only", action="store_true", help="grade the forward only")
    ap.add_argument("--input-dtype", choices=["case", "float32"], default="case",
                    help="feed bf16/f16 cases in their own dtype (default), or upcast to float32")
    ap.add_argument("--serves", choices=["all", "h1"], default="all",
                    help="the cases the function serves: all, or h1 (single-head: H = 1 only)")
    ap.add_argument("--convention", choices=["exact", "hf-rmsnorm"], default="exact",
                    help="the rounding convention verify grades under")
    ap.add_argument("--json", action="store_true", help="verify prints JSON")
    ap.add_argument("--repeat", action="store_true",
                    help="run twice and have verify check that the bits are identical")
    ap.add_argument("--toy", help="path of mhar-toy (default: build/tools/mhar-toy, $MHAR_TOY)")
    a = ap.parse_args(argv)

    toy = find_toy(a.toy)
    try:
        manifest = read_manifest(a.cases)
    except CaseFileError as e:
        die(str(e))
    fn = load_callable(a.impl, "--impl")
    backward = None
    forward_only = a.forward_only
    if a.framework == "numpy" and not forward_only:
        backward = load_callable(a.backward, "--backward") if a.backward else getattr(fn, "backward", None)
        if backward is None:
            forward_only = True
            print("mhar_verify: no backward given (--backward, or fn.backward): a forward-only "
                  "candidate; the gradients are not checked")
    if a.framework == "torch":
        try:
            import torch  # noqa: F401
        except ImportError as e:
            print(f"mhar_verify: error: --framework torch, but torch cannot be imported: {e}",
                  file=sys.stderr)
            return 4
    results = a.results or tempfile.mkdtemp(prefix="mhar_results_")
    runs = [results] + ([results + ".repeat"] if a.repeat else [])
    for out_dir in runs:  # results take the cases' file names: they would replace the cases
        if os.path.isdir(out_dir) and os.path.samefile(out_dir, a.cases):
            die(f"--results {out_dir} is the cases folder; results are written under the cases' "
                "own file names, so give another folder")
    for out_dir in runs:
        run_all(a, fn, backward, manifest, out_dir)
    cmd = [toy, "verify", "--cases", a.cases, "--results", results, "--serves", a.serves,
           "--convention", a.convention]
    if forward_only:
        cmd.append("--forward-only")
    if a.repeat:
        cmd += ["--repeat", runs[1]]
    if a.json:
        cmd.append("--json")
    sys.stdout.flush()
    return subprocess.call(cmd)


if __name__ == "__main__":
    sys.exit(main())
