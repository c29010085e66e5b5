"""Shared by the py: tests: the torch check, paths, running commands, and the per-tensor relative
error."""

import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
PYTHON_DIR = os.path.join(REPO, "python")
CORPUS = os.path.join(REPO, "data", "tinyshakespeare.txt")
TRAIN_DDP = [sys.executable, os.path.join(PYTHON_DIR, "train_ddp.py")]  # mhar-train-ddp


def torch_missing():
    """None where torch and NumPy import, else why not (the reason a skipped test gives)."""
    try:
        import torch  # noqa: F401
        import numpy  # noqa: F401
    except Exception as e:  # ImportError, or a broken install raising something else
        return ("PyTorch (or NumPy) cannot be imported by %s: %s: %s. Install Debian's "
                "python3-torch and python3-numpy (scripts/setup.sh) to run this test."
                % (sys.executable, type(e).__name__, e))
    return None


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
