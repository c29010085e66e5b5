"""pytest's side of the py: tests: the --toy and --work options, one fresh work folder per test,
the torch check (a test without torch is skipped, naming why), and the exit status ctest reads:
77 (SKIPPED) when every collected test skipped; pytest's own 5 (no tests collected) stays a
failure."""

import os
import re
import shutil

import pytest

import common

SKIP = 77  # ctest SKIP_RETURN_CODE


def pytest_addoption(parser):
    parser.addoption("--toy", default=None, help="the mhar-toy binary")
    parser.addoption("--work", default=None, help="a folder for the tests' files")


@pytest.fixture(autouse=True)
def need_torch():
    why = common.torch_missing()
    if why:
        pytest.skip(why)


@pytest.fixture
def toy(request):
    path = request.config.getoption("--toy")
    if not path:
        pytest.fail("this test runs mhar-toy: pass --toy PATH (ctest does)")
    return path


@pytest.fixture
def work(request, tmp_path_factory):
    """An empty folder per test: under --work (kept for inspection), else pytest's tmp."""
    base = request.config.getoption("--work")
    if not base:
        return str(tmp_path_factory.mktemp("work"))
    path = os.path.join(base, re.sub(r"[^A-Za-z0-9_.=-]+", "_", request.node.name))
    shutil.rmtree(path, ignore_errors=True)
    os.makedirs(path)
    return path


def pytest_sessionfinish(session, exitstatus):
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is None or exitstatus != 0:
        return
    stats = reporter.stats
    ran = sum(len(stats.get(k, [])) for k in ("passed", "failed", "error", "xfailed", "xpassed"))
    if ran == 0 and stats.get("skipped"):
        session.exitstatus = SKIP
