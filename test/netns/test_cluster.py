# SPDX-License-Identifier: Apache-2.0
"""tools/hora-cluster: hosts as network namespaces on a bridge, and jobs on them.

Run one class per meson test: `test_cluster.py CLASS`. Every class but DryRun builds clusters and
exits 77 (skipped) where hora-cluster --check says this machine cannot (no CAP_NET_ADMIN).
meson passes CLUSTER_TOOL (tools/hora-cluster), NETNS_CHECK_PROG (netns_check) and
CLUSTER_TEST_MPI (1 when hora is built with MPI and mpirun is installed)."""

import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "common"))
from time_scale import scaled  # noqa: E402

TOOL = os.environ.get("CLUSTER_TOOL") or os.path.join(HERE, "..", "..", "tools", "hora-cluster")
CHECK_PROG = os.environ.get("NETNS_CHECK_PROG", "")
LINK_PROG = os.environ.get("CLUSTER_LINK_PROG", "")
WITH_MPI = os.environ.get("CLUSTER_TEST_MPI") == "1" and shutil.which("mpirun") is not None
RUN_TIMEOUT_S = scaled(60)
needs_check_prog = unittest.skipUnless(CHECK_PROG, "NETNS_CHECK_PROG not set (meson sets it)")


def tool_env(**extra):
    """This environment without HORA_* settings a test runner may carry (the job sets its own),
    but with HORA_TEST_TIME_SCALE, plus `extra`."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("HORA_") or k == "HORA_TEST_TIME_SCALE"}
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


def run_tool(args, timeout=RUN_TIMEOUT_S, env=None):
    """Runs hora-cluster to the end; returns (CompletedProcess, its pid, seconds)."""
    start = time.monotonic()
    proc = subprocess.Popen([sys.executable, TOOL] + list(args), env=env or tool_env(),
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)  # hora-cluster removes its cluster on SIGTERM
        out, err = proc.communicate(timeout=scaled(30))
        raise AssertionError("hora-cluster %s ran over %ss:\n%s\n%s" % (args, timeout, out, err))
    done = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    return done, proc.pid, time.monotonic() - start


def start_tool(args):
    return subprocess.Popen([sys.executable, TOOL] + list(args), env=tool_env(),
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)


def leftovers(pid):
    """Every namespace, link, hosts folder and state folder of cluster hcl<pid> still there."""
    tag = "hcl%d" % pid
    found = []
    netns = subprocess.run(["ip", "netns", "list"], stdout=subprocess.PIPE, text=True).stdout
    found += [w.split()[0] for w in netns.splitlines()
              if w.split() and re.fullmatch(tag + r"h[0-9]+", w.split()[0])]
    links = subprocess.run(["ip", "-o", "link", "show"], stdout=subprocess.PIPE, text=True).stdout
    for line in links.splitlines():
        name = line.split(":", 2)[1].strip().split("@")[0]
        if re.fullmatch(tag + r"(b|[vp][0-9]+)", name):
            found.append("link " + name)
    if os.path.isdir("/etc/netns"):
        found += ["/etc/netns/" + n for n in os.listdir("/etc/netns") if n.startswith(tag + "h")]
    state = os.path.join(tempfile.gettempdir(), "hora-cluster.%d" % pid)
    if os.path.exists(state):
        found.append(state)
    return found


def netns_of(pid):
    names = subprocess.run(["ip", "netns", "list"], stdout=subprocess.PIPE, text=True).stdout
    return [l.split()[0] for l in names.splitlines()
            if l.split() and l.split()[0].startswith("hcl%dh" % pid)]


def wait_for(predicate, timeout):
    deadline = time.monotonic() + scaled(timeout)
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


def pid_gone(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return True


class ClusterTest(unittest.TestCase):

    def assertClean(self, pid, proc=None):
        self.assertEqual(leftovers(pid), [], proc.stderr if proc is not None else "")

    def assertOk(self, proc):
        self.assertEqual(proc.returncode, 0, "stdout:\n%s\nstderr:\n%s" % (proc.stdout,
                                                                           proc.stderr))


def job_lines(out):
    """The words of each process --dry-run would start in a host (after '# the job')."""
    lines = out.splitlines()
    lines = lines[lines.index("# the job") + 1:]
    return [shlex.split(l[:-2]) for l in lines[:lines.index("wait")]]


class DryRun(unittest.TestCase):
    """--dry-run: what would be built and started (needs no privileges)."""

    def dry(self, args):
        proc = subprocess.run([sys.executable, TOOL, "--dry-run"] + args, env=tool_env(),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              timeout=scaled(30), check=False)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        return proc.stdout

    def test_default_mode(self):
        out = self.dry(["--hosts", "3", "-R", "2", "--subnet", "10.99.7.0/24", "--port", "4242",
                        "-x", "FOO=bar", "./prog", "a b"])
        tag = re.search(r"^# hora-cluster (hcl[0-9]+):", out, re.M).group(1)
        self.assertIn("ip link add %sb type bridge" % tag, out)
        self.assertIn("ip addr add 10.99.7.254/24 dev %sb" % tag, out)
        for i in range(3):
            self.assertIn("ip netns add %sh%d" % (tag, i), out)
            self.assertIn("ip -n %sh%d addr add 10.99.7.%d/24 dev eth0" % (tag, i, i + 1), out)
            self.assertIn("10.99.7.%d\thost%d" % (i + 1, i), out)  # the hosts file
        self.assertNotIn("tc ", out)
        jobs = job_lines(out)
        self.assertEqual(len(jobs), 3)
        for i, words in enumerate(jobs):
            at = words.index("ip")
            self.assertEqual(words[at:at + 10], ["ip", "netns", "exec", "%sh%d" % (tag, i),
                                                 "nsenter", "--target", "$HOLDER_%d" % i,
                                                 "--uts", "--ipc", sys.executable])
            self.assertIn("HOLDER_%d=$!" % i, out)
            h = next(k for k, w in enumerate(words) if w.endswith("horarun"))
            rest = words[h + 1:]
            for option, value in (("-np", "2"), ("--nnodes", "3"), ("--node-rank", str(i)),
                                  ("--master-addr", "10.99.7.1"), ("--master-port", "4242"),
                                  ("-x", "FOO=bar")):
                self.assertEqual(rest[rest.index(option) + 1], value, words)
            self.assertEqual(rest[-3:], ["--", "./prog", "a b"])

    def test_shaping(self):
        out = self.dry(["--rate", "1gbit", "--delay", "1ms", "./prog"])
        tag = re.search(r"^# hora-cluster (hcl[0-9]+):", out, re.M).group(1)
        # 4 ms at 1 Gbit/s: 500000 bytes.
        tbf = "tbf rate 1gbit burst 500000 latency 50ms"
        self.assertIn("tc qdisc add dev %sv0 root %s" % (tag, tbf), out)
        self.assertIn("tc -n %sh1 qdisc add dev eth0 root handle 1: netem delay 1ms" % tag, out)
        self.assertIn("tc -n %sh1 qdisc add dev eth0 parent 1: handle 2: %s" % (tag, tbf), out)

    def test_modes(self):
        out = self.dry(["-R", "3", "--mpirun", "--mpirun-args", "--mca foo 1", "./prog"])
        jobs = job_lines(out)
        self.assertEqual(len(jobs), 1)
        words = jobs[0]
        self.assertEqual(words[words.index("-H") + 1], "host0:3,host1:3")
        mpi = shlex.split(words[words.index("--mpirun-args") + 1])
        self.assertIn("plm_rsh_agent", mpi)
        self.assertIn("btl_tcp_if_include", mpi)
        self.assertEqual(mpi[-3:], ["--mca", "foo", "1"])
        self.assertIn("rsh-agent <<'EOF'", out)
        self.assertIn('exec ip netns exec "$ns" nsenter --target "$holder" --uts --ipc sh -c "$*"',
                      out)

        out = self.dry(["--hosts", "2", "-R", "4", "--per-host", "--", "my-launcher", "-v"])
        jobs = job_lines(out)
        self.assertEqual(len(jobs), 2)
        for i, words in enumerate(jobs):
            self.assertEqual(words[-2:], ["my-launcher", "-v"])
            for var in ("NODE_RANK=%d" % i, "NNODES=2", "LOCAL_WORLD_SIZE=4", "MASTER_PORT=29500"):
                self.assertIn(var, words)

    def test_usage_errors(self):
        for args in (["--hosts", "0", "p"], ["--rate", "fast", "p"], ["--delay", "1", "p"],
                     ["--subnet", "10.0.0.0/30", "--hosts", "3", "p"], [],
                     ["--mpirun-args", "x", "p"], ["--burst", "100000", "p"]):
            proc = subprocess.run([sys.executable, TOOL, "--dry-run"] + args, env=tool_env(),
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                  timeout=scaled(30), check=False)
            self.assertEqual(proc.returncode, 2, (args, proc.stdout, proc.stderr))
            self.assertIn("hora-cluster: error:", proc.stderr)

    def test_help(self):
        proc = subprocess.run([sys.executable, TOOL, "--help"], stdout=subprocess.PIPE,
                              text=True, timeout=scaled(30), check=False)
        self.assertEqual(proc.returncode, 0)
        for word in ("--hosts", "--ranks-per-host", "--rate", "--delay", "--subnet", "--mpirun",
                     "--per-host", "--host0", "--cleanup", "--dry-run", "netem",
                     "CLUSTER_HOSTFILE"):
            self.assertIn(word, proc.stdout)


class EnvRanks(ClusterTest):
    """2 hosts x 2 ranks through horarun on each host: netns_check's topology and collectives."""

    @needs_check_prog
    def test_netns_check(self):
        proc, pid, _ = run_tool(["--hosts", "2", "-R", "2",
                                 "-x", "HORA_TIMEOUT_S=%d" % scaled(30), CHECK_PROG])
        self.assertOk(proc)
        self.assertIn("[0] netns: 4 ranks on 2 hosts: OK", proc.stdout)
        self.assertClean(pid, proc)

    @needs_check_prog
    def test_three_hosts(self):
        proc, pid, _ = run_tool(["--hosts", "3", "-R", "1",
                                 "-x", "HORA_TIMEOUT_S=%d" % scaled(30), CHECK_PROG, "3"])
        self.assertOk(proc)
        self.assertIn("[0] netns: 3 ranks on 3 hosts: OK", proc.stdout)
        self.assertClean(pid, proc)

    @needs_check_prog
    def test_ucx_alone_on_each_host_quiet(self):
        # Every rank alone on its host: the UCX plane sends eagerly and widens the TCP transport's
        # segments, keys UCX warns about where no transport takes them (UCX_TLS without tcp).
        for tls in (None, "tcp,self", "sm,tcp"):
            args = ["--hosts", "2", "-R", "1", "-x", "HORA_CPU_BACKEND=ucx",
                    "-x", "HORA_TIMEOUT_S=%d" % scaled(30)]
            if tls:
                args += ["-x", "UCX_TLS=" + tls]
            proc, pid, _ = run_tool(args + [CHECK_PROG, "2"])
            self.assertOk(proc)
            self.assertIn("[0] netns: 2 ranks on 2 hosts: OK", proc.stdout)
            self.assertNotIn("UCX  WARN", proc.stdout + proc.stderr, tls)
            self.assertClean(pid, proc)

    def test_variables(self):
        script = 'echo "$RANK $WORLD_SIZE $LOCAL_RANK $LOCAL_WORLD_SIZE $NODE_RANK $(hostname) ' \
                 '$MASTER_ADDR $MASTER_PORT ${OMPI_COMM_WORLD_SIZE:-none}"'
        env = tool_env(OMPI_COMM_WORLD_SIZE="7")  # as under an outer mpirun: removed
        proc, pid, _ = run_tool(["--hosts", "2", "-R", "2", "--subnet", "10.219.3.0/24",
                                 "--port", "4000", "sh", "-c", script], env=env)
        self.assertOk(proc)
        lines = sorted(proc.stdout.splitlines())
        self.assertEqual(lines, ["[%d] %d 4 %d 2 %d host%d 10.219.3.1 4000 none" % (
            r, r, r % 2, r // 2, r // 2) for r in range(4)])
        self.assertClean(pid, proc)


class HostNames(ClusterTest):
    """Ranks started by another launcher (--per-host) without LOCAL_RANK: hora derives the
    topology from the host names alone, as on two machines."""

    @needs_check_prog
    def test_topology_from_host_names(self):
        script = ('hostname; unset LOCAL_WORLD_SIZE; '
                  'RANK=$((NODE_RANK * 2)) WORLD_SIZE=4 "$0" & a=$!; '
                  'RANK=$((NODE_RANK * 2 + 1)) WORLD_SIZE=4 "$0" & b=$!; '
                  's=0; wait $a || s=1; wait $b || s=1; exit $s')
        proc, pid, _ = run_tool(["--hosts", "2", "-R", "2", "--per-host",
                                 "-x", "HORA_TIMEOUT_S=%d" % scaled(30),
                                 "--", "sh", "-c", script, CHECK_PROG])
        self.assertOk(proc)
        self.assertIn("[host0] host0", proc.stdout)
        self.assertIn("[host1] host1", proc.stdout)
        self.assertIn("[host0] netns: 4 ranks on 2 hosts: OK", proc.stdout)
        self.assertClean(pid, proc)


class Isolation(ClusterTest):
    """What a host shares with the other hosts and with its own processes: the ranks of one host
    share its UTS and IPC namespaces; two hosts share neither, so UCX's shared-memory transports
    (which compare IPC namespaces) do not connect them."""

    def test_namespaces(self):
        script = 'echo "$RANK $(readlink /proc/self/ns/ipc) $(readlink /proc/self/ns/uts) ' \
                 '$(readlink /proc/self/ns/net)"'
        proc, pid, _ = run_tool(["--hosts", "2", "-R", "2", "--no-prefix", "sh", "-c", script])
        self.assertOk(proc)
        ns = dict((int(l.split()[0]), l.split()[1:]) for l in proc.stdout.splitlines())
        self.assertEqual(sorted(ns), [0, 1, 2, 3], proc.stdout)
        self.assertEqual(ns[0], ns[1])
        self.assertEqual(ns[2], ns[3])
        for a, b in zip(ns[0], ns[2]):
            self.assertNotEqual(a, b)
        self.assertNotIn(os.readlink("/proc/self/ns/ipc"), ns[0] + ns[2])
        self.assertClean(pid, proc)

    @unittest.skipIf(shutil.which("ucx_perftest") is None, "no ucx_perftest (ucx-utils)")
    def test_ucx_shared_memory_stays_in_a_host(self):
        # UCX_TLS=posix,self: a server and a client on the same host connect; across hosts the
        # destination is unreachable.
        perf = "timeout %d ucx_perftest -t tag_lat -n 100 -p" % scaled(20)
        script = ('if [ "$NODE_RANK" = 1 ]; then {p} 13001 >/dev/null 2>&1 & '
                  '{p} 13002 >/dev/null 2>&1 & sleep 0.5; '
                  '{p} 13001 host1 >/dev/null 2>&1 && echo same-host ok; wait; '
                  'else sleep 1; {p} 13002 host1 2>&1 | grep -o "Destination is unreachable" | '
                  'head -1; fi').format(p=perf)
        proc, pid, _ = run_tool(["--hosts", "2", "--per-host", "-x", "UCX_TLS=posix,self",
                                 "--", "sh", "-c", script])
        self.assertIn("[host1] same-host ok", proc.stdout, proc.stderr)
        self.assertIn("[host0] Destination is unreachable", proc.stdout, proc.stderr)
        self.assertClean(pid, proc)


class Failure(ClusterTest):
    """A failing rank: its status is the job's, the other host stops, nothing is left."""

    def test_rank_fails(self):
        script = 'if [ "$RANK" = 2 ]; then exit 3; fi; exec sleep 60'
        proc, pid, took = run_tool(["--hosts", "2", "-R", "2", "--stop-after", "0.5",
                                    "sh", "-c", script])
        self.assertEqual(proc.returncode, 3, proc.stderr)
        self.assertIn("host1's horarun exited with status 3", proc.stderr)
        self.assertLess(took, scaled(30))
        self.assertClean(pid, proc)

    def test_program_missing(self):
        proc, pid, _ = run_tool(["--hosts", "2", "/nonexistent/prog"])
        self.assertEqual(proc.returncode, 127, proc.stderr)
        self.assertClean(pid, proc)

    def test_delay_without_netem_or_with(self):
        proc, pid, _ = run_tool(["--hosts", "2", "--delay", "1ms", "--per-host", "--",
                                 "tc", "qdisc", "show", "dev", "eth0"])
        if proc.returncode == 0:
            self.assertIn("netem", proc.stdout)  # this kernel has netem
        else:
            self.assertEqual(proc.returncode, 1, proc.stderr)
            self.assertIn("netem", proc.stderr)
        self.assertClean(pid, proc)


class Signals(ClusterTest):
    """SIGTERM stops every rank and removes the cluster; SIGUSR1 reaches every rank."""

    def start_sleepers(self, ranks_per_host=2):
        script = 'trap "echo usr1 $RANK" USR1; echo up; while :; do sleep 0.1; done'
        proc = start_tool(["--hosts", "2", "-R", str(ranks_per_host), "--grace", "3",
                           "sh", "-c", script])
        # Every rank's "up" line: read the first lines as they come.
        seen = 0
        deadline = time.monotonic() + scaled(30)
        os.set_blocking(proc.stdout.fileno(), True)
        while seen < 2 * ranks_per_host and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            seen += line.rstrip().endswith(" up")
        self.assertEqual(seen, 2 * ranks_per_host)
        return proc

    def test_sigterm(self):
        proc = self.start_sleepers()
        self.assertEqual(len(netns_of(proc.pid)), 2)
        proc.send_signal(signal.SIGUSR1)
        time.sleep(0.5)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=scaled(30))
        self.assertEqual(proc.returncode, 128 + signal.SIGTERM, err)
        usr1 = sorted(l for l in out.splitlines() if "usr1" in l)
        self.assertEqual(usr1, ["[%d] usr1 %d" % (r, r) for r in range(4)], out + err)
        self.assertEqual(leftovers(proc.pid), [], err)


class KilledRun(ClusterTest):
    """A SIGKILLed hora-cluster: its ranks die with it; --cleanup (or the next run) removes its
    namespaces and links, and leaves a live cluster alone."""

    def test_leftovers_removed(self):
        victim = start_tool(["--hosts", "2", "sh", "-c", "echo up; exec sleep 60"])
        self.assertTrue(wait_for(lambda: len(netns_of(victim.pid)) == 2, 30))
        # Wait until both hosts' ranks are running.
        os.set_blocking(victim.stdout.fileno(), True)
        self.assertIn("up", victim.stdout.readline())
        self.assertIn("up", victim.stdout.readline())
        pids = [int(p) for ns in netns_of(victim.pid) for p in subprocess.run(
            ["ip", "netns", "pids", ns], stdout=subprocess.PIPE, text=True).stdout.split()]
        self.assertTrue(pids)
        live = start_tool(["--hosts", "2", "sh", "-c", "echo up; exec sleep 60"])
        try:
            self.assertTrue(wait_for(lambda: len(netns_of(live.pid)) == 2, 30))
            os.kill(victim.pid, signal.SIGKILL)
            victim.communicate(timeout=scaled(30))
            self.assertNotEqual(leftovers(victim.pid), [])
            # Its ranks died with it (parent-death signal), though its namespaces remain.
            self.assertTrue(wait_for(lambda: all(pid_gone(p) for p in pids), 10), pids)

            proc = subprocess.run([sys.executable, TOOL, "--cleanup"], env=tool_env(),
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                  timeout=scaled(60), check=False)
            self.assertOk(proc)
            self.assertEqual(leftovers(victim.pid), [])
            self.assertEqual(len(netns_of(live.pid)), 2)  # the live cluster stays
        finally:
            live.send_signal(signal.SIGTERM)
            live.communicate(timeout=scaled(30))
            if victim.poll() is None:
                victim.kill()
                victim.communicate()
        self.assertEqual(leftovers(live.pid), [])

    def test_next_run_removes_leftovers(self):
        victim = start_tool(["--hosts", "2", "sh", "-c", "echo up; exec sleep 60"])
        self.assertTrue(wait_for(lambda: len(netns_of(victim.pid)) == 2, 30))
        os.kill(victim.pid, signal.SIGKILL)
        victim.communicate(timeout=scaled(30))
        self.assertNotEqual(leftovers(victim.pid), [])
        proc, pid, _ = run_tool(["--hosts", "1", "true"])
        self.assertOk(proc)
        self.assertEqual(leftovers(victim.pid), [])
        self.assertClean(pid, proc)


class Shaping(ClusterTest):
    """--rate: a tbf on both ends of each host's link, and transfers take at least as long as
    the rate allows."""

    def test_rate(self):
        proc, pid, _ = run_tool(["--hosts", "2", "--rate", "100mbit", "--per-host", "--",
                                 "tc", "qdisc", "show", "dev", "eth0"])
        self.assertOk(proc)
        for host in ("host0", "host1"):
            self.assertRegex(proc.stdout, r"\[%s\] qdisc tbf .*rate 100Mbit" % host)
        self.assertClean(pid, proc)

    def test_transfer_time(self):
        # host1 sends 4 MB to host0 over a 50 Mbit/s link: at least 0.64 s minus one bucket
        # (4 ms worth, at least 64 KiB), where an unshaped veth takes milliseconds.
        size = 4 * 1000 * 1000
        server = ("import socket,sys,time;s=socket.socket();"
                  "s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1);"
                  "s.bind(('0.0.0.0',int(sys.argv[1])));s.listen(1);c,_=s.accept();n=0;t=None\n"
                  "while True:\n d=c.recv(1<<20)\n if not d: break\n"
                  " t=t or time.monotonic();n+=len(d)\n"
                  "print('got',n,'in %.3f'%(time.monotonic()-t))")
        client = ("import socket,sys,time\n"
                  "for i in range(200):\n"
                  " try:\n  c=socket.create_connection((sys.argv[2],int(sys.argv[1])));break\n"
                  " except OSError: time.sleep(0.05)\n"
                  "c.sendall(b'x'*%d);c.close()" % size)
        script = ('if [ "$NODE_RANK" = 0 ]; then exec "$0" -c "$1" "$MASTER_PORT"; '
                  'else exec "$0" -c "$2" "$MASTER_PORT" "$MASTER_ADDR"; fi')
        proc, pid, _ = run_tool(["--hosts", "2", "--rate", "50mbit", "--per-host", "--",
                                 "sh", "-c", script, sys.executable, server, client])
        self.assertOk(proc)
        m = re.search(r"\[host0\] got (\d+) in ([0-9.]+)", proc.stdout)
        self.assertTrue(m, proc.stdout)
        self.assertEqual(int(m.group(1)), size)
        self.assertGreater(float(m.group(2)), (size - 64 * 1024) * 8 / 50e6 * 0.9)
        self.assertClean(pid, proc)


@unittest.skipUnless(LINK_PROG, "no hora-link in this build")
class LinkBound(ClusterTest):
    """hora-link between 2 hosts over links shaped to 100 Mbit/s: the rate it measures cannot
    exceed the link's, and the allreduce bound it prints follows from that rate."""

    def test_shaped(self):
        proc, pid, _ = run_tool(["--hosts", "2", "--rate", "100mbit", LINK_PROG, "--ops", "50",
                                 "--bytes", "2M", "--sizes", "4,8M"])
        self.assertOk(proc)
        out = proc.stdout
        self.assertEqual(len(re.findall(r"^\[0\] +[12] +(sleep|spin) ", out, re.M)), 4, out)
        m = re.search(r"per rank, each way: ([0-9.]+) GB/s", out)
        self.assertTrue(m, out)
        rate = float(m.group(1))
        # 100 Mbit/s is 0.0125 GB/s; a tbf bucket (64 KiB) of 2 MiB may pass at once.
        self.assertGreater(rate, 0)
        self.assertLess(rate, 0.0125 * 1.05 * 2 / (2 - 64 / 1024))
        m = re.search(r"^\[0\] +8388608 +([0-9.]+) +([0-9.]+)", out, re.M)
        self.assertTrue(m, out)
        # 2 hosts x 1 rank: each rank sends the whole vector's worth, 8 MiB, at `rate`.
        expected = 8 * 2**20 / (rate * 1e9) * 1e6
        self.assertAlmostEqual(float(m.group(1)), expected, delta=0.01 * expected)
        self.assertClean(pid, proc)


@unittest.skipUnless(WITH_MPI, "hora without MPI, or no mpirun")
class Mpirun(ClusterTest):
    """--mpirun: Open MPI's daemons in the namespaces through the rsh agent."""

    @needs_check_prog
    def test_netns_check(self):
        proc, pid, _ = run_tool(["--hosts", "2", "-R", "2", "--mpirun",
                                 "-x", "HORA_TIMEOUT_S=%d" % scaled(30), CHECK_PROG])
        self.assertOk(proc)
        self.assertRegex(proc.stdout, r"<stdout>:netns: 4 ranks on 2 hosts: OK")
        self.assertClean(pid, proc)

    def test_hosts_and_addresses(self):
        script = 'echo "$OMPI_COMM_WORLD_RANK $(hostname) $(ip -4 -o addr show dev eth0)"'
        proc, pid, _ = run_tool(["--hosts", "2", "-R", "2", "--subnet", "10.219.5.0/24",
                                 "--mpirun", "--no-prefix", "sh", "-c", script])
        self.assertOk(proc)
        lines = sorted(proc.stdout.splitlines())
        self.assertEqual(len(lines), 4, proc.stdout)
        for r, line in enumerate(lines):
            self.assertRegex(line, r"^%d host%d .* inet 10\.219\.5\.%d/24 " % (r, r // 2,
                                                                               r // 2 + 1))
        self.assertClean(pid, proc)


if __name__ == "__main__":
    if sys.argv[1:2] != ["DryRun"]:
        check = subprocess.run([sys.executable, TOOL, "--check"], stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, timeout=scaled(60))
        if check.returncode != 0:
            print("SKIP: %s" % check.stdout.strip())
            sys.exit(77)
    unittest.main(verbosity=2)
