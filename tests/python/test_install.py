"""py:install — `pip install ./python` in a fresh venv, as docs/pytorch.md says for Debian 12
(PEP 668): a venv that sees Debian's torch and numpy (--system-site-packages), setuptools from
python3-setuptools (--no-build-isolation, no index). Then, from a folder outside the checkout,
the console scripts answer --help and `import mhar_torch` finds the installed copy, not the
checkout's."""

import os
import shutil
import sys

import pytest

import common


@pytest.fixture(scope="module")
def venv(request, tmp_path_factory):
    work = request.config.getoption("--work")
    base = os.path.join(work, "venv") if work else str(tmp_path_factory.mktemp("install"))
    shutil.rmtree(base, ignore_errors=True)
    src = os.path.join(base, "src")  # a copy: pip builds in the tree it installs from
    shutil.copytree(common.PYTHON_DIR, src,
                    ignore=shutil.ignore_patterns("__pycache__", "build", "*.egg-info"))
    v = os.path.join(base, "venv")
    common.run([sys.executable, "-m", "venv", "--system-site-packages", v], timeout=120)
    _, out, _ = common.run([os.path.join(v, "bin", "pip"), "install", "--no-build-isolation",
                            "--no-index", src], timeout=300)
    print("\n" + out.strip().splitlines()[-1])
    outside = os.path.join(base, "elsewhere")
    os.makedirs(outside)
    return v, outside


def clean_env():
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["OMP_NUM_THREADS"] = "1"
    return env


@pytest.mark.parametrize("script,words", [("mhar-verify", "--impl"),
                                          ("mhar-train-ddp", "--routing")])
def test_console_script_help(venv, script, words):
    v, outside = venv
    _, out, _ = common.run([os.path.join(v, "bin", script), "--help"], cwd=outside,
                           env=clean_env())
    print("\n$ %s --help\n%s" % (script, "\n".join(out.splitlines()[:3])))
    assert out.startswith("usage: %s" % script) and words in out


@pytest.mark.parametrize("module", ["mhar_torch", "mhar_verify"])
def test_import_from_outside(venv, module):
    v, outside = venv
    _, out, _ = common.run([os.path.join(v, "bin", "python3"), "-c",
                            "import %s; print(%s.__file__)" % (module, module)],
                           cwd=outside, env=clean_env())
    print("\nimport %s: %s" % (module, out.strip()))
    assert out.strip().startswith(v) and not out.strip().startswith(common.PYTHON_DIR)


def test_harness_skips_without_torch_and_fails_on_no_tests(tmp_path):
    """What ctest sees: with a torch that cannot be imported every case skips, naming why, and
    pytest exits 77 (SKIPPED); a run that collects no test exits 5, which ctest counts as failed."""
    fake = tmp_path / "torch"
    fake.mkdir()
    (fake / "__init__.py").write_text('raise ImportError("simulated: no torch")\n')
    pytest_cmd = [sys.executable, "-m", "pytest", "-c", os.path.join(common.HERE, "pytest.ini"),
                  "--rootdir", common.HERE, os.path.join(common.HERE, "test_routing.py"), "-rs"]
    env = dict(os.environ, PYTHONPATH=str(tmp_path))
    rc, out, _ = common.run(pytest_cmd, env=env, expect=None)
    print("\nwithout torch: exit %d, %s" % (rc, out.strip().splitlines()[-1]))
    assert rc == 77 and "simulated: no torch" in out and "passed" not in out
    rc, out, _ = common.run(pytest_cmd + ["-k", "no_such_case"], expect=None)
    print("no test collected: exit %d" % rc)
    assert rc == 5
