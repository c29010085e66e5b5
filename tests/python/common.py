"""Shared by the py: tests: the torch check (exit 77 = SKIPPED, never a pass), paths, running
mhar-toy, and the per-tensor relative error."""

import os
import subprocess
import sys

SKIP = 77  # ctest SKIP_RETURN_CODE
HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
PYTHON_DIR = os.path.join(REPO, "python")
CORPUS = os.path.join(REPO, "data", "tinyshakespeare.txt")


def need_torch():
    """Imports torch or exits with SKIP, saying why."""
    try:
        import torch  # noqa: F401
        import numpy  # noqa: F401
    except Exception as e:  # ImportError, or a broken install raising something else
        print("SKIPPED: PyTorch (or NumPy) cannot be imported by %s: %s: %s. Install Debian's "
              "python3-torch and python3-numpy (scripts/setup.sh) to run this test."
              % (sys.executable, type(e).__name__, e))
        sys.exit(SKIP)
    if PYTHON_DIR not in sys.path:
        sys.path.insert(0, PYTHON_DIR)


def start(doc):
    """The start of every test that runs mhar-toy: argv is `TOY WORKDIR`. Checks torch (SKIP
    without it), empties WORKDIR and returns (toy, work); on a wrong argv prints `doc` and exits
    2."""
    if len(sys.argv) != 3:
        print(doc)
        sys.exit(2)
    need_torch()
    import shutil
    toy, work = sys.argv[1], sys.argv[2]
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    return toy, work


def run(cmd, cwd=None, env=None, timeout=600, expect=0):
    """Runs a command; returns (rc, stdout, stderr); fails loudly unless rc == expect (None: any)."""
    p = subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True,
                       timeout=timeout)
    if expect is not None and p.returncode != expect:
        raise AssertionError("command %s exited %d (expected %d)\nstdout:\n%s\nstderr:\n%s"
                             % (" ".join(map(str, cmd)), p.returncode, expect, p.stdout, p.stderr))
    return p.returncode, p.stdout, p.stderr


def rel_error(got, want):
    """max |got − want| / max |want| over a tensor; 0 when both are all zero, inf when only `want`
    is (a gradient that should vanish and does not)."""
    import numpy as np
    got = np.asarray(got, dtype=np.float64)
    want = np.asarray(want, dtype=np.float64)
    diff = float(np.max(np.abs(got - want))) if got.size else 0.0
    scale = float(np.max(np.abs(want))) if want.size else 0.0
    if scale == 0.0:
        return 0.0 if diff == 0.0 else float("inf")
    return diff / scale


def torch_env(threads=None):
    """The environment for child Python processes: python/ on the path, bounded threads."""
    env = dict(os.environ)
    env["PYTHONPATH"] = PYTHON_DIR + os.pathsep + env.get("PYTHONPATH", "")
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    return env
