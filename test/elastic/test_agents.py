# SPDX-License-Identifier: Apache-2.0
"""horarun's agents: restarts (--max-restarts), rounds across hosts (--nnodes MIN:MAX,
--rdzv-endpoint), elastic worlds (--min-np, --max-np, --host-discovery-script) and a worker's
hora_shutdown + hora_init after a lost peer.

    python3 test_agents.py CLASS        one class (meson runs each as its own test)

Environment (meson sets it): HORARUN, CLUSTER_TOOL, RESTART_PROG, SURVIVOR_PROG, TORCH_TRAIN
and PYTHONPATH (empty when there is no torch). The cluster classes exit 77 (skipped) where
hora-cluster --check says no cluster can be built here (no CAP_NET_ADMIN)."""

import os
import re
import subprocess
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from picked_port import free_port  # noqa: E402
from time_scale import scaled  # noqa: E402

HORARUN = os.environ.get("HORARUN", "")
CLUSTER = os.environ.get("CLUSTER_TOOL", "")
RESTART_PROG = os.environ.get("RESTART_PROG", "")
SURVIVOR_PROG = os.environ.get("SURVIVOR_PROG", "")
TORCH_TRAIN = os.environ.get("TORCH_TRAIN", "")
EXAMPLE = os.environ.get("ELASTIC_EXAMPLE", "")
TORCHRUN_WORKER = os.environ.get("TORCHRUN_WORKER", "")
QUIET = {"HORA_LOG_LEVEL": "error"}


def run(argv, env=None, timeout=120):
    full = dict(os.environ, **QUIET)
    full.update(env or {})
    return subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          env=full, timeout=scaled(timeout))


def horarun(*args, env=None, timeout=120):
    return run([sys.executable, HORARUN] + list(args), env, timeout)


def child_named(parent, name):
    """The pid of a child process of `parent` whose command is `name`, or None."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % entry) as f:
                stat = f.read()
        except OSError:
            continue
        comm = stat[stat.index("(") + 1:stat.rindex(")")]
        ppid = int(stat[stat.rindex(")") + 2:].split()[1])
        if ppid == parent and comm == name:
            return int(entry)
    return None


class AgentTest(unittest.TestCase):
    def show(self, proc):
        return "\nstatus %d\nstdout:\n%s\nstderr:\n%s" % (proc.returncode, proc.stdout,
                                                          proc.stderr)


class Restart(AgentTest):
    """--max-restarts on one host: a rank that aborts in round 0 restarts the whole group."""

    def test_restart_finishes_the_job(self):
        proc = horarun("-np", "2", "--max-restarts", "1", RESTART_PROG)
        self.assertEqual(proc.returncode, 0, self.show(proc))
        for r in range(2):
            self.assertIn("[%d] rank %d of 2: 10 steps correct in round 1" % (r, r), proc.stdout,
                          self.show(proc))
        self.assertRegex(proc.stderr, r"horarun: round 0 ended: rank 1 on \S+ was killed by "
                         r"signal 6 \(SIGABRT\); restarting the workers \(restart 1 of 1\)")

    def test_no_restart_left_fails_naming_the_rank(self):
        proc = horarun("-np", "2", "--max-restarts", "0", RESTART_PROG)
        self.assertEqual(proc.returncode, 128 + 6, self.show(proc))
        self.assertRegex(proc.stderr, r"horarun: rank 1 on \S+ was killed by signal 6 "
                         r"\(SIGABRT\); no restarts left \(--max-restarts 0\)")
        self.assertNotIn("steps correct", proc.stdout)

    def test_restart_count_variables(self):
        # torchrun's variable too, so torch-style scripts see the round unchanged
        script = ('echo "$RANK $HORA_RESTART_COUNT $TORCHELASTIC_RESTART_COUNT"; '
                  '[ "$RANK" != 1 ] || [ "$HORA_RESTART_COUNT" -ge 2 ] || exit 3')
        proc = horarun("-np", "2", "--max-restarts", "2", "--no-prefix", "sh", "-c", script)
        self.assertEqual(proc.returncode, 0, self.show(proc))
        self.assertEqual(sorted(proc.stdout.split("\n")[:-1]),
                         ["0 0 0", "0 1 1", "0 2 2", "1 0 0", "1 1 1", "1 2 2"], self.show(proc))
        self.assertEqual(len(re.findall(r"rank 1 on \S+ exited with status 3; restarting",
                                        proc.stderr)), 2, self.show(proc))

    def test_exhausted_restarts_keep_the_rank_status(self):
        proc = horarun("-np", "2", "--max-restarts", "1", "sh", "-c", '[ "$RANK" != 0 ] || exit 5')
        self.assertEqual(proc.returncode, 5, self.show(proc))
        self.assertIn("restart 1 of 1", proc.stderr)
        self.assertIn("no restarts left (--max-restarts 1)", proc.stderr)


class LateAgent(AgentTest):
    """Two agents of one machine at one endpoint: the first forms a round alone (--nnodes 1:2);
    the second's arrival ends it, and both form a round of two without using a restart."""

    def test_late_agent_starts_a_new_round(self):
        port = free_port()
        script = 'echo "$RANK/$WORLD_SIZE restarts=$HORA_RESTART_COUNT"; sleep %d' % scaled(3)
        argv = [sys.executable, HORARUN, "--nnodes", "1:2", "--rdzv-endpoint",
                "127.0.0.1:%d" % port, "--rdzv-id", "late", "-np", "1", "--no-prefix",
                "sh", "-c", script]
        env = dict(os.environ, **QUIET)
        first = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                 env=env)
        try:
            self.assertEqual(first.stdout.readline().strip(), "0/1 restarts=0")
            second = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    text=True, env=env, timeout=scaled(60))
            out, err = first.communicate(timeout=scaled(60))
        finally:
            if first.poll() is None:
                first.kill()
        self.assertEqual(first.returncode, 0, err)
        self.assertEqual(second.returncode, 0, second.stderr)
        self.assertIn("round 0 ended: an agent asks to join (1 of at most 2 hosts in this "
                      "round); forming a new round", err)
        self.assertEqual(sorted([out.strip(), second.stdout.strip()]),
                         ["0/2 restarts=0", "1/2 restarts=0"])


class Forming(AgentTest):
    """While a job forms, rank 0 says which ranks it still waits for (not silence)."""

    def test_rank_zero_names_the_missing_rank(self):
        script = '[ "$RANK" = 1 ] && sleep %d; exec "$0"' % scaled(12)
        proc = horarun("-np", "2", "sh", "-c", script, RESTART_PROG,
                       env={"HORA_LOG_LEVEL": "warning", "STEPS": "1", "FAIL_STEP": "9"})
        self.assertEqual(proc.returncode, 0, self.show(proc))
        self.assertRegex(proc.stderr, r"\[0\] \[hora\] W .*rendezvous: 1 of 2 ranks are "
                         r"here after 1\d s; waiting for rank 1 \(the store is at ")


    def test_agents_say_who_they_wait_for(self):
        # a round short of MIN agents is reported after 10 s, then fails at --rdzv-timeout
        proc = horarun("--nnodes", "2:2", "--rdzv-endpoint", "127.0.0.1:%d" % free_port(),
                       "--rdzv-timeout", "11", "-np", "1", "true")
        self.assertEqual(proc.returncode, 1, self.show(proc))
        self.assertRegex(proc.stderr, r"horarun: round 0: 1 of the 2 agents that --nnodes 2:2 "
                         r"needs have joined after 1\d s; waiting for the others")
        self.assertIn("only 1 of the 2 agents that --nnodes 2:2 needs joined round 0 within 11 s",
                      proc.stderr)


class Usage(AgentTest):
    def assertUsage(self, args, message):
        proc = horarun(*(list(args) + ["true"]))
        self.assertEqual(proc.returncode, 2, self.show(proc))
        self.assertIn(message, proc.stderr)

    def test_errors(self):
        self.assertUsage(["--nnodes", "2:1"], "--nnodes 2:1: need 1 <= MIN <= MAX")
        self.assertUsage(["--nnodes", "x"], "--nnodes x: expected N or MIN:MAX")
        self.assertUsage(["--nnodes", "1:2"], "--nnodes 1:2 needs --rdzv-endpoint")
        self.assertUsage(["--max-restarts", "-1"], "must not be negative")
        self.assertUsage(["--min-np", "1", "--max-restarts", "1"], "carry on without a restart")
        self.assertUsage(["--min-np", "3", "--max-np", "2"], "need 1 <= min <= max")
        self.assertUsage(["--standalone", "--rdzv-endpoint", "h:1"], "excludes --rdzv-endpoint")
        self.assertUsage(["--max-restarts", "1", "-H", "a:1"], "one horarun per host")
        self.assertUsage(["--rdzv-endpoint", "h:x"], "expected HOST or HOST:PORT")

    def test_torchrun_spellings(self):
        proc = horarun("--nproc_per_node", "2", "--standalone", "--max_restarts", "0",
                       "--no-prefix", "sh", "-c", 'echo "$RANK/$WORLD_SIZE/$LOCAL_WORLD_SIZE"')
        self.assertEqual(proc.returncode, 0, self.show(proc))
        self.assertEqual(sorted(proc.stdout.split()), ["0/2/2", "1/2/2"])


class Elastic(AgentTest):
    """In-process elasticity through the C API: survivors of a lost worker form a new world."""

    def test_survivors_carry_on(self):
        proc = horarun("-np", "3", "--min-np", "2", SURVIVOR_PROG)
        self.assertEqual(proc.returncode, 0, self.show(proc))
        lines = sorted(l for l in proc.stdout.splitlines() if "steps correct" in l)
        self.assertEqual(len(lines), 2, self.show(proc))
        for line in lines:
            self.assertRegex(line, r"rank [01] of 2: 20 steps correct, 2 worlds")
        self.assertRegex(proc.stderr, r"worker 2 was killed by signal 9 \(SIGKILL\); the others "
                         r"carry on")

    def test_worker_killed_before_its_world_forms(self):
        """The agents placed 3 workers in the first world; the third dies before that world has
        formed (HORA_TEST_AT kills it right after it got its place). Its agent tells the round at
        once, and the survivors' hora_init gives up on that world and joins the next, of two,
        within seconds: they used to wait for the dead worker until HORA_TIMEOUT_S (60 s here)."""
        start = time.monotonic()
        proc = horarun("-np", "3", "--min-np", "2", SURVIVOR_PROG,
                       env={"HORA_TEST_AT": "elastic-joined@2:kill", "VICTIM": "99",
                            "HORA_TIMEOUT_S": "60"})
        took = time.monotonic() - start
        self.assertEqual(proc.returncode, 0, self.show(proc))
        lines = sorted(l for l in proc.stdout.splitlines() if "steps correct" in l)
        self.assertEqual(len(lines), 2, self.show(proc))
        for line in lines:
            self.assertRegex(line, r"rank [01] of 2: 20 steps correct, 1 worlds")
        self.assertRegex(proc.stderr, r"worker 2 was killed by signal 9 \(SIGKILL\); the others "
                         r"carry on")
        self.assertLess(took, scaled(20), "the survivors waited %.1f s" % took)

    def test_store_process_killed_is_named(self):
        """The hora-store process the agent runs dies while the agent lives: the agent says that
        its hora-store was killed, not that "its agent is gone"."""
        env = dict(os.environ, **QUIET)
        job = subprocess.Popen([sys.executable, HORARUN, "-np", "1", "--min-np", "1", "sh", "-c",
                                "sleep 60"], env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, start_new_session=True)
        try:
            store = None
            deadline = time.monotonic() + scaled(20)
            while store is None and time.monotonic() < deadline:
                store = child_named(job.pid, "hora-store")
                time.sleep(0.05)
            self.assertIsNotNone(store, "no hora-store under horarun")
            time.sleep(0.5)
            os.kill(store, 9)
            out, err = job.communicate(timeout=scaled(60))
        finally:
            if job.poll() is None:
                os.killpg(job.pid, 9)
                job.wait()
        self.assertIn("hora-store (pid %d), which served the job's store here, was killed by "
                      "signal 9 (SIGKILL)" % store, err)
        self.assertNotIn("agent is gone", err)
        self.assertNotEqual(job.returncode, 0)

    def test_below_min_np_fails(self):
        proc = horarun("-np", "2", "--min-np", "2", "--rdzv-timeout", "3", SURVIVOR_PROG,
                       env={"HORA_TIMEOUT_S": "30"})
        self.assertNotEqual(proc.returncode, 0, self.show(proc))
        self.assertIn("only 1 workers were ready for a new world within 3 s, and --min-np is 2",
                      proc.stderr)


@unittest.skipUnless(TORCH_TRAIN, "no torch for /usr/bin/python3, or no Python bindings")
class TorchElastic(AgentTest):
    """hora.torch.elastic: a lost worker mid-epoch, the survivor from the last commit, a worker
    added back through the discovery script, identical replicas at the end."""

    def test_lose_and_regrow(self):
        with tempfile.TemporaryDirectory() as tmp:
            hosts = os.path.join(tmp, "hosts")
            with open(hosts, "w") as f:
                f.write("localhost:2\n")
            script = os.path.join(tmp, "discover.sh")
            with open(script, "w") as f:
                f.write("#!/bin/sh\ncat %s\n" % hosts)
            os.chmod(script, 0o755)
            proc = horarun("-np", "2", "--min-np", "1", "--max-np", "2",
                           "--host-discovery-script", script, "/usr/bin/python3", TORCH_TRAIN,
                           env={"ELASTIC_DISCOVERY_FILE": hosts}, timeout=240)
        self.assertEqual(proc.returncode, 0, self.show(proc))
        self.assertIn("worker 1 was killed by signal 9 (SIGKILL); the others carry on", proc.stderr)
        resets = re.findall(r"RESET size (\d) rank (\d) epoch (\d) batch (\d+) loss (\S+) "
                            r"committed (\S+)", proc.stdout)
        # alone from the last commit (epoch 1, batch 4: worker 1 died at batch 6), then two again
        self.assertIn(("1", "0", "1", "4"), [r[:4] for r in resets], self.show(proc))
        self.assertIn("2", [r[0] for r in resets], self.show(proc))
        for r in resets:
            self.assertAlmostEqual(float(r[4]), float(r[5]), places=7)
        final = re.findall(r"FINAL rank (\d) size (\d) epoch (\d) checksum (\S+)", proc.stdout)
        self.assertEqual(sorted(f[0] for f in final), ["0", "1"], self.show(proc))
        self.assertEqual({f[1] for f in final}, {"2"})
        self.assertEqual({f[2] for f in final}, {"3"})
        self.assertEqual(len({f[3] for f in final}), 1, "replicas differ: %s" % final)


@unittest.skipUnless(TORCHRUN_WORKER, "no torch for /usr/bin/python3")
class TorchRestart(AgentTest):
    """A torchrun-style torch.distributed script on Gloo restarts unchanged under horarun:
    MASTER_ADDR:MASTER_PORT are torch's (its rank 0 serves there), hora's store is elsewhere."""

    def test_torch_gloo_script_restarts(self):
        proc = horarun("-np", "2", "--max-restarts", "1", "/usr/bin/python3", TORCHRUN_WORKER,
                       timeout=180)
        self.assertEqual(proc.returncode, 0, self.show(proc))
        self.assertIn("KILLED_AT", proc.stderr)
        self.assertRegex(proc.stdout, r"\[0\] RESUMED_AT \d+")
        self.assertRegex(proc.stderr, r"round 0 ended: rank 1 on \S+ was killed by signal 9")


@unittest.skipUnless(TORCH_TRAIN and EXAMPLE, "no torch for /usr/bin/python3, or no bindings")
class Example(AgentTest):
    """bindings/python/examples/elastic_train.py, with a worker killed from outside."""

    def test_example_survives_a_kill(self):
        proc = subprocess.Popen(
            [sys.executable, HORARUN, "-np", "3", "--min-np", "2", "/usr/bin/python3", EXAMPLE,
             "--epochs", "3", "--batches", "20", "--work", "0.05"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env=dict(os.environ, **QUIET))
        try:
            first = proc.stdout.readline()  # epoch 0 is done: kill a worker that is not rank 0
            self.assertIn("epoch 0: mean loss", first)
            workers = subprocess.run(["pgrep", "-P", str(proc.pid), "-f", "elastic_train.py"],
                                     stdout=subprocess.PIPE, text=True).stdout.split()
            self.assertEqual(len(workers), 3, workers)
            os.kill(int(sorted(workers, key=int)[-1]), 9)
            out, err = proc.communicate(timeout=scaled(120))
        finally:
            if proc.poll() is None:
                proc.kill()
        self.assertEqual(proc.returncode, 0, "%s\n%s\n%s" % (first, out, err))
        self.assertRegex(out, r"now 2 workers, from epoch [12] batch (0|10)\b")
        self.assertIn("epoch 2: mean loss", out)


class ClusterTest(AgentTest):
    """Two namespace hosts, one agent each (hora-cluster --per-host); the agent on host0 serves
    the store. Host1's first rank kills its agent and then itself (a lost host)."""

    def agents(self, horarun_args, prog, extra_env=(), timeout=180):
        # host1's command may die with its agent: the cluster must not stop host0 for that
        inner = ('%s %s --nnodes "$AGENT_NNODES" --rdzv-endpoint "$MASTER_ADDR:29400" '
                 '--rdzv-id t %s %s; s=$?; [ "$NODE_RANK" = 1 ] && exit 0; exit $s') % (
                     sys.executable, HORARUN, horarun_args, prog)
        argv = [sys.executable, CLUSTER, "--hosts", "2", "--per-host", "-x", "FAIL_HOST=host1",
                "-x", "KILL_AGENT=1", "-x", "HORA_LOG_LEVEL=error"]
        for e in extra_env:
            argv += ["-x", e]
        return run(argv + ["sh", "-c", inner], timeout=timeout)


class ClusterRestart(ClusterTest):
    def test_other_host_restarts_alone(self):
        proc = self.agents("-np 1 --max-restarts 1", RESTART_PROG,
                           ["AGENT_NNODES=1:2", "HORA_TIMEOUT_S=30"])
        self.assertEqual(proc.returncode, 0, self.show(proc))
        self.assertRegex(proc.stdout, r"rank 0 of 1: 10 steps correct in round 1")
        self.assertRegex(proc.stderr, r"round 0 ended: .*restarting the workers \(restart 1 of 1\)")

    def test_below_min_names_the_missing_host(self):
        proc = self.agents("-np 1 --max-restarts 1 --rdzv-timeout 4", RESTART_PROG,
                           ["AGENT_NNODES=2:2", "HORA_TIMEOUT_S=30"])
        self.assertNotEqual(proc.returncode, 0, self.show(proc))
        self.assertRegex(proc.stderr, r"only 1 of the 2 agents that --nnodes 2:2 needs joined "
                         r"round 1 within 4 s \(--rdzv-timeout\); missing: host host1")


class ClusterElastic(ClusterTest):
    def test_other_host_carries_on(self):
        # --nnodes 2:2: the first world waits for both hosts' workers
        proc = self.agents("-np 1 --min-np 1", SURVIVOR_PROG,
                           ["AGENT_NNODES=2:2", "HORA_TIMEOUT_S=30"])
        self.assertEqual(proc.returncode, 0, self.show(proc))
        self.assertRegex(proc.stdout, r"rank 0 of 1: 20 steps correct, 2 worlds")


if __name__ == "__main__":
    if sys.argv[1:2] and sys.argv[1].startswith("Cluster"):
        check = subprocess.run([sys.executable, CLUSTER, "--check"], stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, timeout=scaled(60))
        if check.returncode != 0:
            print("SKIP: %s" % check.stdout.strip())
            sys.exit(77)
    unittest.main(verbosity=2)
