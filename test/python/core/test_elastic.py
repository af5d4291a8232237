# SPDX-License-Identifier: Apache-2.0
"""hora.elastic in one process (a world of one): what commit, restore and sync keep, what run()
does with a lost-peer error inside and outside an elastic job, and HostsUpdatedInterrupt. The
multi-worker behaviour is tested under horarun in test/elastic."""

import os

import pytest

import hora
import hora.elastic as elastic


@pytest.fixture(autouse=True)
def world_of_one(monkeypatch):
    for name in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "HORA_ELASTIC"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HORA_BOOTSTRAP", "single")
    hora.init()
    yield
    hora.shutdown()


def test_object_state_commit_and_restore():
    state = elastic.ObjectState(epoch=0, batch=0, history=[])
    state.epoch, state.batch = 2, 7
    state.history.append("a")
    state.commit()  # a world of one outside an elastic job: no new world, no interrupt
    state.epoch, state.batch = 3, 1
    state.history.append("b")
    state.restore()
    assert (state.epoch, state.batch, state.history) == (2, 7, ["a"])
    state.sync()  # rank 0's values: the same here
    assert (state.epoch, state.batch, state.history) == (2, 7, ["a"])


def test_world_changed_is_false_outside_an_elastic_job():
    assert not elastic.is_elastic()
    assert elastic.world_changed() is False


def test_run_propagates_errors_outside_an_elastic_job():
    calls = []

    @elastic.run
    def train(state):
        calls.append(state.epoch)
        raise hora.PeerLostError("a peer is gone", 7)

    with pytest.raises(hora.PeerLostError):
        train(elastic.ObjectState(epoch=5))
    assert calls == [5]


def test_run_restores_the_commit_after_a_lost_peer(monkeypatch):
    monkeypatch.setenv("HORA_ELASTIC", "1")
    resets = []
    monkeypatch.setattr(elastic, "_reset", lambda: resets.append(hora.is_initialized()))
    state = elastic.ObjectState(step=0)
    state.register_reset_callbacks([lambda: resets.append("callback")])
    seen = []

    @elastic.run
    def train(state):
        seen.append(state.step)
        while state.step < 6:
            state.step += 1
            if state.step == 2:
                state.commit()
            if state.step == 4 and len(seen) == 1:
                raise hora.PeerLostError("rank 1 is gone", 7)
        return state.step

    assert train(state) == 6
    assert seen == [0, 2]  # the second call starts from the commit, not from step 4
    assert resets == [True, "callback"]


def test_commit_interrupts_when_a_world_is_forming(monkeypatch):
    monkeypatch.setenv("HORA_ELASTIC", "1")
    monkeypatch.setattr(elastic, "_reset", lambda: None)
    answers = [True]  # the agents' news, once
    monkeypatch.setattr(elastic, "world_changed", lambda: bool(answers and answers.pop()))
    state = elastic.ObjectState(step=0)
    seen = []

    @elastic.run
    def train(state):
        seen.append(state.step)
        state.step += 4
        state.commit()  # raises HostsUpdatedInterrupt the first time: nothing is rolled back
        state.step += 3
        return state.step

    assert train(state) == 11
    assert seen == [0, 4]
