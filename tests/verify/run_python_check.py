#!/usr/bin/python3
"""ctest driver: runs python/mhar_verify.py on one implementation and asserts the verdict.

    run_python_check.py --toy TOY --cases DIR --impl MOD:FN --expect pass|fail|incomplete|declined
                        [--framework torch] [--must-fail TENSOR[,TENSOR]] [--must-pass TENSOR]
                        [--serves h1] [--convention C] [--input-dtype D] [--hint TEXT]
                        [--every-h1-graded] [--exact-ratio-above X] [--inputs VALUE]
                        [--then-delete FILE]

Exit 0 when the verdict is as expected, 1 when not, 77 (ctest: skipped) with "MHAR_SKIP: ..."
when NumPy, or torch for --framework torch, cannot be imported by this interpreter.
"""

import argparse
import json
import os
import struct
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
HARNESS = os.path.join(HERE, "..", "..", "python", "mhar_verify.py")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--toy", required=True)
    ap.add_argument("--cases", required=True)
    ap.add_argument("--impl", required=True)
    ap.add_argument("--expect", choices=["pass", "fail", "incomplete", "declined"], required=True,
                    help="incomplete: every served case passes, and the rest are missing; "
                         "declined: every served case passes, the rest are declined (not missing)")
    ap.add_argument("--framework", default="numpy")
    ap.add_argument("--results", required=True)
    ap.add_argument("--must-fail", default="", help="a tensor that must be among the failures")
    ap.add_argument("--must-pass", default="", help="a tensor that must pass in every case")
    ap.add_argument("--serves", default="all")
    ap.add_argument("--convention", default="exact")
    ap.add_argument("--input-dtype", default="case")
    ap.add_argument("--hint", default="", help="text that a hint (or a report note) must hold")
    ap.add_argument("--every-h1-graded", action="store_true",
                    help="COMPLETE, and every case file with H = 1 graded (and no other)")
    ap.add_argument("--exact-ratio-above", type=float,
                    help="the worst ratio under exact must exceed this (a convention's cost)")
    ap.add_argument("--inputs", help="what the report must say fed the bf16/f16 cases")
    ap.add_argument("--doc-hint", help="a doc whose quoted report hints ('hint: ...' lines "
                                       "naming the convention) must each be one of this run's")
    ap.add_argument("--then-delete", help="then delete this results file: verify must call it "
                                          "missing and exit 1")
    a = ap.parse_args()
    for mod in ["numpy"] + (["torch"] if a.framework == "torch" else []):
        try:
            __import__(mod)
        except ImportError as e:
            print(f"MHAR_SKIP: {mod} cannot be imported by {sys.executable}: {e}")
            return 77
    cmd = [sys.executable, HARNESS, "--impl", a.impl, "--cases", a.cases, "--framework",
           a.framework, "--results", a.results, "--toy", a.toy, "--json", "--serves", a.serves,
           "--convention", a.convention, "--input-dtype", a.input_dtype]
    env = dict(os.environ, PYTHONPATH=os.path.join(HERE, "..", "..", "python"))
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
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
    elif a.expect == "declined":
        ok = (not report["pass"]) and p.returncode == 1 and s["fail"] == 0 and s["missing"] == 0
        ok = ok and s["pass"] > 0 and s["declined"] > 0
        declined = [r for r in rows if r["verdict"] == "declined"]
        print(f"{len(declined)} cases declined, e.g. {declined[0]['case']}: {declined[0]['note']}"
              if declined else "no case declined")
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
    ok = extra_checks(a, report) and ok
    print("as expected" if ok else "NOT as expected")
    return 0 if ok else 1


def h1_files(cases):
    """The case files of the manifest whose H is 1 (read from each file's header)."""
    with open(os.path.join(cases, "manifest.json")) as f:
        manifest = json.load(f)
    files = set()
    for e in manifest["cases"]:
        with open(os.path.join(cases, e["file"]), "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            meta = json.loads(f.read(n))["__metadata__"]
        if meta["H"] == "1":
            files.add(e["file"])
    return files


def extra_checks(a, report):
    ok = True
    rows, s = report["rows"], report["summary"]
    if a.hint:
        texts = [r["note"] for r in rows if r["verdict"] == "hint"] + report["notes"]
        if not any(a.hint in t for t in texts):
            print(f"expected a hint holding {a.hint!r}; the hints are: {texts}")
            ok = False
        else:
            print("hint:", next(t for t in texts if a.hint in t))
    if a.every_h1_graded:
        graded = {r["case"] for r in rows if r["verdict"] in ("pass", "FAIL")}
        want = h1_files(a.cases)
        if not report["complete"] or graded != want or s["cases_graded"] != len(want):
            print(f"expected COMPLETE with exactly the {len(want)} H = 1 case files graded; "
                  f"graded {len(graded)}, complete {report['complete']}, "
                  f"not graded {sorted(want - graded)}, others {sorted(graded - want)}")
            ok = False
        else:
            print(f"COMPLETE within scope {report['scope']}: all {len(want)} H = 1 case files graded")
    if a.exact_ratio_above is not None:
        ex, conv = report["worst_ratio_exact"], report["worst_ratio"]
        print(f"worst ratio under exact {ex['ratio']:.3f} ({ex['at']}), under {report['convention']} "
              f"{conv['ratio']:.3f} ({conv['at']})")
        if not ex["ratio"] > a.exact_ratio_above:
            print(f"expected the worst ratio under exact above {a.exact_ratio_above}")
            ok = False
    if a.inputs is not None and report["inputs"] != a.inputs:
        print(f"expected the bf16/f16 inputs to be reported as {a.inputs!r}, not {report['inputs']!r}")
        ok = False
    if a.doc_hint:
        with open(a.doc_hint) as f:
            quoted = [line.rstrip("\n") for line in f
                      if line.startswith("hint: ") and "(hf-rmsnorm)" in line]
        notes = {"hint: " + n for n in report["notes"]}
        stale = [q for q in quoted if q not in notes]
        if not quoted or stale:
            print(f"{a.doc_hint}: quoted hints not in this run's report: {stale or 'none quoted'}; "
                  f"the report's: {sorted(notes)}")
            ok = False
        else:
            print(f"{a.doc_hint}: its {len(quoted)} quoted hint(s) match the report")
    if a.then_delete:
        ok = deleted_is_missing(a) and ok
    return ok


def deleted_is_missing(a):
    """Deletes one results file and reruns verify: the case must be missing, the exit 1."""
    os.remove(os.path.join(a.results, a.then_delete))
    p = subprocess.run([a.toy, "verify", "--cases", a.cases, "--results", a.results, "--serves",
                        a.serves, "--convention", a.convention, "--json"],
                       capture_output=True, text=True)
    report = json.loads(p.stdout)
    row = [r for r in report["rows"] if r["case"] == a.then_delete]
    ok = p.returncode == 1 and len(row) == 1 and row[0]["verdict"] == "missing"
    print(f"deleted {a.then_delete}: verify exit {p.returncode}, its row: "
          f"{row[0]['verdict'] + ': ' + row[0]['note'] if row else 'none'}")
    return ok


if __name__ == "__main__":
    sys.exit(main())
