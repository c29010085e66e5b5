#!/usr/bin/python3
"""ctest driver: runs python/mhar_verify.py on one implementation and asserts the verdict.

    run_python_check.py --toy TOY --cases DIR --impl MOD:FN --expect pass|fail|incomplete
                        [--framework torch] [--must-fail TENSOR[,TENSOR]] [--must-pass TENSOR]

Exit 0 when the verdict is as expected, 1 when not, 77 (ctest: skipped) with "MHAR_SKIP: ..."
when NumPy, or torch for --framework torch, cannot be imported by this interpreter.
"""

import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
HARNESS = os.path.join(HERE, "..", "..", "python", "mhar_verify.py")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--toy", required=True)
    ap.add_argument("--cases", required=True)
    ap.add_argument("--impl", required=True)
    ap.add_argument("--expect", choices=["pass", "fail", "incomplete"], required=True,
                    help="incomplete: every served case passes, and the declined ones are missing")
    ap.add_argument("--framework", default="numpy")
    ap.add_argument("--results", required=True)
    ap.add_argument("--must-fail", default="", help="a tensor that must be among the failures")
    ap.add_argument("--must-pass", default="", help="a tensor that must pass in every case")
    a = ap.parse_args()
    for mod in ["numpy"] + (["torch"] if a.framework == "torch" else []):
        try:
            __import__(mod)
        except ImportError as e:
            print(f"MHAR_SKIP: {mod} cannot be imported by {sys.executable}: {e}")
            return 77
    cmd = [sys.executable, HARNESS, "--impl", a.impl, "--cases", a.cases, "--framework",
           a.framework, "--results", a.results, "--toy", a.toy, "--json"]
    p = subprocess.run(cmd, capture_output=True, text=True)
    sys.stdout.write(p.stdout[:p.stdout.find("\n{") + 1] if "\n{" in p.stdout else "")
    sys.stderr.write(p.stderr)
    start = p.stdout.find("\n{")
    if start < 0:
        print(f"no JSON verdict from the harness (exit {p.returncode}):\n{p.stdout}")
        return 1
    report = json.loads(p.stdout[start + 1:])
    rows = report["rows"]
    fails = [r for r in rows if r["verdict"] == "FAIL"]
    s = report["summary"]
    print(f"verdict: {'PASS' if report['pass'] else 'FAIL'} ({s['pass']} pass, {s['fail']} fail, "
          f"{s['missing']} missing, {s['not_checked']} not checked), exit {p.returncode}")
    for r in fails[:3]:
        print(f"fails: case {r['case']} tensor {r['tensor']}: error {r['error']} > tolerance "
              f"{r['tolerance']} (ratio {r['ratio']}) {r['note']}")
    ok = True
    if a.expect == "pass":
        ok = report["pass"] and p.returncode == 0 and s["missing"] == 0 and s["fail"] == 0
        if not ok:
            for r in rows:
                if r["verdict"] not in ("pass", "hint"):
                    print("unexpected:", r)
    elif a.expect == "incomplete":
        ok = (not report["pass"]) and p.returncode == 1 and s["fail"] == 0 and s["missing"] > 0
        ok = ok and s["pass"] > 0
    else:
        ok = (not report["pass"]) and p.returncode == 1 and len(fails) > 0
        ok = ok and all(r["case"] and r["tensor"] for r in fails)
        for t in filter(None, a.must_fail.split(",")):
            if not any(r["tensor"] == t for r in fails):
                print(f"expected tensor {t} among the failures; it is not")
                ok = False
        if a.must_pass:
            bad = [r for r in rows if r["tensor"] == a.must_pass and r["verdict"] != "pass"]
            if bad:
                print(f"expected {a.must_pass} to pass everywhere; it fails in {bad[0]['case']}")
                ok = False
    print("as expected" if ok else "NOT as expected")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
