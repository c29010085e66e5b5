"""Keeping freed memory in the process between training steps (glibc's malloc, on Linux).

PyTorch's CPU tensors come from the C library's malloc. A training step allocates and frees the
same few hundred megabytes every step, and glibc by default hands freed memory back to the
kernel: blocks above its mmap threshold are unmapped on free, and the top of the heap is trimmed
once more than its trim threshold is free there. The next step then takes every page back
through a page fault, and the kernel zeroes each one. Measured with ``perf stat -e page-faults``
on the twin's step at d 256, T 256, batch 4, L 12, one thread (``python/bench_step.py``, 2 and 6
steps, the difference): 6,000 to 12,000 faults a step in either mode with glibc's defaults, the
count varying from process to process; with ``keep_freed_memory()`` 75 to 430.

``keep_freed_memory()`` sets the two thresholds once, for the whole process, with ``mallopt``:
- M_MMAP_THRESHOLD at 32 MiB, the most glibc accepts on 64-bit: blocks up to that size come from
  the heap and go back to it (its default starts at 128 KiB and only grows as blocks are freed);
- M_TRIM_THRESHOLD at 2 GiB − 1: the heap's free top is kept for the next step.
The cost: the process keeps its peak heap after a step instead of returning it, so its resident
memory stays at the peak that it reached anyway (peak RSS does not grow). The twin's own scripts
(``mhar-train-ddp``, ``python/bench_step.py``) call it at start; call it first in your own training
script the same way, or set MALLOC_MMAP_THRESHOLD_=33554432 and MALLOC_TRIM_THRESHOLD_=2147483647
in the environment. jemalloc or tcmalloc through LD_PRELOAD (PyTorch's CPU tuning guide) are the
other road to the same end.
"""

import ctypes
import platform
import sys

M_TRIM_THRESHOLD = -1  # glibc's malloc.h
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 * 1024 * 1024  # glibc's upper bound on 64-bit (HEAP_MAX_SIZE / 2)
TRIM_THRESHOLD = 2**31 - 1  # mallopt takes an int


def keep_freed_memory() -> bool:
    """Sets glibc's mmap and trim thresholds (module docstring) for this process. Returns True
    when both were set, False where there is no glibc (macOS, Windows, musl) or it refused a
    value; nothing else changes then."""
    if not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc":
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    # mallopt returns 1 on success, 0 for a value it refuses
    return (mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1
            and mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1)
