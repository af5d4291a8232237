# SPDX-License-Identifier: Apache-2.0
"""Local mode: the ranks of this machine as child processes, their output cut into tagged lines,
signals forwarded, and the first failure named (LocalJob, which the agents run too)."""

import errno
import os
import selectors
import shlex
import signal
import subprocess
import threading
import time

from .common import (RANK_VARS, STDERR, STDOUT, TOKEN_VAR, describe_exit, free_port,
                     is_launcher_var, job_token, make_child_setup, plural, say, signal_name)

# Passed on to every rank without stopping the job: schedulers send them as a warning (Slurm's
# --signal, "checkpoint now"); a rank that does not handle one dies and the job stops as usual.
PASS_ON_SIGNALS = (signal.SIGUSR1, signal.SIGUSR2)

# A line without a newline is still passed on once it is this long, so that a rank printing
# progress bars with '\r' cannot make horarun buffer without bound.
MAX_LINE = 64 * 1024
# After SIGKILL a process can only survive in uninterruptible sleep; do not wait on it forever.
KILL_WAIT_S = 5.0
# Output still arriving after every rank exited comes from processes the ranks left behind; read
# what is there, then stop.
DRAIN_S = 2.0
# When a rank fails: how long horarun waits for exits that already happened to be timed, and how
# long before the first exit a rank's traceback may have come to count as its failure (it then
# failed first, and took long to exit: atexit handlers, hora's shutdown). An older traceback, or
# one its rank printed more on stdout after (HANDLED_S later), was an exception it handled.
SETTLE_S = 0.05
RAISED_BEFORE_S = 10.0
HANDLED_S = 0.1
# A rank killed by a signal horarun did not send is timed by the watcher thread that notices its
# death, which on a busy machine can be scheduled after another rank's reader has already read
# the traceback that death caused (a peer's "Connection reset by peer" comes within a
# millisecond). Such a death counts as this much earlier than it was noticed.
SIGNAL_LAG_S = 0.3
# How often an agent looks at the store while its workers run (LocalJob's hooks.watch).
AGENT_POLL_S = 0.2


def rank_env(base, args, knobs, rank, local_rank, master_addr, master_port):
    """The environment of one local rank: base minus launcher variables, plus env:// and knobs."""
    env = {k: v for k, v in base.items() if not is_launcher_var(k)}
    world_size = args.np * args.nnodes
    env.update({
        "MASTER_ADDR": master_addr,
        "MASTER_PORT": str(master_port),
        "RANK": str(rank),
        "WORLD_SIZE": str(world_size),
        "LOCAL_RANK": str(local_rank),
        "LOCAL_WORLD_SIZE": str(args.np),
        "NODE_RANK": str(args.node_rank),
        "GROUP_RANK": str(args.node_rank),
        "HORA_BOOTSTRAP": "env",
    })
    env.update(knobs)  # after ours: -x HORA_BOOTSTRAP=... is the user's explicit choice
    return env


def stream_masks(args, local_rank):
    """(redirected, teed) stream masks of one local rank: 1 stdout, 2 stderr."""
    def of(spec):
        default, per_rank = spec
        return per_rank.get(local_rank, default)
    tee = of(args.tee_spec)
    return of(args.redirect_spec) & ~tee, tee


class RankStream:
    """The read end of one rank's stdout or stderr, cut into lines: to horarun's own stream
    (console), to a log file (log), or both. On stderr (watch) it keeps the time and the last
    line of the rank's latest Python traceback, for the failure summary."""

    def __init__(self, rank, fd, sink, prefix, log=None, console=True, watch=False):
        self.fd = fd
        self.sink = sink
        self.prefix = ("[%s] " % rank).encode() if prefix else None
        self.pending = b""
        self.log = log
        self.console = console
        self.watch = watch
        self.traceback_at = None  # when its latest "Traceback (most recent call last):" came
        self.error_line = None    # that traceback's exception line: "ValueError: boom"
        self.error_at = None      # when that line came
        self.in_traceback = False
        self.last_at = None       # when the latest line came

    def feed(self, data):
        self.pending += data
        cut = self.pending.rfind(b"\n") + 1
        if cut == 0 and len(self.pending) >= MAX_LINE:
            cut = len(self.pending)
        if cut:
            self.emit(self.pending[:cut])
            self.pending = self.pending[cut:]

    def finish(self):
        """End of stream: the last line, even without its newline. It gets one, with or without
        the prefix, so that another rank's next line does not continue it."""
        if self.pending:
            self.emit(self.pending + b"\n")
            self.pending = b""
        if self.log is not None:
            self.log.close()
            self.log = None

    def scan(self, chunk):
        now = time.monotonic()
        for line in chunk.split(b"\n"):
            if line.startswith(b"Traceback (most recent call last):"):
                self.traceback_at, self.in_traceback, self.error_line = now, True, None
            elif self.in_traceback and line.strip() and not line[:1].isspace():
                # The first unindented line after the frames names the exception (a chained
                # one starts another traceback, whose line then counts).
                self.error_line, self.error_at = line.strip(), now
                self.in_traceback = False

    def emit(self, chunk):
        self.last_at = time.monotonic()
        if self.watch:
            self.scan(chunk)
        if self.log is not None:
            try:
                self.log.write(chunk)
            except OSError as e:
                say("cannot write %s: %s; no more of it is logged" % (self.log.name,
                                                                       e.strerror or e))
                self.log.close()
                self.log = None
        if not self.console:
            return
        if self.prefix is None:
            self.sink.write(chunk)
            return
        lines = chunk.split(b"\n")
        if lines[-1] == b"":
            lines.pop()
        self.sink.write(b"".join(self.prefix + line + b"\n" for line in lines))


class Rank:
    def __init__(self, index, proc):
        self.index = index
        self.proc = proc
        self.returncode = None
        self.exit_at = None  # when it exited (monotonic), as its watcher thread saw it
        self.pipes = []
        self.out = None      # its stdout's RankStream
        self.err = None      # its stderr's RankStream
        self.watcher = None

    def watch_exit(self, wake_fd):
        """A thread blocked in waitid() for this rank alone: it notes the time of the exit the
        moment it happens, whatever the loop is busy with, and wakes the loop. WNOWAIT leaves
        the rank for Popen to reap."""
        def wait():
            try:
                os.waitid(os.P_PID, self.proc.pid, os.WEXITED | os.WNOWAIT)
            except ChildProcessError:
                pass
            self.exit_at = time.monotonic()
            try:
                os.write(wake_fd, b"x")
            except OSError:
                pass  # full: the loop wakes anyway
        self.watcher = threading.Thread(target=wait, daemon=True,
                                        name="horarun-rank-%s" % self.index)
        self.watcher.start()

    def exited_unnoticed(self):
        """True when the rank is gone but its watcher has not said so yet."""
        if self.exit_at is not None or self.returncode is not None:
            return False
        try:
            return os.waitid(os.P_PID, self.proc.pid,
                             os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
        except ChildProcessError:
            return False

    def raised_at(self, first_exit):
        """When it printed the traceback it dies with (or is dying with), None if it did not:
        no traceback, one from long before first_exit, or one it printed more on stdout after."""
        err = self.err
        if err is None or err.traceback_at is None or \
                err.traceback_at < first_exit - RAISED_BEFORE_S:
            return None
        if err.error_at is not None and self.out.last_at is not None and \
                self.out.last_at > err.error_at + HANDLED_S:
            return None
        return err.traceback_at

    def failed_at(self, first_exit):
        """When it failed: its exit, or the Python traceback it printed before (a rank that
        raised may take long to exit: atexit handlers, hora's shutdown)."""
        exit_at = self.exit_at
        if exit_at is not None and self.returncode is not None and self.returncode < 0:
            exit_at -= SIGNAL_LAG_S
        times = [t for t in (exit_at, self.raised_at(first_exit)) if t is not None]
        return min(times) if times else float("inf")

    @property
    def running(self):
        return self.returncode is None

    def signal_group(self, sig):
        # The whole process group: a shell script's children or a rank's helpers go too.
        try:
            os.killpg(self.proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


class SignalHub:
    """horarun's signal handlers: they only note the signal; a wakeup pipe makes select()
    return at once to act on it."""

    def __init__(self):
        self.pending = []
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_r, False)
        os.set_blocking(self.wake_w, False)
        signal.set_wakeup_fd(self.wake_w, warn_on_full_buffer=False)
        for sig in (signal.SIGINT, signal.SIGTERM) + PASS_ON_SIGNALS:
            signal.signal(sig, self.on_signal)
        if signal.getsignal(signal.SIGHUP) != signal.SIG_IGN:  # respect nohup
            signal.signal(signal.SIGHUP, self.on_signal)
        signal.signal(signal.SIGCHLD, lambda *_: None)  # wakes select() when a rank exits

    def on_signal(self, signum, _frame):
        self.pending.append(signum)


class LocalJob:
    """Runs the ranks of this machine and watches them until they are all gone.

    An agent (elastic modes) passes `hooks`: hooks.watch(job) runs every loop turn (at least
    every AGENT_POLL_S) and may call job.stop(); hooks.on_exit(job, rank) hears of every exit;
    with hooks.carry_on true, a failed rank does not stop the others."""

    def __init__(self, args, workers, hooks=None, attempt=0):
        self.args = args
        self.workers = workers  # (rank label, environment) of each local rank
        self.hooks = hooks
        self.attempt = attempt    # the round: the log files' attempt_K
        self.started = 0          # local ranks started: the next one's LOCAL_RANK
        self.signaled_at = None   # when horarun first signaled ranks to stop
        self.summary_due = False  # a rank failed; the line naming the first is not out yet
        self.ranks = []
        self.selector = selectors.DefaultSelector()
        self.stop_reason = None   # None, ("rank", code) or ("signal", signum)
        self.term_at = None       # when ranks still running after a rank failed get SIGTERM
        self.kill_at = None       # when ranks still running get SIGKILL
        self.give_up_at = None    # when horarun stops waiting for SIGKILLed ranks
        self.drain_until = None
        self.pending_signals = []

    # -- setup

    def install_signals(self, hub=None):
        """Signals go to `hub` (one per horarun: an agent runs one job per round and must not
        lose a signal between them)."""
        self.hub = hub or SignalHub()
        self.wake_r = self.hub.wake_r
        self.pending_signals = self.hub.pending
        self.selector.register(self.wake_r, selectors.EVENT_READ, None)

    def start(self):
        for rank, env in self.workers:
            failed = self.add(rank, env)
            if failed is not None:
                for r in self.ranks:
                    r.signal_group(signal.SIGKILL)
                    r.proc.wait()
                return failed
        return None

    def add(self, rank, env):
        """Starts one rank (also while the job runs: elastic workers); None, or the exit status
        that a program which cannot be started means."""
        local = self.started
        self.started += 1
        try:
            logs = self.open_logs(rank, local)
        except OSError as e:
            say("cannot write the logs of rank %s in %s: %s" % (rank, self.args.log_dir,
                                                                 e.strerror or e))
            return 1
        try:
            proc = subprocess.Popen(
                self.args.command, env=env,
                stdin=None if rank == 0 else subprocess.DEVNULL,
                stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                start_new_session=True, preexec_fn=make_child_setup(os.getpid()))
        except OSError as e:
            for log, _ in logs.values():
                log.close()
            hint = ""
            if e.errno == errno.EACCES and os.path.isfile(self.args.command[0]):
                hint = " (not executable: chmod +x it, or name its interpreter)"
            say("cannot start %s: %s%s" % (self.args.program, e.strerror or e, hint))
            return 126 if e.errno in (errno.EACCES, errno.ENOEXEC, errno.EISDIR) else 127
        entry = Rank(rank, proc)
        self.ranks.append(entry)
        for pipe, sink, name in ((proc.stdout, STDOUT, "stdout"), (proc.stderr, STDERR, "stderr")):
            log, console = logs.get(name, (None, True))
            shown = getattr(self.args, "shown_ranks", None)
            console = console and (shown is None or local in shown)
            stream = RankStream(rank, pipe.fileno(), sink, self.args.prefix, log, console,
                                watch=name == "stderr")
            os.set_blocking(pipe.fileno(), False)  # drain() reads what is there, no more
            self.selector.register(pipe, selectors.EVENT_READ, stream)
            entry.pipes.append(pipe)
            entry.out = entry.out or stream
        entry.err = stream
        entry.watch_exit(self.hub.wake_w)
        return None

    def open_logs(self, rank, local):
        """{stream name: (file, also to the console)} of --log-dir/--redirects/--tee."""
        if not getattr(self.args, "logging", False):
            return {}
        redirected, teed = stream_masks(self.args, local)
        logs = {}
        for bit, name in ((1, "stdout"), (2, "stderr")):
            if (redirected | teed) & bit:
                folder = os.path.join(self.args.log_dir, "attempt_%d" % self.attempt, str(rank))
                os.makedirs(folder, exist_ok=True)
                logs[name] = (open(os.path.join(folder, name + ".log"), "wb", buffering=0),
                              not redirected & bit)
        return logs

    def stop(self, status):
        """An agent's decision: stop every rank (SIGTERM, SIGKILL after --grace); run() then
        returns `status`."""
        if self.summary_due:
            self.summarize(force=True)
        if self.stop_reason is None:
            self.stop_reason = ("rank", status)
            self.term_at = None
            self.signal_running(signal.SIGTERM)

    # -- the loop

    def run(self):
        while True:
            now = time.monotonic()
            self.handle_signals()
            self.reap()
            if self.summary_due:
                self.summarize(force=False)
            if self.hooks is not None:
                self.hooks.watch(self)
            self.check_deadlines(now)
            if not any(r.running for r in self.ranks):
                if self.drain_until is None:
                    self.drain_until = now + DRAIN_S
                if self.summary_due:
                    self.summarize(force=True)
                if len(self.selector.get_map()) <= 1 or now >= self.drain_until:
                    break
            for key, _ in self.selector.select(self.next_timeout(now)):
                if key.data is None:
                    self.drain_wakeups()
                else:
                    self.read(key)
        self.finish()
        return self.exit_code()

    def next_timeout(self, now):
        # SIGCHLD and the wakeup pipe make exits and signals immediate; the timeout is only for
        # deadlines, plus a safety poll in case a wakeup was lost.
        timeout = 0.5 if self.hooks is None else AGENT_POLL_S
        for t in (self.term_at, self.kill_at, self.give_up_at, self.drain_until):
            if t is not None:
                timeout = min(timeout, max(0.0, t - now))
        return timeout

    def drain_wakeups(self):
        try:
            while os.read(self.wake_r, 512):
                pass
        except BlockingIOError:
            pass

    def read(self, key):
        """Reads what one stream has; False when it had nothing (or ended)."""
        stream = key.data
        try:
            data = os.read(stream.fd, 65536)
        except BlockingIOError:
            return False
        except OSError:
            data = b""
        if data:
            stream.feed(data)
            return True
        stream.finish()
        self.selector.unregister(key.fileobj)
        key.fileobj.close()
        return False

    def drain(self, rank):
        """Reads what a rank wrote so far (a dead rank's last words: its traceback)."""
        for pipe in rank.pipes:
            for _ in range(64):  # at most 4 MiB: a helper it left behind may still write
                try:
                    key = self.selector.get_key(pipe)
                except (KeyError, ValueError):
                    break
                if not self.read(key):
                    break

    def reap(self):
        exited = []
        for rank in self.ranks:
            if not rank.running:
                continue
            if rank.exit_at is None and rank.watcher is not None and rank.watcher.is_alive():
                continue  # running, or exiting and its watcher is about to say so
            code = rank.proc.poll()
            if code is None:
                continue
            if rank.exit_at is None:
                rank.exit_at = time.monotonic()
            rank.returncode = code
            exited.append(rank)
        # Several exits seen at once are taken in the order they happened, not by rank.
        first_exit = min((r.exit_at for r in exited), default=0.0)
        exited.sort(key=lambda r: r.failed_at(first_exit))
        for rank in exited:
            if self.hooks is not None:
                self.hooks.on_exit(self, rank)
                if self.hooks.carry_on:
                    continue
            if rank.returncode != 0 and self.stop_reason is None:
                self.on_rank_failed(rank)

    def on_rank_failed(self, rank):
        """The first failure seen: stop the others after --stop-after. The line naming the rank
        that failed first waits for summarize()."""
        _, status = describe_exit(rank.returncode)
        self.stop_reason = ("rank", status)
        self.term_at = time.monotonic() + self.args.stop_after
        self.summary_due = True

    def failed_on_its_own(self, rank):
        """Exited non-zero before horarun signaled it: a failure, not horarun's doing."""
        return rank.returncode not in (None, 0) and (
            self.signaled_at is None or rank.exit_at < self.signaled_at)

    def summarize(self, force):
        """Says which rank failed first: by the time it exited, or printed the traceback it
        then exited with, whichever came first; not by the order horarun noticed. A rank still
        running that printed a traceback before that is waited for (it may be exiting slowly),
        until horarun stops the ranks (force)."""
        deadline = time.monotonic() + SETTLE_S
        while any(r.exited_unnoticed() for r in self.running()) and time.monotonic() < deadline:
            time.sleep(0.002)  # an exit that happened already: let its watcher note the time
        self.reap()
        for rank in self.ranks:
            self.drain(rank)
        failed = [r for r in self.ranks if self.failed_on_its_own(r)]
        if not failed:
            return
        first_exit = min(r.exit_at for r in failed)
        first = min(failed, key=lambda r: r.failed_at(first_exit))
        when = first.failed_at(first_exit)
        raised = [r for r in self.running()
                  if (r.raised_at(first_exit) or float("inf")) < when]
        if raised and not force:
            return
        self.summary_due = False
        if raised:
            first = min(raised, key=lambda r: r.failed_at(first_exit))
        error = first.err.error_line
        error = error[:300].decode("utf-8", "replace") if error else None
        if raised:
            what = "raised %s and has not exited" % (error or "an exception")
        else:
            what, status = describe_exit(first.returncode)
            self.stop_reason = ("rank", status)
            if error:
                what += " (%s)" % error
        if self.hooks is not None and hasattr(self.hooks, "on_first_failure"):
            self.hooks.on_first_failure(first, what, self.stop_reason[1])
        others = [r for r in self.running() if r is not first]
        if others:
            whom = "the other rank" if len(others) == 1 else "the other %d ranks" % len(others)
            say("rank %s %s; stopping %s" % (first.index, what, whom))
        else:
            say("rank %s %s" % (first.index, what))

    def running(self):
        return [r for r in self.ranks if r.running]

    def handle_signals(self):
        while self.pending_signals:
            sig = self.pending_signals.pop(0)
            running = self.running()
            if sig in PASS_ON_SIGNALS:
                for rank in running:
                    rank.signal_group(sig)
            elif self.stop_reason is None:
                self.stop_reason = ("signal", sig)
                say("received %s; forwarding it to %s" % (signal_name(sig),
                                                          plural(len(running), "rank")))
                self.signal_running(sig)
            elif running and self.term_at is not None:
                # Asked while the others may still exit on their own: stop them now.
                self.term_at = None
                self.signal_running(sig)
            elif running and self.kill_at is not None:
                # Asked while the ranks are being stopped: the user will not wait out the grace.
                again = " again" if self.stop_reason[0] == "signal" else ""
                say("received %s%s; killing %s" % (signal_name(sig), again,
                                                   plural(len(running), "rank")))
                self.kill_running()

    def signal_running(self, sig):
        if self.summary_due:
            self.summarize(force=True)
        if self.signaled_at is None:
            self.signaled_at = time.monotonic()
        for rank in self.running():
            rank.signal_group(sig)
        self.kill_at = time.monotonic() + self.args.grace

    def kill_running(self):
        if self.signaled_at is None:
            self.signaled_at = time.monotonic()
        for rank in self.running():
            rank.signal_group(signal.SIGKILL)
        self.kill_at = None
        self.give_up_at = time.monotonic() + KILL_WAIT_S

    def check_deadlines(self, now):
        if self.term_at is not None and now >= self.term_at:
            self.term_at = None
            self.signal_running(signal.SIGTERM)
        if self.kill_at is not None and now >= self.kill_at:
            self.kill_at = None
            running = self.running()
            if running:
                say("sending SIGKILL to %s still running: %s" % (
                    plural(len(running), "rank"), ", ".join(str(r.index) for r in running)))
                self.kill_running()
        if self.give_up_at is not None and now >= self.give_up_at:
            self.give_up_at = None
            running = self.running()
            if running:
                say("giving up on %s that did not exit after SIGKILL (pids %s)" % (
                    plural(len(running), "rank"), ", ".join(str(r.proc.pid) for r in running)))
                for rank in running:
                    rank.returncode = -signal.SIGKILL
                self.drain_until = now

    def finish(self):
        if self.summary_due:
            self.summarize(force=True)
        for key in list(self.selector.get_map().values()):
            if key.data is not None:
                key.data.finish()
        if self.stop_reason is not None:
            # A stopped job leaves nothing behind: helpers that outlived their rank go too.
            for rank in self.ranks:
                rank.signal_group(signal.SIGKILL)
        self.selector.close()

    def exit_code(self):
        if self.stop_reason is not None:
            kind, value = self.stop_reason
            return value if kind == "rank" else 128 + value
        return 0


def run_local(args, knobs):
    if args.master_addr is None:
        args.master_addr = "127.0.0.1"
    port = args.master_port
    if port is None:
        try:
            port = free_port(args.master_addr)
        except OSError as e:
            say(str(e))
            return 1
    base = dict(os.environ)
    token = job_token(args, base, knobs)
    if token is not None:
        knobs = dict(knobs, **{TOKEN_VAR: token})
    envs = [rank_env(base, args, knobs, args.node_rank * args.np + i, i, args.master_addr, port)
            for i in range(args.np)]
    if args.dry_run:
        removed = sorted(k for k in base if is_launcher_var(k))
        for env in envs:
            print(dry_run_line(env, base, removed, args.command))
        return 0
    job = LocalJob(args, [(args.node_rank * args.np + i, env) for i, env in enumerate(envs)])
    job.install_signals()
    failed = job.start()
    if failed is not None:
        return failed
    return job.run()


def dry_run_line(env, base, removed, command):
    """One rank as a shell command: env -u REMOVED... NAME=VALUE... PROGRAM ARGS."""
    words = ["env"]
    for name in removed:
        words += ["-u", name]
    # Every variable horarun sets, even where this environment happens to hold the same value.
    words += ["%s=%s" % (k, v) for k, v in env.items() if k in RANK_VARS or base.get(k) != v]
    return " ".join(shlex.quote(w) for w in words + list(command))
