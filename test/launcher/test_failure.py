# SPDX-License-Identifier: Apache-2.0
"""horarun when a rank fails: one line naming it, the others stopped, nothing left behind."""

import os
import re
import time
import unittest

from launcher_util import TempDirTest, clean_env, kill_leftovers, process_gone, rank_cmd, \
    run_horarun, scaled

# The ranks left running sleep 60 s; stopping them must take a small part of that.
STOP_LIMIT_S = scaled(10)


class RankFailure(TempDirTest):

    def assert_nothing_left(self):
        pids = self.read_pids("pid.")
        self.assertTrue(pids, "the sleeping ranks never wrote their pids")
        deadline = time.monotonic() + scaled(3)  # orphaned helpers wait for init to reap them
        while time.monotonic() < deadline and not all(process_gone(p) for p in pids):
            time.sleep(0.05)
        alive = [p for p in pids if not process_gone(p)]
        kill_leftovers(alive)
        self.assertEqual(alive, [], "processes left behind")

    def failure_lines(self, stderr):
        return [l for l in stderr.splitlines() if l.startswith("horarun: rank ")]

    def test_exit_status_stops_the_others(self):
        proc, took = run_horarun(["-np", "4"] + rank_cmd("fail", self.dir, 2, 3))
        self.assertEqual(proc.returncode, 3, proc.stderr)
        self.assertLess(took, STOP_LIMIT_S)
        self.assertEqual(self.failure_lines(proc.stderr),
                         ["horarun: rank 2 exited with status 3; stopping the other 3 ranks"])
        self.assert_nothing_left()

    def test_killed_by_signal(self):
        proc, took = run_horarun(["-np", "3"] + rank_cmd("fail", self.dir, 1, "kill"))
        self.assertEqual(proc.returncode, 128 + 9, proc.stderr)
        self.assertLess(took, STOP_LIMIT_S)
        self.assertEqual(
            self.failure_lines(proc.stderr),
            ["horarun: rank 1 was killed by signal 9 (SIGKILL); stopping the other 2 ranks"])
        self.assert_nothing_left()

    def test_sigterm_ignored_then_sigkill(self):
        # The survivors ignore SIGTERM: horarun must SIGKILL them once --grace has passed.
        proc, took = run_horarun(["-np", "3", "--grace", "1"] + rank_cmd("fail", self.dir, 0, 5),
                                 env=clean_env(IGNORE_TERM="1"))
        self.assertEqual(proc.returncode, 5, proc.stderr)
        self.assertGreaterEqual(took, 1.0)
        self.assertLess(took, STOP_LIMIT_S)
        self.assertEqual(self.failure_lines(proc.stderr),
                         ["horarun: rank 0 exited with status 5; stopping the other 2 ranks"])
        self.assertIn("horarun: sending SIGKILL to 2 ranks still running: 1, 2", proc.stderr)
        self.assert_nothing_left()

    def test_last_rank_failing_alone(self):
        # Ranks 0 and 1 exit 0 at once; rank 2 fails later with nobody left to stop.
        proc, _ = run_horarun(["-np", "3", "bash", "-c", '[ "$RANK" = 2 ] && sleep 1 && exit 4; '
                               "exit 0"])
        self.assertEqual(proc.returncode, 4, proc.stderr)
        self.assertEqual(self.failure_lines(proc.stderr), ["horarun: rank 2 exited with status 4"])

    def test_program_not_found(self):
        proc, _ = run_horarun(["-np", "2", self.path("no-such-program")])
        self.assertEqual(proc.returncode, 127)
        self.assertRegex(proc.stderr, re.escape("horarun: cannot start %s: " %
                                                self.path("no-such-program")))


class FirstFailure(TempDirTest):
    """The summary line names the rank that failed first, with its status and exception line,
    whatever the order horarun reaps the ranks in."""

    def test_ten_jobs_name_the_rank_that_raised(self):
        # Job j: rank j % 3 raises after a staggered delay; the others sleep until stopped
        # (must not be named), or fail 30 ms after it (peers), or exit before it (slow: its
        # atexit handlers take 0.3 s): by exit time alone a peer would be first.
        modes = ["sleep", "peers", "slow"]
        wrong = []
        for job in range(10):
            failing, mode = job % 3, modes[(job // 3) % 3]
            out = self.path("job%d" % job)
            os.mkdir(out)
            args = ["-np", "3", "--grace", "1", "--stop-after", "0" if mode == "sleep" else "5"]
            proc, _ = run_horarun(args + rank_cmd("raise", out, failing, 0.02 * job, mode))
            lines = [l for l in proc.stderr.splitlines() if l.startswith("horarun: rank ")]
            want = r"horarun: rank %d exited with status 1 \(ValueError: boom from rank %d\)" \
                % (failing, failing)
            if mode == "sleep":
                want += "; stopping the other 2 ranks"
            else:
                want += "(; stopping the other (rank|2 ranks))?"  # peers may still run
            if proc.returncode != 1 or len(lines) != 1 or not re.fullmatch(want, lines[0]):
                wrong.append("job %d (%s, rank %d raises): status %d, %s" % (
                    job, mode, failing, proc.returncode, lines))
        self.assertEqual(wrong, [])

    def test_a_handled_traceback_is_no_failure(self):
        proc, _ = run_horarun(["-np", "2", "--stop-after", "0"] + rank_cmd("handled"))
        self.assertEqual(proc.returncode, 3, proc.stderr)
        self.assertEqual([l for l in proc.stderr.splitlines() if l.startswith("horarun: rank ")],
                         ["horarun: rank 1 exited with status 3; stopping the other rank"])


class FirstFailureOrder(unittest.TestCase):
    """Which rank failed first, from the times horarun noted, without the races of a real job:
    horarun's local mode loaded as a module, ranks as its Rank objects with the times set by
    hand."""

    @classmethod
    def setUpClass(cls):
        from launcher_util import horarun_module
        cls.h = horarun_module("local")

    def rank(self, index, exit_at, returncode, traceback_at=None):
        r = self.h.Rank(index, None)
        r.exit_at, r.returncode = exit_at, returncode
        r.err = self.h.RankStream(index, -1, None, False, watch=True)
        r.out = self.h.RankStream(index, -1, None, False)
        r.err.traceback_at = traceback_at
        return r

    def first(self, ranks):
        first_exit = min(r.exit_at for r in ranks)
        return min(ranks, key=lambda r: r.failed_at(first_exit)).index

    def test_a_signal_death_noticed_after_the_traceback_it_caused(self):
        # rank 1 killed at t=100.00, its watcher ran late (100.05); rank 0's "connection reset"
        # traceback was read at 100.01 and it exited at 100.20
        killed = self.rank(1, 100.05, -9)
        peer = self.rank(0, 100.20, 1, traceback_at=100.01)
        self.assertEqual(self.first([peer, killed]), 1)

    def test_a_traceback_long_before_a_signal_death(self):
        # rank 0 raised at t=100 and took a second to exit; rank 1 was killed at 101 for it
        raised = self.rank(0, 101.5, 1, traceback_at=100.0)
        killed = self.rank(1, 101.0, -9)
        self.assertEqual(self.first([killed, raised]), 0)

    def test_a_slow_exit_after_raising_beats_the_failures_it_caused(self):
        raised = self.rank(2, 100.8, 1, traceback_at=100.0)
        others = [self.rank(i, 100.3, 1) for i in (0, 1)]
        self.assertEqual(self.first(others + [raised]), 2)


if __name__ == "__main__":
    unittest.main(verbosity=2)
