# SPDX-License-Identifier: Apache-2.0
"""Elastic mode (Horovod's model): a failed worker is not restarted; the survivors carry on in a
new world, and hosts come and go with --host-discovery-script."""

import json
import socket
import subprocess
import time

from .agent import DISCOVERY_S, AgentError, Leader, start_agent
from .common import describe_exit, say, signal_name
from .local import AGENT_POLL_S, LocalJob
from .store import StoreError

class WorldLeader(Leader):
    """Elastic mode: the hosts' slots (--host-discovery-script) and the workers' worlds."""

    def lead(self):
        g, previous = 0, []
        registered, first = [], None
        noticed = set()
        next_discovery = 0.0
        self.store.set(self.p + "w/open", "0")
        while True:
            if self.pause():
                return
            now = time.monotonic()
            if self.args.host_discovery_script and now >= next_discovery:
                next_discovery = now + DISCOVERY_S
                self.discover()
            w = self.p + "w%d/" % g
            if g > 0 and g - 1 not in noticed and previous and \
                    not self.store.check(self.p + "succeeded"):
                # A member of the last world died, perhaps before that world even formed: its
                # survivors may be waiting for it in hora_init. Tell them at once; they join
                # the next world (the waits of forming one look for this key).
                gone = [x for x in previous if x not in self.live()]
                if gone:
                    noticed.add(g - 1)
                    self.store.set(self.p + "w%d/update" % (g - 1),
                                   "worker %s is gone; a new world is forming" % ", ".join(gone))
            n = self.store.add(w + "n", 0)
            if n == 0:
                continue
            if self.store.check(self.p + "succeeded"):
                # Training is over; a worker that asks now (a late newcomer) must not start it
                # again on its own.
                self.store.set(w + "world", "error 9\nthe job is finishing: its workers "
                               "completed training")
                self.store.set(self.p + "w/open", str(g + 1))
                g, registered, first = g + 1, [], None
                continue
            first = first or now
            if g > 0 and g - 1 not in noticed:
                noticed.add(g - 1)
                self.store.set(self.p + "w%d/update" % (g - 1), "a new world is forming")
            while len(registered) < n:
                # "" for a worker that died between counting itself and writing its id
                registered.append(self.store.get(w + "reg/%d" % (len(registered) + 1), 5) or "")
            live = self.live()
            waiting = live - set(registered)
            late = now - first > self.args.rdzv_timeout
            # A live member of the last world still trains in it: a world without it would
            # split the job in two. It registers at its next commit, or dies and leaves `live`.
            # Newcomers that never ask are left out after --rdzv-timeout. The first world waits
            # for --nnodes MIN agents (each has published its workers by then).
            if waiting & set(previous) or (waiting and not late):
                continue
            if g == 0 and not late and self.store.add(self.p + "agents", 0) < self.args.nnodes_min:
                continue
            # The last world's members keep their order (its rank 0 holds the state the others
            # sync from); newcomers follow, by agent and slot.
            newcomers = sorted(set(registered) - set(previous) - {""}, key=worker_order)
            members = [x for x in previous + newcomers
                       if x in live and x in registered][:self.args.max_np]
            if len(members) < self.args.min_np:
                if not late:
                    continue
                reason = "only %d workers were ready for a new world within %g s, and " \
                    "--min-np is %d" % (len(members), self.args.rdzv_timeout, self.args.min_np)
                self.store.set(w + "world", "error 6\n" + reason)
                self.fail(reason)
                return
            self.store.set(self.p + "w/open", str(g + 1))
            self.store.set(w + "world", "ok\n" + "\n".join(members))
            g, previous, registered, first = g + 1, members, [], None

    def live(self):
        """Every live worker of every agent that still answers."""
        out = set()
        for name in self.agents():
            if name and self.alive(name):
                out.update((self.store.get(self.p + "live/" + name, 0) or "").split())
        return out

    def discover(self):
        try:
            proc = subprocess.run([self.args.host_discovery_script], stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, timeout=30, check=False)
        except (OSError, subprocess.SubprocessError) as e:
            say("--host-discovery-script %s: %s" % (self.args.host_discovery_script, e))
            return
        if proc.returncode != 0:
            say("--host-discovery-script exited with status %d; keeping the hosts as they are"
                % proc.returncode)
            return
        slots = {}
        for line in proc.stdout.decode("utf-8", "replace").splitlines():
            line = line.split("#", 1)[0].strip()
            if line:
                name, _, count = line.partition(":")
                slots[name] = slots.get(name, 0) + (int(count) if count.isdigit() else 1)
        text = json.dumps(slots, sort_keys=True)
        if text != self.store.get(self.p + "slots", 0):
            self.store.set(self.p + "slots", text)


def worker_order(worker_id):
    """Sort key of an elastic worker's id, "host:pid/slot"."""
    agent, _, slot = worker_id.rpartition("/")
    return agent, int(slot) if slot.isdigit() else 0


def names_of_this_host():
    names = {socket.gethostname(), socket.getfqdn(), "localhost", "127.0.0.1"}
    try:
        names.update(socket.gethostbyname_ex(socket.gethostname())[2])
    except OSError:
        pass
    return names


class ElasticHooks:
    """LocalJob hooks of an elastic agent: workers come and go; the others carry on."""

    carry_on = True

    def __init__(self, agent, args):
        self.agent = agent
        self.args = args
        self.slot = 0          # workers this agent started
        self.retired = 0       # slots whose worker failed: not refilled unless the hosts grow
        self.live = {}         # rank label -> worker id
        self.succeeded = False
        self.last_failure = None
        self.next_look = 0.0
        self.names = names_of_this_host()
        self.target = args.np
        self.outcome = None

    def publish(self):
        self.agent.store.set(self.agent.prefix + "live/" + self.agent.name,
                             " ".join(self.live.values()))

    def start_workers(self, job):
        # A slot whose worker failed stays empty (Horovod leaves a failed host out) until the
        # discovery script reports more slots than this host had.
        while len(self.live) < min(self.target - self.retired, self.args.max_np):
            worker_id = "%s/%d" % (self.agent.name, self.slot)
            env = self.agent.worker_env({
                "HORA_ELASTIC": "1", "HORA_ELASTIC_ID": worker_id,
                "HORA_STORE_PREFIX": self.agent.prefix, "HORA_RESTART_COUNT": "0",
                "TORCHELASTIC_RESTART_COUNT": "0"})
            self.live[self.slot] = worker_id
            self.publish()  # before it starts: the leader waits for every live worker
            status = job.add(self.slot, env)
            if status is not None:
                del self.live[self.slot]
                self.publish()
                return status
            self.slot += 1
        return None

    def on_exit(self, job, rank):
        self.live.pop(rank.index, None)
        try:
            self.publish()
        except StoreError:
            pass
        if rank.returncode == 0:
            self.succeeded = True
            try:
                self.agent.store.set(self.agent.prefix + "succeeded", self.agent.name)
            except StoreError:
                pass
            return
        what, status = describe_exit(rank.returncode)
        self.retired += 1
        self.last_failure = status
        if self.outcome is None and not self.succeeded:
            say("worker %d %s; the others carry on" % (rank.index, what))

    def watch(self, job):
        now = time.monotonic()
        if self.outcome is not None or now < self.next_look:
            return
        self.next_look = now + AGENT_POLL_S
        try:
            self.agent.beat()
            failed = self.agent.failed()
            if failed is not None:
                self.outcome = failed
                job.stop(failed["status"])
                return
            if self.agent.store.check(self.agent.prefix + "succeeded"):
                self.succeeded = True  # another host's workers completed: start no more
            slots = self.agent.store.get_json(self.agent.prefix + "slots")
            if slots is not None and not self.succeeded and job.running():
                self.target = sum(n for host, n in slots.items() if host in self.names)
                self.start_workers(job)
        except StoreError as e:
            self.outcome = {"reason": str(e), "status": 1}
            job.stop(1)


def run_elastic_agent(args, knobs):
    agent = start_agent(args, knobs)
    if agent is None:
        return 1
    try:
        if agent.leading:
            agent.leader = WorldLeader(agent)
            agent.leader.start()
        hooks = ElasticHooks(agent, args)
        job = LocalJob(args, [], hooks)
        job.install_signals(agent.hub)
        status = hooks.start_workers(job)
        if status is not None:
            agent.fail_job("cannot start %s on %s" % (args.program, agent.host), status)
            return status
        agent.register()
        status = job.run()
        if job.stop_reason is not None and job.stop_reason[0] == "signal":
            agent.fail_job("horarun on %s received %s" % (agent.host,
                                                          signal_name(job.stop_reason[1])), status)
            return status
        if hooks.outcome is not None:
            say(hooks.outcome["reason"])
            return hooks.outcome["status"] or 1
        if not hooks.succeeded:
            agent.fail_job("every worker on %s failed" % agent.host, hooks.last_failure or 1)
            return hooks.last_failure or 1
        if agent.leading:  # keep the store up while other agents' workers run
            agent.wait_out(lambda: not agent.leader.live())
        return 0
    except AgentError as e:
        say(str(e))
        return e.status
    finally:
        agent.close()
