"""mhar_torch.allocator.keep_freed_memory: each case runs in its own process (mallopt changes
the whole process), allocating and freeing the same tensors of 1–20 MiB round after round, as a
training step does, and counting the page faults of the later rounds (getrusage's ru_minflt)."""

import json
import os
import subprocess
import sys

import pytest

import common

PROBE = r"""
import json, resource, sys, torch
applied = None
if sys.argv[1] == "keep":
    from mhar_torch.allocator import keep_freed_memory
    applied = keep_freed_memory()
def one_round():
    ts = [torch.empty(k * 262144 + 4096).fill_(1.0) for k in (1, 3, 2, 5, 4, 1, 6, 20)]
    del ts
for _ in range(3):
    one_round()
f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(10):
    one_round()
print(json.dumps({"applied": applied,
                  "faults": (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0) / 10}))
"""


def probe(kind):
    env = dict(os.environ, PYTHONPATH=common.PYTHON_DIR)
    p = subprocess.run([sys.executable, "-c", PROBE, kind], env=env, capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_keep_freed_memory_stops_the_faults():
    import platform
    if platform.libc_ver()[0] != "glibc":
        pytest.skip("keep_freed_memory acts on glibc's malloc only; this is %r"
                    % (platform.libc_ver(),))
    default, keep = probe("default"), probe("keep")
    print("\npage faults per round of 42 MiB of tensors: glibc's defaults %.0f, keep %.0f"
          % (default["faults"], keep["faults"]))
    # The probe must fault without the setting, else it shows nothing about it.
    assert default["faults"] > 500, "the probe no longer faults under glibc's defaults"
    assert keep["applied"] is True
    assert keep["faults"] < 0.05 * default["faults"]
