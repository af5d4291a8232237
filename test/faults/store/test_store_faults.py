#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The env:// store and data plane against strangers (docs/security.md).

argv: store_rank (store_rank.c), horarun. Each case starts its ranks with a short HORA_TIMEOUT_S,
kills every process it started when it ends (passed or failed), and asserts the outcome: the job's
sum computed here, the refused connection closed, the error's status and words."""
import os
import re
import resource
import signal
import socket
import struct
import subprocess
import sys
import time
import unittest

STORE_RANK = os.path.abspath(sys.argv[1])
HORARUN = os.path.abspath(sys.argv[2])
STORE_TOOL = os.path.abspath(sys.argv[3])
SCALE = float(os.environ.get("HORA_TEST_TIME_SCALE", "1"))


def report(line):
    """A measured figure, for the log (docs/security.md quotes them)."""
    print("    measured: " + line, file=sys.stderr, flush=True)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def connect(host, port, timeout=1.0):
    """A connected socket, or None if refused."""
    s = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    s.settimeout(timeout)
    try:
        s.connect((host, port))
        return s
    except OSError:
        s.close()
        return None


def wait_listening(port, proc, deadline_s=5.0):
    end = time.time() + deadline_s * SCALE
    while time.time() < end:
        # /proc/net/tcp: is anything listening on the port (no connection of ours, which the
        # store would count as a stranger)?
        for table in ("/proc/net/tcp", "/proc/net/tcp6"):
            with open(table) as f:
                for line in f.readlines()[1:]:
                    fields = line.split()
                    if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                        return
        if proc.poll() is not None:
            raise AssertionError("rank 0 exited before serving the store: %s" % proc.communicate()[1])
        time.sleep(0.02)
    raise AssertionError("the store never listened on port %d" % port)


def closed_within(sock, seconds):
    """Seconds until the peer closed `sock` (reading and dropping what it sends), or None."""
    start = time.time()
    sock.settimeout(0.05)
    while time.time() - start < seconds:
        try:
            data = sock.recv(65536)
            if not data:
                return time.time() - start
        except socket.timeout:
            continue
        except OSError:
            return time.time() - start
    return None


def store_request(sock, command, args, wait_ms=0):
    """One request of hora's store protocol; returns (status, payload)."""
    body = struct.pack("<BII", command, wait_ms, len(args))
    body += b"".join(struct.pack("<I", len(a)) + a for a in args)
    sock.sendall(struct.pack("<I", len(body)) + body)
    head = b""
    while len(head) < 4:
        chunk = sock.recv(4 - len(head))
        if not chunk:
            raise OSError("closed by the store")
        head += chunk
    (n,) = struct.unpack("<I", head)
    reply = b""
    while len(reply) < n:
        chunk = sock.recv(n - len(reply))
        if not chunk:
            raise OSError("closed by the store")
        reply += chunk
    return reply[0], reply[1:]


def store_client(port, timeout=5.0):
    """A connection that has done the handshake with a store that asks for no token."""
    sock = connect("127.0.0.1", port, timeout)
    if sock is None:
        raise OSError("refused")
    try:
        status, _ = store_request(sock, 6, [b"hora-store/1", b"", os.urandom(32)])  # HELLO
        if status == 0:
            status, _ = store_request(sock, 7, [b""])  # PROOF (none)
        if status != 0:
            raise OSError("the store answered the handshake with status %d" % status)
    except OSError:
        sock.close()
        raise
    return sock


def is_closed(sock):
    """Whether the peer has closed `sock`, without waiting."""
    sock.setblocking(False)
    try:
        return sock.recv(65536, socket.MSG_PEEK) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


def cpu_seconds(pid):
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class StoreFaults(unittest.TestCase):
    def setUp(self):
        self.procs = []
        self.sockets = []
        self.port = free_port()

    def tearDown(self):
        for s in self.sockets:
            s.close()
        for p in self.procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
            p.communicate()

    def env(self, rank, size=2, timeout=3, drop=(), **extra):
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("HORA_", "OMPI_", "PMI", "SLURM_")) and
               k not in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK")}
        env.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(self.port), "RANK": str(rank),
                    "WORLD_SIZE": str(size), "HORA_BOOTSTRAP": "env",
                    "HORA_TIMEOUT_S": str(timeout * SCALE), "HORA_FLIGHT_RECORDER": "off"})
        env.update({k: str(v) for k, v in extra.items() if v is not None})
        for k in list(drop) + [k for k, v in extra.items() if v is None]:
            env.pop(k, None)
        return env

    def start(self, env, *args):
        p = subprocess.Popen([STORE_RANK] + list(args), env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, start_new_session=True)
        self.procs.append(p)
        return p

    def finish(self, p, timeout=15):
        try:
            out, err = p.communicate(timeout=timeout * SCALE)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            out, err = p.communicate()
            self.fail("a rank hung: %s %s" % (out, err))
        return p.returncode, out, err

    def assert_sum(self, result, expected, size=2):
        code, out, err = result
        self.assertEqual(code, 0, err)
        m = re.search(r"rank (\d+) of (\d+) sum (\S+)", out)
        self.assertIsNotNone(m, out + err)
        self.assertEqual(int(m.group(2)), size, out)
        self.assertEqual(float(m.group(3)), expected, out)

    # --------------------------------------------------------------------------------------
    def test_strangers_on_the_port(self):
        """Garbage, a huge length, a half frame, and more connections than the limit: the bad
        ones are closed, the half frame after the idle timeout, and the job still forms."""
        rank0 = self.start(self.env(0, HOLD_S=4 * SCALE))
        wait_listening(self.port, rank0)
        garbage = connect("127.0.0.1", self.port)
        garbage.sendall(b"GET / HTTP/1.1\r\nHost: hora\r\n\r\n")
        huge = connect("127.0.0.1", self.port)
        huge.sendall(b"\xff\xff\xff\x7fxxxx")
        half = connect("127.0.0.1", self.port)
        half.sendall(b"\x30\x00\x00\x00\x06hora")
        half_at = time.time()
        self.sockets += [garbage, huge, half]
        t_garbage = closed_within(garbage, 1.0)
        t_huge = closed_within(huge, 1.0)
        self.assertIsNotNone(t_garbage, "garbage was not closed")
        self.assertIsNotNone(t_huge, "a 2 GB length prefix was not closed")
        report("garbage closed in %.3f s, a 2 GB length prefix in %.3f s" % (t_garbage, t_huge))
        # At most 64 connections that have not finished the handshake: each one past that
        # closes the oldest (the two above that are still open count too).
        flood = [connect("127.0.0.1", self.port) for _ in range(100)]
        self.sockets += [s for s in flood if s]
        time.sleep(0.3)
        closed = sum(1 for s in flood if s is None or is_closed(s))
        report("100 connections at once: %d closed at once (at most 64 without a handshake)"
               % closed)
        self.assertGreaterEqual(closed, 100 - 64)
        self.assertTrue(is_closed(flood[0]), "the oldest was not the one closed")
        self.assertFalse(is_closed(flood[-1]), "the newest was closed")
        for s in flood:
            if s:
                s.close()
        # The job forms and computes right while `half` still sits there.
        rank1 = self.start(self.env(1))
        result = self.finish(rank1)
        if result[0] != 0 and rank0.poll() is not None:
            self.fail("rank 0 ended: %s" % (rank0.communicate(),))
        self.assert_sum(result, 3.0)
        # The half frame is closed once the idle timeout (HORA_TIMEOUT_S, 3 s) passes, while
        # rank 0 still serves (it holds 4 s after the allreduce).
        waited = closed_within(half, 6.0 * SCALE)
        self.assertIsNotNone(waited, "a half frame was never closed")
        report("a half frame closed %.2f s after it arrived (HORA_TIMEOUT_S=3)" % (time.time() - half_at))
        self.assertGreater(time.time() - half_at, 2.0)
        self.assertIsNone(rank0.poll(), "rank 0 had already ended: the close proves nothing")
        code, out, err = self.finish(rank0)
        self.assert_sum((code, out, err), 3.0)
        refused = [l for l in err.splitlines() if "refused a connection" in l]
        self.assertGreaterEqual(len(refused), 1, err)
        report("rank 0 logged %d refusal line(s) for ~32 refused connections" % len(refused))
        self.assertLessEqual(len(refused), 3, "the refusals were not rate-limited:\n" + err)
        self.assertIn("127.0.0.1:", refused[0])

    def test_accept_out_of_descriptors_stays_quiet_and_cheap(self):
        """accept() failing with EMFILE: no busy loop, at most a line per few seconds, and the
        store serves again once descriptors are back."""
        rank0 = self.start(self.env(0, timeout=8))
        wait_listening(self.port, rank0)
        time.sleep(0.3)
        open_fds = len(os.listdir("/proc/%d/fd" % rank0.pid))
        old = resource.prlimit(rank0.pid, resource.RLIMIT_NOFILE)
        resource.prlimit(rank0.pid, resource.RLIMIT_NOFILE, (open_fds + 2, old[1]))
        flood = [connect("127.0.0.1", self.port) for _ in range(12)]
        self.sockets += [s for s in flood if s]
        time.sleep(0.2)
        before = cpu_seconds(rank0.pid)
        time.sleep(1.5)
        used = cpu_seconds(rank0.pid) - before
        resource.prlimit(rank0.pid, resource.RLIMIT_NOFILE, old)
        for s in flood:
            if s:
                s.close()
        report("accept() at EMFILE: rank 0 used %.1f%% of a core over 1.5 s" % (100 * used / 1.5))
        self.assertLess(used / 1.5, 0.2, "rank 0 used %.0f%% of a core while accept failed" % (100 * used / 1.5))
        rank1 = self.start(self.env(1, timeout=8))
        self.assert_sum(self.finish(rank1), 3.0)
        code, out, err = self.finish(rank0)
        self.assert_sum((code, out, err), 3.0)
        accept_lines = [l for l in err.splitlines() if "accept failed" in l]
        self.assertGreaterEqual(len(accept_lines), 1, err)
        report("accept() at EMFILE: %d log line(s)" % len(accept_lines))
        self.assertLessEqual(len(accept_lines), 2, "\n".join(accept_lines))
        self.assertIn("too many open files", accept_lines[0])

    def test_forged_rank_without_a_token_is_trusted(self):
        """The documented trust model without HORA_JOB_TOKEN: whoever reaches the port first as
        RANK=1 is rank 1, and its data counts."""
        rank0 = self.start(self.env(0))
        impostor = self.start(self.env(1, VALUE=1000))
        self.assert_sum(self.finish(rank0), 1001.0)
        self.assert_sum(self.finish(impostor), 1001.0)

    def test_forged_rank_with_a_token_is_refused(self):
        """With HORA_JOB_TOKEN on the real ranks, impostors with a wrong or no token fail at once
        with a clear error, rank 0 logs them, and the real job's sum is right."""
        token = "job-" + os.urandom(8).hex()
        rank0 = self.start(self.env(0, timeout=4, HORA_JOB_TOKEN=token))
        wait_listening(self.port, rank0)
        start = time.time()
        wrong = self.start(self.env(1, timeout=4, VALUE=1000, HORA_JOB_TOKEN="guess"))
        missing = self.start(self.env(1, timeout=4, VALUE=1000))
        code, out, err = self.finish(wrong)
        self.assertEqual(code, 2, out + err)
        self.assertIn("invalid argument (1)", err)
        self.assertIn("wrong job token", err)
        code, out, err = self.finish(missing)
        self.assertEqual(code, 2, out + err)
        self.assertIn("requires the job's token", err)
        report("two impostors refused within %.3f s of starting" % (time.time() - start))
        self.assertLess(time.time() - start, 2.5 * SCALE, "the impostors were not refused at once")
        real = self.start(self.env(1, timeout=4, HORA_JOB_TOKEN=token))
        self.assert_sum(self.finish(real), 3.0)
        code, out, err = self.finish(rank0)
        self.assert_sum((code, out, err), 3.0)
        refused = [l for l in err.splitlines() if "refused a connection from 127.0.0.1:" in l]
        self.assertGreaterEqual(len(refused), 1, err)
        self.assertLessEqual(len(refused), 2, err)
        self.assertRegex(refused[0], "job token")
        report("rank 0 logged: " + refused[0].split("W ", 1)[-1])

    def test_binds_to_master_addr_unless_told(self):
        """MASTER_ADDR=127.0.0.1: the store is not reachable at another local address;
        HORA_STORE_BIND=0.0.0.0 opens it."""
        others = ["127.0.0.2"]
        try:
            out = subprocess.run(["hostname", "-I"], capture_output=True, text=True, timeout=5).stdout
            others += [a for a in out.split() if ":" not in a][:1]
        except (OSError, subprocess.SubprocessError):
            pass
        rank0 = self.start(self.env(0))
        wait_listening(self.port, rank0)
        for address in others:
            s = connect(address, self.port)
            self.assertIsNone(s, "reached the store at %s:%d" % (address, self.port))
        s = connect("127.0.0.1", self.port)
        self.assertIsNotNone(s)
        s.close()
        os.killpg(rank0.pid, signal.SIGKILL)
        rank0.communicate()

        self.port = free_port()
        rank0 = self.start(self.env(0, HORA_STORE_BIND="0.0.0.0"))
        wait_listening(self.port, rank0)
        for address in others:
            s = connect(address, self.port)
            self.assertIsNotNone(s, "HORA_STORE_BIND=0.0.0.0 but %s:%d refused" % (address, self.port))
            s.close()

    def test_store_closes_at_shutdown_and_init_works_again(self):
        """Three init/shutdown cycles in the same processes: each sums right, and after each
        shutdown rank 0's store port no longer accepts (its keys are gone with it)."""
        rank0 = self.start(self.env(0, timeout=4), "cycles", "3")
        rank1 = self.start(self.env(1, timeout=4), "cycles", "3")
        code1, out1, err1 = self.finish(rank1, 30)
        code0, out0, err0 = self.finish(rank0, 30)
        self.assertEqual(code0, 0, err0)
        self.assertEqual(code1, 0, err1)
        self.assertEqual(re.findall(r"sum (\S+)", out0), ["3"] * 3, out0)
        self.assertEqual(re.findall(r"sum (\S+)", out1), ["3"] * 3, out1)
        self.assertEqual(re.findall(r"cycle \d: store port (\w+)", out0), ["closed"] * 3, out0)

    def test_half_set_launch_variables_fail(self):
        """RANK=1 WORLD_SIZE=2 without MASTER_ADDR or MASTER_PORT is an error naming what is
        missing; RANK=0 WORLD_SIZE=1 alone, or nothing, is a world of one."""
        for missing in (["MASTER_ADDR"], ["MASTER_PORT"], ["MASTER_ADDR", "MASTER_PORT"]):
            env = self.env(1, drop=["HORA_BOOTSTRAP"] + missing)
            code, out, err = self.finish(self.start(env))
            self.assertEqual(code, 2, out + err)
            self.assertIn("invalid argument (1)", err)
            self.assertIn(" and ".join(missing) + (" is" if len(missing) == 1 else " are") + " not set", err)
        for extra in ({"RANK": "0", "WORLD_SIZE": "1"}, {}):
            env = self.env(0, drop=["HORA_BOOTSTRAP", "MASTER_ADDR", "MASTER_PORT", "RANK",
                                    "WORLD_SIZE"])
            env.update(extra)
            self.assert_sum(self.finish(self.start(env)), 1.0, size=1)

    def test_strangers_holding_connections_do_not_keep_a_rank_out(self):
        """A stranger without the job's token holds more connections open than the store
        admits: they never finish the handshake, so they do not count against the limit, and a
        rank that comes after them closes the oldest and gets in (they used to fill every slot,
        and the rank failed with "unreachable (connection refused)")."""
        token = "test-token-%d" % os.getpid()
        rank0 = self.start(self.env(0, timeout=8, HORA_JOB_TOKEN=token, HOLD_S=1))
        wait_listening(self.port, rank0)
        time.sleep(0.3)  # rank 0 is in, waiting for rank 1
        flood = [connect("127.0.0.1", self.port) for _ in range(150)]
        self.sockets += [s for s in flood if s]
        time.sleep(0.2)
        start = time.time()
        rank1 = self.start(self.env(1, timeout=8, HORA_JOB_TOKEN=token))
        result = self.finish(rank1)
        report("a rank behind 150 idle stranger connections formed the job in %.2f s"
               % (time.time() - start))
        self.assert_sum(result, 3.0)
        self.assert_sum(self.finish(rank0), 3.0)

    def test_store_full_says_so(self):
        """A rank the store cannot take (as many clients as the limit allows, each with the
        handshake done) fails saying the store is full, not that the master is unreachable."""
        rank0 = self.start(self.env(0, timeout=4))
        wait_listening(self.port, rank0)
        time.sleep(0.3)
        members = []
        try:
            for _ in range(80):  # the limit for a world of 2 is 4 * 2 + 64 = 72
                try:
                    members.append(store_client(self.port, 2.0))
                except OSError:
                    break
            self.assertLess(len(members), 80, "the store took every connection")
            code, out, err = self.finish(self.start(self.env(1, timeout=2)))
            self.assertNotEqual(code, 0, out + err)
            self.assertIn("did not let this process in", err)
            self.assertIn("the store is full", err)
            self.assertNotIn("unreachable", err)
        finally:
            for m in members:
                m.close()

    def test_store_serves_on_when_nobody_reads_its_stderr(self):
        """hora-store with its stderr a pipe nobody reads, and a client that makes it log many
        lines (bad frames after the handshake): it drops log lines rather than block, and goes
        on serving (it used to stop in write(2) after about 500 lines)."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("HORA_")}
        store = subprocess.Popen([STORE_TOOL, "--host", "127.0.0.1", "--port", "0"], env=env,
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, start_new_session=True)
        self.procs.append(store)
        line = store.stdout.readline().decode()
        self.assertTrue(line.startswith("hora-store listening on "), line)
        port = int(line.split()[-1])
        for i in range(1500):  # about 150 bytes logged each: 3x a pipe's 64 KiB
            bad = store_client(port)
            bad.sendall(struct.pack("<I", 5) + b"xxxxx")  # below the smallest request
            bad.close()
        good = store_client(port)
        good.settimeout(5.0 * SCALE)
        start = time.time()
        store_request(good, 1, [b"key", b"value"])  # SET
        status, value = store_request(good, 2, [b"key"], wait_ms=1000)  # GET
        report("a store whose stderr nobody read answered in %.3f s after 1500 logged faults"
               % (time.time() - start))
        self.assertEqual((status, value), (0, b"value"))
        good.close()
        # what it wrote says that lines were dropped
        os.killpg(store.pid, signal.SIGKILL)
        err = store.stderr.read().decode("utf-8", "replace")
        self.assertIn("closing the connection", err)

    def test_horarun_gives_each_job_its_own_token(self):
        """horarun passes every rank a non-empty HORA_JOB_TOKEN, the same within a job and
        different between jobs; a token the user set is passed on instead."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("HORA_")}
        script = 'echo "token=$HORA_JOB_TOKEN"'
        jobs = []
        for _ in range(2):
            p = subprocess.run([sys.executable, HORARUN, "-np", "2", "sh", "-c", script], env=env,
                               capture_output=True, text=True, timeout=30 * SCALE)
            self.assertEqual(p.returncode, 0, p.stderr)
            tokens = re.findall(r"token=(\S*)", p.stdout)
            self.assertEqual(len(tokens), 2, p.stdout)
            self.assertEqual(tokens[0], tokens[1])
            self.assertRegex(tokens[0], r"^[0-9a-f]{64}$")
            jobs.append(tokens[0])
        self.assertNotEqual(jobs[0], jobs[1])
        env["HORA_JOB_TOKEN"] = "mine"
        p = subprocess.run([sys.executable, HORARUN, "-np", "2", "sh", "-c", script], env=env,
                           capture_output=True, text=True, timeout=30 * SCALE)
        self.assertEqual(re.findall(r"token=(\S*)", p.stdout), ["mine", "mine"], p.stdout)
        # Through mpirun: by name only, so that the secret is not on the command line.
        p = subprocess.run([sys.executable, HORARUN, "-H", "a:1", "--pml", "ob1", "--dry-run", "./x"],
                           env=env, capture_output=True, text=True, timeout=30 * SCALE)
        self.assertIn("-x HORA_JOB_TOKEN ", p.stdout)
        self.assertNotIn("mine", p.stdout)


if __name__ == "__main__":
    # A hang anywhere fails the whole file instead of blocking the suite.
    signal.alarm(int(150 * SCALE))
    unittest.main(argv=sys.argv[:1], verbosity=2)
