# SPDX-License-Identifier: Apache-2.0
"""Shared helpers of the horarun tests: where horarun is, how to run it, the rank program."""

import os
import signal
import subprocess
import sys
import tempfile
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "common"))
from time_scale import scaled  # noqa: E402  (re-exported for the launcher tests)

# meson passes HORARUN; run by hand, the tests find the script in the source tree.
HORARUN = os.environ.get("HORARUN") or os.path.join(HERE, "..", "..", "tools", "horarun")
RANK_PROG = os.path.join(HERE, "rank_prog.py")
# Every horarun run is bounded: a hang fails the test instead of the meson timeout.
RUN_TIMEOUT_S = scaled(30)


def horarun_module(name):
    """horarun_lib.NAME, the package of the script HORARUN, found as running the script finds it:
    the script is loaded as a module (its main() does not run) and puts the package on sys.path."""
    import importlib
    import importlib.machinery
    import importlib.util
    loader = importlib.machinery.SourceFileLoader("horarun_script", HORARUN)
    spec = importlib.util.spec_from_loader("horarun_script", loader)
    loader.exec_module(importlib.util.module_from_spec(spec))
    return importlib.import_module("horarun_lib." + name)


def rank_cmd(*words):
    """The command line of the rank program, run by this test's own interpreter."""
    return [sys.executable, RANK_PROG] + [str(w) for w in words]


def clean_env(**extra):
    """This environment without HORA_* variables (horarun exports every one it sees, and the
    tests check what it exports: a test runner's own, such as HORA_TEST_TIME_SCALE, must not
    leak into that), plus `extra`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HORA_")}
    env.pop("PYTHONUNBUFFERED", None)
    env.update(extra)
    return env


def run_horarun(args, env=None, timeout=RUN_TIMEOUT_S, input_data=None, cwd=None):
    """Runs horarun to completion; returns (CompletedProcess with text output, seconds)."""
    start = time.monotonic()
    proc = subprocess.run([HORARUN] + list(args), env=env if env is not None else clean_env(),
                          input=input_data if input_data is not None else "", cwd=cwd,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          timeout=timeout, check=False)
    return proc, time.monotonic() - start


def start_horarun(args, env=None):
    """Starts horarun in its own session, as a shell starts a foreground job."""
    return subprocess.Popen([HORARUN] + list(args), env=env if env is not None else clean_env(),
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)


def wait_for_files(paths, timeout=20.0):
    deadline = time.monotonic() + scaled(timeout)
    while time.monotonic() < deadline:
        if all(os.path.exists(p) for p in paths):
            return True
        time.sleep(0.02)
    return False


def process_gone(pid):
    """True when pid no longer runs (a zombie waiting for its reaper counts as gone)."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
        return state in ("Z", "X")
    except FileNotFoundError:
        return True
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        return False


def kill_leftovers(pids):
    """Cleanup after a failed assertion, so a broken horarun does not leave sleepers behind."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


class TempDirTest(unittest.TestCase):
    """A fresh directory per test, for the files the ranks write."""

    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory(prefix="horarun-test-")
        self.dir = self._tmp.name
        # A cleanup, not tearDown: it must run after the cleanups that tests add later.
        self.addCleanup(self._tmp.cleanup)

    def path(self, *parts):
        return os.path.join(self.dir, *parts)

    def read_pids(self, pattern_prefix):
        pids = []
        for name in os.listdir(self.dir):
            if name.startswith(pattern_prefix):
                with open(self.path(name)) as f:
                    pids += [int(w) for w in f.read().split()]
        return pids
