# SPDX-License-Identifier: Apache-2.0
"""Starts a Python rank program at N ranks under horarun or mpirun, with a watchdog.

The meson test environment names the launchers: HORA_HORARUN (tools/horarun) and, where Open MPI
is built in, HORA_MPIEXEC (mpirun) with HORA_MPIRUN_FLAGS (the flags of tools/mpirun_flags.sh).
PYTHONPATH points at the build tree's bindings/python, so the ranks import the hora just built.
"""

import os
import shlex
import signal
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from time_scale import scaled  # noqa: E402  (re-exported for the test modules)

# The interpreter running the tests (meson runs them with Debian's /usr/bin/python3, where numpy,
# torch and pytest live; elsewhere, the one where hora was pip-installed), or HORA_TEST_PYTHON.
PYTHON = os.environ.get("HORA_TEST_PYTHON") or sys.executable or "/usr/bin/python3"


def launchers():
    """The launchers this test environment can use: "horarun" always, "mpirun" when built."""
    found = []
    if os.environ.get("HORA_HORARUN"):
        found.append("horarun")
    if os.environ.get("HORA_MPIEXEC"):
        found.append("mpirun")
    return found


def command(np_, script, args=(), launcher="horarun"):
    """The command line that starts `script` at np_ ranks under `launcher`."""
    program = [PYTHON, "-u", script] + [str(a) for a in args]
    if launcher == "horarun":
        return [PYTHON, os.environ["HORA_HORARUN"], "-np", str(np_)] + program
    if launcher == "mpirun":
        flags = shlex.split(os.environ.get("HORA_MPIRUN_FLAGS", "--allow-run-as-root --oversubscribe"))
        # every variable the test set must reach the ranks: Open MPI passes only what -x names
        exported = []
        for name in ("PYTHONPATH", "HORA_TIMEOUT_S", "MASTER_ADDR", "MASTER_PORT", "HORA_SHM",
                     "HORA_FUSION_THRESHOLD", "HORA_LOG_LEVEL", "OMP_NUM_THREADS"):
            if name in os.environ:
                exported += ["-x", name]
        return [os.environ["HORA_MPIEXEC"]] + flags + exported + ["-np", str(np_)] + program
    raise ValueError("unknown launcher %r (known: %s)" % (launcher, ", ".join(launchers())))


def run_ranks(np_, script, args=(), launcher="horarun", timeout=120, env=None, expect_fail=False):
    """Runs `script` at np_ ranks and returns every rank's output (stdout and stderr) as one
    string. Raises AssertionError with that output when the job fails (or, with expect_fail,
    succeeds), and when the watchdog kills it after `timeout` seconds."""
    if launcher not in launchers():
        raise AssertionError("launcher %s is not available here (have: %s)"
                             % (launcher, ", ".join(launchers())))
    run_env = dict(os.environ)
    run_env.setdefault("HORA_TIMEOUT_S", str(int(scaled(60))))  # hora's bound, inside the watchdog
    run_env.setdefault("OMP_NUM_THREADS", "1")  # torch's threads would fight the ranks for cores
    if env:
        run_env.update({k: str(v) for k, v in env.items()})
    argv = command(np_, script, args, launcher)
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=run_env,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=scaled(timeout))
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        raise AssertionError("watchdog: %s did not finish in %d s; output:\n%s"
                             % (" ".join(argv), scaled(timeout), out.decode(errors="replace")))
    text = out.decode(errors="replace")
    failed = proc.returncode != 0
    if failed != expect_fail:
        raise AssertionError("%s exited with %d (expected %s); output:\n%s"
                             % (" ".join(argv), proc.returncode,
                                "failure" if expect_fail else "success", text))
    return text


def main():
    """python3 harness.py NP LAUNCHER SCRIPT [ARGS...]: for trying a rank program by hand."""
    np_, launcher, script = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    print(run_ranks(np_, script, sys.argv[4:], launcher=launcher))


if __name__ == "__main__":
    main()
