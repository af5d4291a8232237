# SPDX-License-Identifier: Apache-2.0
"""What one rank does in the horarun tests: rank_prog.py ACTION [ARGS...] (no hora needed)."""

import atexit
import json
import os
import signal
import subprocess
import sys
import time

RANK = int(os.environ.get("RANK", "-1"))
WORLD = int(os.environ.get("WORLD_SIZE", "0"))


def write(path, text):
    # Written under a temporary name and renamed, so a test never reads half a file.
    with open(path + ".tmp", "w") as f:
        f.write(text)
    os.rename(path + ".tmp", path)


def dump_env(out_dir):
    write(os.path.join(out_dir, "env.%d.json" % RANK), json.dumps(dict(os.environ)))


def output(lines):
    # Each line goes out in two writes with a pause between, so that a launcher passing bytes
    # on as they come would interleave ranks within lines.
    for i in range(int(lines)):
        os.write(1, b"rank %d out %d " % (RANK, i))
        time.sleep(0.0005)
        os.write(1, b"%s\n" % (b"x" * 40))
        os.write(2, b"rank %d err %d\n" % (RANK, i))
    os.write(1, b"rank %d tail" % RANK)  # no newline: the launcher must still pass it on


def sleeper_with_helper(out_dir):
    """Sleeps 60 s with a helper child in the same process group; records both pids."""
    helper = subprocess.Popen(["sleep", "60"])
    write(os.path.join(out_dir, "pid.%d" % RANK), "%d %d\n" % (os.getpid(), helper.pid))
    if os.environ.get("IGNORE_TERM"):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    time.sleep(60)


def fail(out_dir, failing_rank, how):
    if RANK != int(failing_rank):
        sleeper_with_helper(out_dir)
        return 0
    # Fail only once every other rank is up, so the launcher has someone to stop.
    others = ["pid.%d" % r for r in range(WORLD) if r != RANK]
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not all(
            os.path.exists(os.path.join(out_dir, p)) for p in others):
        time.sleep(0.02)
    if how == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    return int(how)


def trap(out_dir):
    """Records each SIGINT/SIGTERM/SIGUSR1 in got.RANK; exits 0 on the first two."""
    def on_signal(signum, _frame):
        with open(os.path.join(out_dir, "got.%d" % RANK), "a") as f:
            f.write("%s\n" % signal.Signals(signum).name)
        if signum != signal.SIGUSR1:
            sys.exit(0)
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1):
        signal.signal(sig, on_signal)
    write(os.path.join(out_dir, "ready.%d" % RANK), "")
    time.sleep(60)
    return 1


def raise_first(out_dir, failing_rank, delay, mode):
    """The failing rank raises ValueError after `delay` s. The others: sleep (mode sleep:
    horarun stops them), or fail 30 ms after it printed its traceback, the way a hora job's
    ranks fail when a peer is gone (mode peers); with mode slow it then takes 0.3 s to exit
    (atexit handlers), so the others exit first."""
    marker = os.path.join(out_dir, "raised")
    if RANK == int(failing_rank):
        time.sleep(float(delay))
        if mode == "slow":
            atexit.register(time.sleep, 0.3)
        if mode != "sleep":
            atexit.register(write, marker, "")  # runs first: after the traceback is out
        raise ValueError("boom from rank %d" % RANK)
    if mode == "sleep":
        time.sleep(30)
        return 0
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not os.path.exists(marker):
        time.sleep(0.005)
    time.sleep(0.03)
    sys.stderr.write("Traceback (most recent call last):\n  File \"x.py\", line 1, in <module>\n"
                     "RuntimeError: rank %d lost its peer\n" % RANK)
    sys.stderr.flush()
    os._exit(7)


def handled():
    """Rank 0 prints the traceback of an exception it handled and carries on; rank 1 exits 3
    0.3 s later: rank 1 failed first."""
    if RANK == 0:
        sys.stderr.write("Traceback (most recent call last):\n  File \"x.py\", line 1, in f\n"
                         "KeyError: 'handled'\n")
        sys.stderr.flush()
        time.sleep(0.2)
        print("recovered", flush=True)
        time.sleep(30)
        return 0
    time.sleep(0.5)
    return 3


def echo_stdin():
    data = sys.stdin.read()
    print("stdin: %r" % data, flush=True)


def main(argv):
    action = argv[0]
    if action == "env":
        dump_env(argv[1])
    elif action == "output":
        output(argv[1])
    elif action == "fail":
        return fail(*argv[1:])
    elif action == "trap":
        return trap(argv[1])
    elif action == "raise":
        return raise_first(*argv[1:])
    elif action == "handled":
        return handled()
    elif action == "stdin":
        echo_stdin()
    elif action == "exit":
        return int(argv[1 + RANK] if len(argv) > 1 + RANK else argv[-1])
    else:
        print("rank_prog.py: unknown action %s" % action, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
