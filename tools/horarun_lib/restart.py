# SPDX-License-Identifier: Apache-2.0
"""Restart mode (torchrun's model): rounds of workers; a failed rank stops every worker of every
host, and all start again in a new round."""

import json
import time

from .agent import (FORMING_EVERY_S, FORMING_FIRST_S, AgentError, Leader, await_value,
                    route_address, start_agent)
from .common import free_port, say, signal_name
from .local import AGENT_POLL_S, LocalJob
from .store import StoreError

class RoundLeader(Leader):
    """Restart mode: forms round after round (torchrun's rendezvous)."""

    def lead(self):
        k, previous = 0, []
        self.store.set(self.p + "open", "0")
        while True:
            members = self.form(k, previous)
            if members is None or not self.watch(k, members):
                return
            k, previous = k + 1, members

    def form(self, k, previous):
        lo, hi = self.args.nnodes_min, self.args.nnodes_max
        r = self.p + "r%d/" % k
        start = time.monotonic()
        next_word = start + FORMING_FIRST_S
        while self.store.add(r + "n", 0) < lo:
            if self.pause():
                return None
            if time.monotonic() >= next_word:  # not silence while a round forms
                next_word += FORMING_EVERY_S
                say("round %d: %d of the %d agents that --nnodes %s needs have joined after %d s; "
                    "waiting for the others (up to --rdzv-timeout %g s)" % (
                        k, self.store.add(r + "n", 0), lo, self.args.nnodes_text,
                        time.monotonic() - start, self.args.rdzv_timeout))
            if time.monotonic() - start > self.args.rdzv_timeout:
                joined = [json.loads(self.store.get(r + "agent/%d" % i, 5))["name"]
                          for i in range(1, self.store.add(r + "n", 0) + 1)]
                missing = [m for m in previous if m["name"] not in joined]
                reason = "only %d of the %d agents that --nnodes %s needs joined round %d within " \
                    "%g s (--rdzv-timeout)" % (len(joined), lo, self.args.nnodes_text, k,
                                               self.args.rdzv_timeout)
                if missing:
                    reason += "; missing: " + ", ".join("host %s (agent %s, node rank %d)" % (
                        m["host"], m["name"], m["node_rank"]) for m in missing)
                self.store.set(r + "world", json.dumps({"error": reason}))
                self.fail(reason)
                return None
        last_call = time.monotonic() + self.args.last_call_s
        while time.monotonic() < last_call and self.store.add(r + "n", 0) < hi:
            if self.pause():
                return None
        n = self.store.add(r + "n", 0)
        offers = [json.loads(self.store.get(r + "agent/%d" % i, 5)) for i in range(1, n + 1)]
        before = [m["name"] for m in previous]
        offers.sort(key=lambda a: before.index(a["name"]) if a["name"] in before else len(before))
        members, base = [], 0
        for node_rank, offer in enumerate(offers[:hi]):
            members.append(dict(offer, node_rank=node_rank, rank_base=base))
            base += offer["nproc"]
        self.store.set(self.p + "open", str(k + 1))
        self.store.set(r + "world", json.dumps({"round": k, "members": members, "world_size": base}))
        return members

    def watch(self, k, members):
        """True when round k ends and another should form; False when the job is over."""
        r = self.p + "r%d/" % k
        while True:
            if self.pause(0.1):
                return False
            if self.store.check(r + "restart"):
                return True
            done = [m for m in members if self.store.check(r + "done/" + m["name"])]
            if len(done) == len(members):
                return False
            if len(members) < self.args.nnodes_max and self.store.add(self.p + "r%d/n" % (k + 1), 0):
                self.store.first_set(r + "restarts", r + "restart", {
                    "kind": "membership", "status": 0,
                    "reason": "an agent asks to join (%d of at most %d hosts in this round)" % (
                        len(members), self.args.nnodes_max)})
                return True
            for m in members:
                if m not in done and not self.alive(m["name"]):
                    self.store.first_set(r + "restarts", r + "restart", {
                        "kind": "failure", "status": 1,
                        "reason": "the agent of host %s (node rank %d) stopped answering" % (
                            m["host"], m["node_rank"])})
                    return True


class RestartHooks:
    """LocalJob hooks of one round: a failed rank ends the round for every agent."""

    carry_on = False

    def __init__(self, agent, k):
        self.agent = agent
        self.r = agent.prefix + "r%d/" % k
        self.outcome = None  # ("restart", info) or ("failed", info)
        self.local_failure = None
        self.next_look = 0.0

    def on_exit(self, job, rank):
        pass  # a failure is told once the job knows which rank failed first

    def on_first_failure(self, rank, what, status):
        """The job's summary: this rank failed first (LocalJob.summarize)."""
        if self.outcome is not None or self.local_failure is not None:
            return
        self.local_failure = status
        try:
            self.agent.store.first_set(self.r + "restarts", self.r + "restart", {
                "kind": "failure", "status": status,
                "reason": "rank %s on %s %s" % (rank.index, self.agent.host, what)})
        except StoreError:
            pass

    def watch(self, job):
        now = time.monotonic()
        if self.outcome is not None or now < self.next_look:
            return
        self.next_look = now + AGENT_POLL_S
        store = self.agent.store
        try:
            self.agent.beat()
            failed = self.agent.failed()
            if failed is not None:
                self.outcome = ("failed", failed)
            else:
                restart = store.get_json(self.r + "restart")
                if restart is not None:
                    self.outcome = ("restart", restart)
        except StoreError as e:
            self.outcome = ("failed", {"reason": str(e), "status": 1})
        if self.outcome is not None:
            job.stop(self.outcome[1]["status"])


def join_round(agent, nproc, start_round):
    """Asks for a place in the round the leader forms now; (k, world, my entry)."""
    store, p = agent.store, agent.prefix
    k = start_round
    if k is None:
        k = int(await_value(agent, lambda: store.get(p + "open", AGENT_POLL_S)))
    address = agent.args.local_addr or route_address(agent.store_host, agent.store_port)
    while True:
        r = p + "r%d/" % k
        i = store.add(r + "n")
        # MASTER_ADDR:MASTER_PORT of the round, if this agent gets node rank 0: torch's rank 0
        # serves its own store there (hora's workers use the agents' store).
        store.set(r + "agent/%d" % i, json.dumps({
            "name": agent.name, "host": agent.host, "nproc": nproc,
            "addr": address, "port": free_port(address)}))
        world = await_value(agent, lambda: store.get_json(r + "world", AGENT_POLL_S))
        if "error" in world:
            raise AgentError(world["error"])
        for m in world["members"]:
            if m["name"] == agent.name:
                return k, world, m
        k += 1  # late, or beyond MAX: wait for the next round


def run_restart_agent(args, knobs):
    """torchrun's model: rounds of workers; a failure stops them all and starts a new round."""
    agent = start_agent(args, knobs)
    if agent is None:
        return 1
    if agent.leading:
        agent.leader = RoundLeader(agent)
        agent.leader.start()
    try:
        return restart_rounds(agent, args)
    except AgentError as e:
        if str(e) != "stopped":
            say(str(e))
        return e.status
    finally:
        agent.close()


def restart_rounds(agent, args):
    restarts, k = 0, None
    while True:
        k, world, me = join_round(agent, args.np, k)
        if k > 0 or args.nnodes_max > 1:
            say("round %d: %s is node %d of %d, ranks %d-%d of %d" % (
                k, agent.host, me["node_rank"], len(world["members"]), me["rank_base"],
                me["rank_base"] + args.np - 1, world["world_size"]))
        r = agent.prefix + "r%d/" % k
        workers = []
        for i in range(args.np):
            rank = me["rank_base"] + i
            workers.append((rank, agent.worker_env({
                "MASTER_ADDR": world["members"][0]["addr"],
                "MASTER_PORT": str(world["members"][0]["port"]),
                "RANK": str(rank), "WORLD_SIZE": str(world["world_size"]), "LOCAL_RANK": str(i),
                "LOCAL_WORLD_SIZE": str(args.np), "NODE_RANK": str(me["node_rank"]),
                "GROUP_RANK": str(me["node_rank"]), "HORA_STORE_PREFIX": r,
                "HORA_RESTART_COUNT": str(restarts), "TORCHELASTIC_RESTART_COUNT": str(restarts),
                "TORCHELASTIC_MAX_RESTARTS": str(args.max_restarts),
                "TORCHELASTIC_RUN_ID": args.rdzv_id})))
        hooks = RestartHooks(agent, k)
        job = LocalJob(args, workers, hooks, attempt=k)
        job.install_signals(agent.hub)
        status = job.start()
        if status is not None:
            agent.fail_job("cannot start %s on %s" % (args.program, agent.host), status)
            return status
        status = job.run()
        if job.stop_reason is not None and job.stop_reason[0] == "signal":
            agent.fail_job("horarun on %s received %s" % (agent.host,
                                                          signal_name(job.stop_reason[1])), status)
            return status
        if hooks.outcome is None and status == 0:
            agent.store.set(r + "done/" + agent.name, "")
            if agent.leading:  # keep the store up until every agent's workers are done
                agent.wait_out(lambda: not agent.leader.is_alive())
            return 0
        if hooks.outcome is None:  # our failure; read what the round says
            info = agent.store.get_json(r + "restart", 5) or {
                "kind": "failure", "reason": "a rank failed", "status": status}
        elif hooks.outcome[0] == "failed":
            info = hooks.outcome[1]
            say(info["reason"])
            return hooks.local_failure or info["status"] or 1
        else:
            info = hooks.outcome[1]
        if info["kind"] == "failure":
            if restarts >= args.max_restarts:
                reason = "%s; no restarts left (--max-restarts %d)" % (info["reason"],
                                                                       args.max_restarts)
                agent.fail_job(reason, info["status"])
                say(reason)
                return hooks.local_failure or info["status"] or 1
            restarts += 1
            say("round %d ended: %s; restarting the workers (restart %d of %d)" % (
                k, info["reason"], restarts, args.max_restarts))
        else:
            say("round %d ended: %s; forming a new round" % (k, info["reason"]))
        k += 1
