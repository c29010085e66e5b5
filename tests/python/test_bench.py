"""py:bench — python/bench_step.py's table (time beside peak memory, the malloc setting named), and
mhar_torch.allocator.keep_freed_memory, which it and mhar-train-ddp call (each allocator case in
its own process: mallopt changes the whole process)."""

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

import common

PROBE = r"""
import json, sys, torch
applied = None
if sys.argv[1] == "keep":
    from mhar_torch.allocator import keep_freed_memory
    applied = keep_freed_memory()
def resident():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096
t = torch.empty(4 * 1024 * 1024).fill_(1.0)  # 16 MiB, every page touched
held = resident()
del t
print(json.dumps({"applied": applied, "returned_mib": (held - resident()) / 2**20}))
"""


def probe(kind):
    env = dict(os.environ, PYTHONPATH=common.PYTHON_DIR)
    p = subprocess.run([sys.executable, "-c", PROBE, kind], env=env, capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_keep_freed_memory_keeps_a_freed_tensor():
    """A 16 MiB tensor freed: glibc's defaults give its pages back to the kernel (it was mmapped,
    being above the 128 KiB starting threshold), so the next step would fault them in again;
    with keep_freed_memory() the block came from the heap and stays resident."""
    import platform
    if platform.libc_ver()[0] != "glibc":
        pytest.skip("keep_freed_memory acts on glibc's malloc only; this is %r"
                    % (platform.libc_ver(),))
    default, keep = probe("default"), probe("keep")
    print("\nfreeing a 16 MiB tensor returned %.1f MiB to the kernel with glibc's defaults, "
          "%.1f MiB with keep_freed_memory()" % (default["returned_mib"], keep["returned_mib"]))
    assert default["returned_mib"] >= 15, "glibc's defaults no longer return it: nothing shown"
    assert keep["applied"] is True
    assert keep["returned_mib"] < 1


def test_bench_step_prints_time_and_peak_memory():
    """A tiny run of both modes, two rounds: one row per mode with ms/step and peak RSS, each a
    positive number, the routing named, and the header naming the malloc setting."""
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1")
    cmd = [sys.executable, os.path.join(common.PYTHON_DIR, "bench_step.py"), "--modes",
           "residual,mhar", "--layers", "2", "--d", "32", "-T", "16", "-B", "2", "--n-head", "2",
           "--n-kv-head", "1", "--ffn", "48", "--threads", "1", "--repeats", "1", "--rounds", "2"]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    print("\n" + p.stdout)
    lines = p.stdout.splitlines()
    assert "malloc: keep" in lines[0] and "after 3 warm-up steps" in lines[0]
    assert "peak RSS MiB" in lines[2]
    table = [r for r in lines[3:] if not r.startswith(("round by round", "memory, "))]
    rows = {r.split()[2]: r.split() for r in table}
    assert set(rows) == {"residual", "mhar"}
    rounds = [r for r in lines if r.startswith("round by round, L 2 [1] mhar ÷ residual: median ")]
    assert len(rounds) == 1 and rounds[0].endswith("(2 rounds)"), lines
    assert rows["mhar"][3] == "fast" and rows["residual"][3] == "-"
    for r in rows.values():  # L pkg mode routing ms/step steps/s ÷ RSS ÷
        assert float(r[4]) > 0 and float(r[7]) > 0, r
    assert_memory_line(lines[-1], 2)


@pytest.mark.parametrize("args", [["--help"], ["--modes", "residual", "--layers", "1", "--d",
                                                  "32", "-T", "16", "-B", "2", "--n-head", "2",
                                                  "--n-kv-head", "1", "--ffn", "48", "--repeats",
                                                  "1", "--threads", "1"]],
                         ids=["help", "table"])
def test_bench_step_on_a_full_disk_says_the_output_is_incomplete(args):
    """Standard output on a full disk (/dev/full): one line, exit 1 (it was a traceback, from
    argparse's help or from print)."""
    cmd = [sys.executable, os.path.join(common.PYTHON_DIR, "bench_step.py")] + args
    with open("/dev/full", "w") as full:
        p = subprocess.run(cmd, stdout=full, stderr=subprocess.PIPE, text=True, timeout=120,
                           env=dict(os.environ, OPENBLAS_NUM_THREADS="1"))
    assert p.returncode == 1, p.stderr
    assert p.stderr == ("bench_step.py: error: writing the output (standard output) failed: No "
                        "space left on device; it is incomplete\n"), p.stderr


def test_bench_step_into_a_closed_pipe_ends_silently():
    """Standard output a pipe whose reader has gone (`| head`): ended by SIGPIPE and nothing said,
    as mhar-toy (it was a BrokenPipeError traceback). The read end is closed before the start, so
    that every write fails."""
    r, w = os.pipe()
    os.close(r)
    p = subprocess.run([sys.executable, os.path.join(common.PYTHON_DIR, "bench_step.py"),
                        "--help"], stdout=w, stderr=subprocess.PIPE, text=True, timeout=120)
    os.close(w)
    assert p.returncode == -signal.SIGPIPE and p.stderr == "", (p.returncode, p.stderr)


def test_bench_step_interrupted_is_one_line_exit_130():
    """Ctrl-C while a configuration is timed: one line, exit 130 as mhar-toy's (it was a
    traceback and death by the signal)."""
    cmd = [sys.executable, os.path.join(common.PYTHON_DIR, "bench_step.py"), "--modes",
           "residual", "--layers", "1", "--d", "32", "-T", "16", "-B", "2", "--n-head", "2",
           "--n-kv-head", "1", "--ffn", "48", "--repeats", "100000", "--threads", "1"]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=dict(os.environ, OPENBLAS_NUM_THREADS="1"),
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    for _ in range(600):  # until the child that times the configuration runs (a minute at most)
        if child_of(p.pid) or p.poll() is not None:
            break
        time.sleep(0.1)
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=120)
    assert p.returncode == 130, err
    assert err.strip() == "bench_step.py: interrupted (Ctrl-C); no table", err
    assert out == ""


def child_of(pid: int) -> bool:
    """Whether process `pid` has a child (from /proc)."""
    for name in os.listdir("/proc"):
        try:
            with open("/proc/%s/stat" % name) as f:
                if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                    return True
        except (OSError, ValueError, IndexError):
            continue
    return False


def assert_memory_line(line: str, rounds: int) -> None:
    """The last line: the copy and read speeds measured before each round, median and range,
    each a positive number with the median inside its range."""
    head = "memory, before each of %d rounds (torch, 1 thread): a 64 MiB copy " % rounds
    assert line.startswith(head), line
    spans = re.findall(r"([0-9.]+) GB/s \(([0-9.]+)–([0-9.]+)\)", line)
    assert len(spans) == 2 and "counting read + write, a 64 MiB read" in line, line
    for med, lo, hi in spans:
        assert 0 < float(lo) <= float(med) <= float(hi), line


def test_bench_step_one_process_two_packages(tmp_path):
    """--one-process with the same mhar_torch given twice (two folders, each imported under its
    own name): a row per package and mode with a time and no peak RSS, each package's folder
    named, and round-by-round lines over every step; a folder without mhar_torch is refused with
    exit 2 before anything runs."""
    import shutil
    other = tmp_path / "copy"
    shutil.copytree(os.path.join(common.PYTHON_DIR, "mhar_torch"), other / "mhar_torch")
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1")
    cmd = [sys.executable, os.path.join(common.PYTHON_DIR, "bench_step.py"), "--modes",
           "residual,mhar", "--layers", "2", "--d", "32", "-T", "16", "-B", "2", "--n-head", "2",
           "--n-kv-head", "1", "--ffn", "48", "--threads", "1", "--repeats", "2", "--rounds", "2",
           "--one-process", "--package-dir", common.PYTHON_DIR, "--package-dir", str(other)]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    print("\n" + p.stdout)
    lines = p.stdout.splitlines()
    assert "one process" in lines[0] and "malloc: keep" in lines[0]
    assert lines[2].endswith(os.path.join(str(other), "mhar_torch"))
    table = [r.split() for r in lines[4:] if not r.startswith(("round by round", "memory, "))]
    assert [(r[1], r[2]) for r in table] == [("[1]", "residual"), ("[1]", "mhar"),
                                            ("[2]", "residual"), ("[2]", "mhar")]
    for r in table:  # L pkg mode routing ms/step steps/s ÷ - -
        assert float(r[4]) > 0 and r[7:] == ["-", "-"], r
    rounds = [r for r in lines if r.startswith("round by round, L 2 [2] mhar ÷ residual")]
    assert len(rounds) == 1 and rounds[0].endswith("(4 rounds)"), lines
    assert_memory_line(lines[-1], 2)
    bad = subprocess.run(cmd[:-1] + [str(tmp_path)], env=env, capture_output=True, text=True,
                         timeout=120)
    assert bad.returncode == 2 and "holds no mhar_torch package" in bad.stderr
    assert bad.stdout == ""


@pytest.mark.parametrize("bad", [["--warmup", "-1"], ["--repeats", "0"], ["--rounds", "0"]],
                         ids=["warmup-negative", "repeats-zero", "rounds-zero"])
def test_bench_step_refuses_counts_that_time_nothing(bad):
    """A negative warm-up, or no timed step, is refused with exit 2 and one line, before any
    step runs (no median of nothing, no traceback)."""
    cmd = [sys.executable, os.path.join(common.PYTHON_DIR, "bench_step.py"), "--modes",
           "residual", "--layers", "2", "--d", "32"] + bad
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and p.stdout == ""
    assert p.stderr.startswith("bench_step.py: error: --warmup must be 0 or more"), p.stderr
    assert "Traceback" not in p.stderr


@pytest.mark.parametrize("layers", ["x", "4,y", "6,,12"], ids=["word", "one-of-two", "empty-item"])
def test_bench_step_refuses_layers_that_are_not_integers(layers):
    """--layers that is not a list of integers: exit 2 and argparse's one line naming the flag,
    before any process starts (it reached a child's int() as a ValueError traceback)."""
    cmd = [sys.executable, os.path.join(common.PYTHON_DIR, "bench_step.py"), "--modes",
           "residual", "--layers", layers, "--d", "32"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and p.stdout == "" and "Traceback" not in p.stderr, p.stderr
    assert p.stderr.splitlines()[-1] == ("bench_step.py: error: argument --layers/-L: '%s' is "
                                         "not an integer or a comma-separated list of integers"
                                         % layers), p.stderr


def test_bench_step_refuses_a_model_larger_than_the_memory():
    """3.1e11 parameters: the child process was killed by the kernel and the bench exited 2 with
    nothing said. One line now, exit 2, before the model is built."""
    cmd = [sys.executable, os.path.join(common.PYTHON_DIR, "bench_step.py"), "--modes",
           "residual", "--layers", "24", "--d", "65536"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and p.stdout == "" and "Traceback" not in p.stderr, p.stderr
    assert p.stderr.startswith("bench_step.py: error: d = 65536, L = 24, ffn = 352 has 3.11e+11 "
                               "parameters") and p.stderr.count("\n") == 1, p.stderr


@pytest.mark.parametrize("bad", [["--batch", "0"], ["--threads", "-1"], ["--threads", "20000"]],
                         ids=["batch-zero", "threads-negative", "threads-too-many"])
def test_bench_step_refuses_an_empty_batch_or_bad_threads(bad):
    """A batch of no sequences (it timed a step of nothing), or a thread count below 0 or above
    1024 (torch took minutes to start 20,000): exit 2 and one line, before any step runs."""
    cmd = [sys.executable, os.path.join(common.PYTHON_DIR, "bench_step.py"), "--modes",
           "residual", "--layers", "2", "--d", "32"] + bad
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and p.stdout == "" and "Traceback" not in p.stderr, p.stderr
    assert p.stderr == ("bench_step.py: error: --batch must be 1 or more, --threads from 0 "
                        "(torch's default) to 1024\n"), p.stderr
