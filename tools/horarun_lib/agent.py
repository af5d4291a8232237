# SPDX-License-Identifier: Apache-2.0
"""What both kinds of agent share (restart.py, elastic.py): the agent itself (its store, heartbeat
and signals), the leader thread's base, and waiting for the store."""

import os
import select
import socket
import threading
import time

from .common import (RANK_VARS, TOKEN_VAR, AgentError, is_launcher_var, job_token, say,
                     signal_name)
from .local import AGENT_POLL_S, PASS_ON_SIGNALS, SignalHub
from .store import StoreClient, StoreError, StoreProcess

# Agents: restarts, several hosts, elasticity (docs/elastic.md).
#
# An agent is a horarun that keeps its workers going. Agents meet in the job's store, which
# the agent at the rendezvous endpoint serves as a process of its own (hora-store), so that it
# outlives every worker. That agent also leads: it forms the rounds (restart mode) or the worlds
# (elastic mode) and decides who is in them. Keys, under P = "rdzv/<rdzv-id>/":
#   P agents, P agent/<i>       every agent that ever joined, by name (host:pid)
#   P beat/<name>               counter each agent bumps every HEARTBEAT_S
#   P failed                    the job is over: {"reason", "status"}; every agent stops
#   restart mode, round k (the workers' HORA_RESTART_COUNT counts the rounds a failure ended):
#   P open                      the round that agents join now
#   P r<k>/n, P r<k>/agent/<i>  agents asking to be in round k, and what each offers
#   P r<k>/world                the leader's answer: the members, their node ranks, the size
#   P r<k>/restart              why round k ends: {"kind": failure|membership, "reason", "status"}
#   P r<k>/done/<name>          that agent's workers all exited 0
#   P r<k>/...                  the workers' own world (HORA_STORE_PREFIX)
#   elastic mode: P live/<name> (that agent's live workers), P slots (hosts -> slots), and the
#   worlds' keys of lib/bootstrap/env/elastic.h.

HEARTBEAT_S = 0.5        # an agent bumps its beat this often
AGENT_LOST_S = 5.0       # the leader counts an agent gone after this long without a beat
DISCOVERY_S = 1.0        # how often the leader runs --host-discovery-script
FORMING_FIRST_S = 10.0   # a round still short of MIN agents is reported after this long,
FORMING_EVERY_S = 30.0   # and again this often


def route_address(host, port):
    """This machine's address on the route to host (what its peers can reach it at)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((host, port or 9))
            return s.getsockname()[0]
    except OSError:
        return "127.0.0.1"


def is_local_address(host):
    """Whether host names an address of this machine (we can bind to it)."""
    try:
        infos = socket.getaddrinfo(host, None, socket.AF_INET, socket.SOCK_STREAM)
    except OSError:
        return False
    for info in infos:
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                s.bind((info[4][0], 0))
                return True
        except OSError:
            continue
    return False


class Agent:
    """What every agent shares: its name, the store, the signal hub, its heartbeat."""

    def __init__(self, args, knobs):
        self.args = args
        self.knobs = knobs
        self.host = socket.gethostname()
        self.name = "%s:%d" % (self.host, os.getpid())
        self.prefix = "rdzv/%s/" % args.rdzv_id
        self.base = dict(os.environ)
        self.token = job_token(args, self.base, knobs)
        self.hub = SignalHub()
        self.store_proc = None
        self.last_beat = 0.0
        host, port = args.rdzv_host, args.rdzv_port
        if args.standalone:
            self.store_proc = StoreProcess("127.0.0.1", 0, self.token)
            host, port = "127.0.0.1", self.store_proc.port
        elif args.is_host if args.is_host is not None else is_local_address(host):
            try:
                self.store_proc = StoreProcess(host, port, self.token)
            except AgentError as e:
                if "in use" not in str(e) or args.is_host:
                    raise  # another agent of this machine serves it: follow that one
        self.store_host, self.store_port = host, port
        self.store = StoreClient(host, port, self.token, args.rdzv_timeout)
        if self.store_proc is not None:
            self.store.explain = self.store_proc.exit_words
        self.leader = None
        self.beat()

    def register(self):
        """Elastic mode: counts this agent among those whose live workers the leader waits for
        (after it published its first workers, so that none is missed)."""
        i = self.store.add(self.prefix + "agents")
        self.store.set(self.prefix + "agent/%d" % i, self.name)

    @property
    def leading(self):
        return self.store_proc is not None

    def beat(self):
        now = time.monotonic()
        if now - self.last_beat >= HEARTBEAT_S:
            self.last_beat = now
            self.store.add(self.prefix + "beat/" + self.name)

    def failed(self):
        """The job's end, as {"reason", "status"}, once any agent declared it."""
        return self.store.get_json(self.prefix + "failed")

    def fail_job(self, reason, status):
        try:
            self.store.first_set(self.prefix + "failures", self.prefix + "failed",
                                 {"reason": reason, "status": status})
        except StoreError:
            pass

    def worker_env(self, extra):
        env = {k: v for k, v in self.base.items()
               if not is_launcher_var(k) and k not in RANK_VARS and k != TOKEN_VAR}
        store = "[%s]" % self.store_host if ":" in self.store_host else self.store_host
        env.update({"HORA_BOOTSTRAP": "env",
                    "HORA_AGENT_STORE": "%s:%d" % (store, self.store_port)})
        env.update(extra)
        env.update(self.knobs)
        if self.token:
            env[TOKEN_VAR] = self.token
        return env

    def wait_out(self, until, blocks=False):
        """Waits (handling signals) until until() is true; False when a signal said stop.
        blocks: until() itself waits up to AGENT_POLL_S (a get the store answers early)."""
        while not until():
            if any(sig not in PASS_ON_SIGNALS for sig in self.hub.pending):
                return False
            self.hub.pending[:] = []
            self.beat()
            select.select([self.hub.wake_r], [], [], 0 if blocks else AGENT_POLL_S)
            try:
                while os.read(self.hub.wake_r, 512):
                    pass
            except BlockingIOError:
                pass
        return True

    def stopped_by_signal(self):
        sig = next(sig for sig in self.hub.pending if sig not in PASS_ON_SIGNALS)
        self.fail_job("horarun on %s received %s" % (self.host, signal_name(sig)), 128 + sig)
        return 128 + sig

    def close(self):
        if self.leader is not None:
            self.leader.stop = True
            self.leader.join(timeout=5)
        self.store.close()
        if self.store_proc is not None:
            self.store_proc.close()


class Leader(threading.Thread):
    """The agent at the endpoint forms rounds or worlds on a thread and connection of its own."""

    def __init__(self, agent):
        super().__init__(name="horarun-leader", daemon=True)
        self.agent = agent
        self.args = agent.args
        self.p = agent.prefix
        self.store = StoreClient(agent.store_host, agent.store_port, agent.token, 30)
        self.stop = False
        self.beats = {}  # agent name -> (last value, when it changed)

    def run(self):
        try:
            self.lead()
        except StoreError:
            pass  # the agent sees the same store trouble and says so
        except Exception as e:  # a bug here must end the job, not leave every agent waiting
            try:
                self.fail("horarun's rendezvous leader failed: %r" % e)
            except StoreError:
                pass

    def pause(self, seconds=0.05):
        time.sleep(seconds)
        if self.stop:
            raise StoreError("stopped")
        return self.store.check(self.p + "failed")

    def alive(self, name):
        value = self.store.add(self.p + "beat/" + name, 0)
        now = time.monotonic()
        last = self.beats.get(name)
        if last is None or last[0] != value:
            self.beats[name] = (value, now)
            return True
        return now - last[1] < AGENT_LOST_S

    def agents(self):
        n = self.store.add(self.p + "agents", 0)
        return [self.store.get(self.p + "agent/%d" % i, 5) for i in range(1, n + 1)]

    def fail(self, reason, status=1):
        self.store.first_set(self.p + "failures", self.p + "failed",
                             {"reason": reason, "status": status})


def await_value(agent, fetch):
    """fetch()'s first answer that is not None (fetch may wait up to AGENT_POLL_S in the store);
    AgentError when the job failed meanwhile or a signal said stop."""
    found = []

    def ready():
        value = fetch()
        if value is not None:
            found.append(value)
            return True
        return agent.failed() is not None

    if not agent.wait_out(ready, blocks=True):
        raise AgentError("stopped", agent.stopped_by_signal())
    if not found:
        failed = agent.failed()
        raise AgentError(failed["reason"], failed["status"])
    return found[0]


def start_agent(args, knobs):
    """The agent, or None after saying why it cannot start."""
    try:
        return Agent(args, knobs)
    except AgentError as e:
        say(str(e))
        return None
