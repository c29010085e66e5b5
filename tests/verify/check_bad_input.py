#!/usr/bin/python3
"""python/mhar_verify.py on a damaged cases folder or an unwritable results folder: each refusal
is one line that names the file and says what is wrong in our words (no Python exception text:
no "[Errno", no "Expecting value", no traceback), with mhar-toy's exit code (2 for input the user
can fix), and a case name that would put a results file outside --results is refused. Each case copies the quick cases (written by the ctest fixture), damages one thing and
runs the harness on the NumPy reference; the last three run it on the good cases with standard
output on a full disk, with standard output a closed pipe, and with a Ctrl-C while the function
runs. Exit 0 when every case holds, 1 when one does not, 77
without NumPy.

    check_bad_input.py --toy build/tools/mhar-toy --cases build/tests/verify/quick-cases
"""

import argparse
import filecmp
import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
HARNESS = os.path.join(HERE, "..", "..", "python", "mhar_verify.py")
IMPL = "verify_examples.numpy_routing:routing"
LIBRARY_TEXT = ("Traceback", "[Errno", "Expecting value", "Expecting property", "KeyError",
                "cannot reshape")


def safetensors(header, body=b""):
    text = json.dumps(header).encode()
    return struct.pack("<Q", len(text)) + text + body


def first_case(cases):
    with open(os.path.join(cases, "manifest.json")) as f:
        return json.load(f)["cases"][0]["file"]


def manifest_naming(cases, name):
    """The manifest's text with its first case renamed `name` (a results file of that name
    would be written outside --results)."""
    with open(os.path.join(cases, "manifest.json")) as f:
        m = json.load(f)
    m["cases"][0]["file"] = name
    return json.dumps(m).encode()


def damage(cases, work):
    """(name, cases folder, results folder, expected exit code, text the message must hold)."""
    def copy(name):
        d = os.path.join(work, name)
        shutil.copytree(cases, d)
        return d

    def put(d, file, data):
        with open(os.path.join(d, file), "wb") as f:
            f.write(data)
        return d

    def link(d, file, target):
        os.remove(os.path.join(d, file))
        os.symlink(target, os.path.join(d, file))
        return d

    f = first_case(cases)
    res = os.path.join(work, "results")
    plain = os.path.join(work, "a-file")
    open(plain, "w").close()
    empty = os.path.join(work, "empty")
    os.mkdir(empty)
    return [
        ("no cases folder", os.path.join(work, "none"), res, 2, "none: no such directory"),
        ("no manifest", empty, res, 2, "manifest.json: cannot read it: No such file"),
        ("manifest not JSON", put(copy("m1"), "manifest.json", b"{"), res, 2,
         "manifest.json: not valid JSON (at byte 2)"),
        ("manifest an array", put(copy("m2"), "manifest.json", b"[1]"), res, 2,
         "manifest.json: not a JSON object"),
        ("manifest without cases", put(copy("m3"), "manifest.json", b'{"cases": 3}'), res, 2,
         "manifest.json: malformed manifest: \"cases\""),
        ("manifest nested too deep", put(copy("m4"), "manifest.json", b"[" * 100000), res, 2,
         "manifest.json: not valid JSON here (nested too deep)"),
        ("case name out of the folder", put(copy("m5"), "manifest.json", manifest_naming(
            cases, "../" + f)), res, 2, f"case file name '../{f}' is not a plain file name"),
        ("case file a link to /dev/zero", link(copy("c6"), f, "/dev/zero"), res, 2,
         f + ": not a regular file"),
        ("case file garbage", put(copy("c1"), f, b"garbage!"), res, 2,
         f + ": header length"),
        ("case header not JSON", put(copy("c2"), f, struct.pack("<Q", 2) + b"{x"), res, 2,
         f + ": not valid JSON (at byte 2)"),
        ("tensor past the data", put(copy("c3"), f, safetensors(
            {"sources": {"dtype": "F32", "shape": [1000], "data_offsets": [0, 4000]}},
            b"\0" * 16)), res, 2, f + ": tensor 'sources': data_offsets [0, 4000] do not hold"),
        ("tensor without shape", put(copy("c4"), f, safetensors(
            {"sources": {"dtype": "F32", "data_offsets": [0, 4]}}, b"\0" * 4)), res, 2,
         f + ": tensor 'sources': dtype, shape and data_offsets"),
        ("not a case file", put(copy("c5"), f, safetensors(
            {"__metadata__": {"H": "1"}, "x": {"dtype": "F32", "shape": [1],
                                              "data_offsets": [0, 4]}}, b"\0" * 4)), res, 2,
         f + ": not a case file (no eps, scale"),
        ("results under a file", cases, os.path.join(plain, "r"), 2,
         "a-file/r: cannot write it: Not a directory"),
        ("results in the cases folder", copy("r1"), os.path.join(work, "r1", "."), 2,
         "is the cases folder; results are written under the cases' own file names"),
    ]


def run(cases, results, toy, stdout=subprocess.PIPE):
    env = dict(os.environ, PYTHONPATH=os.path.join(HERE, "..", "..", "python"))
    p = subprocess.run([sys.executable, HARNESS, "--impl", IMPL, "--cases", cases, "--results",
                        results, "--toy", toy], stdout=stdout, stderr=subprocess.PIPE, text=True,
                       env=env, timeout=300)
    return p.returncode, (p.stdout or "") + p.stderr


def full_stdout(cases, work, toy):
    """Good cases, standard output on a full disk (/dev/full): one line saying the output is
    incomplete, exit 1; it was a traceback (argparse's or print's OSError)."""
    with open("/dev/full", "w") as full:
        rc, out = run(cases, os.path.join(work, "full"), toy, stdout=full)
    lines = out.strip().splitlines()
    ok = (rc == 1 and len(lines) == 1 and lines[0].startswith(
        "mhar_verify: error: writing the output (standard output) failed: No space left")
        and not any(t in out for t in LIBRARY_TEXT))
    print(f"{'ok' if ok else 'FAIL'}: standard output on a full disk: exit {rc} (want 1): "
          f"{out.strip()}")
    return ok


SLOW_IMPL = """import os, time
def routing(*args, **kwargs):
    open(os.environ["MHAR_STARTED"], "w").close()
    time.sleep(120)
"""


def closed_pipe(cases, work, toy):
    """Standard output a pipe whose reader has gone (`| head`): ended by SIGPIPE and nothing said,
    as mhar-toy (it was a BrokenPipeError traceback). The read end is closed first, so that every
    write fails."""
    r, w = os.pipe()
    os.close(r)
    try:
        rc, out = run(cases, os.path.join(work, "pipe"), toy, stdout=w)
    finally:
        os.close(w)
    ok = rc == -signal.SIGPIPE and out == ""
    print(f"{'ok' if ok else 'FAIL'}: standard output a closed pipe: exit {rc} (want "
          f"{-signal.SIGPIPE}): {out.strip()}")
    return ok


def interrupted(cases, work, toy):
    """Ctrl-C while the function runs: one line, exit 130 as mhar-toy's (it was a traceback and
    death by the signal)."""
    impl, started = os.path.join(work, "slow_impl.py"), os.path.join(work, "started")
    with open(impl, "w") as f:
        f.write(SLOW_IMPL)
    env = dict(os.environ, PYTHONPATH=os.path.join(HERE, "..", "..", "python"),
               MHAR_STARTED=started)
    p = subprocess.Popen([sys.executable, HARNESS, "--impl", impl + ":routing", "--cases", cases,
                          "--results", os.path.join(work, "slow"), "--toy", toy, "--forward-only"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    for _ in range(600):  # until the function runs (at most a minute)
        if os.path.exists(started) or p.poll() is not None:
            break
        time.sleep(0.1)
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=120)
    ok = (p.returncode == 130 and err.strip() == "mhar_verify: interrupted (Ctrl-C); no verdict"
          and not any(t in out + err for t in LIBRARY_TEXT))
    print(f"{'ok' if ok else 'FAIL'}: Ctrl-C while the function runs: exit {p.returncode} "
          f"(want 130): {err.strip()}")
    return ok


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--toy", required=True)
    ap.add_argument("--cases", required=True)
    a = ap.parse_args()
    try:
        import numpy  # noqa: F401
    except ImportError as e:
        print(f"MHAR_SKIP: NumPy cannot be imported by {sys.executable}: {e}")
        return 77
    failures = 0
    with tempfile.TemporaryDirectory(prefix="mhar_verify_bad_") as work:
        for name, cases, results, want, text in damage(a.cases, work):
            rc, out = run(cases, results, a.toy)
            lines = out.strip().splitlines()
            ok = (rc == want and len(lines) == 1 and text in lines[0]
                  and lines[0].startswith("mhar_verify: error: ")
                  and not any(t in out for t in LIBRARY_TEXT))
            if name == "results in the cases folder":  # and the cases are still there
                f = first_case(a.cases)
                ok = ok and filecmp.cmp(os.path.join(cases, f), os.path.join(a.cases, f), False)
            failures += not ok
            print(f"{'ok' if ok else 'FAIL'}: {name}: exit {rc} (want {want}): {out.strip()}")
            if not ok:
                print(f"      expected one line holding: {text}")
        failures += not full_stdout(a.cases, work, a.toy)
        failures += not closed_pipe(a.cases, work, a.toy)
        failures += not interrupted(a.cases, work, a.toy)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
